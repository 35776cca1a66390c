/* fuzz_judge_reply.c — the judge reply parsers on arbitrary bytes: the client's chat-completion reply parser
 * (choices[i].message.content, error objects; decoded, then redacted), the LongMemEval verdict, the quality
 * and rubric score parsers, the redaction of an echoed secret (plain, or spelled with JSON escapes: no secret
 * may come out of the parser, its raw text or the decoded error text), and the LongMemEval judge template
 * loader. client.c is included for its static parser. */
#include "judge/client.c"
#include "judge/judges.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    kvb_secrets sec = {0};
    kvb_secrets_add(&sec, "sk-fuzz-secret");
    kvb_judge_req r;
    memset(&r, 0, sizeof r);
    if (parse_reply(&r, &sec, text, 4, 1e300) == 0)
        for (int i = 0; i < r.n_replies; i++) {
            double v;
            kvb_lme_verdict(r.replies[i]);
            kvb_quality_parse(r.replies[i], &v);
            kvb_rubric_parse(r.replies[i], &v);
            if (strstr(r.replies[i], "sk-fuzz-secret")) abort();
        }
    if (r.n_replies > 4 || (r.raw && strstr(r.raw, "sk-fuzz-secret"))) abort();
    kvb_judge_req_clear(&r);
    char *decoded = kvb_redact_decoded(&sec, strdup(text)); /* an error body, as the client shows it */
    if (decoded && strstr(decoded, "sk-fuzz-secret")) abort();
    free(decoded);
    double v;
    kvb_lme_verdict(text);
    if (kvb_quality_parse(text, &v) == 0 && !(v >= 0 && v <= 10)) abort(); /* documented range */
    if (kvb_rubric_parse(text, &v) == 0 && !(v >= 0 && v <= 10)) abort();
    text = kvb_redact(&sec, text);
    if (text && strstr(text, "sk-fuzz-secret")) abort();
    kvb_secrets_free(&sec);
    char path[256], err[256];
    fuzz_write("templates.json", data, size, path, sizeof path);
    kvb_lme_templates_free(kvb_lme_templates_load(path, err, sizeof err));
    free(text);
    return 0;
}
