/* test_export_kvpress.c — `kvbench export --kvpress` (reports/export_kvpress.h) on a run directory made with the
 * record writer: one kvpress directory per (dataset, data_dir, model, press, ratio, query_aware), named as
 * kvpress's evaluate.py names it; predictions.csv, metrics.json and config.yaml checked field by field;
 * methods, budgets and benchmarks kvpress has no name for, and failed samples, skipped and counted; a missing
 * run, an unreadable record, an OUT that cannot be written or is not empty are one-line refusals, exit 1. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "reports/export_kvpress.h"
#include "reports/record.h"

static char root[64] = "/tmp/kvb_export_XXXXXX";
static char err[2048];
#define M "qwen2.5-coder-0.5b-instruct-q8_0"

static char *path_of(const char *a, const char *b) {
    static char p[4][600];
    static int k;
    k = (k + 1) % 4;
    if (b) snprintf(p[k], sizeof p[k], "%s/%s/%s", root, a, b);
    else snprintf(p[k], sizeof p[k], "%s/%s", root, a);
    return p[k];
}

/* the KV after prefill the next record holds and what full attention would (bytes; 0 = not set) */
static double next_kv_device, next_kv_full;

/* One record through the record writer (reports/record.h), as the runner appends it. */
static void rec(FILE *f, const char *method, const char *budget, const char *params, const char *bench, const char *task,
                const char *id, const char *question, const char *pred, const char *ans1, const char *ans2, double score,
                const char *error) {
    kvb_record r;
    kvb_record_init(&r);
    r.method = strdup(method), r.budget = strdup(budget), r.benchmark = strdup(bench), r.task = strdup(task);
    r.sample_id = strdup(id), r.question = strdup(question), r.prediction = strdup(pred);
    if (params) r.method_params = strdup(params);
    r.answers.v = calloc(2, sizeof *r.answers.v);
    r.answers.v[r.answers.n++] = strdup(ans1);
    if (ans2) r.answers.v[r.answers.n++] = strdup(ans2);
    r.score = score, r.seed = 1;
    if (next_kv_full > 0) r.kv_device_bytes = next_kv_device, r.kv_full_bytes = next_kv_full;
    next_kv_device = next_kv_full = 0;
    if (error) r.error = strdup(error);
    char why[256];
    cJSON *j = kvb_record_to_json(&r, why, sizeof why);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    char *line = cJSON_PrintUnformatted(j);
    fprintf(f, "%s\n", line);
    free(line);
    cJSON_Delete(j);
    kvb_record_free(&r);
}

