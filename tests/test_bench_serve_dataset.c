/* test_bench_serve_dataset.c — `kvbench bench-serve --dataset` and `--duration` as a user runs them (the binary from
 * KVB_BIN), on a tiny random-weight model with one token per byte. The requests it hands the scheduler
 * (--log-requests) are checked against the benchmark's own loader and prompt builder called here: LongBench records
 * (one longer than the context, middle-cut; each request generating the task's dataset2maxlen capped by --max-new)
 * through lb_load + kvb_prompt_single, ShareGPT conversations through
 * sharegpt_load + kvb_prompt_dialogue, each to the context less the request's generation, token id for token id;
 * a ShareGPT request generates its recorded reply's length (bytes, one token each), capped by --max-new; requests
 * cycle through every record in a seeded order. --duration stops sending in time and counts every request sent
 * (closed and open loop); with --requests, whichever comes first. A missing or malformed file, or a bad spec, is one
 * line and exit 1. The real records in ../shared/data are served the same way (skipped with one line outside CI). */
#include <cjson/cJSON.h>
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "benchmarks/loaders.h"
#include "benchmarks/prompt.h"
#include "engine/model.h"
#include "util_common.h"
#include "util_gguf_writer.h"

static char tmpdir[64] = "/tmp/kvb_bsdata_XXXXXX", model[128], out_path[160], err_path[160], log_path[160],
            json_path[160], lb_dir[160], lb_file[200], sg_file[160];
static const char *bin;
static kvb_model *M;

static int run(const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s bench-serve --model %s --threads 1 %s >%s 2>%s", bin, model, args, out_path, err_path);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

static void check_refused(const char *args, const char *what) {
    CU_ASSERT(run(args) == 1);
    char *e = util_read_file(err_path, NULL);
    CU_ASSERT_FATAL(e != NULL);
    CU_ASSERT(count(e, "\n") == 1 && strncmp(e, "kvbench: ", 9) == 0 && strstr(e, what) != NULL);
    if (!strstr(e, what)) fprintf(stderr, "\n  %s -> %s", args, e);
    free(e);
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = fputs(text, f) < 0;
    return fclose(f) || rc ? -1 : 0;
}

/* The logged requests: a cJSON array of the --log-requests lines. */
static cJSON *read_log(void) {
    char *t = util_read_file(log_path, NULL);
    if (!t) return NULL;
    cJSON *a = cJSON_CreateArray();
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) cJSON_AddItemToArray(a, cJSON_Parse(line));
    free(t);
    return a;
}

static const kvb_sample *find(const kvb_samples *v, const char *id) {
    for (int i = 0; i < v->n; i++)
        if (v->v[i].id && !strcmp(v->v[i].id, id)) return &v->v[i];
    return NULL;
}

/* Every logged request's ids equal the builder's prompt of its record within the context less its max_new + 1; the
 * first n_records requests are n_records distinct records and request i repeats request i - n_records. Returns the
 * number of records whose prompt the builder cut. */
static int check_served(const cJSON *log, const kvb_samples *v, kvb_prompt_fn build, int n_records) {
    int cut = 0;
    const int n_ctx = M->cfg.n_ctx_train;
    for (int i = 0; i < cJSON_GetArraySize(log); i++) {
        const cJSON *r = cJSON_GetArrayItem(log, i);
        const char *rec = cJSON_GetStringValue(cJSON_GetObjectItem(r, "record"));
        const kvb_sample *s = rec ? find(v, rec) : NULL;
        CU_ASSERT_FATAL(s != NULL);
        CU_ASSERT(cJSON_GetObjectItem(r, "request")->valueint == i);
        if (i >= n_records)
            CU_ASSERT_STRING_EQUAL(rec, cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(log, i - n_records), "record")));
        for (int j = 0; j < i && i < n_records; j++)
            CU_ASSERT(strcmp(rec, cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(log, j), "record"))) != 0);
        kvb_prompt p;
        char err[256];
        const int max_new = cJSON_GetObjectItem(r, "max_new")->valueint;
        CU_ASSERT_FATAL(build(M, s, n_ctx - max_new - 1, 512, &p, err, sizeof err) == 0);
        const cJSON *ids = cJSON_GetObjectItem(r, "ids");
        CU_ASSERT_FATAL(cJSON_GetArraySize(ids) == p.n);
        int same = 1;
        for (int k = 0; k < p.n; k++) same &= cJSON_GetArrayItem(ids, k)->valueint == p.ids[k];
        CU_ASSERT(same);
        CU_ASSERT(p.n + max_new < n_ctx);
        cut += i < n_records && p.truncated;
        kvb_prompt_free(&p);
    }
    return cut;
}

