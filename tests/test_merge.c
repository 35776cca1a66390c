/* test_merge.c — `kvbench merge` (reports/merge.h) on hand-made run directories: an "unsharded" run split
 * into 3 shards by the real shard function, with other timings, merges back to the same records in the
 * same order and the same summary.csv but its timing columns; identical duplicates are kept once; each
 * refusal (mixed suite, model or commit; a conflicting duplicate; missing cells; a bad OUT) is a one-line
 * error naming the problem, and through the CLI exits 1 with one line on stderr; --allow-mixed and
 * --allow-missing record what they let through. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/shard.h"
#include "reports/merge.h"

static char root[64] = "/tmp/kvb_merge_XXXXXX";
static char err[2048];
static const char *SHA = "sha-a";
static const char *METHODS[3][2] = {{"full", "full"}, {"snapkv", "30%"}, {"h2o", "30%"}};
static const char *TASKS[2][2] = {{"2stage", "2stage"}, {"niah", "niah"}};
#define N_SAMPLES 4
#define N_CELLS (3 * 2 * N_SAMPLES)

static char *path_of(const char *dir, const char *file) {
    static char p[4][400];
    static int k;
    k = (k + 1) % 4;
    if (file) snprintf(p[k], sizeof p[k], "%s/%s/%s", root, dir, file);
    else snprintf(p[k], sizeof p[k], "%s/%s", root, dir);
    return p[k];
}

static void write_run_json(const char *dir, const char *suite, const char *sha, const char *commit, const char *shard) {
    mkdir(path_of(dir, NULL), 0755);
    FILE *f = fopen(path_of(dir, "run.json"), "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"suite\":\"%s\",\"model_sha256\":\"%s\",\"git_commit\":\"%s\",\"git_dirty\":false,\"host\":\"h\",\"backend\":\"cpu\","
               "\"created\":\"2026-01-0%cT00:00:00Z\",\"shard\":%s%s%s}\n",
            suite, sha, commit, shard ? shard[0] + 1 : '1', shard ? "\"" : "", shard ? shard : "null", shard ? "\"" : "");
    fclose(f);
}

/* The record of cell (m, t, s); timing_ms differs between the unsharded run and the shards. */
static void write_rec(FILE *f, int m, int t, int s, double timing_ms, const char *prediction) {
    double score = ((m + t + s) % 3) / 2.0;
    fprintf(f, "{\"method\":\"%s\",\"budget\":\"%s\",\"benchmark\":\"%s\",\"task\":\"%s\",\"sample_id\":\"%d\","
               "\"prediction\":\"%s\",\"score\":%g,\"ttft_ms\":%g,\"prefill_ms\":%g,\"decode_ms_per_token\":%g,"
               "\"breakdown\":{\"prefill\":{\"mlp\":%g}},\"kv_device_bytes\":%d,\"kv_full_bytes\":4096}\n",
            METHODS[m][0], METHODS[m][1], TASKS[t][0], TASKS[t][1], s, prediction ? prediction : "p", score, timing_ms, timing_ms,
            timing_ms / 10, timing_ms / 2, m ? 1229 : 4096);
}

/* The unsharded run ("all") and, when n_shards > 0, its shards "<prefix>0".. by kvb_shard_of. */
static void make_runs(const char *prefix, int n_shards, const char *all) {
    FILE *res[8] = {0}, *plan[8] = {0};
    int n_out = n_shards ? n_shards : 1;
    for (int i = 0; i < n_out; i++) {
        char name[64], sh[16];
        snprintf(name, sizeof name, n_shards ? "%s%d" : "%s", n_shards ? prefix : all, i);
        snprintf(sh, sizeof sh, "%d/%d", i, n_shards);
        write_run_json(name, "quick", SHA, "abc123", n_shards ? sh : NULL);
        res[i] = fopen(path_of(name, "results.jsonl"), "w");
        plan[i] = fopen(path_of(name, "plan.jsonl"), "w");
        CU_ASSERT_FATAL(res[i] && plan[i]);
    }
    /* run order: task, sample, cell, as the runner appends */
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < N_SAMPLES; s++)
            for (int m = 0; m < 3; m++) {
                char id[8];
                snprintf(id, sizeof id, "%d", s);
                int sh = kvb_shard_of(SHA, METHODS[m][0], METHODS[m][1], "", TASKS[t][0], TASKS[t][1], id, n_shards ? n_shards : 1);
                for (int i = 0; i < n_out; i++)
                    fprintf(plan[i], "[\"%s\",\"%s\",\"%s\",\"%s\",\"%s\",%d]\n", METHODS[m][0], METHODS[m][1], TASKS[t][0], TASKS[t][1], id, sh);
                write_rec(res[sh], m, t, s, n_shards ? 200 + sh : 100, NULL);
            }
    for (int i = 0; i < n_out; i++) fclose(res[i]), fclose(plan[i]);
}

