/* test_runner.c — `kvbench run` on the default model: a run killed with SIGKILL mid-way (and left with a torn
 * last line) resumes and ends with exactly the records of an uninterrupted run; results of another suite,
 * malformed result lines, bad suites and unknown methods or benchmarks are one-line errors with exit 1. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util_common.h"

static const char *bin;
static char dir[64] = "/tmp/kvb_runner_XXXXXX";
static char suite[128];

static const char *SUITE =
    "{\"name\": \"%s\", \"model\": \"default\", \"seed\": 7, \"round_chunk\": 64,\n"
    " \"methods\": [{\"name\": \"full\"}, {\"name\": \"streamingllm\"}, {\"name\": \"snapkv\", \"opts\": {\"window\": 8}},\n"
    "             {\"name\": \"round\", \"opts\": {\"lw\": 12}}],\n"
    " \"budgets\": [\"50%%\"],\n"
    " \"benchmarks\": [{\"type\": \"2stage\", \"samples\": 2, \"min_pairs\": 6, \"max_pairs\": 9},\n"
    "                {\"type\": \"recall\", \"dialogues\": 1, \"rounds\": 4}]}\n";

static void write_suite(const char *path, const char *name) {
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, SUITE, name);
    fclose(f);
}

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, bin, a, b);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *path) {
    size_t len;
    char *t = util_read_file(path, &len);
    int n = 0;
    for (size_t i = 0; t && i < len; i++) n += t[i] == '\n';
    free(t);
    return n;
}

/* "method|budget|task|id -> prediction|score|kv" for every record, sorted, as one string. */
static char *digest(const char *results) {
    size_t len;
    char *t = util_read_file(results, &len);
    if (!t) return NULL;
    char **rows = NULL;
    int n = 0;
    for (char *save, *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *r = cJSON_Parse(line);
        if (!r) continue;
        char *pred = cJSON_GetObjectItem(r, "prediction")->valuestring;
        cJSON *score = cJSON_GetObjectItem(r, "score");
        char buf[4096];
        snprintf(buf, sizeof buf, "%s|%s|%s|%s -> %s|%g|%.0f", cJSON_GetObjectItem(r, "method")->valuestring,
                 cJSON_GetObjectItem(r, "budget")->valuestring, cJSON_GetObjectItem(r, "task")->valuestring,
                 cJSON_GetObjectItem(r, "sample_id")->valuestring, pred, cJSON_IsNumber(score) ? score->valuedouble : -1,
                 cJSON_GetObjectItem(r, "kv_device_bytes")->valuedouble);
        rows = realloc(rows, (size_t)(n + 1) * sizeof *rows);
        rows[n++] = strdup(buf);
        cJSON_Delete(r);
    }
    free(t);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(rows[i], rows[j]) > 0) {
                char *x = rows[i];
                rows[i] = rows[j];
                rows[j] = x;
            }
    size_t cap = 16;
    for (int i = 0; i < n; i++) cap += strlen(rows[i]) + 1;
    char *out = calloc(1, cap);
    for (int i = 0; i < n; i++) {
        strcat(out, rows[i]);
        strcat(out, "\n");
        free(rows[i]);
    }
    free(rows);
    return out;
}

static void test_killed_run_resumes_to_the_same_records(void) {
    char a[256], b[256], ra[300], rb[300];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(ra, sizeof ra, "%s/results.jsonl", a);
    snprintf(rb, sizeof rb, "%s/results.jsonl", b);
    CU_ASSERT_FATAL(sh("'%s' run %s --out %s --quiet --threads 2 > /dev/null 2>&1", suite, a) == 0);
    CU_ASSERT_EQUAL(count_lines(ra), 3 * 4); /* 3 samples x 4 cells */

    /* the same run, killed with SIGKILL after a few records */
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", 1);
        dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "run", suite, "--out", b, "--quiet", "--threads", "2", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 6000 && count_lines(rb) < 4; i++) usleep(50000); /* up to 5 minutes on a busy machine */
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    int before = count_lines(rb);
    CU_ASSERT(before >= 4 && before < 12);
    /* a crash in the middle of a write leaves a torn line: resume must drop it */
    FILE *f = fopen(rb, "a");
    fputs("{\"method\":\"full\",\"budget\":\"fu", f);
    fclose(f);
    CU_ASSERT_FATAL(sh("'%s' run %s --out %s --quiet --threads 2 > /dev/null 2>/tmp/kvb_runner_err.txt", suite, b) == 0);
    CU_ASSERT_EQUAL(count_lines(rb), 12);
    char *da = digest(ra), *db = digest(rb);
    CU_ASSERT_FATAL(da && db);
    CU_ASSERT_STRING_EQUAL(da, db);
    free(da);
    free(db);
    /* a third run has nothing left to do and changes nothing */
    CU_ASSERT(sh("'%s' run %s --out %s --quiet > /dev/null 2>&1", suite, b) == 0);
    CU_ASSERT_EQUAL(count_lines(rb), 12);
    /* the records carry the cost next to the score */
    size_t len;
    char *t = util_read_file(rb, &len);
    CU_ASSERT(strstr(t, "\"decode_ms_per_token\"") && strstr(t, "\"kv_device_bytes\"") && strstr(t, "\"breakdown\"") &&
              strstr(t, "\"model_sha256\"") && strstr(t, "\"ttft_ms\""));
    CU_ASSERT(strstr(t, "rounds are 64-token chunks") != NULL); /* round on 2StageRetr says how it ran */
    free(t);
}

