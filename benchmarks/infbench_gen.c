/* infbench_gen.c — InfiniteBench's synthetic tasks (infbench.h), following OpenBMB/InfiniteBench
 * data/construct_synthetic_dataset.py (build_passkey, build_number_string, build_kv_retrieval) and
 * src/prompt.py (yarn_mistral_templates), read, not copied. Choices: the haystack size is fitted to a token
 * length instead of the official fixed line counts (5220 noise lines / 2500 pairs for 128K); kv_retrieval's
 * UUID pairs are drawn here (the official file of pre-drawn pairs is not public); kvbench's splitmix64 PRNG. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/infbench.h"

static const char NOISE[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n";
static const char PASSKEY_T1[] = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I "
                                 "will quiz you about the important information.\n\n";
static const char NUMSTR_T1[] = "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you "
                                "about the important information there.\n\n";
static const char KV_T1[] = "Extract the value corresponding to the specified key in the JSON object below.\n\n";

typedef struct {
    int kind; /* 0 passkey, 1 number_string, 2 kv_retrieval */
    char key[48];
    char (*pairs)[2][37];
    int n_pairs;
} gen;

static void uuid4(uint64_t *rng, char *out) {
    uint64_t hi = kvb_rng_next(rng), lo = kvb_rng_next(rng);
    hi = (hi & ~0xf000ULL) | 0x4000ULL;
    lo = (lo & ~(0xc000ULL << 48)) | (0x8000ULL << 48);
    snprintf(out, 37, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(hi >> 32), (unsigned)((hi >> 16) & 0xffff),
             (unsigned)(hi & 0xffff), (unsigned)(lo >> 48), (unsigned long long)(lo & 0xffffffffffffULL));
}

/* context and question for haystack size n with the needle after `at` units */
static void build(const gen *g, int n, int at, kvb_sb *ctx, kvb_sb *q) {
    if (g->kind < 2) {
        for (int j = 0; j < n; j++) {
            if (j == at) {
                if (g->kind == 0) kvb_sb_addf(ctx, "The pass key is %s. Remember it. %s is the pass key.\n", g->key, g->key);
                else kvb_sb_addf(ctx, "The sequence of digits is %s. Remember it. %s is the sequence of digits.\n", g->key, g->key);
            }
            kvb_sb_adds(ctx, NOISE);
        }
        if (at >= n) {
            if (g->kind == 0) kvb_sb_addf(ctx, "The pass key is %s. Remember it. %s is the pass key.\n", g->key, g->key);
            else kvb_sb_addf(ctx, "The sequence of digits is %s. Remember it. %s is the sequence of digits.\n", g->key, g->key);
        }
        kvb_sb_addf(q, "\n\n%s\n\n%s", g->kind == 0 ? "What is the pass key?" : "What is the sequence of digits?",
                    g->kind == 0 ? "The pass key is" : "The sequence of digits is");
    } else {
        kvb_sb_adds(ctx, "JSON data:\n{");
        for (int j = 0; j < n; j++) kvb_sb_addf(ctx, "%s\"%s\": \"%s\"", j ? ", " : "", g->pairs[j][0], g->pairs[j][1]);
        kvb_sb_adds(ctx, "}");
        kvb_sb_addf(q, "\n\n\nKey: \"%s\"\nThe value associated with the specified key is: ", g->pairs[at < n ? at : n - 1][0]);
    }
}

static int64_t prompt_tokens(const gen *g, int n, int at, kvb_count_tokens_fn count, void *ctx) {
    kvb_sb b = {0}, c = {0}, q = {0};
    build(g, n, at, &c, &q);
    kvb_sb_adds(&b, g->kind == 0 ? PASSKEY_T1 : g->kind == 1 ? NUMSTR_T1 : KV_T1);
    kvb_sb_adds(&b, c.p ? c.p : "");
    kvb_sb_adds(&b, q.p ? q.p : "");
    char *s = kvb_sb_take(&b);
    kvb_sb_free(&c);
    kvb_sb_free(&q);
    int64_t t = s ? count(ctx, s) : -1;
    free(s);
    return t;
}

/* The key of the next sample: 5 random digits (passkey), or number_string's 10 digits (5 random, then
 * keys.insert(pos, keys[pos]) five times with pos = randint(0, 5 + k - 1)). */
static void draw_key(gen *g, uint64_t *rng) {
    if (g->kind == 0) snprintf(g->key, sizeof g->key, "%05d", (int)kvb_rng_below(rng, 100000));
    else if (g->kind == 1) {
        char d[11];
        int n = 5;
        for (int k = 0; k < 5; k++) d[k] = (char)('0' + kvb_rng_below(rng, 10));
        for (int k = 0; k < 5; k++, n++) {
            int pos = (int)kvb_rng_below(rng, (uint64_t)(5 + k));
            memmove(d + pos + 1, d + pos, (size_t)(n - pos));
            d[pos] = d[pos + 1];
        }
        d[10] = 0;
        snprintf(g->key, sizeof g->key, "%s", d);
    }
}

/* The largest haystack (units: noise lines or pairs) whose prompt with the needle at depth frac fits `length`
 * with max_new tokens: doubling, then a binary search (tokens grow with it); kv_retrieval's pairs are drawn anew.
 * The size in *n_out; 0, -1 (out of memory or the counter failed), or -2 + err (length too short). */
