/* registry.c — the benchmark table (registry.h) and the loaders of the suite entries that are not generated
 * task families of their own file (ruler and infinitebench: synth_suite.c). */
#include "benchmarks/registry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchmarks/datahint.h"
#include "benchmarks/jsonl.h"
#include "benchmarks/longbench_v2.h"
#include "benchmarks/scbench.h"
#include "benchmarks/score.h"
#include "benchmarks/synth_suite.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

static int jtrue(const cJSON *o, const char *k) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k)); }

/* A path that does not fit is refused, never cut (a cut path read or wrote elsewhere). */
#define EXPAND(in, out, what)                                                                                          \
    do {                                                                                                               \
        if (e->expand_path((in), (out), sizeof(out)))                                                                  \
            return ERR("%s: %s \"%.40s...\" is longer than the %zu bytes a path may have here", e->suite_path, (what), \
                       (in), sizeof(out) - 1);                                                                         \
    } while (0)

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

static int load_2stage(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    kvb_samples *out = e->add_task(e->add_ctx, "2stage", "2stage", KVB_JK_NONE, err, err_len);
    int n = (int)kvb_json_num(b, "samples", 40);
    if (e->limit > 0 && e->limit < n) n = e->limit;
    return out ? twostage_generate(e->seed, n, (int)kvb_json_num(b, "min_pairs", 40), (int)kvb_json_num(b, "max_pairs", 200),
                                   jtrue(b, "cot"), out, err, err_len)
               : -1;
}

static int load_recall(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    kvb_samples *out = e->add_task(e->add_ctx, "recall", "recall", KVB_JK_NONE, err, err_len);
    int n = (int)kvb_json_num(b, "dialogues", 20);
    if (e->limit > 0 && e->limit < n) n = e->limit;
    return out ? recall_generate(e->seed, n, (int)kvb_json_num(b, "rounds", 12), out, err, err_len) : -1;
}

static int load_niah(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    /* every entry is a cell of the grid: as many as the suite lists, each a number, none dropped */
    const cJSON *L = cJSON_GetObjectItemCaseSensitive(b, "lengths"), *D = cJSON_GetObjectItemCaseSensitive(b, "depths");
    int nl = cJSON_IsArray(L) ? cJSON_GetArraySize(L) : 0, nd = cJSON_IsArray(D) ? cJSON_GetArraySize(D) : 0;
    if (!nl || !nd) return ERR("suite %s: niah needs non-empty \"lengths\" and \"depths\" arrays", e->suite_path);
    for (int i = 0; i < nl; i++) {
        const cJSON *x = cJSON_GetArrayItem(L, i);
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 1 ||
            x->valuedouble > e->n_ctx_train)
            return ERR("suite %s: niah \"lengths\"[%d] must be an integer in [1, %d] (tokens; the model's context)",
                       e->suite_path, i, e->n_ctx_train);
    }
    for (int i = 0; i < nd; i++) {
        const cJSON *x = cJSON_GetArrayItem(D, i);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble <= 100))
            return ERR("suite %s: niah \"depths\"[%d] must be a number in [0, 100] (percent)", e->suite_path, i);
    }
    int judged = jtrue(b, "judge");
    if (judged && !e->have_judge)
        return ERR("niah: \"judge\": true needs a judge (--judge-url URL, e.g. of kvbench serve, or the suite's \"judge\")");
    char hay[1024] = "";
    const char *h = kvb_json_str(b, "haystack", NULL);
    if (h) EXPAND(h, hay, "niah \"haystack\"");
    int *lengths = malloc((size_t)nl * sizeof *lengths);
    double *depths = malloc((size_t)nd * sizeof *depths);
    if (!lengths || !depths) return free(lengths), free(depths), ERR("out of memory");
    for (int i = 0; i < nl; i++) lengths[i] = cJSON_GetArrayItem(L, i)->valueint;
    for (int i = 0; i < nd; i++) depths[i] = cJSON_GetArrayItem(D, i)->valuedouble;
    kvb_samples *out = e->add_task(e->add_ctx, "niah", "niah", judged ? KVB_JK_RUBRIC : KVB_JK_NONE, err, err_len);
    int rc = out ? niah_generate(h ? hay : NULL, lengths, nl, depths, nd, NULL, NULL, NULL, e->count_tokens, e->tok_ctx,
                                 out, err, err_len)
                 : -1;
    free(lengths), free(depths);
    if (!rc && e->limit > 0 && out->n > e->limit) kvb_samples_truncate(out, e->limit);
    return rc;
}

