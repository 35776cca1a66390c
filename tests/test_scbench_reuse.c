/* test_scbench_reuse.c — SCBench's multi-turn KV cache reuse (scbench.h "kv_reuse", hidden.h kvb_carried_build,
 * shared_prefill.h): every turn's ids are the official pieces (eval_utils.py create_multiturn_prompt with the chat
 * template, tests/fixtures/scbench/expected.json), tokenized one by one as GreedySearch.test feeds its cache; on
 * records the test writes in SCBench's format, a run through the runner on the default model gives, under full
 * attention, the greedy tokens of the whole-prompt path ("kv_reuse": false) on every turn whose ids are the same
 * (with an f32 cache, whose numerics do not depend on where the prefill is cut into calls);
 * the first turn's prompt is prefilled once per record (its record "first", each later turn "reused" and counting
 * its own piece); SnapKV at 50% keeps the same share of the first turn's prompt on every turn, the later pieces
 * appended whole, measured by the store; Round Attention is refused on carried turns and the others still share the
 * prefill; the suite entry refuses bad "kv_reuse" values in one line. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/hidden.h"
#include "benchmarks/prompt.h"
#include "benchmarks/registry.h"
#include "benchmarks/runner.h"
#include "benchmarks/scbench.h"
#include "engine/chat.h"
#include "engine/model.h"
#include "reports/record.h"

#define FIX "tests/fixtures/scbench"
#define N_RECORDS 2
#define N_TURNS 3
#define N_KEYS 12

static kvb_model *model;
static char err[512], dir[64] = "/tmp/kvb_scb_reuse_XXXXXX";

static int load(const char *path, const char *task, int kv_reuse, kvb_samples *v) {
    scb_opts o = {.kv_reuse = kv_reuse};
    return scb_load(path, task, &o, v, err, sizeof err);
}

/* ids of text appended to *ids (bos: the model's BOS first) */
static void encode_onto(const char *text, int bos, int32_t **ids, int64_t *n) {
    int32_t *t = NULL;
    int k = 0;
    CU_ASSERT_FATAL(tok_encode(model->tok, text, strlen(text), bos, 1, &t, &k, err, sizeof err) == 0);
    *ids = realloc(*ids, (size_t)(*n + k + 1) * sizeof **ids);
    memcpy(*ids + *n, t, (size_t)k * sizeof *t);
    *n += k;
    free(t);
}

/* Every turn of every fixture task, carried: its ids are the official prompts[0..k] (GreedySearch.test prefills
 * prompts[0] and then each later prompt on the same cache), each tokenized alone; the split is after prompts[0]
 * and the turn's own part is prompts[k]. prompts[0] holds Qwen's default system prompt (the fixture script's
 * tokenizer): the default model's own takes its place. */
static void test_carried_turns_are_the_official_pieces(void) {
    CU_ASSERT_FATAL(model != NULL);
    char *text = util_read_file(FIX "/expected.json", NULL);
    cJSON *e = text ? cJSON_Parse(text) : NULL, *t;
    free(text);
    CU_ASSERT_FATAL(e != NULL);
    const char *qwen = cJSON_GetObjectItem(e, "qwen_system")->valuestring;
    char *own_sys = chat_default_system_from_model(model->gguf);
    CU_ASSERT_FATAL(own_sys != NULL);
    int checked = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(e, "tasks")) {
        char path[256];
        snprintf(path, sizeof path, FIX "/%s.jsonl", t->string);
        kvb_samples v = {0};
        CU_ASSERT_FATAL(load(path, t->string, 1, &v) == 0);
        const cJSON *recs = cJSON_GetObjectItem(t, "records");
        int at = 0;
        for (int r = 0; r < cJSON_GetArraySize(recs); r++) {
            const cJSON *prompts = cJSON_GetObjectItem(cJSON_GetArrayItem(recs, r), "multi_turn");
            for (int k = 0; k < cJSON_GetArraySize(prompts); k++, at++) {
                CU_ASSERT_FATAL(at < v.n);
                const kvb_sample *s = &v.v[at];
                char task[96], group[128];
                snprintf(task, sizeof task, "%s_reuse", t->string);
                CU_ASSERT(s->carried == 1 && !strcmp(s->task, task));
                /* one group per record: the id's part before "/t<k>" */
                snprintf(group, sizeof group, "%s_reuse/%.*s", t->string, (int)(strrchr(s->id, '/') - s->id), s->id);
                CU_ASSERT(s->group && !strcmp(s->group, group));
                int32_t *want = NULL;
                int64_t nw = 0, split = 0, own_at = 0;
                for (int j = 0; j <= k; j++) {
                    const char *piece = cJSON_GetArrayItem(prompts, j)->valuestring;
                    if (j == 0) { /* the default system prompt swapped */
                        const char *q = strstr(piece, qwen);
                        CU_ASSERT_FATAL(q != NULL);
                        size_t l = strlen(piece) - strlen(qwen) + strlen(own_sys) + 1;
                        char *p0 = malloc(l);
                        snprintf(p0, l, "%.*s%s%s", (int)(q - piece), piece, own_sys, q + strlen(qwen));
                        encode_onto(p0, 1, &want, &nw);
                        free(p0);
                        split = nw;
                    } else {
                        if (j == k) own_at = nw;
                        encode_onto(piece, 0, &want, &nw);
                    }
                }
                kvb_prompt p;
                int64_t got_split = -1, got_own = -1;
                CU_ASSERT_FATAL(kvb_carried_build(model, s, 1 << 20, &p, &got_split, &got_own, err, sizeof err) == 0);
                CU_ASSERT(p.n == nw && !memcmp(p.ids, want, (size_t)nw * sizeof *want));
                if (p.n != nw || memcmp(p.ids, want, (size_t)nw * sizeof *want))
                    fprintf(stderr, "\n%s turn %d: %lld ids, the official pieces %lld\n", s->id, k + 1, (long long)p.n, (long long)nw);
                CU_ASSERT(got_split == split && got_own == own_at);
                CU_ASSERT(p.n_rounds == k + 1 && p.real_rounds == 1);
                kvb_prompt_free(&p);
                free(want);
                checked++;
            }
        }
        CU_ASSERT(at == v.n);
        kvb_samples_free(&v);
    }
    CU_ASSERT(checked == 45); /* the fixtures' 45 multi-turn turns */
    free(own_sys);
    cJSON_Delete(e);
}