static int fit_haystack(gen *g, int length, int max_new, double frac, kvb_count_tokens_fn count, void *tok_ctx,
                        uint64_t *rng, int *n_out, char *err, size_t err_len) {
    int lo = 1, hi = 1, hi_cap = 1 << 20;
    if (g->kind == 2) {
        free(g->pairs);
        g->n_pairs = 0;
        g->pairs = NULL;
    }
    for (;;) { /* grow hi until too long */
        if (g->kind == 2 && hi > g->n_pairs) {
            int want = hi * 2;
            void *np = realloc(g->pairs, (size_t)want * sizeof *g->pairs);
            if (!np) return -1;
            g->pairs = np;
            for (int j = g->n_pairs; j < want; j++) uuid4(rng, g->pairs[j][0]), uuid4(rng, g->pairs[j][1]);
            g->n_pairs = want;
        }
        int64_t t = prompt_tokens(g, hi, (int)(frac * hi + 0.5), count, tok_ctx);
        if (t < 0) return -1;
        if (t + max_new > length || hi >= hi_cap) break;
        lo = hi;
        hi *= 2;
    }
    if (prompt_tokens(g, lo, (int)(frac * lo + 0.5), count, tok_ctx) + max_new > length) {
        kvb_seterr(err, err_len, "infinitebench %s: length %d is too short",
                   g->kind == 0 ? "passkey" : g->kind == 1 ? "number_string" : "kv_retrieval", length);
        return -2;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        int64_t t = prompt_tokens(g, mid, (int)(frac * mid + 0.5), count, tok_ctx);
        if (t >= 0 && t + max_new <= length) lo = mid;
        else hi = mid;
    }
    *n_out = lo;
    return 0;
}

/* Sample i of the task: the template, the haystack of n units with the needle after `at`. 0 / -1 (OOM). */
static int push_sample(const gen *g, const char *task, int length, int i, int n, int at, const char *group,
                       int max_new, kvb_count_tokens_fn count, void *tok_ctx, kvb_samples *out) {
    kvb_sb c = {0}, q = {0}, p = {0};
    build(g, n, at, &c, &q);
    kvb_sample s;
    kvb_sample_init(&s);
    kvb_sb_adds(&p, g->kind == 0 ? PASSKEY_T1 : g->kind == 1 ? NUMSTR_T1 : KV_T1);
    kvb_sb_adds(&p, c.p ? c.p : "");
    kvb_sb_adds(&p, q.p ? q.p : "");
    s.prompt = kvb_sb_take(&p);
    s.context = kvb_sb_take(&c);
    s.question = kvb_sb_take(&q);
    char id[64], qt[32];
    snprintf(id, sizeof id, "%s_%d_%d", task, length, i);
    snprintf(qt, sizeof qt, "len=%d", length);
    s.id = kvb_strdup(id);
    s.task = kvb_strdup(task);
    s.qtype = kvb_strdup(qt);
    s.group = kvb_strdup(group);
    s.max_new_tokens = max_new;
    s.use_chat = 1;
    s.ctx_tokens = length;
    s.depth = 100.0 * at / n;
    s.length = s.prompt ? count(tok_ctx, s.prompt) : -1;
    if (!s.prompt || !s.context || !s.question || !s.id || !s.task || !s.qtype || (group && !s.group) ||
        kvb_sample_add_answer(&s, g->kind == 2 ? g->pairs[at][1] : g->key)) {
        kvb_sample_free(&s);
        return -1;
    }
    return kvb_samples_push(out, &s);
}

int infbench_generate(const char *task, int length, int n_samples, int queries_per_context, uint64_t seed,
                      kvb_count_tokens_fn count_tokens, void *tok_ctx, kvb_samples *out, char *err, size_t err_len) {
    gen g = {0};
    if (!task || (strcmp(task, "passkey") && strcmp(task, "number_string") && strcmp(task, "kv_retrieval"))) {
        kvb_seterr(err, err_len, "infinitebench: no generator for task '%s' (passkey, number_string, kv_retrieval)", task ? task : "(null)");
        return -1;
    }
    g.kind = !strcmp(task, "passkey") ? 0 : !strcmp(task, "number_string") ? 1 : 2;
    int max_new = g.kind == 0 ? 6 : g.kind == 1 ? 12 : 50, repeat = g.kind == 0 ? 5 : g.kind == 1 ? 10 : 1;
    if (n_samples < 1 || length < 64) {
        kvb_seterr(err, err_len, "infinitebench %s: need a length >= 64 tokens and at least one sample", task);
        return -1;
    }
    int qpc = queries_per_context > 1 ? queries_per_context : 1;
    if (qpc > 1 && g.kind != 2) {
        kvb_seterr(err, err_len, "infinitebench %s: queries per context is kv_retrieval's (one needle per haystack here)", task);
        return -1;
    }
    kvb_count_tokens_fn count = count_tokens ? count_tokens : niah_count_words;
    int n0 = out->n, rc = 0, n_groups = (n_samples + qpc - 1) / qpc, n_depth = (n_groups + repeat - 1) / repeat, n = 0;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 0x494e4642ULL;
    for (int i = 0; i < n_samples && !rc; i++) {
        int gi = i / qpc, j = i % qpc, at = 0;
        char group[64];
        snprintf(group, sizeof group, "%s_%d_g%d", task, length, gi);
        if (j == 0) { /* a new haystack; its later queries ask other pairs of the same one */
            draw_key(&g, &rng);
            double frac = n_depth > 1 ? (double)(gi / repeat) / (n_depth - 1) : 0;
            if ((rc = fit_haystack(&g, length, max_new, frac, count, tok_ctx, &rng, &n, err, err_len))) break;
            at = (int)(frac * n + 0.5);
        }
        if (qpc > 1) at = (int)((j + 0.5) * n / qpc); /* the queries spread over the haystack's depth */
        if (g.kind == 2 && at >= n) at = n - 1;
        if (push_sample(&g, task, length, i, n, at, qpc > 1 ? group : NULL, max_new, count, tok_ctx, out)) rc = -1;
    }
    free(g.pairs);
    if (rc == -1) kvb_seterr(err, err_len, "infinitebench %s: out of memory or the token counter failed", task);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}