static int load_longbench(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    char data_dir[1024], cfg_dir[1024], path[1024];
    EXPAND(kvb_json_str(b, "data_dir", "$KVB_DATA/longbench/data"), data_dir, "longbench \"data_dir\"");
    EXPAND(kvb_json_str(b, "config_dir", "$KVB_DATA/longbench/config"), cfg_dir, "longbench \"config_dir\"");
    const cJSON *tasks = cJSON_GetObjectItemCaseSensitive(b, "tasks"), *x;
    int longbench_e = jtrue(b, "e");
    /* "spread": the --limit / "limit" records spread over the file; hidden: context and question apart */
    int flags = (jtrue(b, "spread") ? LB_SPREAD : 0) | (!strcmp(kvb_json_str(b, "question", "visible"), "hidden") ? LB_HIDDEN : 0);
    cJSON_ArrayForEach(x, tasks) {
        if (!cJSON_IsString(x)) continue;
        if (lb_data_path(data_dir, x->valuestring, longbench_e, path, sizeof path)) return ERR("path too long");
        if (!file_exists(path)) {
            char hint[1400];
            kvb_data_hint("longbench", hint, sizeof hint);
            if (e->optional) { fprintf(stderr, "skipping LongBench %s: %s not found (%s)\n", x->valuestring, path, hint); continue; }
            return ERR("LongBench task %s: %s not found (%s)", x->valuestring, path, hint);
        }
        char msg[256];
        if (kvb_score_check_task(x->valuestring, msg, sizeof msg)) {
            if (e->optional) { fprintf(stderr, "skipping LongBench %s: %s\n", x->valuestring, msg); continue; }
            return ERR("%s", msg);
        }
        kvb_samples *out = e->add_task(e->add_ctx, x->valuestring, "longbench", KVB_JK_NONE, err, err_len);
        if (!out || lb_load_ex(path, x->valuestring, cfg_dir, e->limit, flags, out, err, err_len)) return -1;
    }
    return 0;
}

/* LongMemEval and ShareGPT: one file, every sample judged */
static int load_judged(const kvb_bench_env *e, const cJSON *b, const char *type, kvb_judge_kind kind, char *err,
                       size_t err_len) {
    char path[1024];
    EXPAND(kvb_json_str(b, "path", ""), path, "\"path\"");
    if (!file_exists(path)) {
        char hint[1400];
        kvb_data_hint(type, hint, sizeof hint);
        if (e->optional) { fprintf(stderr, "skipping %s: %s not found (%s)\n", type, path, hint); return 0; }
        return ERR("%s: %s not found (%s)", type, path, hint);
    }
    if (!e->have_judge) {
        if (e->optional) { fprintf(stderr, "skipping %s: it is scored by a judge and none is configured (--judge-url)\n", type); return 0; }
        return ERR("%s is scored by a judge: give --judge-url URL (an OpenAI-compatible server, e.g. kvbench serve) or the suite's \"judge\"", type);
    }
    if (e->ready_judge && e->ready_judge(e->add_ctx, kind, err, err_len)) return -1;
    int lme = kind == KVB_JK_LONGMEMEVAL;
    kvb_samples got = {0};
    int rc = lme ? lme_load(path, kvb_json_str(b, "format", "json"), jtrue(b, "cot"), e->limit, &got, err, err_len)
                 : sharegpt_load(path, e->limit, &got, err, err_len);
    if (rc) return -1;
    const char *name = lme ? (got.n ? got.v[0].task : "longmemeval") : "sharegpt";
    kvb_samples *out = e->add_task(e->add_ctx, name, type, kind, err, err_len);
    if (!out) { kvb_samples_free(&got); return -1; }
    *out = got;
    return 0;
}