/* LongBench records in the official schema, one of them longer than the tiny model's context */
static void test_longbench_records_served_as_the_builder_makes_them(void) {
    char *big = malloc(3001);
    CU_ASSERT_FATAL(big != NULL);
    for (int i = 0; i < 3000; i++) big[i] = "abcdefgh ."[i % 10];
    big[3000] = 0;
    cJSON *recs[4];
    for (int i = 0; i < 4; i++) {
        recs[i] = cJSON_CreateObject();
        char ctx[128], id[16];
        snprintf(ctx, sizeof ctx, "Passage %d: the key of door %d is number %d.", i, i, 17 * i + 3);
        snprintf(id, sizeof id, "lb%d", i);
        cJSON_AddStringToObject(recs[i], "input", "Which number opens the door?");
        cJSON_AddStringToObject(recs[i], "context", i == 2 ? big : ctx);
        cJSON_AddItemToObject(recs[i], "answers", cJSON_CreateStringArray((const char *[]){"3"}, 1));
        cJSON_AddNumberToObject(recs[i], "length", 10);
        cJSON_AddStringToObject(recs[i], "dataset", "hotpotqa");
        cJSON_AddStringToObject(recs[i], "_id", id);
    }
    FILE *f = fopen(lb_file, "wb");
    CU_ASSERT_FATAL(f != NULL);
    for (int i = 0; i < 4; i++) {
        char *line = cJSON_PrintUnformatted(recs[i]);
        fprintf(f, "%s\n", line);
        free(line);
        cJSON_Delete(recs[i]);
    }
    fclose(f);
    free(big);
    char args[1024];
    snprintf(args, sizeof args, "--dataset longbench:%s --methods full --clients 2 --requests 9 --max-new 4 --pool-seqs 2 "
                                "--log-requests %s --json %s", lb_file, log_path, json_path);
    CU_ASSERT_FATAL(run(args) == 0);
    kvb_samples v = {0};
    char err[256], cfg[200];
    snprintf(cfg, sizeof cfg, "%s/config", lb_dir);
    CU_ASSERT_FATAL(lb_load(lb_file, "hotpotqa", cfg, 0, &v, err, sizeof err) == 0);
    cJSON *log = read_log();
    CU_ASSERT_FATAL(cJSON_GetArraySize(log) == 9);
    CU_ASSERT(check_served(log, &v, kvb_prompt_single, 4) == 1); /* the long record, middle-cut */
    for (int i = 0; i < 9; i++) CU_ASSERT(cJSON_GetObjectItem(cJSON_GetArrayItem(log, i), "max_new")->valueint == 4);
    char *o = util_read_file(out_path, NULL), *js = util_read_file(json_path, NULL);
    CU_ASSERT_FATAL(o && js);
    CU_ASSERT(strstr(o, "| full | - | 9/9 | 0 | 0 |") && strstr(o, "| longbench:hotpotqa |"));
    cJSON *rows = cJSON_Parse(js);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "dataset")), "longbench:hotpotqa");
    cJSON_Delete(rows);
    free(o), free(js);
    /* --max-new above the task's dataset2maxlen (32): requests generate 32, and the prompts are the runner's
     * (the context less 32 + 1) */
    snprintf(args, sizeof args, "--dataset longbench:%s --methods full --clients 2 --requests 4 --max-new 100 "
                                "--log-requests %s", lb_file, log_path);
    CU_ASSERT_FATAL(run(args) == 0);
    cJSON *log32 = read_log();
    CU_ASSERT_FATAL(cJSON_GetArraySize(log32) == 4);
    for (int i = 0; i < 4; i++) CU_ASSERT(cJSON_GetObjectItem(cJSON_GetArrayItem(log32, i), "max_new")->valueint == 32);
    CU_ASSERT(check_served(log32, &v, kvb_prompt_single, 4) == 1);
    cJSON_Delete(log32);
    /* another seed, another order of the same records */
    char first[4][16];
    for (int i = 0; i < 4; i++)
        snprintf(first[i], sizeof first[i], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(log, i), "record")));
    cJSON_Delete(log);
    int differs = 0;
    for (int seed = 2; seed < 6 && !differs; seed++) {
        snprintf(args, sizeof args, "--dataset longbench:%s --methods full --clients 1 --requests 4 --max-new 2 "
                                    "--seed %d --log-requests %s", lb_file, seed, log_path);
        CU_ASSERT_FATAL(run(args) == 0);
        log = read_log();
        for (int i = 0; i < 4; i++)
            differs |= strcmp(first[i], cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(log, i), "record"))) != 0;
        cJSON_Delete(log);
    }
    CU_ASSERT(differs);
    kvb_samples_free(&v);
}

