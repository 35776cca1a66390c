/* test_sample.c — the benchmark sample (benchmarks/sample.h): the (user, assistant) round builder's alternation
 * rules, ownership of pushed and truncated samples, the string builder, one-line errors, and splitmix64 with its
 * unbiased draw against a Python implementation (tests/fixtures/splitmix64_ref.json, by splitmix64_ref.py). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/sample.h"

/* "role:content" of every turn, joined by " | ". */
static char *turns_of(const kvb_sample *s) {
    kvb_sb b = {0};
    for (int i = 0; i < s->n_turns; i++) kvb_sb_addf(&b, "%s%s:%s", i ? " | " : "", s->turns[i].role, s->turns[i].content);
    return kvb_sb_take(&b);
}

static void expect_turns(const kvb_sample *s, const char *want) {
    char *got = turns_of(s);
    CU_ASSERT_STRING_EQUAL(got, want);
    free(got);
}

/* Messages keep the user/assistant alternation: a missing partner is an empty message, so turns[2r] and
 * turns[2r+1] are always round r. */
static void test_messages_alternate_with_empty_partners_inserted(void) {
    kvb_sample s;
    kvb_sample_init(&s);
    CU_ASSERT(kvb_sample_add_message(&s, "assistant", "hello", "d0") == 0); /* starts with the assistant (ShareGPT) */
    CU_ASSERT(kvb_sample_add_message(&s, "user", "u1", "d1") == 0);
    CU_ASSERT(kvb_sample_add_message(&s, "user", "u2", "d2") == 0); /* two users in a row */
    CU_ASSERT(kvb_sample_add_message(&s, "assistant", "a2", NULL) == 0);
    CU_ASSERT(kvb_sample_add_message(&s, "assistant", "a3", NULL) == 0); /* two assistants in a row */
    CU_ASSERT(kvb_sample_add_message(&s, "user", "u4", NULL) == 0);
    expect_turns(&s, "user: | assistant:hello | user:u1 | assistant: | user:u2 | assistant:a2 | user: | assistant:a3 | user:u4");
    /* the inserted partner carries the date of the message it precedes */
    CU_ASSERT(s.turns[0].date && !strcmp(s.turns[0].date, "d0") && !strcmp(s.turns[3].date, "d2"));
    CU_ASSERT(s.turns[6].date == NULL && s.turns[0].session == -1 && s.turns[0].has_answer == 0);
    CU_ASSERT(kvb_sample_n_rounds(&s) == 4); /* the trailing user turn is no round yet */
    CU_ASSERT(kvb_sample_close_rounds(&s) == 0);
    CU_ASSERT(s.n_turns == 10 && !strcmp(s.turns[9].role, "assistant") && !strcmp(s.turns[9].content, ""));
    CU_ASSERT(kvb_sample_n_rounds(&s) == 5);
    CU_ASSERT(kvb_sample_close_rounds(&s) == 0 && s.n_turns == 10); /* closed already: nothing added */
    kvb_sample_free(&s);
    CU_ASSERT(s.turns == NULL && s.n_turns == 0);
}

/* "system" is taken only as the very first turn; a later one is refused (1) and stores nothing. */
static void test_system_only_as_the_first_turn(void) {
    kvb_sample s;
    kvb_sample_init(&s);
    CU_ASSERT(kvb_sample_add_message(&s, "system", "be nice", NULL) == 0);
    CU_ASSERT(kvb_sample_add_message(&s, "assistant", "hi", NULL) == 0); /* after system a user turn is due */
    CU_ASSERT(kvb_sample_add_message(&s, "system", "late", NULL) == 1);
    CU_ASSERT(kvb_sample_add_message(&s, "user", "u", NULL) == 0);
    expect_turns(&s, "system:be nice | user: | assistant:hi | user:u");
    CU_ASSERT(kvb_sample_n_rounds(&s) == 1);
    kvb_sample_free(&s);
}

static void make(kvb_sample *s, const char *id) {
    kvb_sample_init(s);
    s->id = kvb_strdup(id);
    s->prompt = kvb_strdup("p");
    CU_ASSERT_FATAL(kvb_sample_add_answer(s, "x") == 0 && kvb_sample_add_answer(s, "y") == 0);
    CU_ASSERT_FATAL(kvb_sample_add_turn(s, "user", "u", "date") == 0);
}

/* Push moves the sample into the set (the caller's copy is zeroed); truncate frees the tail, and a set
 * truncated to nothing holds no allocation (what a failed load leaves). Everything is freed (ASan checks). */
static void test_push_takes_ownership_and_truncate_frees(void) {
    kvb_samples v = {0};
    for (int i = 0; i < 40; i++) { /* past the first growth (16) twice */
        kvb_sample s;
        char id[16];
        snprintf(id, sizeof id, "s%d", i);
        make(&s, id);
        CU_ASSERT_FATAL(kvb_samples_push(&v, &s) == 0);
        CU_ASSERT(s.id == NULL && s.answers == NULL && s.turns == NULL);
    }
    CU_ASSERT(v.n == 40 && !strcmp(v.v[39].id, "s39") && v.v[39].n_answers == 2 && !strcmp(v.v[39].answers[1], "y"));
    kvb_samples_truncate(&v, 25);
    CU_ASSERT(v.n == 25 && v.v != NULL && !strcmp(v.v[24].id, "s24"));
    kvb_samples_truncate(&v, 30); /* beyond the end: nothing happens */
    CU_ASSERT(v.n == 25);
    kvb_samples_truncate(&v, 0);
    CU_ASSERT(v.n == 0 && v.v == NULL && v.cap == 0);
    kvb_sample s;
    make(&s, "again");
    CU_ASSERT(kvb_samples_push(&v, &s) == 0 && v.n == 1);
    kvb_samples_free(&v);
    CU_ASSERT(v.v == NULL && v.n == 0);
}