static int load_longmemeval(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    return load_judged(e, b, "longmemeval", KVB_JK_LONGMEMEVAL, err, err_len);
}

static int load_sharegpt(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    return load_judged(e, b, "sharegpt", KVB_JK_QUALITY, err, err_len);
}

/* A filter of a longbench_v2 entry: an array of strings, each one of allowed (NULL: any string); *n = its length. */
static int string_list(const kvb_bench_env *e, const cJSON *b, const char *key, const char *const *allowed, int n_allowed,
                       const char **out, int cap, int *n, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key), *x;
    *n = 0;
    if (!v) return 0;
    if (!cJSON_IsArray(v) || !cJSON_GetArraySize(v) || cJSON_GetArraySize(v) > cap)
        return ERR("suite %s: longbench_v2 \"%s\" must be a non-empty array of at most %d strings", e->suite_path, key, cap);
    cJSON_ArrayForEach(x, v) {
        int ok = cJSON_IsString(x) && n_allowed == 0;
        for (int i = 0; cJSON_IsString(x) && i < n_allowed; i++) ok |= !strcmp(x->valuestring, allowed[i]);
        if (!ok) return ERR("suite %s: longbench_v2 \"%s\" holds %s%s%s%s", e->suite_path, key,
                            cJSON_IsString(x) ? "\"" : "", cJSON_IsString(x) ? x->valuestring : "a non-string",
                            cJSON_IsString(x) ? "\"" : "", n_allowed ? ", not one of its values" : "");
        out[(*n)++] = x->valuestring;
    }
    return 0;
}

/* {"type": "longbench_v2", "path": "$KVB_DATA/longbench-v2/data.json", "cot": false, "samples": N, "length": [...],
 * "difficulty": [...], "domain": [...], "optional": true} */
static int load_longbench_v2(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    static const char *const LEN[] = {"short", "medium", "long"}, *const DIFF[] = {"easy", "hard"};
    const char *lens[3], *diffs[2], *doms[16];
    lbv2_opts o = {.cot = jtrue(b, "cot"), .length = lens, .difficulty = diffs, .domain = doms};
    if (string_list(e, b, "length", LEN, 3, lens, 3, &o.n_length, err, err_len) ||
        string_list(e, b, "difficulty", DIFF, 2, diffs, 2, &o.n_difficulty, err, err_len) ||
        string_list(e, b, "domain", NULL, 0, doms, 16, &o.n_domain, err, err_len))
        return -1;
    o.limit = (int)kvb_json_num(b, "samples", 0);
    if (e->limit > 0 && (o.limit <= 0 || e->limit < o.limit)) o.limit = e->limit;
    char path[1024];
    EXPAND(kvb_json_str(b, "path", "$KVB_DATA/longbench-v2/data.json"), path, "longbench_v2 \"path\"");
    if (!file_exists(path)) {
        const char *hint = "the official data.json of THUDM/LongBench-v2 on the Hugging Face Hub";
        if (e->optional) { fprintf(stderr, "skipping LongBench v2: %s not found (%s)\n", path, hint); return 0; }
        return ERR("LongBench v2: %s not found (%s)", path, hint);
    }
    kvb_samples *out = e->add_task(e->add_ctx, o.cot ? "longbench_v2_cot" : "longbench_v2", "longbench_v2", KVB_JK_NONE, err, err_len);
    return out ? lbv2_load(path, &o, out, err, err_len) : -1;
}

static const char *longbench_bin(const kvb_sample *s) { return lb_e_bin(s->length); }
static const char *longbench_v2_bin(const kvb_sample *s) { return lbv2_length_bin(s->length); }

/* The keys each loader reads (cJSON_GetObjectItemCaseSensitive, kvb_json_str/num, jtrue, string_list); the runner's
 * own (runner.c: load_benchmark, kvb_run_suite) are COMMON. */
