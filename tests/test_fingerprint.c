/* test_fingerprint.c — record fingerprints (benchmarks/fingerprint.h): each field that determines a record
 * changes the fingerprint and is named when it differs; key order and count-only benchmark keys do not
 * matter; the resume index keeps the last record of a key and the records still waiting for a verdict. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/fingerprint.h"
#include "benchmarks/runopts.h"
#ifdef KVB_HAVE_CUDA
#include "kernels/cuda/attention.h"
#endif

static kvb_sample sample(const char *prompt) {
    kvb_sample s;
    kvb_sample_init(&s);
    s.id = strdup("7");
    s.task = strdup("2stage");
    s.prompt = strdup(prompt);
    kvb_sample_add_answer(&s, "42");
    return s;
}

typedef struct {
    cJSON *opts, *bench;
    char sha[65];
    kvb_fp_in in;
} fixture;

static void fixture_make(fixture *f, const char *opts, const char *bench, const char *prompt) {
    f->opts = cJSON_Parse(opts);
    f->bench = cJSON_Parse(bench);
    kvb_sample s = sample(prompt);
    kvb_fp_sample(&s, f->sha);
    kvb_sample_free(&s);
    f->in = (kvb_fp_in){"abc123", "snapkv", "50%", f->opts, f->bench, f->sha, 64, 512, 7, NULL};
}

static void fixture_free(fixture *f) {
    cJSON_Delete(f->opts);
    cJSON_Delete(f->bench);
}

/* The field kvb_fp_compare names for stored a vs now b ("" when equal). */
static void differing(const kvb_fp_in *a, const kvb_fp_in *b, char *why, size_t cap) {
    cJSON *x = kvb_fp_make(a), *y = kvb_fp_make(b);
    why[0] = 0;
    CU_ASSERT_FATAL(x && y);
    if (!kvb_fp_compare(x, y, why, cap)) why[0] = 0;
    cJSON_Delete(x);
    cJSON_Delete(y);
}

