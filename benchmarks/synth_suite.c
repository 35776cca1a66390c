/* synth_suite.c — "ruler" and "infinitebench" suite entries (synth_suite.h). */
#include "benchmarks/synth_suite.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "benchmarks/infbench.h"
#include "benchmarks/jsonl.h"
#include "benchmarks/ruler.h"
#include "benchmarks/sample.h"

static int n_samples(const kvb_bench_env *env, const cJSON *b, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "samples");
    int n = cJSON_IsNumber(v) ? v->valueint : def;
    return env->limit > 0 && env->limit < n ? env->limit : n;
}

int kvb_synth_load_ruler(const kvb_bench_env *env, const cJSON *b, char *err, size_t err_len) {
    const cJSON *L = cJSON_GetObjectItemCaseSensitive(b, "lengths"), *T = cJSON_GetObjectItemCaseSensitive(b, "tasks"), *x, *y;
    if (!cJSON_IsArray(L) || !cJSON_GetArraySize(L)) {
        kvb_seterr(err, err_len, "suite %s: ruler needs a \"lengths\" array", env->suite_path);
        return -1;
    }
    char hay[1024], words[1024], squad[1024], hotpot[1024];
    env->expand_path(kvb_json_str(b, "haystack", "$KVB_DATA/niah/PaulGrahamEssays"), hay, sizeof hay);
    env->expand_path(kvb_json_str(b, "words_dir", "$KVB_DATA/ruler/wonderwords"), words, sizeof words);
    env->expand_path(kvb_json_str(b, "squad", "$KVB_DATA/ruler/squad.json"), squad, sizeof squad);
    env->expand_path(kvb_json_str(b, "hotpotqa", "$KVB_DATA/ruler/hotpotqa.json"), hotpot, sizeof hotpot);
    int n = n_samples(env, b, 500);
    cJSON_ArrayForEach(x, L) {
        if (!cJSON_IsNumber(x) || x->valueint > env->n_ctx_train) {
            kvb_seterr(err, err_len, "suite %s: ruler lengths must be numbers within the model's context %d", env->suite_path, env->n_ctx_train);
            return -1;
        }
        for (int i = 0; i < RULER_N_TASKS; i++) {
            const char *name = ruler_task_name(i);
            int want = !cJSON_IsArray(T);
            cJSON_ArrayForEach(y, T) want |= cJSON_IsString(y) && !strcmp(y->valuestring, name);
            if (!want) continue;
            int needs = ruler_task_needs(name);
            char nouns[1100];
            snprintf(nouns, sizeof nouns, "%s/nounlist.txt", words);
            const char *qa = !strcmp(name, "qa_1") ? squad : hotpot;
            const char *missing = (needs & RULER_NEEDS_WORDS) && access(nouns, R_OK) ? words
                                : (needs & RULER_NEEDS_ESSAY) && access(hay, R_OK) ? hay
                                : (needs & RULER_NEEDS_QA) && access(qa, R_OK) ? qa : NULL;
            if (missing) {
                fprintf(stderr, "skipping RULER %s: %s not found (scripts/fetch-datasets.sh ruler)\n", name, missing);
                continue;
            }
            /* "per_query": true: niah_multiquery's queries posed one at a time over each haystack (a context
             * group: with "question": "hidden" the haystack is prefilled once) */
            int per_query = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "per_query")) && !strcmp(name, "niah_multiquery");
            char tname[64];
            snprintf(tname, sizeof tname, "%s_%d%s", name, x->valueint, per_query ? "+per_query" : "");
            kvb_samples *out = env->add_task(env->add_ctx, tname, "ruler", KVB_JK_NONE, err, err_len);
            ruler_opts ro = {name, x->valueint, n, env->seed, hay, words, qa, env->count_tokens, env->tok_ctx, per_query};
            if (!out || ruler_generate(&ro, out, err, err_len)) return -1;
        }
    }
    return 0;
}

/* One official file as the task `task` (a loader of infbench_has_loader's); an absent file is an error, or one
 * line when the entry is optional. */
static int load_infbench_file(const kvb_bench_env *env, const char *task, const char *path, int optional, int n,
                              char *err, size_t err_len) {
    if (access(path, R_OK)) {
        if (optional) {
            fprintf(stderr, "skipping InfiniteBench %s: %s not found (scripts/fetch-datasets.sh infinitebench)\n", task, path);
            return 0;
        }
        kvb_seterr(err, err_len, "InfiniteBench task %s: %s not found (scripts/fetch-datasets.sh infinitebench)", task, path);
        return -1;
    }
    kvb_samples *out = env->add_task(env->add_ctx, task, "infinitebench", KVB_JK_NONE, err, err_len);
    return out && !infbench_load(path, task, n, out, err, err_len) ? 0 : -1;
}

/* The task a file holds by its name: "<dir>/passkey.jsonl" -> "passkey" into buf; NULL if the name is not
 * "<task>.jsonl" of a task with a loader. */
static const char *task_of_file(const char *path, char *buf, size_t cap) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(base);
    if (n <= 6 || strcmp(base + n - 6, ".jsonl") || n - 6 >= cap) return NULL;
    memcpy(buf, base, n - 6);
    buf[n - 6] = 0;
    return infbench_has_loader(buf) ? buf : NULL;
}

/* {"path": FILE or DIR} (or "data_dir": DIR): the official files, tasks named as the files. A directory holds
 * DIR/<task>.jsonl for each of "tasks"; a file is one task: the one "tasks" names, else the file's own name. */
