/* test_redact.c — secrets out of texts (judge/redact.h): every occurrence of a secret and of its base64 form
 * is replaced, URLs lose their userinfo (also inside a longer text), short "secrets" are ignored. */
#include <CUnit/Basic.h>
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

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("redact", NULL, NULL);
    CU_add_test(s, "secrets and their base64 are replaced", test_secrets_and_their_base64_are_replaced);
    CU_add_test(s, "URL userinfo is removed", test_url_userinfo_is_removed);
    return util_run_suites();
}
