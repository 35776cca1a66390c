/* test_kvzip.c — KVzip on a tiny random model against a float64 restatement of kvpress's KVzipPress: the prompt is
 * prefilled, the reconstruction prompts are rebuilt here from kvpress's construction (repeat instruction, the previous
 * chunk's last 8 tokens after the first chunk, the chat template's assistant opening, the chunk), fed through a fork
 * whose hook captures each layer's queries and keys, and each prompt slot's score is the float64 max over the KV
 * head's query heads and the reconstruction's rows of the softmax over sinks + the chunk's slots + the
 * reconstruction so far (the first 4 slots score 1); the method must keep the top B of that score in every layer and
 * KV head (alloc=head), or kvpress's pooled top counts over each layer's heads (alloc=layer) or over everything
 * (alloc=global, its default), where heads hold different counts. Also: the extra prefill and peak KV it reports
 * are the reconstruction's token count and the KV of the prompt and a chunk's reconstruction (the tiny model has no
 * sliding window: the method reconstructs in place, the restatement on a fork of the same content); decode appends
 * after it; budget 100% keeps everything and reconstructs nothing; bad options are refused. Device-tier memory is
 * read only through the backend, so the suite also runs under KVB_GUARD=1 (test_kvzip_guard). `test_kvzip MODEL.gguf`
 * runs the restatement on another model (CTest: test_kvzip_gemma3, the seeded gemma3 model, whose sliding-window
 * layers make the method reconstruct on forks; its global layers compared, at 60 tokens). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/chat.h"
#include "engine/model.h"
#include "methods/method.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 1024 };
enum { N = 150, CHUNK = 64, SINKS = 4, B = 75 };
enum { MAXL = 64, MAXKV = 16 }; /* the other model's room (test_kvzip MODEL.gguf) */

static uint64_t rng = 29;

/* the model under test: the tiny one, or a seeded one with sliding-window layers given on the command line, where
 * the reconstruction runs on forks and only the global layers are compared */
static kvb_model *model;
static int nl, nh, nkv, hd, grp;

static int windowed(int l) { return kvb_layer_window(&model->cfg, l) != 0; }

