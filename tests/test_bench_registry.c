/* test_bench_registry.c — the benchmark table (benchmarks/registry.h): every row is whole (loader, prompt builder)
 * and scored one way (a scorer, or a judge kind), types are unique and found by name, every suite in configs/ names
 * only types of the table, kvb_score_sample dispatches through the rows (substring for niah, none for a judged or
 * unknown type), and the generated benchmarks' samples, loaded through their rows, get from their row's prompt
 * builder the ids the shape-dispatching builder gives (on a tiny byte-vocabulary model); a builder given the other
 * shape refuses it with one line; every row lists the entry keys its loader reads, each once. */
#include <CUnit/Basic.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "benchmarks/registry.h"
#include "benchmarks/score.h"

static kvb_model *model;
static char model_path[64] = "/tmp/kvb_bench_registry_XXXXXX";
static char err[512];

static void test_every_row_is_whole_and_scored_one_way(void) {
    CU_ASSERT(kvb_benchmark_count() > 0);
    for (int i = 0; i < kvb_benchmark_count(); i++) {
        const kvb_benchmark *b = kvb_benchmark_at(i);
        CU_ASSERT_FATAL(b && b->type && b->load && b->prompt);
        CU_ASSERT((b->score != NULL) != (b->judge != KVB_JK_NONE)); /* a scorer or a judge, not both, not neither */
        CU_ASSERT(kvb_benchmark_find(b->type) == b);                 /* unique: the first row of its name is itself */
    }
    CU_ASSERT(kvb_benchmark_at(kvb_benchmark_count()) == NULL && kvb_benchmark_at(-1) == NULL);
    CU_ASSERT(kvb_benchmark_find("nosuch") == NULL && kvb_benchmark_find(NULL) == NULL);
    char names[256];
    kvb_benchmark_names(names, sizeof names);
    for (int i = 0; i < kvb_benchmark_count(); i++) CU_ASSERT(strstr(names, kvb_benchmark_at(i)->type) != NULL);
}

/* every "type" of every suite shipped in configs/ is a row (a suite with an unknown type fails before any run) */
/* Every row lists the entry keys its loader reads (suitecheck refuses any other), none twice and none of the common
 * keys every entry takes (those are listed once, none twice either). */
static void test_every_row_lists_its_keys_once(void) {
    const char *const *common = kvb_benchmark_common_keys();
    CU_ASSERT_FATAL(common && common[0]);
    for (int a = 0; common[a]; a++)
        for (int b = a + 1; common[b]; b++) CU_ASSERT(strcmp(common[a], common[b]) != 0);
    for (int i = 0; i < kvb_benchmark_count(); i++) {
        const kvb_benchmark *r = kvb_benchmark_at(i);
        CU_ASSERT_FATAL(r && r->keys);
        CU_ASSERT(r->keys[0] != NULL);
        if (!r->keys[0]) fprintf(stderr, "\n  %s lists no keys\n", r->type);
        for (int a = 0; r->keys[a]; a++) {
            CU_ASSERT(r->keys[a][0] != 0);
            for (int b = a + 1; r->keys[b]; b++) {
                CU_ASSERT(strcmp(r->keys[a], r->keys[b]) != 0);
                if (!strcmp(r->keys[a], r->keys[b])) fprintf(stderr, "\n  %s lists \"%s\" twice\n", r->type, r->keys[a]);
            }
            for (int c = 0; common[c]; c++) {
                CU_ASSERT(strcmp(r->keys[a], common[c]) != 0);
                if (!strcmp(r->keys[a], common[c])) fprintf(stderr, "\n  %s lists the common \"%s\"\n", r->type, common[c]);
            }
        }
    }
}