static char *shard_dirs[8];
static char **shards(const char *prefix, int n) {
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s%d", prefix, i);
        free(shard_dirs[i]);
        shard_dirs[i] = strdup(path_of(name, NULL));
    }
    return shard_dirs;
}

/* results.jsonl without the timing fields, one canonical line per record, in file order. */
static char *untimed(const char *dir) {
    char *t = util_read_file(path_of(dir, "results.jsonl"), NULL);
    if (!t) return NULL;
    char *out = calloc(1, strlen(t) + 1);
    for (char *save, *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *r = cJSON_Parse(line);
        static const char *vol[] = {"ttft_ms", "prefill_ms", "decode_ms_per_token", "breakdown"};
        for (int k = 0; k < 4; k++) cJSON_DeleteItemFromObject(r, vol[k]);
        char *c = cJSON_PrintUnformatted(r);
        strcat(out, c);
        strcat(out, "\n");
        free(c);
        cJSON_Delete(r);
    }
    free(t);
    return out;
}

/* summary.csv without columns 12 and 13 (ttft_ms, decode_ms_per_token). */
static char *untimed_csv(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cut -d, -f1-11,14- %s > %s.cut", path_of(dir, "summary.csv"), path_of(dir, "summary.csv"));
    CU_ASSERT_EQUAL(system(cmd), 0);
    return util_read_file(path_of(dir, "summary.csv.cut"), NULL);
}

static void test_merge_of_shards_equals_the_unsharded_run(void) {
    make_runs(NULL, 0, "all");
    make_runs("s", 3, NULL);
    char **d = shards("s", 3);
    /* the shards really split the suite: each holds some but not all records */
    for (int i = 0; i < 3; i++) {
        char *t = util_read_file(path_of(strrchr(d[i], '/') + 1, "results.jsonl"), NULL);
        int n = 0;
        for (char *p = t; p && *p; p++) n += *p == '\n';
        CU_ASSERT(n > 0 && n < N_CELLS);
        free(t);
    }
    kvb_merge_opts o = {0};
    CU_ASSERT_EQUAL_FATAL(kvb_merge(path_of("m", NULL), d, 3, &o, NULL, err, sizeof err), 0);
    char *a = untimed("all"), *b = untimed("m");
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_STRING_EQUAL(a, b); /* same records, same order */
    free(a), free(b);
    /* the report of "all" is written the same way the merge writes its own */
    CU_ASSERT_EQUAL(kvb_merge(path_of("all-report", NULL), (char *[]){path_of("all", NULL)}, 1, &o, NULL, err, sizeof err), 0);
    char *ca = untimed_csv("all-report"), *cb = untimed_csv("m");
    CU_ASSERT_PTR_NOT_NULL_FATAL(ca);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cb);
    CU_ASSERT_STRING_EQUAL(ca, cb);
    CU_ASSERT_PTR_NOT_NULL(strstr(ca, "snapkv,30%,niah,niah,4,4,"));
    free(ca), free(cb);
    char *full_csv = util_read_file(path_of("m", "summary.csv"), NULL), *un_csv = util_read_file(path_of("all-report", "summary.csv"), NULL);
    CU_ASSERT(full_csv && un_csv && strcmp(full_csv, un_csv) != 0); /* timings do differ: the comparison above is not vacuous */
    free(full_csv), free(un_csv);
    /* provenance: every input under merged_from, shard null */
    char *rj = util_read_file(path_of("m", "run.json"), NULL);
    cJSON *j = cJSON_Parse(rj);
    free(rj);
    CU_ASSERT_EQUAL(cJSON_GetArraySize(cJSON_GetObjectItem(j, "merged_from")), 3);
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(j, "shard")));
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "merged_from"), 2), "shard")->valuestring, "2/3");
    CU_ASSERT_PTR_NULL(cJSON_GetObjectItem(j, "mixed"));
    cJSON_Delete(j);
    CU_ASSERT_EQUAL(access(path_of("m", "report.md"), R_OK), 0);
    /* re-merging into the same OUT (after a re-queued shard) is allowed */
    CU_ASSERT_EQUAL(kvb_merge(path_of("m", NULL), d, 3, &o, NULL, err, sizeof err), 0);
}