/* ShareGPT conversations (FastChat's layout): replies of 3, 6 and 20 bytes under --max-new 6 */
static void test_sharegpt_dialogues_and_their_reply_lengths(void) {
    static const char *const REPLY[3] = {"abc", "sixsix", "twenty bytes of text"};
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < 3; i++) {
        cJSON *c = cJSON_CreateObject(), *conv = cJSON_AddArrayToObject(c, "conversations");
        char id[16];
        snprintf(id, sizeof id, "sg%d", i);
        cJSON_AddStringToObject(c, "id", id);
        const char *const msgs[] = {"hello there", "hi, how can I help?", "tell me a number", "seven", "and another one?", REPLY[i]};
        for (int k = 0; k < 6; k++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "from", k % 2 ? "gpt" : "human");
            cJSON_AddStringToObject(m, "value", msgs[k]);
            cJSON_AddItemToArray(conv, m);
        }
        cJSON_AddItemToArray(a, c);
    }
    char *js = cJSON_Print(a);
    cJSON_Delete(a);
    CU_ASSERT_FATAL(write_text(sg_file, js) == 0);
    free(js);
    char args[1024];
    snprintf(args, sizeof args, "--dataset sharegpt:%s --methods full,streamingllm@50%% --clients 2 --requests 6 "
                                "--max-new 6 --pool-seqs 2 --log-requests %s --json %s", sg_file, log_path, json_path);
    CU_ASSERT_FATAL(run(args) == 0);
    kvb_samples v = {0};
    char err[256];
    CU_ASSERT_FATAL(sharegpt_load(sg_file, 0, &v, err, sizeof err) == 0);
    cJSON *log = read_log();
    CU_ASSERT_FATAL(cJSON_GetArraySize(log) == 12); /* two methods, six requests each */
    cJSON *first = cJSON_CreateArray(), *second = cJSON_CreateArray();
    for (int i = 0; i < 12; i++) cJSON_AddItemToArray(i < 6 ? first : second, cJSON_Duplicate(cJSON_GetArrayItem(log, i), 1));
    cJSON_Delete(log);
    CU_ASSERT(check_served(first, &v, kvb_prompt_dialogue, 3) == 0);
    int want_tokens = 0;
    for (int i = 0; i < 6; i++) {
        const cJSON *r = cJSON_GetArrayItem(first, i);
        const int k = cJSON_GetStringValue(cJSON_GetObjectItem(r, "record"))[2] - '0';
        const int want = strlen(REPLY[k]) < 6 ? (int)strlen(REPLY[k]) : 6;
        CU_ASSERT(cJSON_GetObjectItem(r, "max_new")->valueint == want);
        want_tokens += want;
    }
    cJSON_Delete(first), cJSON_Delete(second);
    /* ignore_eos: each request generated its max_new, no more */
    char *j = util_read_file(json_path, NULL);
    cJSON *rows = cJSON_Parse(j);
    CU_ASSERT_FATAL(cJSON_GetArraySize(rows) == 2);
    for (int i = 0; i < 2; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        CU_ASSERT(cJSON_GetObjectItem(r, "ok")->valueint == 6 && cJSON_GetObjectItem(r, "lost")->valueint == 0);
        CU_ASSERT(cJSON_GetObjectItem(r, "output_tokens")->valueint == want_tokens);
        CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(r, "dataset")), "sharegpt:sg.json");
    }
    cJSON_Delete(rows);
    free(j);
    kvb_samples_free(&v);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static const cJSON *row0(cJSON **rows) {
    char *j = util_read_file(json_path, NULL);
    *rows = j ? cJSON_Parse(j) : NULL;
    free(j);
    return cJSON_GetArrayItem(*rows, 0);
}