static int last_line_has(const char *path, const char *needle) {
    size_t len;
    char *t = util_read_file(path, &len);
    if (!t) return 0;
    while (len && t[len - 1] == '\n') t[--len] = 0;
    char *last = strrchr(t, '\n');
    last = last ? last + 1 : t;
    int ok = strncmp(last, "kvbench:", 8) == 0 && strstr(last, needle) != NULL;
    if (!ok) fprintf(stderr, "\n  last stderr line: %s\n", last);
    free(t);
    return ok;
}

static void expect_error(const char *args, const char *needle) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%%s' run %s 2>/tmp/kvb_runner_err.txt >/dev/null%%s", args);
    int rc = sh(cmd, "", "");
    CU_ASSERT(rc == 1);
    CU_ASSERT(last_line_has("/tmp/kvb_runner_err.txt", needle));
}

static void test_bad_inputs_are_one_line_errors(void) {
    char path[512], args[1400], out[256];
    /* results of another suite in the output directory */
    snprintf(path, sizeof path, "%s/other.json", dir);
    write_suite(path, "other");
    snprintf(args, sizeof args, "%s --out %s/a", path, dir);
    expect_error(args, "holds results of suite 'runner-test'");
    /* a malformed record in the middle of results.jsonl: named by file and line, nothing overwritten */
    snprintf(out, sizeof out, "%s/c", dir);
    mkdir(out, 0755);
    char rj[400];
    snprintf(rj, sizeof rj, "%s/a/run.json", dir);
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "cp %s %s/ && head -n 2 %s/a/results.jsonl > %s/results.jsonl && echo 'garbage' >> "
             "%s/results.jsonl && sed -n 3p %s/a/results.jsonl >> %s/results.jsonl", rj, out, dir, out, out, dir, out);
    CU_ASSERT_FATAL(system(cmd) == 0);
    snprintf(args, sizeof args, "%s --out %s", suite, out);
    expect_error(args, "results.jsonl:3: not a kvbench result record");
    snprintf(path, sizeof path, "%s/results.jsonl", out);
    CU_ASSERT_EQUAL(count_lines(path), 4);
    /* bad suites */
    expect_error("/nonexistent/suite.json", "cannot read suite");
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"name\": \"x\",\n \"methods\": [\n", f);
    fclose(f);
    snprintf(args, sizeof args, "%s --out %s/d", path, dir);
    expect_error(args, "not valid JSON");
    f = fopen(path, "w");
    fputs("{\"name\": \"x\", \"methods\": [{\"name\": \"magic\"}], \"budgets\": [\"30%\"], \"benchmarks\": []}", f);
    fclose(f);
    expect_error(args, "unknown method 'magic'");
    f = fopen(path, "w");
    fputs("{\"name\": \"x\", \"methods\": [{\"name\": \"h2o\"}], \"budgets\": [\"130%\"], \"benchmarks\": []}", f);
    fclose(f);
    expect_error(args, "outside (0%, 100%]");
    f = fopen(path, "w");
    fputs("{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"trivia\"}]}", f);
    fclose(f);
    expect_error(args, "unknown benchmark type 'trivia'");
    f = fopen(path, "w");
    fputs("{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"longbench\", "
          "\"data_dir\": \"/nonexistent\", \"tasks\": [\"hotpotqa\"]}]}", f);
    fclose(f);
    expect_error(args, "not found (scripts/fetch-datasets.sh fetches it into $KVB_DATA");
    /* with the sample records beside the checkout the message offers them; without, it does not mention them */
    if (UTIL_SHARED_DATA("longbench/reconstructed_from_minilongbench", NULL, 0)) {
        expect_error(args, "reconstructed_from_minilongbench (kvbench run configs/sample-data.json");
    } else {
        char *t = util_read_file("/tmp/kvb_runner_err.txt", NULL);
        CU_ASSERT(t && !strstr(t, "sample records"));
        free(t);
    }
    /* round_chunk 0 or negative would make zero rounds: named */
    const char *chunks[] = {"0", "-5", "1.5", "\"64\""};
    for (int i = 0; i < 4; i++) {
        f = fopen(path, "w");
        fprintf(f, "{\"name\": \"x\", \"round_chunk\": %s, \"methods\": [{\"name\": \"full\"}], \"benchmarks\": []}", chunks[i]);
        fclose(f);
        expect_error(args, "\"round_chunk\" must be an integer in [1, ");
    }
}