static void test_every_suite_names_known_types(void) {
    glob_t g;
    CU_ASSERT_FATAL(glob("configs/*.json", 0, NULL, &g) == 0);
    glob("configs/paper/*.json", GLOB_APPEND, NULL, &g);
    int n = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char *text = util_read_file(g.gl_pathv[i], NULL);
        CU_ASSERT_FATAL(text != NULL);
        cJSON *j = cJSON_Parse(text), *b;
        CU_ASSERT(j != NULL);
        cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "benchmarks")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
            int known = cJSON_IsString(t) && kvb_benchmark_find(t->valuestring);
            CU_ASSERT(known);
            if (!known) fprintf(stderr, "\n  %s: unknown benchmark type\n", g.gl_pathv[i]);
            n++;
        }
        cJSON_Delete(j);
        free(text);
    }
    CU_ASSERT(n > 0);
    globfree(&g);
}

static void test_score_sample_goes_through_the_rows(void) {
    char *answers[] = {"blue whale"};
    kvb_sample s = {0};
    s.task = "niah";
    s.answers = answers;
    s.n_answers = 1;
    double score = -1;
    char metric[48];
    CU_ASSERT(kvb_score_sample("niah", &s, "It is the Blue Whale.", &score, metric, sizeof metric) == 0);
    CU_ASSERT(score == 1.0 && !strcmp(metric, "substring"));
    CU_ASSERT(kvb_score_sample("niah", &s, "a shark", &score, metric, sizeof metric) == 0 && score == 0.0);
    CU_ASSERT(kvb_score_sample("longmemeval", &s, "blue whale", &score, metric, sizeof metric) == -1 &&
              !strcmp(metric, "none")); /* judged, never scored here */
    CU_ASSERT(kvb_score_sample("nosuch", &s, "blue whale", &score, metric, sizeof metric) == -1);
    s.task = "no_such_ruler_task";
    CU_ASSERT(kvb_score_sample("ruler", &s, "blue whale", &score, metric, sizeof metric) == -1); /* no metric */
}

/* ---- the rows' prompt builders ---- */

static kvb_samples loaded[4];
static int n_loaded;

static kvb_samples *collect(void *ctx, const char *name, const char *benchmark, kvb_judge_kind judge, char *e,
                            size_t e_len) {
    return n_loaded < 4 ? &loaded[n_loaded++] : NULL;
}

static int expand_none(const char *in, char *out, size_t cap) { return snprintf(out, cap, "%s", in) < (int)cap ? 0 : -1; }

/* 1 when a and b are the same prompt: ids, rounds and the truncation flag */
static int same_prompt(const kvb_prompt *a, const kvb_prompt *b) {
    if (a->n != b->n || a->n_rounds != b->n_rounds || a->truncated != b->truncated || a->real_rounds != b->real_rounds)
        return 0;
    if (memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids)) return 0;
    return !memcmp(a->round_end, b->round_end, (size_t)a->n_rounds * sizeof *a->round_end);
}

/* Loads `type` from `entry` through its row and builds every sample with the row's builder and with
 * kvb_prompt_build (by shape), within max_tokens and in 64-token rounds; returns the samples built. */
static int row_builds_as_by_shape(const char *type, const char *entry, int64_t max_tokens) {
    const kvb_benchmark *b = kvb_benchmark_find(type);
    CU_ASSERT_FATAL(b != NULL);
    cJSON *j = cJSON_Parse(entry);
    CU_ASSERT_FATAL(j != NULL);
    kvb_bench_env env = {.suite_path = "test", .n_ctx_train = 512, .seed = 3, .expand_path = expand_none,
                         .count_tokens = kvb_count_tokens, .tok_ctx = model, .add_task = collect};
    n_loaded = 0;
    CU_ASSERT_FATAL(b->load(&env, j, err, sizeof err) == 0);
    cJSON_Delete(j);
    int built = 0;
    for (int t = 0; t < n_loaded; t++) {
        for (int i = 0; i < loaded[t].n; i++) {
            kvb_prompt by_row, by_shape;
            int rc_row = b->prompt(model, &loaded[t].v[i], max_tokens, 64, &by_row, err, sizeof err);
            int rc_shape = kvb_prompt_build(model, &loaded[t].v[i], max_tokens, 64, &by_shape, err, sizeof err);
            CU_ASSERT(rc_row == rc_shape);
            if (!rc_row && !rc_shape) {
                CU_ASSERT(same_prompt(&by_row, &by_shape));
                built++;
            }
            kvb_prompt_free(&by_row);
            kvb_prompt_free(&by_shape);
        }
        kvb_samples_free(&loaded[t]);
    }
    return built;
}

