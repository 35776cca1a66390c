/* test_redact.c — secrets out of texts (judge/redact.h): every occurrence of a secret and of its base64 form
 * is replaced, URLs lose their userinfo (also inside a longer text), short "secrets" are ignored; a secret
 * spelled with JSON escapes is decoded, then redacted, in JSON and in plain text; a percent-encoded URL
 * password is a secret in both spellings. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "judge/redact.h"

static void test_secrets_and_their_base64_are_replaced(void) {
    kvb_secrets s = {0};
    CU_ASSERT(kvb_secrets_add(&s, "sk-SECRET") == 0);
    CU_ASSERT(kvb_secrets_add(&s, "abc") == 0 && s.n == 2); /* too short: ignored */
    CU_ASSERT(kvb_secrets_add(&s, NULL) == 0);
    char *t = strdup("Bearer sk-SECRET; again sk-SECRETsk-SECRET; b64 c2stU0VDUkVU; abc stays");
    t = kvb_redact(&s, t);
    CU_ASSERT_STRING_EQUAL(t, "Bearer [REDACTED]; again [REDACTED][REDACTED]; b64 [REDACTED]; abc stays");
    free(t);
    kvb_secrets_free(&s);
    CU_ASSERT_EQUAL(s.n, 0);
}

static void test_url_userinfo_is_removed(void) {
    char out[256], ui[64], pw[64];
    kvb_url_strip_userinfo("http://user:p%40ss@host:8080/v1?x=a@b", out, sizeof out, ui, sizeof ui, pw, sizeof pw);
    CU_ASSERT_STRING_EQUAL(out, "http://host:8080/v1?x=a@b");
    CU_ASSERT_STRING_EQUAL(ui, "user:p%40ss");
    CU_ASSERT_STRING_EQUAL(pw, "p%40ss");
    kvb_url_strip_userinfo("https://host/v1", out, sizeof out, ui, sizeof ui, pw, sizeof pw);
    CU_ASSERT_STRING_EQUAL(out, "https://host/v1");
    CU_ASSERT_STRING_EQUAL(ui, "");
    kvb_url_strip_userinfo("http://token@host", out, sizeof out, ui, sizeof ui, pw, sizeof pw);
    CU_ASSERT_STRING_EQUAL(out, "http://host");
    CU_ASSERT_STRING_EQUAL(ui, "token");
    CU_ASSERT_STRING_EQUAL(pw, "");
    char text[] = "kvbench run s.json --judge-url http://u:SECRET@127.0.0.1:8080/v1 --out x, mail a@b, \"https://k@h/\"";
    kvb_redact_url_userinfo(text);
    CU_ASSERT_STRING_EQUAL(text, "kvbench run s.json --judge-url http://127.0.0.1:8080/v1 --out x, mail a@b, \"https://h/\"");
}

/* "SEC\u0052ET", every character \u-escaped, "\/" for '/': a JSON reader gets the secret back from each, so
 * redaction runs on the decoded text (keys included); a text that is not JSON has its escapes decoded too. */
static void test_escaped_secrets_are_decoded_then_redacted(void) {
    kvb_secrets s = {0};
    CU_ASSERT_FATAL(kvb_secrets_add(&s, "sk-a/SECRET") == 0);
    char *t = strdup("{\"choices\":[{\"message\":{\"content\":\"k=sk-a\\/SEC\\u0052ET all=\\u0073\\u006b\\u002d\\u0061"
                     "\\u002f\\u0053\\u0045\\u0043\\u0052\\u0045\\u0054\"}}],\"sk-a\\/SECRET\":1}");
    t = kvb_redact_decoded(&s, t);
    CU_ASSERT_FATAL(t != NULL);
    CU_ASSERT_STRING_EQUAL(t, "{\"choices\":[{\"message\":{\"content\":\"k=[REDACTED] all=[REDACTED]\"}}],\"[REDACTED]\":1}");
    free(t);
    t = strdup("<html>you sent Bearer sk-a\\/SEC\\u0052ET</html>"); /* not JSON */
    t = kvb_redact_decoded(&s, t);
    CU_ASSERT_STRING_EQUAL(t, "<html>you sent Bearer [REDACTED]</html>");
    free(t);
    cJSON *j = cJSON_Parse("[{\"a\": \"x sk-a/SECRET y\"}, \"sk-a/SECRET\", 3]");
    CU_ASSERT(kvb_redact_json(&s, j) == 0);
    char *p = cJSON_PrintUnformatted(j);
    CU_ASSERT_STRING_EQUAL(p, "[{\"a\":\"x [REDACTED] y\"},\"[REDACTED]\",3]");
    free(p);
    cJSON_Delete(j);
    kvb_secrets_free(&s);
    /* a URL password as written (p%3Fss) and as libcurl sends it (p?ss), with the base64 of each */
    CU_ASSERT(kvb_secrets_add_url_part(&s, "PW-%3FSECRET77") == 0 && s.n == 4);
    t = strdup("a PW-%3FSECRET77 b PW-?SECRET77 c UFctP1NFQ1JFVDc3");
    t = kvb_redact(&s, t);
    CU_ASSERT_STRING_EQUAL(t, "a [REDACTED] b [REDACTED] c [REDACTED]");
    free(t);
    kvb_secrets_free(&s);
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("redact", NULL, NULL);
    CU_add_test(s, "secrets and their base64 are replaced", test_secrets_and_their_base64_are_replaced);
    CU_add_test(s, "URL userinfo is removed", test_url_userinfo_is_removed);
    CU_add_test(s, "escaped secrets are decoded, then redacted", test_escaped_secrets_are_decoded_then_redacted);
    return util_run_suites();
}
