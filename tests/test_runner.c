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
#include "base/fsutil.h"

static const char *bin;
static char dir[64] = "/tmp/kvb_runner_XXXXXX"; /* this run's scratch folder, $KVB_T in the shell commands */
static char suite[128];

/* dir/name, in one of 4 rotating buffers */
static const char *tp(const char *name) {
    static char buf[4][128];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static const char *SUITE =
    "{\"name\": \"%s\", \"model\": \"default\", \"seed\": 7, \"round_chunk\": 64,\n"
    " \"methods\": [{\"name\": \"full\"}, {\"name\": \"streamingllm\"}, {\"name\": \"snapkv\", \"opts\": {\"window\": 8}},\n"
    "             {\"name\": \"round\", \"opts\": {\"lw\": 12}}],\n"
    " \"budgets\": [\"50%%\"],\n"
    " \"benchmarks\": [{\"type\": \"2stage\", \"samples\": 2, \"min_pairs\": 6, \"max_pairs\": 9, \"max_new_tokens\": 16},\n"
    "                {\"type\": \"recall\", \"dialogues\": 1, \"rounds\": 4, \"max_new_tokens\": 16}]}\n";

static void write_suite(const char *path, const char *name) {
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, SUITE, name);
    fclose(f);
}

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[4096];
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
    CU_ASSERT_FATAL(sh("'%s' run %s --out %s --quiet > /dev/null 2>&1", suite, a) == 0);
    CU_ASSERT_EQUAL(count_lines(ra), 3 * 4); /* 3 samples x 4 cells */

    /* the same run, killed with SIGKILL after a few records */
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", 1);
        dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "run", suite, "--out", b, "--quiet", (char *)NULL);
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
    CU_ASSERT_FATAL(sh("'%s' run %s --out %s --quiet > /dev/null 2>$KVB_T/kvb_runner_err.txt", suite, b) == 0);
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
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%%s' run %s 2>$KVB_T/kvb_runner_err.txt >/dev/null%%s", args);
    int rc = sh(cmd, "", "");
    CU_ASSERT(rc == 1);
    CU_ASSERT(last_line_has(tp("kvb_runner_err.txt"), needle));
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
    expect_error(args, "results.jsonl:3: not valid JSON");
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
        char *t = util_read_file(tp("kvb_runner_err.txt"), NULL);
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
    snprintf(args, sizeof args, "%s --out %s --quiet", path, a);
    expect_error(args, "snapkv|50%|2stage|");
    CU_ASSERT(last_line_has(tp("kvb_runner_err.txt"), "method_opts: stored {\"window\":8}, now {\"window\":4}"));
    CU_ASSERT_EQUAL(count_lines(ra), 12); /* nothing written */
    snprintf(cmd, sizeof cmd, "'%%s' run %s --rerun-changed > /dev/null 2>&1%%s", args);
    CU_ASSERT(sh(cmd, "", "") == 0);
    CU_ASSERT_EQUAL(count_lines(ra), 15); /* the 3 snapkv cells again, nothing else */
    snprintf(cmd, sizeof cmd, "grep -c '\"method\":\"snapkv\".*\"rerun\":true' %s > $KVB_T/kvb_runner_n.txt", ra);
    CU_ASSERT(system(cmd) == 0);
    char *n = util_read_file(tp("kvb_runner_n.txt"), NULL);
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
    snprintf(args, sizeof args, "%s --out %s --quiet --method-opt snapkv:window=16", path, a);
    expect_error(args, "snapkv|50%|2stage|");
    CU_ASSERT(last_line_has(tp("kvb_runner_err.txt"), "method_opts: stored {\"window\":4}, now {\"window\":16}"));
    snprintf(args, sizeof args, "%s --out %s --quiet", path, a);
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
    CU_ASSERT(last_line_has(tp("kvb_runner_err.txt"), "benchmark: stored"));
}

