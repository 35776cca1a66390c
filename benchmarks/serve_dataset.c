/* serve_dataset.c — a benchmark's records as bench-serve's requests (serve_dataset.h). */
#include "benchmarks/serve_dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchmarks/loaders.h"
#include "benchmarks/registry.h"
#include "benchmarks/serve_suite.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)
#define ROUND_CHUNK 512 /* the runner's default; the scheduler reads ids only, rounds do not change a request */

void kvb_serve_set_free(kvb_serve_set *s) {
    for (int i = 0; i < s->n; i++) {
        kvb_prompt_free(&s->prompts[i]);
        free(s->record_ids ? s->record_ids[i] : NULL);
        if (!s->texts) continue;
        free((char *)s->texts[i].system), free((char *)s->texts[i].user);
        for (int h = 0; h < s->texts[i].n_history; h++) free((char *)s->texts[i].history[h]);
        free((void *)s->texts[i].history);
    }
    free(s->prompts), free(s->max_new), free(s->record_ids), free(s->texts);
    memset(s, 0, sizeof *s);
}

static int alloc_set(kvb_serve_set *s, int n, int with_texts) {
    s->prompts = calloc((size_t)n, sizeof *s->prompts);
    s->max_new = calloc((size_t)n, sizeof *s->max_new);
    s->record_ids = calloc((size_t)n, sizeof *s->record_ids);
    s->texts = with_texts ? calloc((size_t)n, sizeof *s->texts) : NULL;
    return s->prompts && s->max_new && s->record_ids && (s->texts || !with_texts) ? 0 : -1;
}

/* niah[:LEN]: the generator's needle prompts, in their depth order (bench-serve's default workload). */
static int load_niah(kvb_model *m, const char *arg, int max_new, int prompt_len, int limit, int with_texts,
                     kvb_serve_set *out, char *err, size_t err_len) {
    if (arg) {
        char *end;
        long v = strtol(arg, &end, 10);
        if (end == arg || *end || v < 16 || v > (1 << 22))
            return ERR("--dataset niah:%s: expected a length in tokens from 16 to %d", arg, 1 << 22);
        prompt_len = (int)v;
    }
    const int n = limit > 0 ? limit : 8;
    snprintf(out->name, sizeof out->name, "niah:%d", prompt_len);
    if (alloc_set(out, n, with_texts)) return ERR("out of memory");
    if (kvb_serve_needle_prompts(m, prompt_len, n, out->prompts, out->texts, err, err_len)) {
        kvb_serve_texts_free(out->texts, n);
        for (int i = 0; i < n; i++) kvb_prompt_free(&out->prompts[i]);
        free(out->texts), out->texts = NULL;
        kvb_serve_set_free(out);
        return -1;
    }
    out->n = n;
    for (int i = 0; i < n; i++) {
        out->max_new[i] = max_new;
        char id[32];
        snprintf(id, sizeof id, "needle-%d", i);
        if (!(out->record_ids[i] = strdup(id))) return kvb_serve_set_free(out), ERR("out of memory");
    }
    return 0;
}

/* The messages a server is sent for sample s whose built prompt is p (max_prompt: the builder's budget). */
static int texts_of(const kvb_model *m, const kvb_sample *s, const kvb_prompt *p, int64_t max_prompt,
                    kvb_load_text *t, char *err, size_t err_len) {
    memset(t, 0, sizeof *t);
    if (s->prompt) { /* a single prompt: its cut text, which the server's template wraps */
        t->system = s->system ? strdup(s->system) : NULL;
        t->user = kvb_prompt_cut_text(m, s, max_prompt, err, err_len);
        if (!t->user) return -1;
        return s->system && !t->system ? ERR("out of memory") : 0;
    }
    /* a dialogue: the system message, the history rounds the builder kept (the first n_rounds - 1), the question */
    const char *sys = s->system;
    int n_hist = 2 * (p->n_rounds - 1), k = 0;
    char **h = n_hist ? calloc((size_t)n_hist, sizeof *h) : NULL;
    if (n_hist && !h) return ERR("out of memory");
    t->history = (const char *const *)h;
    for (int i = 0; i < s->n_turns && k < n_hist; i++) {
        if (!strcmp(s->turns[i].role, "system")) {
            if (!sys && k == 0) sys = s->turns[i].content;
            continue;
        }
        if (!(h[k++] = strdup(s->turns[i].content))) break;
    }
    t->n_history = k;
    t->system = sys ? strdup(sys) : NULL;
    t->user = strdup(s->question);
    return k == n_hist && t->user && (!sys || t->system) ? 0 : ERR("out of memory");
}