/* A record is reused only when its fingerprint matches: an edited suite under the same name (SnapKV window
 * 8 -> 4) is a one-line error naming the cell and the field; --rerun-changed runs just those cells again;
 * another suite in a directory without run.json (2stage max_pairs 9 -> 12) does not adopt the records. */
static void test_changed_cells_are_not_reused(void) {
    char a[256], ra[300], path[512], args[1400], cmd[1600];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(ra, sizeof ra, "%s/results.jsonl", a);
    int before = count_lines(ra);
    CU_ASSERT_FATAL(before == 12); /* the first test's run */
    snprintf(path, sizeof path, "%s/edited.json", dir);
    char *text = util_read_file(suite, NULL);
    CU_ASSERT_FATAL(text != NULL);
    char *w = strstr(text, "\"window\": 8");
    CU_ASSERT_FATAL(w != NULL);
    w[10] = '4';
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    snprintf(args, sizeof args, "%s --out %s --quiet --threads 2", path, a);
    expect_error(args, "snapkv|50%|2stage|");
    CU_ASSERT(last_line_has("/tmp/kvb_runner_err.txt", "method_opts: stored {\"window\":8}, now {\"window\":4}"));
    CU_ASSERT_EQUAL(count_lines(ra), 12); /* nothing written */
    snprintf(cmd, sizeof cmd, "'%%s' run %s --rerun-changed > /dev/null 2>&1%%s", args);
    CU_ASSERT(sh(cmd, "", "") == 0);
    CU_ASSERT_EQUAL(count_lines(ra), 15); /* the 3 snapkv cells again, nothing else */
    snprintf(cmd, sizeof cmd, "grep -c '\"method\":\"snapkv\".*\"rerun\":true' %s > /tmp/kvb_runner_n.txt", ra);
    CU_ASSERT(system(cmd) == 0);
    char *n = util_read_file("/tmp/kvb_runner_n.txt", NULL);
    CU_ASSERT(n && atoi(n) == 3);
    free(n);
    snprintf(cmd, sizeof cmd, "'%%s' run %s > /dev/null 2>&1%%s", args);
    CU_ASSERT(sh(cmd, "", "") == 0); /* now every cell matches */
    CU_ASSERT_EQUAL(count_lines(ra), 15);
    /* --method-opt merges into the suite's options (and so into the fingerprints): the suite's value again is the
     * same cell, another value is a changed one */
    snprintf(cmd, sizeof cmd, "'%%s' run %s --method-opt snapkv:window=4 > /dev/null 2>&1%%s", args);
    CU_ASSERT(sh(cmd, "", "") == 0);
    CU_ASSERT_EQUAL(count_lines(ra), 15);
    snprintf(args, sizeof args, "%s --out %s --quiet --threads 2 --method-opt snapkv:window=16", path, a);
    expect_error(args, "snapkv|50%|2stage|");
    CU_ASSERT(last_line_has("/tmp/kvb_runner_err.txt", "method_opts: stored {\"window\":4}, now {\"window\":16}"));
    snprintf(args, sizeof args, "%s --out %s --quiet --threads 2", path, a);
    char md[300];
    snprintf(md, sizeof md, "%s/report.md", a);
    char *rep = util_read_file(md, NULL);
    CU_ASSERT(rep && !strstr(rep, "duplicate")); /* a rerun supersedes, it is not a duplicate */
    free(rep);
    /* another suite, no run.json to catch it: the benchmark field differs */
    w = strstr(text, "\"max_pairs\": 9");
    CU_ASSERT_FATAL(w != NULL);
    memcpy(w, "\"max_pairs\":12", 14); /* as long as "\"max_pairs\": 9" */
    f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    snprintf(cmd, sizeof cmd, "rm -f %s/run.json", a);
    CU_ASSERT(system(cmd) == 0);
    expect_error(args, "|2stage|");
    CU_ASSERT(last_line_has("/tmp/kvb_runner_err.txt", "benchmark: stored"));
}

int main(void) {
    bin = getenv("KVB_BIN");
    char model[1024];
    if (!bin || !util_default_model(model, sizeof model)) {
        fprintf(stderr, "needs KVB_BIN and the default model (scripts/fetch-model.sh)\n");
        return 1;
    }
    if (!mkdtemp(dir)) return 1;
    snprintf(suite, sizeof suite, "%s/suite.json", dir);
    FILE *f = fopen(suite, "w");
    fprintf(f, SUITE, "runner-test");
    fclose(f);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("runner", NULL, NULL);
    CU_add_test(s, "a killed run resumes to the records of an uninterrupted one", test_killed_run_resumes_to_the_same_records);
    CU_add_test(s, "bad inputs are one-line errors", test_bad_inputs_are_one_line_errors);
    CU_add_test(s, "changed cells are not reused", test_changed_cells_are_not_reused);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
