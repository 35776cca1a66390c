/* fuzz_serve_request.c — `kvbench serve`'s request parser on arbitrary bodies: the NUL check, JSON, and
 * every field's validation (messages, max_tokens, temperature, top_p, n, stream, stop, the "kvbench"
 * method/budget/options extension, the content's byte count behind max_prompt_bytes), up to where a model
 * would be needed; and the bearer-token comparison on the same bytes taken as an Authorization value (a
 * NUL or anything after the token refuses). serve.c is included for its static functions. */
#include "judge/serve.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kvb_serve_opts o;
    server s;
    memset(&s, 0, sizeof s);
    s.o = &o;
    static const char token[] = "tok-123";
    size_t n = size; /* trailing spaces and tabs are HTTP's optional whitespace */
    while (n > 0 && (data[n - 1] == ' ' || data[n - 1] == '\t')) n--;
    int exact = n == 7 + strlen(token) && !memcmp(data, "Bearer ", 7) && !memcmp(data + 7, token, strlen(token));
    if (bearer_matches((const char *)data, size, token) != exact) abort();
    if (json_has_nul((const char *)data, size)) return 0;
    cJSON *req = cJSON_ParseWithLength((const char *)data, size);
    if (req && cJSON_IsObject(req)) {
        req_params p;
        char err[512];
        if (parse_request(&s, req, &p, err, sizeof err) == 0) {
            /* what the server then asks of the method: that it exists with these options and budget */
            if (!kvb_method_find(p.method)) abort();
            size_t bytes = 0;
            for (int i = 0; i < p.n_msgs; i++) bytes += strlen(p.msgs[i].content);
            if (bytes != p.prompt_bytes) abort();
            req_params_free(&p);
        }
    }
    cJSON_Delete(req);
    return 0;
}