static void make_run(const char *dir) {
    mkdir(path_of(dir, NULL), 0755);
    FILE *f = fopen(path_of(dir, "run.json"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fprintf(f, "{\"suite\":\"kvpress-leaderboard\",\"model\":\"/models/" M ".gguf\",\"model_sha256\":\"abc\","
               "\"git_commit\":\"c0ffee\",\"host\":\"h\",\"backend\":\"cpu\",\"created\":\"2026-11-26T00:00:00Z\"}\n");
    fclose(f);
    f = fopen(path_of(dir, "results.jsonl"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    const char *snap = "window=32 kernel=7 pool=max";
    rec(f, "full", "full", NULL, "ruler", "niah_single_1_4096+hidden", "0", "hidden", "1234", "1234", NULL, 1, NULL);
    rec(f, "full", "full", NULL, "ruler", "niah_single_1_4096+hidden", "1", "hidden", "12", "1234", "99", 0.5, NULL);
    rec(f, "snapkv", "50%", snap, "ruler", "niah_single_1_4096+hidden", "0", "hidden", "1234", "1234", NULL, 1, NULL);
    rec(f, "snapkv", "50%", snap, "ruler", "niah_single_1_4096+hidden", "1", "hidden", "none", "1234", NULL, 0, NULL);
    rec(f, "snapkv", "50%", snap, "ruler", "qa_1_4096+hidden", "q,1", "hidden", "He said \"Paris\", twice", "Paris", "it's", 1, NULL);
    rec(f, "snapkv", "50%", snap, "ruler", "cwe_4096+hidden", "c", "hidden", "a b", "a", "b", 0.5, NULL); /* sorts first */
    rec(f, "snapkv", "50%", snap, "ruler", "niah_single_2_4096+hidden", "0", "hidden", "", "7", NULL, NAN, "out of memory");
    rec(f, "snapkv", "25%", snap, "ruler", "niah_single_1_4096+hidden", "0", "hidden", "x", "1234", NULL, 0, NULL);
    rec(f, "h2o", "50%", NULL, "ruler", "niah_single_1_4096+hidden", "0", "hidden", "1234", "1234", NULL, 1, NULL);
    rec(f, "snapkv", "1024", snap, "ruler", "niah_single_1_4096+hidden", "0", "hidden", "1234", "1234", NULL, 1, NULL);
    rec(f, "snapkv", "50%", snap, "niah", "niah", "0", "visible", "1234", "1234", NULL, 1, NULL);
    rec(f, "expected", "50%", "window=32 sinks=4 future=512 ada=1 alpha=0.2 keep=10", "ruler", "niah_single_1_4096+hidden", "0",
        "hidden", "1234", "1234", NULL, 1, NULL);
    rec(f, "knorm", "50%", NULL, "longbench", "narrativeqa", "a", "visible", "x", "y", NULL, 0.25, NULL);
    rec(f, "knorm", "50%", NULL, "longbench", "narrativeqa", "b", "visible", "x", "y", NULL, 0.75, NULL);
    rec(f, "knorm", "50%", NULL, "longbench", "narrativeqa", "c", "visible", "x", "y", NULL, 0, NULL);
    rec(f, "adakv", "50%", "base=pyramidkv window=32", "ruler", "niah_single_1_4096+hidden", "0", "hidden", "1", "1", NULL, 1, NULL);
    /* KVzap under DMSPress's threshold: no budget; each sample's compression is what it measured */
    next_kv_device = 25, next_kv_full = 100; /* the method's own measure first, the record's KV without it */
    rec(f, "kvzap", "full", "scorer=mlp hidden=16 threshold=-4 window=128 evicted=0.7612 held=128-3765", "ruler",
        "niah_single_1_4096+hidden", "0", "hidden", "1234", "1234", NULL, 1, NULL);
    next_kv_device = 40, next_kv_full = 100;
    rec(f, "kvzap", "full", "scorer=mlp hidden=16 threshold=-4 window=128", "ruler", "niah_single_1_4096+hidden", "1",
        "hidden", "12", "1234", NULL, 0, NULL);
    fclose(f);
}

static void expect_file(const char *dir, const char *file, const char *want) {
    char *got = util_read_file(path_of(dir, file), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got);
    if (strcmp(got, want)) fprintf(stderr, "\n%s/%s:\n--- got\n%s--- want\n%s", dir, file, got, want);
    CU_ASSERT_STRING_EQUAL(got, want);
    free(got);
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_each_press_and_ratio_is_a_kvpress_directory_field_by_field(void) {
    make_run("run");
    kvb_kvpress_stats st;
    kvb_kvpress_opts o = {0};
    int rc = kvb_export_kvpress(path_of("run", NULL), path_of("out", NULL), &o, &st, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(st.n_dirs, 6);
    CU_ASSERT_EQUAL(st.n_exported, 13);
    CU_ASSERT_EQUAL(st.n_unrepresentable, 4); /* h2o, adakv over pyramidkv, a token budget, the niah grid */
    CU_ASSERT_EQUAL(st.n_failed, 1);
    if (strcmp(st.skipped, "4 records kvpress cannot represent (no press for adakv, h2o; no dataset for niah; token budgets), 1 failed or unscored sample")) fprintf(stderr, "\nskipped: %s\n", st.skipped);
    CU_ASSERT_STRING_EQUAL(st.skipped, "4 records kvpress cannot represent (no press for adakv, h2o; no dataset for niah; "
                                       "token budgets), 1 failed or unscored sample");

    const char *snap = "out/ruler__4096__" M "__snapkv__0.50";
    expect_file(snap, "predictions.csv",
                "task,answer,predicted_answer,compression_ratio,sample_id,score\n"
                "cwe,\"['a', 'b']\",a b,0.5,c,0.5\n"
                "niah_single_1,['1234'],1234,0.5,0,1.0\n"
                "niah_single_1,['1234'],none,0.5,1,0.0\n"
                "qa_1,\"['Paris', \"\"it's\"\"]\",\"He said \"\"Paris\"\", twice\",0.5,\"q,1\",1.0\n");
    expect_file(snap, "metrics.json",
                "{\n    \"cwe\": {\n        \"string_match\": 50.0\n    },\n"
                "    \"niah_single_1\": {\n        \"string_match\": 50.0\n    },\n"
                "    \"qa_1\": {\n        \"string_match\": 100.0\n    }\n}");
}

/* config.yaml holds the temporary root's real name: compare with it substituted */
static void test_config_names_the_output_and_press(void) {
    char want[2048];
    snprintf(want, sizeof want,
             "dataset: ruler\ndata_dir: '4096'\nmodel: " M "\ndevice: cpu\npress_name: snapkv\ncompression_ratio: 0.5\n"
             "key_channel_compression_ratio: null\nfraction: 1.0\nmax_new_tokens: null\nmax_context_length: null\n"
             "query_aware: false\nneedle_depth: null\ncompression_interval: null\ntarget_size: null\n"
             "hidden_states_buffer_size: null\noutput_dir: %s/out\nlog_level: INFO\n"
             "model_kwargs: {}\npress_init_command: SnapKVPress(compression_ratio=0.5) from kvbench snapkv@50%% "
             "(window=32 kernel=7 pool=max)\nseed: 1\nfp8: false\n",
             root);
    expect_file("out/ruler__4096__" M "__snapkv__0.50", "config.yaml", want);
}

static void test_full_is_no_press_and_budgets_are_ratios(void) {
    const char *full = "out/ruler__4096__" M "__no_press__0.00";
    expect_file(full, "metrics.json", "{\n    \"niah_single_1\": {\n        \"string_match\": 75.0\n    }\n}");
    expect_file(full, "predictions.csv",
                "task,answer,predicted_answer,compression_ratio,sample_id,score\n"
                "niah_single_1,['1234'],1234,0.0,0,1.0\n"
                "niah_single_1,\"['1234', '99']\",12,0.0,1,0.5\n");
    char *cfg = util_read_file(path_of(full, "config.yaml"), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cfg);
    CU_ASSERT_PTR_NOT_NULL(strstr(cfg, "\npress_name: no_press\ncompression_ratio: 0.0\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(cfg, "\npress_init_command: None from kvbench full@full\n"));
    free(cfg);
    /* 25% kept = compression ratio 0.75 */
    expect_file("out/ruler__4096__" M "__snapkv__0.75", "metrics.json",
                "{\n    \"niah_single_1\": {\n        \"string_match\": 0.0\n    }\n}");
    /* expected with AdaKV is the registry's expected_attention */
    char *e = util_read_file(path_of("out/ruler__4096__" M "__expected_attention__0.50", "config.yaml"), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(e);
    CU_ASSERT_PTR_NOT_NULL(strstr(e, "press_init_command: AdaKVPress(ExpectedAttentionPress)(compression_ratio=0.5)"));
    free(e);
    /* kvzap threshold=-4: DMSPress over KVzapPress, named by its threshold; compression measured per sample */
    const char *zap = "out/ruler__4096__" M "__kvzap_mlp__-4.00";
    expect_file(zap, "predictions.csv",
                "task,answer,predicted_answer,compression_ratio,sample_id,score\n"
                "niah_single_1,['1234'],1234,0.7612,0,1.0\n"
                "niah_single_1,['1234'],12,0.6,1,0.0\n");
    char *z = util_read_file(path_of(zap, "config.yaml"), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(z);
    CU_ASSERT_PTR_NOT_NULL(strstr(z, "\npress_name: kvzap_mlp\nkey_channel_compression_ratio: null\nthreshold: -4.0\nfraction:"));
    CU_ASSERT_PTR_NULL(strstr(z, "compression_ratio: 0")); /* save_config drops it where a threshold is set */
    CU_ASSERT_PTR_NOT_NULL(strstr(z, "press_init_command: DMSPress(KVzapPress)(threshold=-4.0) from kvbench kvzap@full"));
    free(z);
    /* nothing of the methods kvpress has no press for */
    CU_ASSERT(!exists(path_of("out/ruler__4096__" M "__h2o__0.50", NULL)));
}

static void test_longbench_is_one_task_per_directory_and_query_aware(void) {
    const char *lb = "out/longbench__narrativeqa__" M "__knorm__0.50__query_aware";
    expect_file(lb, "metrics.json", "33.33");
    expect_file(lb, "predictions.csv",
                "task,answers,predicted_answer,compression_ratio,sample_id,score\n"
                "narrativeqa,['y'],x,0.5,a,0.25\nnarrativeqa,['y'],x,0.5,b,0.75\nnarrativeqa,['y'],x,0.5,c,0.0\n");
    char *cfg = util_read_file(path_of(lb, "config.yaml"), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cfg);
    CU_ASSERT_PTR_NOT_NULL(strstr(cfg, "dataset: longbench\ndata_dir: narrativeqa\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(cfg, "\nquery_aware: true\n"));
    free(cfg);
}

static void test_model_name_is_kvpress_style(void) {
    kvb_kvpress_stats st;
    kvb_kvpress_opts o = {"Qwen/Qwen2.5-Coder-0.5B-Instruct", 0};
    CU_ASSERT_EQUAL_FATAL(kvb_export_kvpress(path_of("run", NULL), path_of("out2", NULL), &o, &st, err, sizeof err), 0);
    CU_ASSERT(exists(path_of("out2/ruler__4096__Qwen--Qwen2.5-Coder-0.5B-Instruct__snapkv__0.50", "predictions.csv")));
    char *cfg = util_read_file(path_of("out2/ruler__4096__Qwen--Qwen2.5-Coder-0.5B-Instruct__snapkv__0.50", "config.yaml"), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cfg);
    CU_ASSERT_PTR_NOT_NULL(strstr(cfg, "\nmodel: Qwen/Qwen2.5-Coder-0.5B-Instruct\n"));
    free(cfg);
}

static void test_press_and_dataset_names(void) {
    const char *pn, *pc;
    static const char *const pairs[][3] = {
        {"snapkv", "", "snapkv"},       {"knorm", "", "knorm"},           {"keydiff", "", "keydiff"},
        {"observed", "", "observed_attention"}, {"streamingllm", "", "streaming_llm"}, {"tova", "", "tova"},
        {"pyramidkv", "", "pyramidkv"}, {"random", "", "random"},         {"adakv", "base=snapkv alpha=0.2", "adakv_snapkv"},
        {"chunkkv", "base=snapkv chunk=20", "chunkkv"}, {"decoding", "base=knorm interval=512", "decoding_knorm"},
        {"full", "", "no_press"},      {"expected", "window=32 ada=0", "expected_attention_no_ada"},
        {"cur", "leverage=kv_product", "cur"}, {"lagkv", "sinks=4 lag=128", "lagkv"}, {"kvzip", "", "kvzip"},
        {"finch", "", "finch"},         {"qfilter", "", "qfilter"},      {"duo", "", "duo_attention"},
        {"criticalkv", "base=snapkv eps=0.01", "critical_snapkv"},
        {"criticalkv", "base=adakv eps=0.01 alpha=0.2", "critical_adakv_snapkv"},
        {"think", "base=none lambda=0.4", "think"}, {"think", "base=snapkv lambda=0.4", "snap_think"},
        {"compactor", "mode=compactor sketch=none blend=0.7 chunk=256 ada=1 alpha=0.2 keep=1129", "adakv_compactor"},
        {"compactor", "mode=compactor sketch=none blend=0.7 chunk=256 keep=1129", "compactor"},
        {"kvzap", "scorer=mlp hidden=16 threshold=-4 window=128", "kvzap_mlp"},
        {"kvzap", "scorer=linear threshold=-6 window=128", "kvzap_linear"},
        {"kvzap", "scorer=mlp hidden=16 keep=9 ada=1 alpha=0.2", "kvzap_mlp_layer"},
        {"kvzap", "scorer=mlp hidden=16 keep=9", "kvzap_mlp_head"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        CU_ASSERT_EQUAL(kvb_kvpress_press(pairs[i][0], pairs[i][1], &pn, &pc), 0);
        CU_ASSERT_STRING_EQUAL(pn, pairs[i][2]);
    }
    CU_ASSERT_EQUAL(kvb_kvpress_press("chunkkv", "base=knorm chunk=20", &pn, &pc), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_press("omnikv", "", &pn, &pc), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_press("compactor", "", &pn, &pc), -1); /* LeverageScorePress: no registry key */
    CU_ASSERT_EQUAL(kvb_kvpress_press("compactor", "mode=leverage sketch=none ada=1 keep=9", &pn, &pc), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_press("compactor", "mode=compactorx ada=1", &pn, &pc), -1); /* whole words only */
    CU_ASSERT_EQUAL(kvb_kvpress_press("think", "lambda=0.4", &pn, &pc), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_press("kvzap", "scorer=linear keep=9", &pn, &pc), -1); /* no registry key */
    CU_ASSERT_EQUAL(kvb_kvpress_press("kvzap", "scorer=random threshold=0", &pn, &pc), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_press("kvzap", "scorer=linear thresholdx=1", &pn, &pc), -1); /* a key is a whole word */
    char ds[32], dd[64], t[64];
    CU_ASSERT_EQUAL(kvb_kvpress_dataset("ruler", "niah_multikey_3_8192", ds, sizeof ds, dd, sizeof dd, t, sizeof t), 0);
    CU_ASSERT_STRING_EQUAL(ds, "ruler");
    CU_ASSERT_STRING_EQUAL(dd, "8192");
    CU_ASSERT_STRING_EQUAL(t, "niah_multikey_3");
    CU_ASSERT_EQUAL(kvb_kvpress_dataset("ruler", "vt_4096+hidden", ds, sizeof ds, dd, sizeof dd, t, sizeof t), 0);
    CU_ASSERT_STRING_EQUAL(t, "vt"); /* the runner's mark of a hidden question is not part of kvpress's task */
    CU_ASSERT_EQUAL(kvb_kvpress_dataset("ruler", "niah_multiquery_4096+per_query+hidden", ds, sizeof ds, dd, sizeof dd, t, sizeof t), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_dataset("ruler", "niah_multiquery_4096+per_query", ds, sizeof ds, dd, sizeof dd, t, sizeof t), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_dataset("infinitebench", "kv_retrieval", ds, sizeof ds, dd, sizeof dd, t, sizeof t), 0);
    CU_ASSERT_STRING_EQUAL(ds, "infinitebench");
    CU_ASSERT_EQUAL(kvb_kvpress_dataset("infinitebench", "kv_retrieval_4096", ds, sizeof ds, dd, sizeof dd, t, sizeof t), -1);
    CU_ASSERT_EQUAL(kvb_kvpress_dataset("2stage", "2stage", ds, sizeof ds, dd, sizeof dd, t, sizeof t), -1);
}

static void expect_refused(const char *run, const char *out, int force, const char *want) {
    kvb_kvpress_stats st;
    kvb_kvpress_opts o = {NULL, force};
    err[0] = 0;
    CU_ASSERT_EQUAL(kvb_export_kvpress(run, out, &o, &st, err, sizeof err), -1);
    if (!strstr(err, want)) fprintf(stderr, "\nerror '%s' lacks '%s'\n", err, want);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    CU_ASSERT_PTR_NULL(strchr(err, '\n'));
}

static void test_refusals_are_one_line(void) {
    expect_refused(path_of("nosuch", NULL), path_of("o1", NULL), 0, "cannot open");
    CU_ASSERT(!exists(path_of("o1", NULL)));
    /* an unreadable record: the shared reader's PATH:LINE */
    make_run("bad");
    FILE *f = fopen(path_of("bad", "results.jsonl"), "a");
    fputs("{\"method\":\"snapkv\",\"budget\":\"50%\",\"task\":\"t\",\"nosuch\":1}\n", f);
    fclose(f);
    expect_refused(path_of("bad", NULL), path_of("o2", NULL), 0, "results.jsonl:19:");
    /* OUT not empty, then --force; OUT under a file */
    expect_refused(path_of("run", NULL), path_of("out", NULL), 0, "exists and is not empty (--force writes into it)");
    kvb_kvpress_stats st;
    kvb_kvpress_opts o = {NULL, 1};
    CU_ASSERT_EQUAL(kvb_export_kvpress(path_of("run", NULL), path_of("out", NULL), &o, &st, err, sizeof err), 0);
    expect_refused(path_of("run", NULL), path_of("run", "run.json/sub"), 0, "cannot create");
    /* nothing kvpress can represent */
    mkdir(path_of("none", NULL), 0755);
    f = fopen(path_of("none", "run.json"), "w");
    fputs("{\"suite\":\"s\"}\n", f);
    fclose(f);
    f = fopen(path_of("none", "results.jsonl"), "w");
    rec(f, "h2o", "50%", NULL, "ruler", "vt_4096+hidden", "0", "hidden", "a", "a", NULL, 1, NULL);
    fclose(f);
    expect_refused(path_of("none", NULL), path_of("o3", NULL), 0, "no record kvpress can represent");
    CU_ASSERT(!exists(path_of("o3", NULL)));
}

static int run_cli(const char *args, const char *err_file) {
    const char *bin = getenv("KVB_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s export %s > %s/cli.out 2> %s/%s", bin, args, root, root, err_file);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_exit_codes_and_lines(void) {
    const char *bin = getenv("KVB_BIN");
    CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
    char args[1024];
    snprintf(args, sizeof args, "--kvpress %s/run %s/o4", root, root);
    CU_ASSERT_EQUAL(run_cli(args, "cli.err"), 0);
    char *out = util_read_file(path_of("cli.out", NULL), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "exported 13 records into 6 kvpress directories under "));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "; skipped 4 records kvpress cannot represent"));
    free(out);
    CU_ASSERT_EQUAL(run_cli(args, "cli.err"), 1); /* o4 is not empty now */
    char *e = util_read_file(path_of("cli.err", NULL), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(e);
    CU_ASSERT(!strncmp(e, "kvbench: export: ", 17));
    CU_ASSERT_PTR_NOT_NULL(strstr(e, "--force"));
    CU_ASSERT(strchr(e, '\n') == e + strlen(e) - 1);
    free(e);
    snprintf(args, sizeof args, "%s/run %s/o5", root, root); /* no --kvpress */
    CU_ASSERT_EQUAL(run_cli(args, "cli.err"), 1);
    CU_ASSERT_EQUAL(run_cli("--help", "cli.err"), 0);
}

int main(void) {
    if (!mkdtemp(root)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("export_kvpress", NULL, NULL);
    CU_add_test(s, "each press and ratio is a kvpress directory, field by field", test_each_press_and_ratio_is_a_kvpress_directory_field_by_field);
    CU_add_test(s, "config names the output and press", test_config_names_the_output_and_press);
    CU_add_test(s, "full is no_press and budgets are ratios", test_full_is_no_press_and_budgets_are_ratios);
    CU_add_test(s, "longbench is one task per directory and query aware", test_longbench_is_one_task_per_directory_and_query_aware);
    CU_add_test(s, "model name is kvpress style", test_model_name_is_kvpress_style);
    CU_add_test(s, "press and dataset names", test_press_and_dataset_names);
    CU_add_test(s, "refusals are one line", test_refusals_are_one_line);
    CU_add_test(s, "CLI exit codes and lines", test_cli_exit_codes_and_lines);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) rc = 1;
    return rc;
}
