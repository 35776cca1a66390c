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

int infbench_generate(const char *task, int length, int n_samples, uint64_t seed, kvb_count_tokens_fn count_tokens,
                      void *tok_ctx, kvb_samples *out, char *err, size_t err_len) {
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
    kvb_count_tokens_fn count = count_tokens ? count_tokens : niah_count_words;
    int n0 = out->n, rc = 0, n_depth = (n_samples + repeat - 1) / repeat, hi_cap = 1 << 20;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 0x494e4642ULL;
    for (int i = 0; i < n_samples && !rc; i++) {
        if (g.kind == 0) snprintf(g.key, sizeof g.key, "%05d", (int)kvb_rng_below(&rng, 100000)); /* 5 random digits */
        else if (g.kind == 1) {
            char d[11];
            int n = 5;
            for (int k = 0; k < 5; k++) d[k] = (char)('0' + kvb_rng_below(&rng, 10));
            for (int k = 0; k < 5; k++, n++) { /* keys.insert(pos, keys[pos]), pos = randint(0, 5 + k - 1) */
                int pos = (int)kvb_rng_below(&rng, (uint64_t)(5 + k));
                memmove(d + pos + 1, d + pos, (size_t)(n - pos));
                d[pos] = d[pos + 1];
            }
            d[10] = 0;
            snprintf(g.key, sizeof g.key, "%s", d);
        }
        /* haystack size: the largest that fits (binary search; tokens grow with it) */
        int lo = 1, hi = 1;
        if (g.kind == 2) {
            free(g.pairs);
            g.n_pairs = 0;
            g.pairs = NULL;
        }
        double frac = n_depth > 1 ? (double)(i / repeat) / (n_depth - 1) : 0;
        for (;;) { /* grow hi until too long */
            if (g.kind == 2 && hi > g.n_pairs) {
                int want = hi * 2;
                void *np = realloc(g.pairs, (size_t)want * sizeof *g.pairs);
                if (!np) { rc = -1; break; }
                g.pairs = np;
                for (int j = g.n_pairs; j < want; j++) uuid4(&rng, g.pairs[j][0]), uuid4(&rng, g.pairs[j][1]);
                g.n_pairs = want;
            }
            int64_t t = prompt_tokens(&g, hi, (int)(frac * hi + 0.5), count, tok_ctx);
            if (t < 0) { rc = -1; break; }
            if (t + max_new > length || hi >= hi_cap) break;
            lo = hi;
            hi *= 2;
        }
        if (rc) break;
        if (prompt_tokens(&g, lo, (int)(frac * lo + 0.5), count, tok_ctx) + max_new > length) {
            kvb_seterr(err, err_len, "infinitebench %s: length %d is too short", task, length);
            rc = -2;
            break;
        }
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            int64_t t = prompt_tokens(&g, mid, (int)(frac * mid + 0.5), count, tok_ctx);
            if (t >= 0 && t + max_new <= length) lo = mid;
            else hi = mid;
        }
        int n = lo, at = (int)(frac * n + 0.5);
        if (g.kind == 2 && at >= n) at = n - 1;
        kvb_sb c = {0}, q = {0}, p = {0};
        build(&g, n, at, &c, &q);
        kvb_sample s;
        kvb_sample_init(&s);
        kvb_sb_adds(&p, g.kind == 0 ? PASSKEY_T1 : g.kind == 1 ? NUMSTR_T1 : KV_T1);
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
        s.max_new_tokens = max_new;
        s.use_chat = 1;
        s.ctx_tokens = length;
        s.depth = 100.0 * at / n;
        s.length = s.prompt ? count(tok_ctx, s.prompt) : -1;
        if (!s.prompt || !s.context || !s.question || !s.id || !s.task || !s.qtype ||
            kvb_sample_add_answer(&s, g.kind == 2 ? g.pairs[at][1] : g.key)) {
            kvb_sample_free(&s);
            rc = -1;
            break;
        }
        if (kvb_samples_push(out, &s)) rc = -1;
    }
    free(g.pairs);
    if (rc == -1) kvb_seterr(err, err_len, "infinitebench %s: out of memory or the token counter failed", task);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}