/* 1 when two lines of a digest (sorted) name the same cell. */
static int has_repeated_key(const char *digest) {
    const char *prev = NULL;
    size_t prev_len = 0;
    for (const char *line = digest; *line;) {
        const char *arrow = strstr(line, " -> "), *nl = strchr(line, '\n');
        if (!arrow || !nl) break;
        size_t len = (size_t)(arrow - line);
        if (prev && len == prev_len && !strncmp(prev, line, len)) return 1;
        prev = line, prev_len = len, line = nl + 1;
    }
    return 0;
}

/* Two runs of one suite started at once into one folder: one runs, the other exits 1 at once with one line naming
 * the folder, the pid that holds it and the lock file; the folder ends with one record per cell (before the lock,
 * both ran to the end, exit 0, and results.jsonl held every record twice). */
static void test_two_runs_at_once_into_one_folder_give_one_record_per_cell(void) {
    char out[256], res[300], errs[2][300];
    snprintf(out, sizeof out, "%s/twin", dir);
    snprintf(res, sizeof res, "%s/results.jsonl", out);
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        snprintf(errs[i], sizeof errs[i], "%s/twin%d.err", dir, i);
        CU_ASSERT_FATAL((pid[i] = fork()) >= 0);
        if (pid[i] == 0) {
            int fd = open(errs[i], O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_WRONLY);
            dup2(null, 1), dup2(fd, 2);
            execl(bin, bin, "run", suite, "--out", out, "--quiet", (char *)NULL);
            _exit(127);
        }
    }
    int rc[2];
    for (int i = 0; i < 2; i++) {
        int st = 0;
        CU_ASSERT(waitpid(pid[i], &st, 0) == pid[i]);
        rc[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    CU_ASSERT((rc[0] == 0 && rc[1] == 1) || (rc[0] == 1 && rc[1] == 0));
    int loser = rc[0] == 1 ? 0 : 1;
    char want[400];
    snprintf(want, sizeof want, "is in use by another kvbench (pid %d holds %s/kvbench.lock)", (int)pid[1 - loser], out);
    CU_ASSERT(last_line_has(errs[loser], want));
    CU_ASSERT_EQUAL(count_lines(res), 12); /* 3 samples x 4 cells, each once */
    char *d = digest(res);
    CU_ASSERT(d && !has_repeated_key(d));
    free(d);
}

/* A folder whose lock another process holds (here: this test) is refused before anything is written to it. */
static void test_a_folder_in_use_is_refused_naming_the_holder(void) {
    char out[256], args[600], want[800], path[320];
    snprintf(out, sizeof out, "%s/held", dir);
    CU_ASSERT_FATAL(kvb_mkdirs(out) == 0);
    int fd = kvb_lock_dir(out, args, sizeof args);
    CU_ASSERT_FATAL(fd >= 0);
    snprintf(args, sizeof args, "%s --out %s --quiet", suite, out);
    snprintf(want, sizeof want, "%s is in use by another kvbench (pid %d holds %s/kvbench.lock); wait for it to end or use another --out",
             out, (int)getpid(), out);
    expect_error(args, want);
    snprintf(path, sizeof path, "%s/results.jsonl", out);
    CU_ASSERT(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/run.json", out);
    CU_ASSERT(access(path, F_OK) != 0);
    kvb_unlock_file(fd);
}

/* results.jsonl is read by the reader report, compare and merge use (reports/results.h): a blank line is skipped
 * (run refused it while the others skipped it), a FIFO in its place is refused at once instead of blocking
 * open() forever, and an output folder longer than the runner's buffer is refused (it was cut, and the results
 * went to the shorter path). */
static void test_results_file_and_output_folder_are_checked_as_everywhere(void) {
    char out[256], path[320], cmd[1600], args[1400];
    snprintf(out, sizeof out, "%s/blank", dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s/b %s && sed -i 1G %s/results.jsonl", out, dir, out, out);
    CU_ASSERT_FATAL(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/results.jsonl", out);
    int before = count_lines(path);
    snprintf(cmd, sizeof cmd, "'%%s' run %s --out %s --quiet > /dev/null 2>$KVB_T/kvb_runner_err.txt%%s", suite, out);
    CU_ASSERT(sh(cmd, "", "") == 0);
    CU_ASSERT_EQUAL(count_lines(path), before); /* nothing run again, nothing dropped */
    snprintf(out, sizeof out, "%s/fifo", dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir %s && cp %s/b/run.json %s/ && mkfifo %s/results.jsonl", out, out, dir, out, out);
    CU_ASSERT_FATAL(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "timeout 120 '%%s' run %s --out %s --quiet > /dev/null 2>$KVB_T/kvb_runner_err.txt%%s", suite, out);
    CU_ASSERT(sh(cmd, "", "") == 1);
    CU_ASSERT(last_line_has(tp("kvb_runner_err.txt"), "results.jsonl: is a FIFO, not a regular file"));
    /* 1100 bytes of folders: cut at 1023 bytes, the old runner wrote the run into the cut path */
    char long_out[1200];
    int n = snprintf(long_out, sizeof long_out, "%s/long", dir);
    while (n < 1100) n += snprintf(long_out + n, sizeof long_out - (size_t)n, "/%s", "abcdefghi");
    snprintf(args, sizeof args, "%s --out %s --quiet", suite, long_out);
    expect_error(args, "is longer than the 1023 bytes kvbench takes; use a shorter --out");
    long_out[1023] = 0;
    CU_ASSERT(access(long_out, F_OK) != 0);
}

/* A record's key holds the sample id whole: LongBench _ids over 1000 bytes that share a prefix stay two cells, and
 * a finished run resumes (their keys were cut at 1023 bytes, became one, and the resume stopped with "made with other
 * inputs"). The records keep the ids whole. */
static void test_long_ids_sharing_a_prefix_stay_apart_and_resume(void) {
    char data[256], cfg[256], path[400], args[1400], out[256], res[300];
    snprintf(data, sizeof data, "%s/lb_data", dir);
    snprintf(cfg, sizeof cfg, "%s/lb_config", dir);
    CU_ASSERT_FATAL(kvb_mkdirs(data) == 0 && kvb_mkdirs(cfg) == 0);
    snprintf(path, sizeof path, "%s/dataset2prompt.json", cfg);
    FILE *f = fopen(path, "w");
    fputs("{\"hotpotqa\": \"Passages: {context}\\nQuestion: {input}\\nAnswer:\"}", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/dataset2maxlen.json", cfg);
    f = fopen(path, "w");
    fputs("{\"hotpotqa\": 2}", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/hotpotqa.jsonl", data);
    f = fopen(path, "w");
    char prefix[1101];
    memset(prefix, 'x', 1100), prefix[1100] = 0;
    for (int i = 1; i <= 2; i++)
        fprintf(f, "{\"_id\": \"%s%d\", \"input\": \"Who?\", \"context\": \"Ann met Bob.\", \"answers\": [\"Ann\"]}\n", prefix, i);
    fclose(f);
    snprintf(path, sizeof path, "%s/long_ids.json", dir);
    f = fopen(path, "w");
    fprintf(f, "{\"name\": \"long-ids\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"longbench\", "
               "\"data_dir\": \"%s\", \"config_dir\": \"%s\", \"tasks\": [\"hotpotqa\"]}]}", data, cfg);
    fclose(f);
    snprintf(out, sizeof out, "%s/long_ids", dir);
    snprintf(res, sizeof res, "%s/results.jsonl", out);
    snprintf(args, sizeof args, "'%%s' run %s --out %s --quiet > /dev/null 2>$KVB_T/kvb_runner_err.txt%%s", path, out);
    CU_ASSERT_FATAL(sh(args, "", "") == 0);
    CU_ASSERT_EQUAL(count_lines(res), 2);
    CU_ASSERT(sh(args, "", "") == 0); /* resumed: both cells found */
    CU_ASSERT_EQUAL(count_lines(res), 2);
    char *t = util_read_file(res, NULL);
    CU_ASSERT(t && strstr(t, "xxx1\"") && strstr(t, "xxx2\""));
    free(t);
}

/* A benchmark's "ignore_eos": true generates exactly max_new_tokens per sample (timing runs), where the same samples
 * without it stop at their end token earlier; a value that is not true or false is refused, named. */
static int count_generated(const char *res, int n) {
    char *t = util_read_file(res, NULL), want[64];
    int k = 0;
    snprintf(want, sizeof want, "\"generated_tokens\":%d,", n);
    for (const char *p = t; p && (p = strstr(p, want)); p++) k++;
    free(t);
    return k;
}

static void test_ignore_eos_generates_max_new_tokens(void) {
    char path[400], out[256], args[1400], res[300];
    for (int no_eos = 0; no_eos < 2; no_eos++) {
        snprintf(path, sizeof path, "%s/eos%d.json", dir, no_eos);
        FILE *f = fopen(path, "w");
        fprintf(f, "{\"name\": \"eos\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"niah\", "
                   "\"lengths\": [320], \"depths\": [0, 100], \"max_new_tokens\": 64%s}]}", no_eos ? ", \"ignore_eos\": true" : "");
        fclose(f);
        snprintf(out, sizeof out, "%s/eos%d", dir, no_eos);
        snprintf(res, sizeof res, "%s/results.jsonl", out);
        snprintf(args, sizeof args, "'%%s' run %s --out %s --quiet > /dev/null 2>$KVB_T/kvb_runner_err.txt%%s", path, out);
        CU_ASSERT(sh(args, "", "") == 0);
        CU_ASSERT_EQUAL(count_lines(res), 2);
        if (no_eos) {
            CU_ASSERT_EQUAL(count_generated(res, 64), 2);
        } else {
            CU_ASSERT(count_generated(res, 64) < 2); /* the samples stop at their end token: the switch is what made 64 */
        }
    }
    FILE *f = fopen(path, "w");
    fputs("{\"name\": \"eos\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"niah\", "
          "\"lengths\": [320], \"depths\": [0], \"ignore_eos\": 1}]}", f);
    fclose(f);
    snprintf(args, sizeof args, "%s --out %s/eos_bad", path, dir);
    expect_error(args, "benchmark 1: \"ignore_eos\" must be true or false");
}

/* NIAH takes as many lengths and depths as the suite lists (17 here): every one is a sample in plan.jsonl and
 * results.jsonl (past 16 they were dropped without a word); an entry that is not a number is refused, named. */
static void test_niah_grid_keeps_every_depth(void) {
    char path[400], out[256], args[1400], plan[300];
    snprintf(path, sizeof path, "%s/niah17.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"name\": \"niah17\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"niah\", \"lengths\": [320], "
          "\"depths\": [0, 6, 12, 18, 25, 31, 37, 43, 50, 56, 62, 68, 75, 81, 87, 93, 100], \"max_new_tokens\": 1}]}", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/niah17", dir);
    snprintf(plan, sizeof plan, "%s/plan.jsonl", out);
    snprintf(args, sizeof args, "'%%s' run %s --out %s --quiet > /dev/null 2>$KVB_T/kvb_runner_err.txt%%s", path, out);
    CU_ASSERT(sh(args, "", "") == 0);
    CU_ASSERT_EQUAL(count_lines(plan), 17);
    snprintf(plan, sizeof plan, "%s/results.jsonl", out);
    CU_ASSERT_EQUAL(count_lines(plan), 17);
    f = fopen(path, "w");
    fputs("{\"name\": \"niah17\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"niah\", \"lengths\": [320], "
          "\"depths\": [0, \"50\"]}]}", f);
    fclose(f);
    snprintf(args, sizeof args, "%s --out %s/niah_bad", path, dir);
    expect_error(args, "niah \"depths\"[1] must be a number in [0, 100]");
}

/* One strict reading of a suite (benchmarks/suitecheck.h), each refusal one line naming the key and what is
 * accepted, before anything is written: an unknown method option (every cell of the method became an error record,
 * exit 0), max_new_tokens -1, 0.5, 1e12 or 100000 (the last blamed "the budget"), text after the JSON object, a
 * key twice, "seed": "abc" (it became 1), a count that is not a number, budgets that are one budget (30% and
 * 30.0% would be one record key for two cells), an unknown key (a misspelled "lenghts", "methdos", "opt": the run
 * used the default). A suite name's control characters are printed escaped. */
static void test_a_suite_is_read_strictly_before_anything_runs(void) {
    static const struct { const char *suite, *want; } cases[] = {
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"snapkv\", \"opts\": {\"nosuch\": 1}}], \"budgets\": [\"50%\"], "
         "\"benchmarks\": [{\"type\": \"recall\", \"dialogues\": 1, \"rounds\": 2}]}",
         "method snapkv: method snapkv has no option 'nosuch'"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\", \"max_new_tokens\": -1}]}",
         "benchmark 1: \"max_new_tokens\" must be an integer in [1, 4096] (tokens; at most half the model's context of 8192"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\", \"max_new_tokens\": 0.5}]}",
         "\"max_new_tokens\" must be an integer in [1, 4096]"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\", \"max_new_tokens\": 1e12}]}",
         "\"max_new_tokens\" must be an integer in [1, 4096]"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\", \"max_new_tokens\": 100000}]}",
         "\"max_new_tokens\" must be an integer in [1, 4096]"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": []}\n{\"more\": 1}",
         ":2: text after the suite's JSON object"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\", \"rounds\": 2, \"rounds\": 4}]}",
         "key \"rounds\" appears twice"},
        {"{\"name\": \"x\", \"seed\": \"abc\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": []}",
         "\"seed\" must be an integer in [0, 9007199254740992]"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\", \"dialogues\": \"2\"}]}",
         "benchmark 1: \"dialogues\" must be an integer in [1, 1000000]"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"h2o\"}], \"budgets\": [\"30%\", \"30.0%\", \"3e1%\"], \"benchmarks\": []}",
         "budgets \"30%\" and \"30.0%\" are one budget (30%): method h2o would run it twice"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"h2o\"}, {\"name\": \"h2o\", \"opts\": {\"heavy\": 0.3}}], \"budgets\": [\"30%\"], "
         "\"benchmarks\": []}",
         "method h2o at budget 30% comes twice"},
        /* a misspelled key would leave its default silently in place */
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\"}, "
         "{\"type\": \"niah\", \"lenghts\": [320], \"depths\": [0]}]}",
         "benchmark 2 (niah): unknown key \"lenghts\" (accepted: type, lengths, depths, haystack, judge,"},
        {"{\"name\": \"x\", \"methdos\": [{\"name\": \"full\"}], \"benchmarks\": []}",
         "unknown key \"methdos\" (accepted: name, description, model, output, seed, round_chunk, methods,"},
        {"{\"name\": \"x\", \"methods\": [{\"name\": \"snapkv\", \"opt\": {\"window\": 4}}], \"budgets\": [\"50%\"], "
         "\"benchmarks\": []}",
         "method 1 (snapkv): unknown key \"opt\" (accepted: name, opts)"},
    };
    char path[400], out[256], args[1400], res[300];
    snprintf(path, sizeof path, "%s/strict.json", dir);
    snprintf(out, sizeof out, "%s/strict", dir);
    snprintf(res, sizeof res, "%s/results.jsonl", out);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(path, "w");
        fputs(cases[i].suite, f);
        fclose(f);
        snprintf(args, sizeof args, "%s --out %s", path, out);
        expect_error(args, cases[i].want);
        CU_ASSERT(access(res, F_OK) != 0); /* refused before any cell ran */
    }
    /* ESC [2J (clear the screen) and BEL in a name reach the terminal as \x1b and \x07 */
    FILE *f = fopen(path, "w");
    fputs("{\"name\": \"x\\u001b[2J\\u0007y\", \"methods\": [{\"name\": \"full\"}], "
          "\"benchmarks\": [{\"type\": \"recall\", \"dialogues\": 1, \"rounds\": 2, \"max_new_tokens\": 1}]}", f);
    fclose(f);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "'%%s' run %s --out %s/named --quiet > $KVB_T/kvb_runner_out.txt 2>$KVB_T/kvb_runner_err.txt%%s", path, dir);
    CU_ASSERT(sh(cmd, "", "") == 0);
    char *e = util_read_file(tp("kvb_runner_err.txt"), NULL), *o = util_read_file(tp("kvb_runner_out.txt"), NULL);
    CU_ASSERT(e && strstr(e, "suite x\\x1b[2J\\x07y: ") && !strchr(e, '\033') && !strchr(e, '\a'));
    CU_ASSERT(o && strstr(o, "x\\x1b[2J\\x07y: score") && !strchr(o, '\033') && !strchr(o, '\a'));
    free(e), free(o);
}

/* Phases are timed only when asked: without --profile the records' "breakdown" is null (no clock read, and on a GPU
 * no device wait, inside the timed decode, as `kvbench bench` times it); with it, the prefill and decode phases of
 * the forward pass are there, and the flag is in run.json's "flags". */
static void test_phases_are_timed_with_profile_only(void) {
    char path[400], res[300], args[1400];
    snprintf(path, sizeof path, "%s/profile.json", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{\"name\": \"profile\", \"methods\": [{\"name\": \"full\"}], "
          "\"benchmarks\": [{\"type\": \"recall\", \"dialogues\": 1, \"rounds\": 2, \"max_new_tokens\": 3}]}", f);
    fclose(f);
    for (int profile = 0; profile < 2; profile++) {
        snprintf(args, sizeof args, "'%%s' run %s --out %s/profile%d --quiet%s > /dev/null 2>&1%%s%%s", path, dir, profile,
                 profile ? " --profile" : "");
        CU_ASSERT_FATAL(sh(args, "", "") == 0);
        snprintf(res, sizeof res, "%s/profile%d/results.jsonl", dir, profile);
        char *t = util_read_file(res, NULL);
        CU_ASSERT_FATAL(t != NULL);
        if (!profile) CU_ASSERT(strstr(t, "\"breakdown\":null") != NULL);
        if (profile) {
            const char *b = strstr(t, "\"breakdown\":{\"prefill\":{");
            CU_ASSERT(b && strstr(b, "\"mlp\"") && strstr(b, "\"decode\":{") && strstr(strstr(b, "\"decode\":{"), "\"mlp\""));
        }
        free(t);
        snprintf(res, sizeof res, "%s/profile%d/run.json", dir, profile);
        t = util_read_file(res, NULL);
        CU_ASSERT(t && (strstr(t, "--profile") != NULL) == profile);
        free(t);
    }
}

int main(void) {
    bin = getenv("KVB_BIN");
    char model[1024];
    if (!bin || !util_default_model(model, sizeof model)) {
        fprintf(stderr, "needs KVB_BIN and the default model (scripts/fetch-model.sh)\n");
        return 1;
    }
    if (!mkdtemp(dir) || setenv("KVB_T", dir, 1)) return 1;
    snprintf(suite, sizeof suite, "%s/suite.json", dir);
    FILE *f = fopen(suite, "w");
    fprintf(f, SUITE, "runner-test");
    fclose(f);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("runner", NULL, NULL);
    CU_add_test(s, "a killed run resumes to the records of an uninterrupted one", test_killed_run_resumes_to_the_same_records);
    CU_add_test(s, "bad inputs are one-line errors", test_bad_inputs_are_one_line_errors);
    CU_add_test(s, "changed cells are not reused", test_changed_cells_are_not_reused);
    CU_add_test(s, "a folder in use is refused, naming the holder", test_a_folder_in_use_is_refused_naming_the_holder);
    CU_add_test(s, "two runs at once into one folder give one record per cell", test_two_runs_at_once_into_one_folder_give_one_record_per_cell);
    CU_add_test(s, "results file and output folder are checked as everywhere", test_results_file_and_output_folder_are_checked_as_everywhere);
    CU_add_test(s, "long ids sharing a prefix stay apart and resume", test_long_ids_sharing_a_prefix_stay_apart_and_resume);
    CU_add_test(s, "niah grid keeps every depth", test_niah_grid_keeps_every_depth);
    CU_add_test(s, "ignore_eos generates max_new_tokens", test_ignore_eos_generates_max_new_tokens);
    CU_add_test(s, "a suite is read strictly before anything runs", test_a_suite_is_read_strictly_before_anything_runs);
    CU_add_test(s, "phases are timed with --profile only", test_phases_are_timed_with_profile_only);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