static int load_infbench_files(const kvb_bench_env *env, const cJSON *b, const cJSON *T, const char *where,
                               char *err, size_t err_len) {
    char at[1024], path[1100], own[64];
    const char *key = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(b, "path")) ? "path" : "data_dir";
    if (env->expand_path(where, at, sizeof at)) {
        kvb_seterr(err, err_len, "suite %s: infinitebench \"%s\" is longer than the %zu bytes a path may have here",
                   env->suite_path, key, sizeof at - 1);
        return -1;
    }
    int optional = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "optional")), n = n_samples(env, b, 0);
    if (env->limit > 0 && n <= 0) n = env->limit; /* no "samples": every record, or --limit's */
    const cJSON *y;
    cJSON_ArrayForEach(y, T)
        if (!cJSON_IsString(y) || !infbench_has_loader(y->valuestring)) {
            kvb_seterr(err, err_len, "suite %s: infinitebench has no loader for task %s (the official files' tasks: passkey, "
                       "number_string, kv_retrieval, longbook_choice_eng, longbook_qa_eng, math_find, code_debug, "
                       "longdialogue_qa_eng, longbook_sum_eng)", env->suite_path, cJSON_IsString(y) ? y->valuestring : "(not a string)");
            return -1;
        }
    /* an absent path is a file when it says .jsonl, else a directory (its files are then missing one by one) */
    struct stat st;
    size_t len = strlen(at);
    int is_dir = !strcmp(key, "data_dir") || (stat(at, &st) == 0 ? S_ISDIR(st.st_mode) : len < 6 || strcmp(at + len - 6, ".jsonl"));
    if (!is_dir) { /* one file, one task */
        const char *task = cJSON_GetArraySize(T) == 1 ? cJSON_GetArrayItem(T, 0)->valuestring : task_of_file(at, own, sizeof own);
        if (!task || cJSON_GetArraySize(T) > 1) {
            kvb_seterr(err, err_len, "suite %s: infinitebench \"path\" %s is one file: name its one task in \"tasks\" "
                       "(or name the file <task>.jsonl), or give the directory of <task>.jsonl files", env->suite_path, at);
            return -1;
        }
        return load_infbench_file(env, task, at, optional, n, err, err_len);
    }
    if (!cJSON_IsArray(T) || !cJSON_GetArraySize(T)) {
        kvb_seterr(err, err_len, "suite %s: infinitebench \"%s\" %s is a directory: name its files' tasks in \"tasks\"", env->suite_path, key, at);
        return -1;
    }
    cJSON_ArrayForEach(y, T) {
        if (infbench_data_path(at, y->valuestring, path, sizeof path)) {
            kvb_seterr(err, err_len, "suite %s: infinitebench \"%s\" is too long", env->suite_path, key);
            return -1;
        }
        if (load_infbench_file(env, y->valuestring, path, optional, n, err, err_len)) return -1;
    }
    return 0;
}

int kvb_synth_load_infbench(const kvb_bench_env *env, const cJSON *b, char *err, size_t err_len) {
    const cJSON *L = cJSON_GetObjectItemCaseSensitive(b, "lengths"), *T = cJSON_GetObjectItemCaseSensitive(b, "tasks"), *x, *y;
    const char *path = kvb_json_str(b, "path", NULL), *data_dir = kvb_json_str(b, "data_dir", NULL);
    if (path && data_dir) {
        kvb_seterr(err, err_len, "suite %s: infinitebench takes \"path\" or \"data_dir\", not both", env->suite_path);
        return -1;
    }
    if (path || data_dir) {
        if (L) {
            kvb_seterr(err, err_len, "suite %s: infinitebench \"lengths\" is for the generated tasks; the official files "
                       "(\"%s\") are cut to the model's context", env->suite_path, path ? "path" : "data_dir");
            return -1;
        }
        if (T && !cJSON_IsArray(T)) {
            kvb_seterr(err, err_len, "suite %s: infinitebench \"tasks\" must be an array of task names", env->suite_path);
            return -1;
        }
        return load_infbench_files(env, b, T, path ? path : data_dir, err, err_len);
    }
    if (!cJSON_IsArray(L) || !cJSON_IsArray(T)) {
        kvb_seterr(err, err_len, "suite %s: infinitebench needs \"lengths\" and \"tasks\" arrays (generated tasks), or "
                   "\"path\": the official <task>.jsonl file or their directory", env->suite_path);
        return -1;
    }
    int n = n_samples(env, b, 50);
    /* "queries_per_context": K (kv_retrieval): K queries over each haystack, one sample each (a context group) */
    const cJSON *Q = cJSON_GetObjectItemCaseSensitive(b, "queries_per_context");
    if (Q && (!cJSON_IsNumber(Q) || Q->valuedouble < 1 || Q->valuedouble > 1000 || Q->valuedouble != Q->valueint)) {
        kvb_seterr(err, err_len, "suite %s: infinitebench \"queries_per_context\" must be an integer in [1, 1000]", env->suite_path);
        return -1;
    }
    cJSON_ArrayForEach(x, L) cJSON_ArrayForEach(y, T) {
        if (!cJSON_IsNumber(x) || x->valueint > env->n_ctx_train || !cJSON_IsString(y)) {
            kvb_seterr(err, err_len, "suite %s: infinitebench lengths must fit the model's context %d and tasks be names", env->suite_path, env->n_ctx_train);
            return -1;
        }
        char tname[64];
        snprintf(tname, sizeof tname, "%s_%d", y->valuestring, x->valueint);
        kvb_samples *out = env->add_task(env->add_ctx, tname, "infinitebench", KVB_JK_NONE, err, err_len);
        if (!out || infbench_generate(y->valuestring, x->valueint, n, Q ? Q->valueint : 1, env->seed, env->count_tokens, env->tok_ctx, out, err, err_len))
            return -1;
    }
    return 0;
}