int kvb_serve_dataset_load(kvb_model *m, const char *spec, const char *config_dir, int n_ctx, int max_new,
                           int prompt_len, int limit, uint64_t seed, int with_texts, kvb_serve_set *out, char *err,
                           size_t err_len) {
    memset(out, 0, sizeof *out);
    const char *colon = strchr(spec, ':');
    const size_t kind_len = colon ? (size_t)(colon - spec) : strlen(spec);
    const char *arg = colon ? colon + 1 : NULL;
    const int lb = kind_len == 9 && !strncmp(spec, "longbench", 9), sg = kind_len == 8 && !strncmp(spec, "sharegpt", 8);
    if (config_dir && !lb) return ERR("--longbench-config goes with --dataset longbench:FILE.jsonl");
    if (kind_len == 4 && !strncmp(spec, "niah", 4))
        return load_niah(m, arg, max_new, prompt_len, limit, with_texts, out, err, err_len);
    if (!lb && !sg) return ERR("--dataset %s: expected longbench:FILE.jsonl, sharegpt:FILE.json or niah[:LEN]", spec);
    if (!arg || !*arg) return ERR("--dataset %s: the file is missing (%.*s:PATH)", spec, (int)kind_len, spec);
    if (access(arg, R_OK)) return ERR("--dataset %s: %s: %s", spec, arg, strerror(errno));
    const char *base = strrchr(arg, '/');
    base = base ? base + 1 : arg;
    kvb_samples ss = {0};
    int rc;
    if (lb) {
        char task[128], cfg[1024];
        size_t bl = strlen(base);
        if (bl < 7 || strcmp(base + bl - 6, ".jsonl") || bl - 6 >= sizeof task)
            return ERR("--dataset longbench:%s: expected a task's FILE.jsonl (e.g. data/hotpotqa.jsonl)", arg);
        memcpy(task, base, bl - 6);
        task[bl - 6] = 0;
        if (config_dir) {
            snprintf(cfg, sizeof cfg, "%s", config_dir);
        } else { /* <root>/<data folder>/<task>.jsonl -> <root>/config */
            const int dir_len = (int)(base - arg);
            if (snprintf(cfg, sizeof cfg, "%.*s../config", dir_len, arg) >= (int)sizeof cfg) return ERR("--dataset: path too long");
            if (!dir_len) snprintf(cfg, sizeof cfg, "../config");
        }
        rc = lb_load(arg, task, cfg, 0, &ss, err, err_len);
        snprintf(out->name, sizeof out->name, "longbench:%.100s", task);
    } else {
        rc = sharegpt_load(arg, 0, &ss, err, err_len);
        snprintf(out->name, sizeof out->name, "sharegpt:%.100s", base);
    }
    for (char *c = out->name; *c; c++)
        if (*c == ',' || *c == '|' || *c == '\n') *c = '_'; /* a CSV and Markdown cell */
    if (rc) return -1;
    if (ss.n == 0) return kvb_samples_free(&ss), ERR("--dataset %s: no records", spec);
    const kvb_benchmark *bm = kvb_benchmark_find(lb ? "longbench" : "sharegpt");
    /* the seeded order: Fisher-Yates over the records */
    int *order = malloc((size_t)ss.n * sizeof *order);
    const int cap = limit > 0 && limit < ss.n ? limit : ss.n;
    if (!order || alloc_set(out, cap, with_texts)) {
        free(order), kvb_samples_free(&ss), kvb_serve_set_free(out);
        return ERR("out of memory");
    }
    for (int i = 0; i < ss.n; i++) order[i] = i;
    uint64_t st = seed;
    for (int i = ss.n - 1; i > 0; i--) {
        const int j = (int)kvb_rng_below(&st, (uint64_t)i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    char why[512] = "";
    rc = 0;
    for (int r = 0; r < ss.n && out->n < cap && !rc; r++) {
        const kvb_sample *s = &ss.v[order[r]];
        int want = max_new;
        if (lb && s->max_new_tokens > 0 && s->max_new_tokens < max_new)
            want = s->max_new_tokens; /* dataset2maxlen's, capped: the runner's budget, so its prompt */
        if (sg && s->n_answers > 0 && s->answers[0][0]) { /* the recorded reply's length, capped */
            const int64_t t = kvb_count_tokens(m, s->answers[0]);
            if (t < 0) { rc = ERR("--dataset %s: record %s: the reply does not tokenize", spec, s->id ? s->id : "?"); break; }
            want = t < 1 ? 1 : t < max_new ? (int)t : max_new;
        }
        const int64_t max_prompt = (int64_t)n_ctx - want - 1; /* the runner's budget: the context less the answer */
        kvb_prompt *p = &out->prompts[out->n];
        char e[512];
        if (max_prompt < 1 || bm->prompt(m, s, max_prompt, ROUND_CHUNK, p, e, sizeof e)) {
            if (!why[0]) snprintf(why, sizeof why, "%s", max_prompt < 1 ? "--max-new leaves no room for a prompt" : e);
            out->skipped++;
            continue;
        }
        out->truncated += p->truncated != 0;
        out->max_new[out->n] = want;
        out->record_ids[out->n] = strdup(s->id ? s->id : "?");
        const int n = out->n++; /* counted now: the set frees what it holds on an error */
        if (!out->record_ids[n]) rc = ERR("out of memory");
        else if (with_texts) rc = texts_of(m, s, p, max_prompt, &out->texts[n], err, err_len);
    }
    free(order);
    kvb_samples_free(&ss);
    if (!rc && out->n == 0) rc = ERR("--dataset %s: no record fits the context of %d tokens (the first: %.300s)", spec, n_ctx, why);
    if (rc) kvb_serve_set_free(out);
    return rc;
}