static kvb_ctx *new_ctx(kvb_dtype dt) {
    if (model == util_tiny) return util_tiny_ctx(dt, CTX);
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = dt;
    p.n_ctx = CTX;
    p.n_threads = 2;
    p.n_batch = 64;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

static void prompt_ids(int32_t *ids) {
    const int span = (model->cfg.n_vocab < 293 ? model->cfg.n_vocab : 293) - 3; /* ids 3 .. 292 on the tiny model */
    for (int i = 0; i < N; i++) ids[i] = 3 + (int32_t)((i * 53 + (i * i) % 17) % span);
}

/* kvpress's prepare: the reconstruction of chunk [start, end) of prompt ids; its length */
static int recon_ids(const int32_t *ids, int64_t start, int64_t end, int32_t *out) {
    char err[256];
    const kvb_tokenizer *t = model->tok;
    CU_ASSERT_FATAL(t != NULL);
    int k = 0, nt = 0;
    int32_t *tk = NULL;
    const char *say = start == 0 ? "\n\nRepeat the previous context exactly."
                                 : "\n\nRepeat the part of the previous context exactly, starting with";
    CU_ASSERT_FATAL(tok_encode(t, say, strlen(say), 0, 1, &tk, &nt, err, sizeof err) == 0);
    if (nt > 0) memcpy(out, tk, (size_t)nt * sizeof *tk);
    k = nt;
    free(tk);
    if (start > 0)
        for (int64_t i = start - 8; i < start; i++) out[k++] = ids[i];
    /* the assistant opening: the template's text after a user turn's content */
    chat_msg msg = {"user", "dummy context\n#############"};
    char *text = NULL;
    CU_ASSERT_FATAL(chat_render(chat_model_kind(model->gguf, model->cfg.arch, NULL), &msg, 1, 1, NULL, &text,
                                err, sizeof err) == 0);
    const char *suffix = strstr(text, "\n#############") + 14;
    CU_ASSERT_FATAL(tok_encode(t, suffix, strlen(suffix), 0, 1, &tk, &nt, err, sizeof err) == 0);
    if (nt > 0) memcpy(out + k, tk, (size_t)nt * sizeof *tk);
    k += nt;
    free(tk);
    free(text);
    for (int64_t i = start; i < end; i++) out[k++] = ids[i];
    return k;
}

/* the reference's state while a reconstruction chunk runs through the capture fork */
static double ref[MAXL][MAXKV][N];
static int64_t ref_start, ref_end;
static kvb_dtype ref_dt;

static int capture(void *self, kvb_ctx *d, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    (void)self, (void)err, (void)err_len;
    if (windowed(layer)) return 0;
    const int64_t sink = ref_start < SINKS ? ref_start : SINKS;
    float *qh = malloc((size_t)n_q * nh * hd * sizeof *qh);
    util_dev_read(d->be, qh, q, (size_t)n_q * nh * hd * sizeof *qh);
    const double scale = d->model->cfg.attn_scale;
    for (int g = 0; g < nkv; g++) {
        util_kv_head hv = util_kv_head_copy(d->kv, layer, g);
        double *p = malloc((size_t)hv.n * sizeof *p);
        for (int r = g * grp; r < (g + 1) * grp; r++)
            for (int64_t t = 0; t < n_q; t++) {
                const float *qr = qh + ((size_t)t * nh + r) * hd;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < hv.n; j++) {
                    int in = j < sink || (j >= ref_start && j < ref_end) || (j >= N && hv.pos[j] <= d->pos[t]);
                    p[j] = NAN;
                    if (!in) continue;
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += (double)qr[e] * util_elem(hv.k, ref_dt, (size_t)j * hd + e);
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < hv.n; j++)
                    if (!isnan(p[j])) sum += exp(p[j] - mx);
                for (int64_t j = ref_start; j < ref_end; j++) {
                    double pj = exp(p[j] - mx) / sum;
                    if (pj > ref[layer][g][j]) ref[layer][g][j] = pj;
                }
            }
        free(p);
        util_kv_head_free(&hv);
    }
    free(qh);
    return 0;
}

/* The float64 scores of the prompt's slots, by the reconstruction rebuilt here; the tokens it fed. */
static int64_t ref_peak; /* the most KV occupied while a chunk was reconstructed */