/* The first cell (run order) that kvb_shard_of puts in shard want of n; 0, or -1 when none. */
static int cell_in_shard(int n, int want, int *m, int *t, int *s) {
    for (*t = 0; *t < 2; (*t)++)
        for (*s = 0; *s < N_SAMPLES; (*s)++)
            for (*m = 0; *m < 3; (*m)++) {
                char id[8];
                snprintf(id, sizeof id, "%d", *s);
                if (kvb_shard_of(SHA, METHODS[*m][0], METHODS[*m][1], "", TASKS[*t][0], TASKS[*t][1], id, n) == want) return 0;
            }
    return -1;
}

static void test_identical_duplicates_are_kept_once(void) {
    make_runs("dup", 2, NULL);
    char **d = shards("dup", 2);
    /* shard 1 also re-ran a cell of shard 0: same result, other timings */
    FILE *f = fopen(path_of("dup1", "results.jsonl"), "a");
    int m, t, s;
    CU_ASSERT_FATAL(cell_in_shard(2, 0, &m, &t, &s) == 0);
    write_rec(f, m, t, s, 999, NULL);
    fclose(f);
    kvb_merge_opts o = {0};
    char *log = NULL;
    size_t len = 0;
    FILE *lf = open_memstream(&log, &len);
    CU_ASSERT_EQUAL(kvb_merge(path_of("mdup", NULL), d, 2, &o, lf, err, sizeof err), 0);
    fclose(lf);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "24 records (1 identical duplicates dropped), 0 of 24 planned cells missing"));
    free(log);
}

static void expect_refusal(int rc, const char *want) {
    CU_ASSERT_EQUAL(rc, -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    CU_ASSERT_PTR_NULL(strchr(err, '\n'));
    if (!strstr(err, want)) fprintf(stderr, "error was: %s\n", err);
}

static void test_conflicting_duplicate_is_refused_naming_the_cell(void) {
    make_runs("con", 2, NULL);
    char **d = shards("con", 2);
    int m, t, s;
    CU_ASSERT_FATAL(cell_in_shard(2, 0, &m, &t, &s) == 0);
    FILE *f = fopen(path_of("con1", "results.jsonl"), "a");
    write_rec(f, m, t, s, 200, "another answer");
    fclose(f);
    kvb_merge_opts o = {0};
    char want[128];
    snprintf(want, sizeof want, "conflicting records of cell %s@%s %s/%s #%d", METHODS[m][0], METHODS[m][1], TASKS[t][0], TASKS[t][1], s);
    expect_refusal(kvb_merge(path_of("mcon", NULL), d, 2, &o, NULL, err, sizeof err), want);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "differ in \"prediction\""));
    CU_ASSERT_NOT_EQUAL(access(path_of("mcon", "results.jsonl"), F_OK), 0); /* nothing written */
}