static void test_duration_stops_in_time_and_counts_every_request(void) {
    char args[1024];
    /* closed loop: clients send for 1.5 s; every request sent is counted, none lost */
    snprintf(args, sizeof args, "--dataset niah:100 --prompts 2 --methods full --clients 2 --duration 1.5 --max-new 2 "
                                "--log-requests %s --json %s", log_path, json_path);
    double t0 = now_s();
    CU_ASSERT_FATAL(run(args) == 0);
    const double took = now_s() - t0;
    cJSON *rows, *log = read_log();
    const cJSON *r = row0(&rows);
    CU_ASSERT_FATAL(r != NULL);
    const int sent = cJSON_GetObjectItem(r, "requests")->valueint;
    CU_ASSERT(sent > 2 && sent == cJSON_GetArraySize(log));
    CU_ASSERT(cJSON_GetObjectItem(r, "ok")->valueint == sent && cJSON_GetObjectItem(r, "lost")->valueint == 0);
    CU_ASSERT(cJSON_GetObjectItem(r, "output_tokens")->valueint == 2 * sent);
    const double wall = cJSON_GetObjectItem(r, "wall_s")->valuedouble;
    CU_ASSERT(wall >= 1.5 && wall < 1.5 + 5);
    CU_ASSERT(took < 1.5 + 20); /* stopped: a run without the stop would never end */
    CU_ASSERT(fabs(cJSON_GetObjectItem(r, "requests_per_s")->valuedouble - sent / wall) < 0.01 * sent / wall + 1e-3);
    cJSON_Delete(rows), cJSON_Delete(log);
    /* open loop: the seeded arrivals of 1 s at 8/s, all counted */
    snprintf(args, sizeof args, "--dataset niah:100 --prompts 2 --methods full --rate 8 --duration 1 --max-new 2 "
                                "--log-requests %s --json %s", log_path, json_path);
    CU_ASSERT_FATAL(run(args) == 0);
    log = read_log();
    r = row0(&rows);
    const int arrived = cJSON_GetObjectItem(r, "requests")->valueint;
    CU_ASSERT(arrived >= 1 && arrived <= 30 && arrived == cJSON_GetArraySize(log));
    CU_ASSERT(cJSON_GetObjectItem(r, "ok")->valueint == arrived && cJSON_GetObjectItem(r, "lost")->valueint == 0);
    cJSON_Delete(rows), cJSON_Delete(log);
    /* both: the count comes first */
    snprintf(args, sizeof args, "--dataset niah:100 --prompts 2 --methods full --clients 2 --duration 600 --requests 3 "
                                "--max-new 2 --json %s", json_path);
    t0 = now_s();
    CU_ASSERT_FATAL(run(args) == 0);
    CU_ASSERT(now_s() - t0 < 60);
    r = row0(&rows);
    CU_ASSERT(cJSON_GetObjectItem(r, "requests")->valueint == 3 && cJSON_GetObjectItem(r, "ok")->valueint == 3);
    cJSON_Delete(rows);
}

static void test_bad_dataset_is_one_line_and_exit_1(void) {
    char args[512], bad[200];
    check_refused("--dataset nosuch:x", "expected longbench:FILE.jsonl");
    check_refused("--dataset sharegpt:", "the file is missing");
    check_refused("--dataset sharegpt:/no/such/file.json", "/no/such/file.json");
    check_refused("--dataset longbench:/no/such/hotpotqa.jsonl", "/no/such/hotpotqa.jsonl");
    check_refused("--dataset niah:x", "niah:x");
    check_refused("--longbench-config /tmp", "--longbench-config goes with");
    snprintf(bad, sizeof bad, "%s/bad.json", tmpdir);
    CU_ASSERT_FATAL(write_text(bad, "[{\"id\": \"x\", \"conversations\": [{\"from\": \"human\", \"value\": 3}]}]") == 0);
    snprintf(args, sizeof args, "--dataset sharegpt:%s", bad);
    check_refused(args, bad);
    snprintf(bad, sizeof bad, "%s/data/hotpotqa.jsonl", lb_dir);
    CU_ASSERT_FATAL(write_text(lb_file, "{\"input\": \"q\", \"context\": 5}\n") == 0);
    snprintf(args, sizeof args, "--dataset longbench:%s", lb_file);
    check_refused(args, "hotpotqa.jsonl");
    unlink(bad);
}