/* A carried turn is never cut: one too long for the model is refused in one line; the suite entry's kv_reuse
 * must be a boolean, for multi_turn only; false keeps today's whole-prompt samples (no group). */
static kvb_samples *add_task(void *ctx, const char *name, const char *benchmark, kvb_judge_kind judge, char *e, size_t el) {
    (void)benchmark, (void)judge, (void)e, (void)el;
    kvb_samples *v = ctx;
    snprintf(err, sizeof err, "%s", name); /* the task name, for the caller */
    return v;
}

static int expand(const char *in, char *out, size_t cap) { return snprintf(out, cap, "%s", in) >= (int)cap ? -1 : 0; }

static void test_the_suite_entry_and_an_over_long_turn_are_refused_in_one_line(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_samples v = {0};
    CU_ASSERT_FATAL(load(FIX "/scbench_kv.jsonl", "scbench_kv", 1, &v) == 0);
    kvb_prompt p;
    int64_t split, own;
    CU_ASSERT(kvb_carried_build(model, &v.v[1], 40, &p, &split, &own, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "does not fit") != NULL && !strchr(err, '\n'));
    kvb_samples_free(&v);
    const kvb_benchmark *b = kvb_benchmark_find("scbench");
    kvb_bench_env env = {.suite_path = "t.json", .n_ctx_train = 32768, .expand_path = expand, .add_task = add_task, .add_ctx = &v};
    const char *bad[] = {"\"kv_reuse\": 1", "\"kv_reuse\": true, \"mode\": \"multi_request\""};
    const char *why[] = {"true or false", "multi_turn"};
    for (int i = 0; i < 2; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"type\": \"scbench\", \"path\": \"" FIX "\", \"tasks\": [\"scbench_kv\"], %s}", bad[i]);
        cJSON *entry = cJSON_Parse(json);
        CU_ASSERT(b->load(&env, entry, err, sizeof err) == -1 && strstr(err, why[i]) != NULL);
        cJSON_Delete(entry);
    }
    cJSON *entry = cJSON_Parse("{\"type\": \"scbench\", \"path\": \"" FIX "\", \"tasks\": [\"scbench_kv\"], \"kv_reuse\": false}");
    CU_ASSERT(b->load(&env, entry, err, sizeof err) == 0 && !strcmp(err, "scbench_kv"));
    CU_ASSERT(v.n == 5 && !v.v[0].group && !v.v[0].carried && !v.v[4].group);
    cJSON_Delete(entry);
    kvb_samples_free(&v);
    entry = cJSON_Parse("{\"type\": \"scbench\", \"path\": \"" FIX "\", \"tasks\": [\"scbench_kv\"]}"); /* the default */
    CU_ASSERT(b->load(&env, entry, err, sizeof err) == 0 && !strcmp(err, "scbench_kv_reuse"));
    CU_ASSERT(v.n == 5 && v.v[0].carried && v.v[4].carried && !strcmp(v.v[3].group, "scbench_kv_reuse/1"));
    cJSON_Delete(entry);
    kvb_samples_free(&v);
}

/* ---- a run through the runner ---- */