static const char *const COMMON[] = {"type", "limit", "optional", "question", "max_new_tokens", "ignore_eos", NULL};
static const char *const K_2STAGE[] = {"samples", "min_pairs", "max_pairs", "cot", NULL};
static const char *const K_RECALL[] = {"dialogues", "rounds", NULL};
static const char *const K_NIAH[] = {"lengths", "depths", "haystack", "judge", NULL};
static const char *const K_RULER[] = {"lengths", "tasks", "samples", "haystack", "words_dir", "squad", "hotpotqa",
                                      "per_query", NULL}; /* synth_suite.c */
static const char *const K_INFBENCH[] = {"lengths", "tasks", "samples", "path", "data_dir", "queries_per_context",
                                         NULL}; /* synth_suite.c */
static const char *const K_LONGBENCH[] = {"tasks", "data_dir", "config_dir", "e", "spread", NULL};
static const char *const K_LONGBENCH_V2[] = {"path", "cot", "samples", "length", "difficulty", "domain", NULL};
static const char *const K_SCBENCH[] = {"tasks", "path", "mode", "samples", "max_turns", "kv_reuse", "max_context_tokens",
                                        NULL}; /* scbench.c scb_bench_load */
static const char *const K_LONGMEMEVAL[] = {"path", "format", "cot", NULL};
static const char *const K_SHAREGPT[] = {"path", NULL};

const char *const *kvb_benchmark_common_keys(void) { return COMMON; }

static const kvb_benchmark BENCHMARKS[] = {
    /* type, loader, prompt builder, scorer (NULL: judged), judge kind, length bin, entry keys */
    {"2stage", load_2stage, kvb_prompt_single, kvb_score_substring, KVB_JK_NONE, NULL, K_2STAGE},
    {"recall", load_recall, kvb_prompt_dialogue, kvb_score_substring, KVB_JK_NONE, NULL, K_RECALL},
    {"niah", load_niah, kvb_prompt_single, kvb_score_substring, KVB_JK_NONE, NULL, K_NIAH},
    {"ruler", kvb_synth_load_ruler, kvb_prompt_single, kvb_score_ruler, KVB_JK_NONE, NULL, K_RULER},
    {"infinitebench", kvb_synth_load_infbench, kvb_prompt_single, kvb_score_infbench, KVB_JK_NONE, NULL, K_INFBENCH},
    {"longbench", load_longbench, kvb_prompt_single, kvb_score_longbench, KVB_JK_NONE, longbench_bin, K_LONGBENCH},
    {"longbench_v2", load_longbench_v2, kvb_prompt_single, kvb_score_longbench_v2, KVB_JK_NONE, longbench_v2_bin, K_LONGBENCH_V2},
    /* a session's first turn is one prompt, its later turns dialogues */
    {"scbench", scb_bench_load, kvb_prompt_build, scb_score, KVB_JK_NONE, NULL, K_SCBENCH},
    {"longmemeval", load_longmemeval, kvb_prompt_single, NULL, KVB_JK_LONGMEMEVAL, NULL, K_LONGMEMEVAL},
    {"sharegpt", load_sharegpt, kvb_prompt_dialogue, NULL, KVB_JK_QUALITY, NULL, K_SHAREGPT},
};
#define N_BENCHMARKS ((int)(sizeof BENCHMARKS / sizeof BENCHMARKS[0]))

const kvb_benchmark *kvb_benchmark_find(const char *type) {
    for (int i = 0; type && i < N_BENCHMARKS; i++)
        if (!strcmp(BENCHMARKS[i].type, type)) return &BENCHMARKS[i];
    return NULL;
}

int kvb_benchmark_count(void) { return N_BENCHMARKS; }
const kvb_benchmark *kvb_benchmark_at(int i) { return i >= 0 && i < N_BENCHMARKS ? &BENCHMARKS[i] : NULL; }

void kvb_benchmark_names(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < N_BENCHMARKS && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", BENCHMARKS[i].type);
}