static void test_mixed_suite_model_commit_are_refused_unless_allowed(void) {
    make_runs("mix", 2, NULL);
    char **d = shards("mix", 2);
    kvb_merge_opts o = {0};
    write_run_json("mix1", "nightly", SHA, "abc123", "1/2");
    expect_refusal(kvb_merge(path_of("mmix", NULL), d, 2, &o, NULL, err, sizeof err), "mixed suites: 'quick'");
    write_run_json("mix1", "quick", "sha-b", "abc123", "1/2");
    expect_refusal(kvb_merge(path_of("mmix", NULL), d, 2, &o, NULL, err, sizeof err), "mixed models: 'sha-a'");
    write_run_json("mix1", "quick", SHA, "def456", "1/2");
    expect_refusal(kvb_merge(path_of("mmix", NULL), d, 2, &o, NULL, err, sizeof err), "mixed commits: 'abc123'");
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--allow-mixed"));
    write_run_json("mix1", "quick", SHA, "abc123", "1/3");
    expect_refusal(kvb_merge(path_of("mmix", NULL), d, 2, &o, NULL, err, sizeof err), "mixed shard counts");
    write_run_json("mix1", "quick", SHA, "def456", "1/2");
    o.allow_mixed = 1;
    CU_ASSERT_EQUAL_FATAL(kvb_merge(path_of("mmix", NULL), d, 2, &o, NULL, err, sizeof err), 0);
    char *rj = util_read_file(path_of("mmix", "run.json"), NULL);
    cJSON *j = cJSON_Parse(rj);
    free(rj);
    cJSON *commits = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "mixed"), "git_commit");
    CU_ASSERT_EQUAL(cJSON_GetArraySize(commits), 2);
    CU_ASSERT_STRING_EQUAL(cJSON_GetArrayItem(commits, 1)->valuestring, "def456");
    cJSON_Delete(j);
}

static void test_missing_cells_are_named_unless_allowed(void) {
    make_runs("mis", 3, NULL);
    char **d = shards("mis", 3);
    kvb_merge_opts o = {0};
    /* shard 1 never ran: its cells are missing, named in plan order */
    expect_refusal(kvb_merge(path_of("mmis", NULL), (char *[]){d[0], d[2]}, 2, &o, NULL, err, sizeof err), "planned cells have no record: ");
    int first = -1, n_missing = 0;
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < N_SAMPLES; s++)
            for (int m = 0; m < 3; m++) {
                char id[8];
                snprintf(id, sizeof id, "%d", s);
                if (kvb_shard_of(SHA, METHODS[m][0], METHODS[m][1], "", TASKS[t][0], TASKS[t][1], id, 3) != 1) continue;
                if (first < 0) {
                    char want[128];
                    snprintf(want, sizeof want, "no record: %s@%s %s/%s #%d", METHODS[m][0], METHODS[m][1], TASKS[t][0], TASKS[t][1], s);
                    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
                    first = 0;
                }
                n_missing++;
            }
    char want[64];
    snprintf(want, sizeof want, "%d of %d planned cells", n_missing, N_CELLS);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    o.allow_missing = 1;
    CU_ASSERT_EQUAL_FATAL(kvb_merge(path_of("mmis", NULL), (char *[]){d[0], d[2]}, 2, &o, NULL, err, sizeof err), 0);
    char *rj = util_read_file(path_of("mmis", "run.json"), NULL);
    cJSON *j = cJSON_Parse(rj);
    free(rj);
    CU_ASSERT_EQUAL(cJSON_GetArraySize(cJSON_GetObjectItem(j, "missing")), n_missing);
    cJSON_Delete(j);
}

static void test_bad_out_and_inputs_are_refused(void) {
    make_runs("bad", 2, NULL);
    char **d = shards("bad", 2);
    kvb_merge_opts o = {0};
    expect_refusal(kvb_merge(d[0], d, 2, &o, NULL, err, sizeof err), "is also an input");
    expect_refusal(kvb_merge(path_of("mbad", NULL), (char *[]){d[0], d[0]}, 2, &o, NULL, err, sizeof err), "is given twice");
    /* an ordinary run as OUT would be overwritten: refused */
    expect_refusal(kvb_merge(path_of("all", NULL), d, 2, &o, NULL, err, sizeof err), "holds a run that is not a merge");
    expect_refusal(kvb_merge(path_of("mbad", NULL), (char *[]){path_of("nope", NULL)}, 1, &o, NULL, err, sizeof err), "is not a run directory");
    FILE *f = fopen(path_of("bad1", "results.jsonl"), "a");
    fputs("{\"method\":\"full\"\n", f);
    fclose(f);
    expect_refusal(kvb_merge(path_of("mbad", NULL), d, 2, &o, NULL, err, sizeof err), "bad1/results.jsonl:");
}

/* Merge reads results.jsonl with the reader report, compare and run use (reports/results.h), strict the same way:
 * a non-finite score (it used to be written out as null), a NUL byte (the records after it used to vanish) and
 * text after a record are refused naming the file and line; a blank line is skipped, as everywhere. */