/* SCBench's kv records: a JSON object of N_KEYS "xxxx-xx" keys, three turns asking three of them. */
static void write_records(const char *path) {
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    unsigned x = 12345;
    for (int r = 0; r < N_RECORDS; r++) {
        char keys[N_KEYS][8], vals[N_KEYS][8];
        cJSON *ctx = cJSON_CreateObject(), *rec = cJSON_CreateObject(), *turns = cJSON_CreateArray();
        for (int i = 0; i < N_KEYS; i++) {
            x = x * 1103515245u + 12345u;
            snprintf(keys[i], sizeof keys[i], "%04x-%02x", (x >> 8) & 0xffff, (x >> 24) & 0xff);
            x = x * 1103515245u + 12345u;
            snprintf(vals[i], sizeof vals[i], "%04x-%02x", (x >> 8) & 0xffff, (x >> 24) & 0xff);
            cJSON_AddStringToObject(ctx, keys[i], vals[i]);
        }
        char *ctext = cJSON_PrintUnformatted(ctx);
        cJSON_AddNumberToObject(rec, "id", r);
        cJSON_AddStringToObject(rec, "context", ctext);
        for (int k = 0; k < N_TURNS; k++) {
            int i = (5 + 7 * k + 3 * r) % N_KEYS;
            char in[128];
            snprintf(in, sizeof in, "Key: \"%s\"\nThe value associated with the specified key is: ", keys[i]);
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "input", in);
            cJSON_AddStringToObject(t, "answer", vals[i]);
            cJSON_AddItemToArray(turns, t);
        }
        cJSON_AddItemToObject(rec, "multi_turns", turns);
        char *line = cJSON_PrintUnformatted(rec);
        fprintf(f, "%s\n", line);
        free(line), free(ctext);
        cJSON_Delete(rec), cJSON_Delete(ctx);
    }
    fclose(f);
}

typedef struct {
    kvb_record r[32];
    int n;
} run_records;

static void run(const char *name, const char *methods, int kv_reuse, run_records *out) {
    char suite[160], outdir[160];
    snprintf(suite, sizeof suite, "%s/%s.json", dir, name);
    snprintf(outdir, sizeof outdir, "%s/%s", dir, name);
    FILE *f = fopen(suite, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"%s\", \"model\": \"default\", \"seed\": 1, \"methods\": [%s], \"budgets\": [\"50%%\"], "
               "\"benchmarks\": [{\"type\": \"scbench\", \"path\": \"%s/scbench_kv.jsonl\", \"kv_reuse\": %s, "
               "\"max_new_tokens\": 10}]}\n", name, methods, dir, kv_reuse ? "true" : "false");
    fclose(f);
    /* an f32 cache (--kv-type f32): its logits do not depend on where the prefill is cut into forward calls, which
     * differs between the two paths; with the f16 cache they do (up to 0.6 in a logit here for the same ids), enough
     * to flip a near-tie */
    kvb_run_opts ro = {.suite_path = suite, .out_dir = outdir, .quiet = 1, .kv_f32 = 1};
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kvb_run_suite(&ro, devnull, err, sizeof err);
    fclose(devnull);
    if (rc) fprintf(stderr, "\n  %s\n", err);
    CU_ASSERT_FATAL(rc == 0);
    char res[200];
    snprintf(res, sizeof res, "%s/results.jsonl", outdir);
    char *text = util_read_file(res, NULL);
    CU_ASSERT_FATAL(text != NULL);
    out->n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        char why[256];
        CU_ASSERT_FATAL(j && out->n < 32 && kvb_record_from_json(j, &out->r[out->n], 0, why, sizeof why) == 0);
        out->n++;
        cJSON_Delete(j);
    }
    free(text);
}

static const kvb_record *find(const run_records *rr, const char *method, const char *id) {
    for (int i = 0; i < rr->n; i++)
        if (!strcmp(rr->r[i].method, method) && !strcmp(rr->r[i].sample_id, id)) return &rr->r[i];
    return NULL;
}

