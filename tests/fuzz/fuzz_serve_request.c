/* fuzz_serve_request.c — `kvbench serve`'s request parser on arbitrary bodies: the NUL check, JSON, and
 * every field's validation (messages, max_tokens, temperature, top_p, n, stream, stop, the "kvbench"
 * method/budget/options extension), up to where a model would be needed. serve.c is included for its
 * static functions. */
#include "judge/serve.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kvb_serve_opts o;
    server s;
    memset(&s, 0, sizeof s);
    s.o = &o;
    if (json_has_nul((const char *)data, size)) return 0;
    cJSON *req = cJSON_ParseWithLength((const char *)data, size);
    if (req && cJSON_IsObject(req)) {
        req_params p;
        char err[512];
        if (parse_request(&s, req, &p, err, sizeof err) == 0) {
            /* what the server then asks of the method: that it exists with these options and budget */
            if (!kvb_method_find(p.method)) abort();
            req_params_free(&p);
        }
    }
    cJSON_Delete(req);
    return 0;
}