/* The real records (../shared/data): a LongBench task and the ShareGPT sample, as the builder makes them. */
static void test_real_records_conform(void) {
    char lb[256], cfg[256], sg[256], args[1024], err[256];
    if (!UTIL_SHARED_DATA("longbench/reconstructed_from_minilongbench/hotpotqa.jsonl", lb, sizeof lb) ||
        !UTIL_SHARED_DATA("longbench/config", cfg, sizeof cfg) ||
        !UTIL_SHARED_DATA("sharegpt/sharegpt_v3_cleaned_split.top50_by_turns.json", sg, sizeof sg))
        return;
    snprintf(args, sizeof args, "--dataset longbench:%s --prompts 3 --methods full --clients 2 --requests 4 --max-new 3 "
                                "--log-requests %s", lb, log_path);
    CU_ASSERT_FATAL(run(args) == 0);
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lb_load(lb, "hotpotqa", cfg, 0, &v, err, sizeof err) == 0);
    cJSON *log = read_log();
    CU_ASSERT_FATAL(cJSON_GetArraySize(log) == 4);
    CU_ASSERT(check_served(log, &v, kvb_prompt_single, 3) == 3); /* ~10K-token records, every one cut to the context */
    cJSON_Delete(log);
    kvb_samples_free(&v);
    snprintf(args, sizeof args, "--dataset sharegpt:%s --prompts 3 --methods full --clients 2 --requests 3 --max-new 8 "
                                "--log-requests %s", sg, log_path);
    CU_ASSERT_FATAL(run(args) == 0);
    CU_ASSERT_FATAL(sharegpt_load(sg, 0, &v, err, sizeof err) == 0);
    log = read_log();
    CU_ASSERT_FATAL(cJSON_GetArraySize(log) == 3);
    check_served(log, &v, kvb_prompt_dialogue, 3);
    for (int i = 0; i < 3; i++) {
        const cJSON *r = cJSON_GetArrayItem(log, i);
        const kvb_sample *s = find(&v, cJSON_GetStringValue(cJSON_GetObjectItem(r, "record")));
        const int64_t t = s->n_answers ? kvb_count_tokens(M, s->answers[0]) : 8;
        CU_ASSERT(cJSON_GetObjectItem(r, "max_new")->valueint == (t < 1 ? 1 : t < 8 ? t : 8));
    }
    cJSON_Delete(log);
    kvb_samples_free(&v);
}

static int setup(void) {
    bin = getenv("KVB_BIN");
    if (!bin || !mkdtemp(tmpdir)) return -1;
    snprintf(model, sizeof model, "%s/tiny.gguf", tmpdir);
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmpdir);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmpdir);
    snprintf(log_path, sizeof log_path, "%s/requests.jsonl", tmpdir);
    snprintf(json_path, sizeof json_path, "%s/rows.json", tmpdir);
    snprintf(sg_file, sizeof sg_file, "%s/sg.json", tmpdir);
    snprintf(lb_dir, sizeof lb_dir, "%s/longbench", tmpdir);
    snprintf(lb_file, sizeof lb_file, "%s/data/hotpotqa.jsonl", lb_dir);
    char d[200];
    if (mkdir(lb_dir, 0700)) return -1;
    snprintf(d, sizeof d, "%s/data", lb_dir);
    if (mkdir(d, 0700)) return -1;
    snprintf(d, sizeof d, "%s/config", lb_dir);
    if (mkdir(d, 0700)) return -1;
    /* LongBench's hotpotqa entries of dataset2prompt.json / dataset2maxlen.json (THUDM/LongBench config) */
    char p[260];
    snprintf(p, sizeof p, "%s/dataset2prompt.json", d);
    if (write_text(p, "{\"hotpotqa\": \"Answer the question based on the given passages. Only give me the answer and do "
                      "not output any other words.\\n\\nThe following are given passages.\\n{context}\\n\\nAnswer the "
                      "question based on the given passages. Only give me the answer and do not output any other "
                      "words.\\n\\nQuestion: {input}\\nAnswer:\"}"))
        return -1;
    snprintf(p, sizeof p, "%s/dataset2maxlen.json", d);
    if (write_text(p, "{\"hotpotqa\": 32}")) return -1;
    gw_random r = {3, 0.5f, NULL};
    gw_tiny t = {"llama", 2, 32, 4, 2, 48, GW_BYTE_VOCAB, 1024, 1,
                 "<|im_start|>system\nYou are tiny.<|im_end|>\n{% for m in messages %}...{% endfor %}", gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model);
    free(r.buf);
    char err[256];
    if (rc || !(M = kvb_model_load(model, err, sizeof err))) return -1;
    return 0;
}

static int teardown(void) {
    kvb_model_free(M);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir); /* mkdtemp's own directory */
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench-serve --dataset", setup, teardown);
    CU_add_test(s, "longbench: the served ids are the builder's (a long record middle-cut), every record in a seeded cycle",
                test_longbench_records_served_as_the_builder_makes_them);
    CU_add_test(s, "sharegpt: the served ids are the dialogue builder's, max_new is the reply's length capped",
                test_sharegpt_dialogues_and_their_reply_lengths);
    CU_add_test(s, "--duration: stops in time, every request sent counted (closed, open, with --requests)",
                test_duration_stops_in_time_and_counts_every_request);
    CU_add_test(s, "a bad spec, a missing or malformed file: one line, exit 1", test_bad_dataset_is_one_line_and_exit_1);
    CU_add_test(s, "the real records of ../shared/data are served as the builders make them", test_real_records_conform);
    return util_run_suites();
}