static void test_each_field_is_named_when_it_differs(void) {
    fixture a, b;
    const char *bench = "{\"type\": \"2stage\", \"samples\": 40, \"min_pairs\": 40, \"max_pairs\": 60}";
    fixture_make(&a, "{\"window\": 32, \"pool\": 7}", bench, "P");
    char why[512];
    /* the same inputs, keys in another order, another sample count: equal */
    fixture_make(&b, "{\"pool\": 7, \"window\": 32}", "{\"max_pairs\": 60, \"samples\": 5, \"type\": \"2stage\", \"min_pairs\": 40, \"limit\": 2}", "P");
    differing(&a.in, &b.in, why, sizeof why);
    CU_ASSERT_STRING_EQUAL(why, "");
    fixture_free(&b);
    struct { const char *opts, *bench, *prompt, *field; } cases[] = {
        {"{\"window\": 8, \"pool\": 7}", bench, "P", "method_opts: stored {\"pool\":7,\"window\":32}, now {\"pool\":7,\"window\":8}"},
        {"{\"window\": 32, \"pool\": 7}", "{\"type\": \"2stage\", \"min_pairs\": 40, \"max_pairs\": 200}", "P", "benchmark:"},
        {"{\"window\": 32, \"pool\": 7}", bench, "P2", "sample:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture_make(&b, cases[i].opts, cases[i].bench, cases[i].prompt);
        differing(&a.in, &b.in, why, sizeof why);
        CU_ASSERT(!strncmp(why, cases[i].field, strlen(cases[i].field)));
        if (strncmp(why, cases[i].field, strlen(cases[i].field))) fprintf(stderr, "\n  got: %s\n", why);
        fixture_free(&b);
    }
    kvb_fp_in in = a.in;
    in.model_sha256 = "def456";
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT(!strncmp(why, "model_sha256: stored abc123, now def456", 39));
    in = a.in, in.method = "h2o";
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT(!strncmp(why, "method:", 7));
    in = a.in, in.budget = "30%";
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT(!strncmp(why, "budget: stored 50%, now 30%", 27));
    in = a.in, in.max_new_tokens = 32;
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT(!strncmp(why, "generation:", 11));
    in = a.in, in.round_chunk = 64;
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT(!strncmp(why, "generation:", 11));
    in = a.in, in.seed = 8;
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT(!strncmp(why, "generation:", 11));
    /* engine settings beside the defaults (run --kv-type f32 ...) count; none given is the same as "" */
    in = a.in, in.engine = "kv=f32";
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT(!strncmp(why, "generation:", 11) && strstr(why, "kv=f32"));
    in = a.in, in.engine = "";
    differing(&a.in, &in, why, sizeof why);
    CU_ASSERT_STRING_EQUAL(why, "");
    /* a record without a fingerprint (an older kvbench) is never reused */
    cJSON *now = kvb_fp_make(&a.in);
    CU_ASSERT(kvb_fp_compare(NULL, now, why, sizeof why) == 1 && strstr(why, "older kvbench"));
    cJSON_Delete(now);
    fixture_free(&a);
}

static void test_sample_hash_covers_the_content(void) {
    kvb_sample s = sample("P");
    char h0[65], h1[65];
    kvb_fp_sample(&s, h0);
    kvb_fp_sample(&s, h1);
    CU_ASSERT_STRING_EQUAL(h0, h1);
    kvb_sample_add_turn(&s, "user", "hello", NULL);
    kvb_fp_sample(&s, h1);
    CU_ASSERT(strcmp(h0, h1) != 0);
    kvb_sample_free(&s);
    /* field boundaries count: ("ab", "c") is not ("a", "bc") */
    kvb_sample a = sample("ab"), b = sample("a");
    a.question = strdup("c");
    b.question = strdup("bc");
    kvb_fp_sample(&a, h0);
    kvb_fp_sample(&b, h1);
    CU_ASSERT(strcmp(h0, h1) != 0);
    kvb_sample_free(&a);
    kvb_sample_free(&b);
    /* a follow-up question (LongBench v2's CoT) is content: a record of the one-question flow is not reused */
    kvb_sample c = sample("P");
    kvb_fp_sample(&c, h0);
    c.followup = strdup("Answer from: $COT$");
    c.followup_slot = strdup("$COT$");
    c.followup_max_new = 128;
    kvb_fp_sample(&c, h1);
    CU_ASSERT(strcmp(h0, h1) != 0);
    c.followup_max_new = 64;
    char h2[65];
    kvb_fp_sample(&c, h2);
    CU_ASSERT(strcmp(h1, h2) != 0);
    kvb_sample_free(&c);
}

/* The engine part of the fingerprint names the backend and, on CUDA, each kernel switch: a record of other
 * kernels is another record (the switches are set, not read from a GPU: no device needed) */
static void test_engine_fingerprint_names_backend_and_kernels(void) {
    kvb_run_opts o;
    memset(&o, 0, sizeof o);
    char cpu[192], cuda[192];
    kvb_run_engine_fingerprint(&o, cpu, sizeof cpu);
    CU_ASSERT(strstr(cpu, "backend=") == NULL);
    o.backend = "cuda";
    kvb_run_engine_fingerprint(&o, cuda, sizeof cuda);
    CU_ASSERT(strstr(cuda, "backend=cuda") != NULL);
#ifdef KVB_HAVE_CUDA
    char a[192], b[192], d[192], e[192];
    kvb_cuda_attention_set_kernel(3);
    kvb_cuda_attention_set_prefill_tc(1);
    kvb_cuda_set_gemv_kernel(1);
    kvb_cuda_attention_set_probs_kernel(1);
    kvb_run_engine_fingerprint(&o, a, sizeof a);
    CU_ASSERT(strstr(a, "kernels=attn3.tc.gemv1.probs1") != NULL);
    kvb_cuda_attention_set_kernel(1);
    kvb_run_engine_fingerprint(&o, b, sizeof b);
    kvb_cuda_attention_set_kernel(3);
    kvb_cuda_attention_set_prefill_tc(0);
    kvb_run_engine_fingerprint(&o, d, sizeof d);
    kvb_cuda_attention_set_prefill_tc(1);
    kvb_cuda_set_gemv_kernel(3);
    kvb_cuda_attention_set_probs_kernel(2);
    kvb_run_engine_fingerprint(&o, e, sizeof e);
    CU_ASSERT(strcmp(a, b) && strcmp(a, d) && strcmp(a, e) && strcmp(b, d) && strcmp(d, e));
    CU_ASSERT(strstr(e, "gemv3.probs2") != NULL);
    kvb_cuda_set_gemv_kernel(1);
    kvb_cuda_attention_set_probs_kernel(1);
#endif
}

static void test_index_keeps_the_last_record_of_a_key(void) {
    const char *lines[] = {
        "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"t\",\"sample_id\":\"1\",\"fingerprint\":{\"sha256\":\"A\"}}",
        "{\"method\":\"h2o\",\"budget\":\"50%\",\"task\":\"t\",\"sample_id\":\"1\",\"judge\":{\"pending\":true},\"prediction\":\"p\"}",
        "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"t\",\"sample_id\":\"1\",\"fingerprint\":{\"sha256\":\"B\"}}",
        "{\"method\":\"snapkv\",\"budget\":\"50%\",\"task\":\"t\",\"sample_id\":\"1\",\"judge\":{\"pending\":true}}",
        "{\"method\":\"snapkv\",\"budget\":\"50%\",\"task\":\"t\",\"sample_id\":\"1\",\"judge\":{\"error\":null},\"score\":1}",
    };
    kvb_fp_index ix = {0};
    for (int i = 0; i < 5; i++) {
        cJSON *r = cJSON_Parse(lines[i]);
        CU_ASSERT(kvb_fp_index_add(&ix, r, i + 1) == 0);
        cJSON_Delete(r);
    }
    cJSON *bad = cJSON_Parse("{\"method\":\"full\",\"task\":\"t\"}");
    CU_ASSERT(kvb_fp_index_add(&ix, bad, 6) == -1);
    cJSON_Delete(bad);
    kvb_fp_index_finish(&ix);
    CU_ASSERT_EQUAL(ix.n, 3);
    char key[128];
    kvb_fp_key(key, sizeof key, "full", "full", "t", "1");
    const kvb_fp_entry *e = kvb_fp_index_find(&ix, key);
    CU_ASSERT_FATAL(e != NULL);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(e->fingerprint, "sha256")), "B");
    kvb_fp_key(key, sizeof key, "h2o", "50%", "t", "1");
    e = kvb_fp_index_find(&ix, key);
    CU_ASSERT(e && e->pending && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e->pending, "prediction")), "p"));
    kvb_fp_key(key, sizeof key, "snapkv", "50%", "t", "1");
    e = kvb_fp_index_find(&ix, key);
    CU_ASSERT(e && !e->pending); /* its verdict arrived */
    kvb_fp_key(key, sizeof key, "snapkv", "50%", "t", "2");
    CU_ASSERT(kvb_fp_index_find(&ix, key) == NULL);
    kvb_fp_index_free(&ix);
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("fingerprint", NULL, NULL);
    CU_add_test(s, "each field is named when it differs", test_each_field_is_named_when_it_differs);
    CU_add_test(s, "the sample hash covers the content", test_sample_hash_covers_the_content);
    CU_add_test(s, "the index keeps the last record of a key", test_index_keeps_the_last_record_of_a_key);
    CU_add_test(s, "the engine fingerprint names the backend and the CUDA kernels",
                test_engine_fingerprint_names_backend_and_kernels);
    return util_run_suites();
}