static void test_records_are_read_by_the_rules_every_command_shares(void) {
#define LINE(text, why) {text, sizeof text - 1, why}
    static const struct { const char *text; size_t len; const char *why; } bad[] = {
        LINE("{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"sample_id\":\"9\",\"score\":1e999}\n",
             "field \"score\" holds a number that is not finite"),
        LINE("{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"sample_id\":\"9\",\"score\":1} {}\n",
             "unexpected text after the record"),
        LINE("{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"sample_id\":\"9\"}\0{\"method\":\"x\"}\n",
             "a NUL byte at column 64"),
    };
#undef LINE
    kvb_merge_opts o = {0};
    for (int i = 0; i < 3; i++) {
        make_runs("strict", 2, NULL);
        char **d = shards("strict", 2);
        int lines = 0; /* the shard's records before the bad one */
        char *t = util_read_file(path_of("strict1", "results.jsonl"), NULL);
        for (char *q = t; q && *q; q++) lines += *q == '\n';
        free(t);
        FILE *f = fopen(path_of("strict1", "results.jsonl"), "a");
        fwrite(bad[i].text, 1, bad[i].len, f);
        fclose(f);
        char want[160];
        snprintf(want, sizeof want, "strict1/results.jsonl:%d: ", lines + 1);
        expect_refusal(kvb_merge(path_of("mstrict", NULL), d, 2, &o, NULL, err, sizeof err), want);
        expect_refusal(-1, bad[i].why);
        CU_ASSERT_NOT_EQUAL(access(path_of("mstrict", "results.jsonl"), F_OK), 0); /* nothing written */
    }
    make_runs("strict", 2, NULL);
    char **d = shards("strict", 2);
    FILE *f = fopen(path_of("strict0", "results.jsonl"), "a");
    fputs("\n  \n", f);
    fclose(f);
    CU_ASSERT_EQUAL(kvb_merge(path_of("mstrict", NULL), d, 2, &o, NULL, err, sizeof err), 0);
}

/* Through the CLI: exit 1 and exactly one line on stderr. */
static void test_cli_refusals_are_one_line_with_exit_1(void) {
    const char *bin = getenv("KVB_BIN");
    CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
    make_runs("cli", 2, NULL);
    write_run_json("cli1", "nightly", SHA, "abc123", "1/2");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s merge %s/mcli %s/cli0 %s/cli1 > /dev/null 2> %s/cli.err", bin, root, root, root, root);
    int st = system(cmd);
    CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    char *e = util_read_file(path_of("cli.err", NULL), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(e);
    CU_ASSERT_PTR_NOT_NULL(strstr(e, "kvbench: merge: mixed suites"));
    CU_ASSERT_PTR_NOT_NULL(strchr(e, '\n'));
    CU_ASSERT_PTR_NULL(strchr(e, '\n') + 1 < e + strlen(e) ? strchr(strchr(e, '\n') + 1, '\n') : NULL);
    free(e);
    snprintf(cmd, sizeof cmd, "%s merge %s/mcli > /dev/null 2> /dev/null", bin, root);
    st = system(cmd);
    CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 1);
}

int main(void) {
    if (!mkdtemp(root)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("merge", NULL, NULL);
    CU_add_test(s, "merge of shards equals the unsharded run", test_merge_of_shards_equals_the_unsharded_run);
    CU_add_test(s, "identical duplicates are kept once", test_identical_duplicates_are_kept_once);
    CU_add_test(s, "conflicting duplicate is refused naming the cell", test_conflicting_duplicate_is_refused_naming_the_cell);
    CU_add_test(s, "mixed suite, model, commit are refused unless allowed", test_mixed_suite_model_commit_are_refused_unless_allowed);
    CU_add_test(s, "missing cells are named unless allowed", test_missing_cells_are_named_unless_allowed);
    CU_add_test(s, "bad OUT and inputs are refused", test_bad_out_and_inputs_are_refused);
    CU_add_test(s, "CLI refusals are one line with exit 1", test_cli_refusals_are_one_line_with_exit_1);
    CU_add_test(s, "records are read by the rules every command shares", test_records_are_read_by_the_rules_every_command_shares);
    int rc = util_run_suites();
    for (int i = 0; i < 8; i++) free(shard_dirs[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) rc = 1;
    return rc;
}