static void test_init_sets_absent_defaults(void) {
    kvb_sample s;
    memset(&s, 0x5a, sizeof s);
    kvb_sample_init(&s);
    CU_ASSERT(s.length == -1 && s.id == NULL && s.n_turns == 0 && s.max_new_tokens == 0 && s.depth == 0);
    CU_ASSERT(kvb_strdup(NULL) == NULL);
    kvb_sample_free(&s); /* an empty sample frees cleanly */
}

/* The builder grows across its first capacity, formats, and gives "" when nothing was added. */
static void test_string_builder_grows_formats_and_resets(void) {
    kvb_sb b = {0};
    char *s = kvb_sb_take(&b);
    CU_ASSERT(s && s[0] == 0);
    free(s);
    for (int i = 0; i < 1000; i++) kvb_sb_addf(&b, "%03d,", i);
    kvb_sb_add(&b, "xyz", 2);
    kvb_sb_adds(&b, "!");
    CU_ASSERT(b.n == 4002 + 1 && !b.oom);
    s = kvb_sb_take(&b);
    CU_ASSERT(s && !strncmp(s, "000,001,", 8) && !strcmp(s + 3992, "998,999,xy!"));
    CU_ASSERT(b.p == NULL && b.n == 0 && b.cap == 0);
    free(s);
    kvb_sb_adds(&b, "tmp");
    kvb_sb_free(&b);
    CU_ASSERT(b.p == NULL && b.n == 0);
}

/* Errors are one line: control characters (a newline inside a file name or a record) become spaces. */
static void test_errors_are_one_line(void) {
    char err[32];
    kvb_seterr(err, sizeof err, "%s:%d: bad\n\tvalue %s", "f.jsonl", 3, "a\rb");
    CU_ASSERT_STRING_EQUAL(err, "f.jsonl:3: bad  value a b");
    kvb_seterr(err, 8, "%s", "truncated message");
    CU_ASSERT_STRING_EQUAL(err, "truncat");
    kvb_seterr(NULL, 0, "%s", "nowhere"); /* no buffer: nothing happens */
}

static uint64_t hex(const cJSON *v) { return strtoull(v->valuestring, NULL, 16); }

/* splitmix64 equals the Python reference for three seeds (seed 0 starts with the well-known e220a8397b1dcdaf),
 * and the draw below n equals the reference's rejection sampling, including n whose rejection zone is half of
 * all values (2^63 + 1). */
static void test_splitmix64_and_draw_below_match_python(void) {
    char *text = util_read_file("tests/fixtures/splitmix64_ref.json", NULL);
    if (!text) CU_FAIL_FATAL("tests/fixtures/splitmix64_ref.json missing (python3 tests/fixtures/splitmix64_ref.py)");
    cJSON *ref = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(ref != NULL);
    const uint64_t seeds[3] = {0, 42, UINT64_MAX};
    for (int k = 0; k < 3; k++) {
        char key[32];
        snprintf(key, sizeof key, "next_%" PRIu64, seeds[k]);
        const cJSON *want = cJSON_GetObjectItem(ref, key);
        CU_ASSERT_FATAL(cJSON_GetArraySize(want) == 8);
        uint64_t st = seeds[k];
        for (int i = 0; i < 8; i++) CU_ASSERT(kvb_rng_next(&st) == hex(cJSON_GetArrayItem(want, i)));
    }
    const cJSON *ns = cJSON_GetObjectItem(ref, "below_n"), *want = cJSON_GetObjectItem(ref, "below");
    int nn = cJSON_GetArraySize(ns);
    CU_ASSERT_FATAL(nn == 8 && cJSON_GetArraySize(want) == 4 * nn);
    uint64_t st = (uint64_t)cJSON_GetObjectItem(ref, "below_seed")->valuedouble;
    for (int i = 0; i < 4 * nn; i++) {
        uint64_t n = hex(cJSON_GetArrayItem(ns, i % nn)), got = kvb_rng_below(&st, n);
        CU_ASSERT(got == hex(cJSON_GetArrayItem(want, i)) && got < (n ? n : 1));
    }
    cJSON_Delete(ref);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("sample", NULL, NULL);
    CU_add_test(s, "messages alternate, empty partners inserted", test_messages_alternate_with_empty_partners_inserted);
    CU_add_test(s, "system only as the first turn", test_system_only_as_the_first_turn);
    CU_add_test(s, "push takes ownership, truncate frees", test_push_takes_ownership_and_truncate_frees);
    CU_add_test(s, "init sets the absent defaults", test_init_sets_absent_defaults);
    CU_add_test(s, "string builder grows, formats and resets", test_string_builder_grows_formats_and_resets);
    CU_add_test(s, "errors are one line", test_errors_are_one_line);
    CU_add_test(s, "splitmix64 and the draw below n match Python", test_splitmix64_and_draw_below_match_python);
    return util_run_suites();
}