static void test_generated_benchmarks_build_their_prompts_through_their_rows(void) {
    /* 2stage: single prompts in 64-token rounds; recall: dialogues (at 300 tokens, history dropped to fit) */
    CU_ASSERT(row_builds_as_by_shape("2stage", "{\"samples\": 3, \"min_pairs\": 4, \"max_pairs\": 8}", 1 << 20) == 3);
    CU_ASSERT(row_builds_as_by_shape("recall", "{\"dialogues\": 2, \"rounds\": 4}", 1 << 20) == 2);
    CU_ASSERT(row_builds_as_by_shape("recall", "{\"dialogues\": 2, \"rounds\": 6}", 300) == 2);
    CU_ASSERT(kvb_benchmark_find("2stage")->prompt == kvb_prompt_single);
    CU_ASSERT(kvb_benchmark_find("recall")->prompt == kvb_prompt_dialogue);
}

static void test_a_builder_given_the_other_shape_refuses_it_in_one_line(void) {
    kvb_sample s;
    kvb_sample_init(&s);
    s.id = strdup("d1");
    s.question = strdup("Which colour?");
    CU_ASSERT_FATAL(kvb_sample_add_turn(&s, "user", "The box is red.", NULL) == 0 &&
                    kvb_sample_add_turn(&s, "assistant", "Noted.", NULL) == 0);
    kvb_prompt p;
    CU_ASSERT(kvb_prompt_single(model, &s, 1000, 64, &p, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "d1") && strstr(err, "no prompt") && !strchr(err, '\n'));
    CU_ASSERT(p.n == 0 && p.ids == NULL);
    CU_ASSERT(kvb_prompt_dialogue(model, &s, 1000, 64, &p, err, sizeof err) == 0 && p.n_rounds == 2);
    kvb_prompt_free(&p);
    s.prompt = strdup("The box is red. Which colour?");
    CU_ASSERT(kvb_prompt_dialogue(model, &s, 1000, 64, &p, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "d1") && strstr(err, "not a dialogue") && !strchr(err, '\n'));
    kvb_sample_free(&s);
}

static int setup(void) {
    int fd = mkstemp(model_path);
    if (fd < 0) return -1;
    close(fd);
    gw_random r = {7, 0.5f, NULL};
    gw_tiny t = {"llama", 2, 32, 4, 2, 48, GW_BYTE_VOCAB, 512, 1,
                 "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                 gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model_path);
    free(r.buf);
    if (rc) return -1;
    model = kvb_model_load(model_path, err, sizeof err);
    if (!model) fprintf(stderr, "tiny model: %s\n", err);
    return model ? 0 : -1;
}

static int teardown(void) {
    kvb_model_free(model);
    unlink(model_path);
    return 0;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_registry", NULL, NULL);
    CU_add_test(s, "every row is whole and scored one way", test_every_row_is_whole_and_scored_one_way);
    CU_add_test(s, "every row lists its keys once", test_every_row_lists_its_keys_once);
    CU_add_test(s, "every suite in configs/ names known types", test_every_suite_names_known_types);
    CU_add_test(s, "kvb_score_sample goes through the rows", test_score_sample_goes_through_the_rows);
    CU_pSuite p = CU_add_suite("bench_registry_prompts", setup, teardown);
    CU_add_test(p, "generated benchmarks build their prompts through their rows",
                test_generated_benchmarks_build_their_prompts_through_their_rows);
    CU_add_test(p, "a builder given the other shape refuses it in one line",
                test_a_builder_given_the_other_shape_refuses_it_in_one_line);
    return util_run_suites();
}