static void test_a_run_carries_the_cache_across_turns(void) {
    CU_ASSERT_FATAL(model != NULL);
    char data[160];
    snprintf(data, sizeof data, "%s/scbench_kv.jsonl", dir);
    write_records(data);
    run_records reuse, whole;
    /* Round Attention prefills the question round itself: refused on every carried turn, without stopping the
     * others' reuse of the first turn's prefill */
    /* Round's watershed given: nothing is calibrated here (the tests' profile directory takes no profile) */
    run("reuse", "{\"name\": \"full\"}, {\"name\": \"snapkv\"}, {\"name\": \"round\", \"opts\": {\"lw\": 13}}", 1, &reuse);
    run("whole", "{\"name\": \"full\"}", 0, &whole);
    CU_ASSERT_FATAL(reuse.n == 3 * N_RECORDS * N_TURNS && whole.n == N_RECORDS * N_TURNS);
    kvb_samples vc = {0}, vw = {0};
    CU_ASSERT_FATAL(load(data, "scbench_kv", 1, &vc) == 0 && load(data, "scbench_kv", 0, &vw) == 0);
    CU_ASSERT_FATAL(vc.n == N_RECORDS * N_TURNS && vw.n == vc.n);
    int same_ids = 0;
    int64_t split = 0, prev_n = 0;
    double kept_first = 0;
    for (int i = 0; i < vc.n; i++) {
        const kvb_sample *s = &vc.v[i];
        int turn = i % N_TURNS;
        kvb_prompt pc, pw;
        int64_t sp, own;
        CU_ASSERT_FATAL(kvb_carried_build(model, s, 1 << 20, &pc, &sp, &own, err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_prompt_build(model, &vw.v[i], 1 << 20, 512, &pw, err, sizeof err) == 0);
        const kvb_record *full = find(&reuse, "full", s->id), *snap = find(&reuse, "snapkv", s->id),
                         *round = find(&reuse, "round", s->id), *ref = find(&whole, "full", s->id);
        CU_ASSERT_FATAL(full && snap && round && ref);
        CU_ASSERT(round->error && strstr(round->error, "carried turns are not supported") && !strchr(round->error, '\n'));
        CU_ASSERT(!full->error && !snap->error && !ref->error);
        if (full->error || snap->error || ref->error)
            fprintf(stderr, "\n%s: %s / %s / %s\n", s->id, full->error ? full->error : "-", snap->error ? snap->error : "-", ref->error ? ref->error : "-");
        CU_ASSERT(!strcmp(full->task, "scbench_kv_reuse") && !strcmp(ref->task, "scbench_kv"));
        /* full attention: the whole-prompt path's greedy tokens wherever the prompts are the same ids */
        if (pc.n == pw.n && !memcmp(pc.ids, pw.ids, (size_t)pc.n * sizeof *pc.ids)) {
            same_ids++;
            CU_ASSERT_STRING_EQUAL(full->prediction, ref->prediction);
            CU_ASSERT(full->score == ref->score);
        }
        /* the cost: the first turn's prompt once (its record "first"), then each turn's own piece */
        if (turn == 0) split = sp, prev_n = 0;
        CU_ASSERT(sp == split && pc.n > prev_n);
        CU_ASSERT(ref->prefill_tokens == (double)pw.n && !ref->context_group);
        for (int m = 0; m < 2; m++) {
            const kvb_record *r = m ? snap : full;
            CU_ASSERT_FATAL(r->context_group && r->shared_prefill);
            CU_ASSERT(!strcmp(r->context_group, s->group));
            CU_ASSERT_STRING_EQUAL(r->shared_prefill, turn ? "reused" : "first");
            CU_ASSERT(r->prefill_tokens == (double)(pc.n - prev_n));
            CU_ASSERT(r->prompt_tokens == (double)pc.n);
        }
        /* the KV the store holds after the turn's prefill: full, every token; SnapKV, the same share of the first
         * turn's prompt on every turn (compressed once) and the later pieces whole */
        double tok_bytes = full->kv_full_bytes / (double)pc.n;
        CU_ASSERT(full->kv_device_bytes == full->kv_full_bytes && snap->kv_full_bytes == full->kv_full_bytes);
        double kept = snap->kv_device_bytes / tok_bytes - (double)(pc.n - split);
        CU_ASSERT(kept <= 0.5 * (double)split + 1 && kept >= 0.4 * (double)split);
        if (turn == 0) kept_first = kept;
        CU_ASSERT(kept > kept_first - 1e-6 && kept < kept_first + 1e-6);
        prev_n = pc.n;
        kvb_prompt_free(&pc), kvb_prompt_free(&pw);
    }
    CU_ASSERT(same_ids == vc.n); /* ChatML's pieces end at special tokens: every turn's ids are the same */
    for (int i = 0; i < reuse.n; i++) kvb_record_free(&reuse.r[i]);
    for (int i = 0; i < whole.n; i++) kvb_record_free(&whole.r[i]);
    kvb_samples_free(&vc), kvb_samples_free(&vw);
}

int main(void) {
    char path[1024];
    if (util_default_model(path, sizeof path)) model = kvb_model_load(path, err, sizeof err);
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("scbench_reuse", NULL, NULL);
    CU_add_test(s, "carried turns are the official pieces", test_carried_turns_are_the_official_pieces);
    CU_add_test(s, "the suite entry and an over-long turn are refused in one line",
                test_the_suite_entry_and_an_over_long_turn_are_refused_in_one_line);
    CU_add_test(s, "a run carries the cache across turns", test_a_run_carries_the_cache_across_turns);
    int rc = util_run_suites();
    kvb_model_free(model);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