static int64_t reference_scores(const int32_t *ids, kvb_dtype dt) {
    char err[256];
    kvb_ctx *c = new_ctx(dt);
    ref_dt = dt;
    int any_window = 0;
    for (int l = 0; l < nl; l++) any_window |= windowed(l);
    CU_ASSERT_FATAL(kvb_forward(c, ids, N, err, sizeof err) == 0);
    memset(ref, 0, sizeof ref);
    ref_peak = 0;
    int64_t fed = 0;
    int32_t rec[CHUNK + 256];
    for (ref_start = 0; ref_start < N; ref_start = ref_end) {
        ref_end = ref_start + CHUNK < N ? ref_start + CHUNK : N;
        int k = recon_ids(ids, ref_start, ref_end, rec);
        kvb_ctx *d = kvb_ctx_fork(c, 0, err, sizeof err);
        CU_ASSERT_FATAL(d != NULL);
        kvb_hooks h = {.pre_attend = capture};
        CU_ASSERT_FATAL(kvb_ctx_set_hooks(d, &h, err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_forward(d, rec, k, err, sizeof err) == 0);
        /* the prompt + the chunk's reconstruction, as the method holds them in place; with sliding windows its fork
         * and the context's prompt */
        int64_t held = kvc_used_bytes(d->kv, KVB_TIER_DEVICE) + (any_window ? kvc_used_bytes(c->kv, KVB_TIER_DEVICE) : 0);
        if (held > ref_peak) ref_peak = held;
        kvb_ctx_free(d);
        fed += k;
    }
    for (int l = 0; l < nl; l++)
        for (int g = 0; g < nkv; g++)
            for (int j = 0; j < SINKS; j++) ref[l][g][j] = 1.0;
    kvb_ctx_free(c);
    return fed;
}

static int64_t described(kvb_method *m, const char *key) {
    char desc[256];
    m->def->describe(m, desc, sizeof desc);
    const char *at = strstr(desc, key);
    CU_ASSERT_FATAL(at != NULL);
    return atoll(at + strlen(key));
}

/* kvpress's allocations of b x heads: "head" (b each), "layer" (the top b x heads of each layer's heads together),
 * "global" (the top b x heads x global layers of every score together); a local layer's rows are never kept. The
 * reference's kept positions per layer and head. */
static int reference_keep(const char *alloc, int64_t b, int32_t want[MAXL][MAXKV][N], int64_t count[MAXL][MAXKV]) {
    static double pool[MAXL * MAXKV * N];
    static int32_t top[MAXL * MAXKV * N];
    const int per_layer = !strcmp(alloc, "layer"), global = !strcmp(alloc, "global");
    int n_global = 0;
    for (int l = 0; l < nl; l++) n_global += !windowed(l);
    const int64_t rows = (int64_t)nl * nkv, width = global ? rows * N : per_layer ? (int64_t)nkv * N : N;
    const int64_t k = global ? b * nkv * n_global : per_layer ? b * nkv : b;
    int near_ties = 0;
    memset(count, 0, sizeof(int64_t) * MAXL * MAXKV);
    for (int64_t at = 0; at < rows * N; at += width) { /* one pool: a head, a layer or everything */
        int skip = 0;
        for (int64_t i = 0; i < width; i++) {
            const int64_t row = (at + i) / N;
            const int l = (int)(row / nkv), g = (int)(row % nkv);
            pool[i] = windowed(l) ? -INFINITY : ref[l][g][(at + i) % N];
            skip |= !global && windowed(l);
        }
        if (skip) continue;
        double margin = 1;
        util_topk_ref(pool, width, k, top, &margin, NULL);
        near_ties += margin < 1e-5;
        for (int64_t i = 0; i < k; i++) { /* ascending: each head's positions in order */
            const int64_t flat = at + top[i], row = flat / N;
            const int l = (int)(row / nkv), g = (int)(row % nkv);
            want[l][g][count[l][g]++] = (int32_t)(flat % N);
        }
    }
    return near_ties;
}

static void check_keeps_the_most_attended(kvb_dtype dt, const char *alloc) {
    char err[256], opts[64];
    static int32_t want[MAXL][MAXKV][N];
    static int64_t count[MAXL][MAXKV];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *c = new_ctx(dt);
    snprintf(opts, sizeof opts, "chunk=64,alloc=%s", alloc);
    /* half the tiny model's cache; on a hybrid one a share leaves its few global layers little, so 60 tokens */
    kvb_method *m = util_make_method("kvzip", c, model == util_tiny ? "50%" : "60", opts);
    int64_t b = 0;
    CU_ASSERT_FATAL(kvb_method_budget_tokens(m, N, &b, err, sizeof err) == 0); /* kvbench's rule for B */
    const int64_t fed = reference_scores(ids, dt);
    CU_ASSERT_EQUAL(reference_keep(alloc, b, want, count), 0); /* no boundary a float rounding could flip */
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0); /* verified at the end of prefill */
    int32_t pos[CTX];
    int mismatches = 0, uneven = 0;
    for (int l = 0; l < nl; l++)
        for (int g = 0; g < nkv && !windowed(l); g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), count[l][g]);
            mismatches += memcmp(pos, want[l][g], (size_t)count[l][g] * sizeof *pos) != 0;
            uneven += count[l][g] != b;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    if (strcmp(alloc, "head") && model == util_tiny) CU_ASSERT(uneven > 0); /* pooled: the heads hold different counts */
    CU_ASSERT_EQUAL(described(m, "extra_prefill_tokens="), fed); /* the cost it reports is what it fed */
    CU_ASSERT(fed > N);
    CU_ASSERT_EQUAL(described(m, "recon_kv_peak_bytes="), ref_peak);
    CU_ASSERT_EQUAL(c->n_past, N); /* the reconstruction left the context as the prefill did */
    for (int t = 0; t < 3; t++) { /* decode appends; the per-layer claim holds */
        int32_t id = 5 + t;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_keeps_the_most_attended_f32(void) { check_keeps_the_most_attended(KVB_F32, "head"); }

/* an f16 store: the reference reads the same f16 keys */
static void test_keeps_the_most_attended_f16(void) { check_keeps_the_most_attended(KVB_F16, "head"); }

/* kvpress's default (layerwise = False) and its layerwise = True */
static void test_pooled_over_every_layer(void) { check_keeps_the_most_attended(KVB_F32, "global"); }
static void test_pooled_per_layer(void) { check_keeps_the_most_attended(KVB_F16, "layer"); }

/* Through the engine: the prefill ends at the budget (verified), decode appends after the kept tokens. */
static void test_decode_appends_after_the_kept(void) {
    char err[256];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("kvzip", c, "40", "alloc=head"); /* one chunk: 2048 covers the prompt */
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0);
    for (int s = 0; s < 4; s++) {
        int32_t id = 9 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL(util_head_positions(c, l, g, pos), 44);
            CU_ASSERT(pos[0] == 0 && pos[3] == 3);        /* the sinks */
            CU_ASSERT(pos[40] == N && pos[43] == N + 3); /* the decoded tokens, after the 40 kept */
        }
    int32_t rec[N + 256];
    CU_ASSERT_EQUAL(described(m, "extra_prefill_tokens="), recon_ids(ids, 0, N, rec)); /* one chunk */
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_full_budget_keeps_everything_reconstructs_nothing(void) {
    char err[256];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("kvzip", c, "100%", NULL);
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(util_head_positions(c, l, 1, pos), N);
    CU_ASSERT_EQUAL(described(m, "extra_prefill_tokens="), 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* A KV store not made by the forward pass has no tokens to repeat: one line, no crash. */
static void test_unknown_tokens_refused(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("kvzip", c, "50%", NULL);
    float *k = calloc((size_t)20 * NKV * HD, sizeof *k);
    int32_t p[20];
    for (int i = 0; i < 20; i++) p[i] = i;
    for (int l = 0; l < L; l++) CU_ASSERT_FATAL(kvc_append(c->kv, l, 20, k, k, p, NULL, err, sizeof err) == 0);
    c->n_past = 20;
    CU_ASSERT(kvb_ctx_end_prefill(c, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "kvzip:") != NULL);
    free(k);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* What the reconstruction reads: the context records the token at each position it read, a fork copies the record,
 * decode extends it, a reset forgets it. */
static void test_context_records_its_tokens(void) {
    char err[256];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    CU_ASSERT_FATAL(kvb_forward(c, ids, 100, err, sizeof err) == 0 && kvb_forward(c, ids + 100, 50, err, sizeof err) == 0);
    CU_ASSERT_EQUAL_FATAL(c->tokens_n, 150);
    CU_ASSERT(memcmp(c->tokens, ids, 150 * sizeof *ids) == 0);
    kvb_ctx *d = kvb_ctx_fork(c, 0, err, sizeof err);
    CU_ASSERT_FATAL(d != NULL);
    int32_t next = 7;
    CU_ASSERT_FATAL(kvb_forward(d, &next, 1, err, sizeof err) == 0);
    CU_ASSERT(d->tokens_n == 151 && d->tokens[150] == 7 && memcmp(d->tokens, ids, 150 * sizeof *ids) == 0);
    CU_ASSERT_EQUAL(c->tokens_n, 150); /* the fork's record is its own */
    kvb_ctx_reset(c);
    CU_ASSERT_EQUAL(c->tokens_n, 0);
    kvb_ctx_free(d);
    kvb_ctx_free(c);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("kvzip", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              !nd.obs_window && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("kvzip", c, "chunk=0", "chunk=0");
    util_check_refusals("kvzip", c, "sinks=-1", "sinks=-1");
    util_check_refusals("kvzip", c, "alloc=pyramid", "alloc=pyramid");
    util_check_refusals("kvzip", c, "window=4", "no option 'window'");
    kvb_ctx_free(c);
}

static void bind_model(kvb_model *m) {
    model = m;
    nl = m->cfg.n_layer, nh = m->cfg.n_head, nkv = m->cfg.n_head_kv, hd = m->cfg.head_dim, grp = nh / nkv;
}

static int setup(void) {
    const util_tiny_shape shape = {"kvzip", L, E, NH, NKV, FF, V, CTX};
    if (util_tiny_setup(&shape, &rng)) return -1;
    bind_model(util_tiny);
    return 0;
}

static int teardown(void) { return util_tiny_teardown(); }

static char other_path[1024];
static int other_setup(void) {
    char err[256];
    kvb_model *m = kvb_model_load(other_path, err, sizeof err);
    if (!m) return fprintf(stderr, "%s\n", err), -1;
    if (m->cfg.n_layer > MAXL || m->cfg.n_head_kv > MAXKV || m->cfg.n_vocab < 16 || !m->tok) {
        fprintf(stderr, "%s: over the test's room, or no tokenizer\n", other_path);
        kvb_model_free(m);
        return -1;
    }
    bind_model(m);
    return 0;
}

static int other_teardown(void) {
    kvb_model_free(model);
    return 0;
}

static void test_global_on_another_model(void) { check_keeps_the_most_attended(KVB_F32, "global"); }
static void test_head_on_another_model(void) { check_keeps_the_most_attended(KVB_F16, "head"); }

int main(int argc, char **argv) {
    CU_initialize_registry();
    if (argc == 2) { /* a seeded model with sliding-window layers (CTest: arch_models/gemma3.gguf) */
        snprintf(other_path, sizeof other_path, "%s", argv[1]);
        CU_pSuite o = CU_add_suite("kvzip on another model", other_setup, other_teardown);
        CU_add_test(o, "alloc=global, as float64 (f32)", test_global_on_another_model);
        CU_add_test(o, "alloc=head, as float64 (f16)", test_head_on_another_model);
        return util_run_suites();
    }
    CU_pSuite s = CU_add_suite("kvzip", setup, teardown);
    CU_add_test(s, "keeps the most attended in the reconstruction, as float64 (f32)", test_keeps_the_most_attended_f32);
    CU_add_test(s, "keeps the most attended in the reconstruction, as float64 (f16)", test_keeps_the_most_attended_f16);
    CU_add_test(s, "alloc=global: the top B x heads x layers of every score (kvpress's default)", test_pooled_over_every_layer);
    CU_add_test(s, "alloc=layer: the top B x heads of each layer (kvpress's layerwise)", test_pooled_per_layer);
    CU_add_test(s, "through the engine: prefill at the budget, decode appends", test_decode_appends_after_the_kept);
    CU_add_test(s, "budget 100% keeps everything and reconstructs nothing", test_full_budget_keeps_everything_reconstructs_nothing);
    CU_add_test(s, "a store without its tokens is refused with one line", test_unknown_tokens_refused);
    CU_add_test(s, "the context records its tokens, forks copy them", test_context_records_its_tokens);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
