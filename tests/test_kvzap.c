/* test_kvzap.c — KVzap (methods/kvzap.c) on a tiny random model, against float64 restatements of kvpress's presses:
 * the safetensors reader on files written here (F32, F16, BF16) and on malformed ones (one line each); the scorer's
 * scores against a float64 MLP (Linear, exact GELU, Linear) and linear map of the attention's input that the engine
 * hands its observer ("attn_norm"), over prefill chunks of 64; the kept sets after prefill: KVzapPress's top-k per
 * head (ties to the earlier token), AdaKVPress's allocation (each head's top int(0.2 B) protected, then the layer's
 * n_head_kv x B best), DMSPress's rule (a token is evicted when it is before the last `window` and its score is
 * below T); the scorer files that do not fit the model, the options refused, and a share that ran no scorer. Device
 * memory is read only through the backend, so the suite also runs under KVB_GUARD=1 (test_kvzap_guard). The
 * comparison with kvpress itself on the default model is test_kvpress_kept's. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "util_method.h"
#include "kernels/dtype.h"
#include "methods/kvzap.h"
#include "methods/method.h"
#include "methods/safetensors.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512, HID = 8, N = 200 };

static uint64_t rng = 71;
static char dir[] = "/tmp/kvb_kvzap_XXXXXX";
static int32_t ids[N];

/* ---- a safetensors writer ---- */

typedef struct {
    const char *name, *dtype; /* "F32", "F16", "BF16", or another (written as 4-byte elements) */
    int n_dims;
    int64_t shape[2];
    float *v; /* the values; rounded to dtype in place, so a reference reads what the file holds */
} st_t;

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static int64_t numel(const st_t *t) { return t->n_dims == 1 ? t->shape[0] : t->shape[0] * t->shape[1]; }
static int esize(const char *dt) { return strcmp(dt, "F16") && strcmp(dt, "BF16") ? 4 : 2; }

/* the file, with `pad` extra bytes of header claimed (a header longer than the file when large) */
static void write_st(const char *path, st_t *t, int n, int64_t pad) {
    char head[65536];
    int at = snprintf(head, sizeof head, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t b = numel(&t[i]) * esize(t[i].dtype);
        at += snprintf(head + at, sizeof head - (size_t)at, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld%s", t[i].name,
                       t[i].dtype, (long long)t[i].shape[0], t[i].n_dims == 2 ? "," : "");
        if (t[i].n_dims == 2) at += snprintf(head + at, sizeof head - (size_t)at, "%lld", (long long)t[i].shape[1]);
        at += snprintf(head + at, sizeof head - (size_t)at, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                       (long long)(off + b));
        off += b;
    }
    at += snprintf(head + at, sizeof head - (size_t)at, "}");
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    uint64_t hl = (uint64_t)at + (uint64_t)pad;
    for (int i = 0; i < 8; i++) fputc((int)(hl >> (8 * i)) & 0xff, f);
    fwrite(head, 1, (size_t)at, f);
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < numel(&t[i]); k++) {
            float x = t[i].v[k];
            if (!strcmp(t[i].dtype, "F16")) {
                uint16_t h = kvb_f32_to_f16(x);
                t[i].v[k] = kvb_f16_to_f32(h);
                fwrite(&h, 2, 1, f);
            } else if (!strcmp(t[i].dtype, "BF16")) {
                uint16_t h = to_bf16(x);
                t[i].v[k] = kvb_bf16_to_f32(h);
                fwrite(&h, 2, 1, f);
            } else
                fwrite(&x, 4, 1, f);
        }
    fclose(f);
}

/* ---- a scorer for the tiny model: per layer w1 [r1][E], b1 [r1], and for an MLP w2 [NKV][HID], b2 [NKV] ---- */

typedef struct {
    int hid; /* 0: linear */
    float w1[L][HID > NKV ? HID : NKV][E], b1[L][HID > NKV ? HID : NKV], w2[L][NKV][HID], b2[L][NKV];
} scorer;

static void draw(scorer *s, int hid) {
    memset(s, 0, sizeof *s);
    s->hid = hid;
    const int r1 = hid ? hid : NKV;
    for (int l = 0; l < L; l++) {
        for (int r = 0; r < r1; r++) {
            for (int i = 0; i < E; i++) s->w1[l][r][i] = util_frand(&rng, 0.5f);
            s->b1[l][r] = util_frand(&rng, 0.5f);
        }
        for (int g = 0; g < NKV && hid; g++) {
            for (int j = 0; j < hid; j++) s->w2[l][g][j] = util_frand(&rng, 1.0f);
            s->b2[l][g] = util_frand(&rng, 0.2f);
        }
    }
}

/* the scorer as KVzapModel.save_pretrained names it, in dtype; n_layer of its layers; extra: one more tensor */
static void save(scorer *s, const char *path, const char *dtype, int n_layer, const char *extra) {
    st_t t[4 * L + 1];
    char names[4 * L + 1][40];
    int n = 0;
    const int r1 = s->hid ? s->hid : NKV;
    for (int l = 0; l < n_layer; l++) {
        snprintf(names[n], sizeof names[n], s->hid ? "layers.%d.0.weight" : "layers.%d.weight", l);
        t[n] = (st_t){names[n], dtype, 2, {r1, E}, &s->w1[l][0][0]}, n++;
        snprintf(names[n], sizeof names[n], s->hid ? "layers.%d.0.bias" : "layers.%d.bias", l);
        t[n] = (st_t){names[n], dtype, 1, {r1, 0}, s->b1[l]}, n++;
        if (!s->hid) continue;
        snprintf(names[n], sizeof names[n], "layers.%d.2.weight", l);
        t[n] = (st_t){names[n], dtype, 2, {NKV, s->hid}, &s->w2[l][0][0]}, n++;
        snprintf(names[n], sizeof names[n], "layers.%d.2.bias", l);
        t[n] = (st_t){names[n], dtype, 1, {NKV, 0}, s->b2[l]}, n++;
    }
    static float one[1] = {1};
    if (extra) t[n++] = (st_t){extra, dtype, 1, {1, 0}, one};
    write_st(path, t, n, 0);
}

/* ---- the engine's attention inputs, caught by its observer ---- */

static double xn[L][N][E]; /* attn_norm rows by position */

static void on_tap(void *user, const char *name, int layer, const float *data, int64_t n_rows, int64_t row_len) {
    kvb_ctx *c = user;
    if (strcmp(name, "attn_norm") || row_len != E) return;
    float *h = malloc((size_t)n_rows * E * sizeof *h);
    util_dev_read(c->be, h, data, (size_t)n_rows * E * sizeof *h);
    for (int64_t t = 0; t < n_rows; t++) {
        const int32_t p = c->pos[t];
        for (int i = 0; i < E && p >= 0 && p < N; i++) xn[layer][p][i] = h[t * E + i];
    }
    free(h);
}

static double ref_score(const scorer *s, int l, int p, int g) {
    if (!s->hid) {
        double a = s->b1[l][g];
        for (int i = 0; i < E; i++) a += (double)s->w1[l][g][i] * xn[l][p][i];
        return a;
    }
    double out = s->b2[l][g];
    for (int j = 0; j < s->hid; j++) {
        double a = s->b1[l][j];
        for (int i = 0; i < E; i++) a += (double)s->w1[l][j][i] * xn[l][p][i];
        out += (double)s->w2[l][g][j] * 0.5 * a * (1.0 + erf(a / sqrt(2.0)));
    }
    return out;
}

/* A prefill of the N ids on a context running the scorer at path through a share (the observer catching the
 * attention inputs); *base and *share are the caller's. */
static void prefill_scored(const char *path, kvb_ctx **base, kvb_share **share) {
    char err[512];
    *base = util_tiny_ctx(KVB_F32, CTX);
    CU_ASSERT_FATAL((*share = kvb_share_create(*base, 0, 0, err, sizeof err)) != NULL);
    int rc = kvb_share_run_scorer(*share, path, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s\n", err);
    CU_ASSERT_FATAL(rc == 0);
    (*base)->tap = on_tap, (*base)->tap_user = *base;
    CU_ASSERT_FATAL(kvb_forward(*base, ids, N, err, sizeof err) == 0);
    (*base)->tap = NULL;
}

static void free_scored(kvb_ctx *base, kvb_share *share) {
    kvb_share_free(share, base);
    kvb_ctx_free(base);
}

/* the recorded scores against the float64 scorer: |a - b| <= 1e-4 (1 + |b|) */
static void check_scores(const scorer *s, const kvb_share *share) {
    const kvb_kvzap *z = kvb_share_kvzap(share);
    CU_ASSERT_FATAL(z != NULL);
    double worst = 0;
    for (int l = 0; l < L; l++) {
        int64_t n = 0;
        const float *sc = kvb_kvzap_scores(z, l, &n);
        CU_ASSERT_FATAL(n == N);
        for (int p = 0; p < N; p++)
            for (int g = 0; g < NKV; g++) {
                double want = ref_score(s, l, p, g), d = fabs(sc[p * NKV + g] - want) / (1 + fabs(want));
                if (d > worst) worst = d;
            }
    }
    CU_ASSERT(worst <= 1e-4);
    if (worst > 1e-4) fprintf(stderr, "\n  scores off by %.3g\n", worst);
}

static void test_scores_mlp_f32(void) {
    static scorer s;
    draw(&s, HID);
    char path[128];
    snprintf(path, sizeof path, "%s/mlp", dir);
    CU_ASSERT_FATAL(mkdir(path, 0755) == 0 || access(path, F_OK) == 0);
    snprintf(path, sizeof path, "%s/mlp/model.safetensors", dir);
    save(&s, path, "F32", L, NULL);
    snprintf(path, sizeof path, "%s/mlp", dir); /* the directory, as save_pretrained leaves it */
    kvb_ctx *base;
    kvb_share *share;
    prefill_scored(path, &base, &share);
    check_scores(&s, share);
    char kind[32];
    kvb_kvzap_kind(kvb_share_kvzap(share), kind, sizeof kind);
    CU_ASSERT_STRING_EQUAL(kind, "mlp hidden=8");
    free_scored(base, share);
}

static void test_scores_linear_bf16_and_f16(void) {
    const char *dts[] = {"BF16", "F16"};
    for (int k = 0; k < 2; k++) {
        static scorer s;
        draw(&s, 0);
        char path[128];
        snprintf(path, sizeof path, "%s/linear_%s.safetensors", dir, dts[k]);
        save(&s, path, dts[k], L, NULL);
        kvb_ctx *base;
        kvb_share *share;
        prefill_scored(path, &base, &share);
        check_scores(&s, share);
        free_scored(base, share);
    }
}

/* positions of layer l, head g that c holds, sorted; their count */
static int64_t held(kvb_ctx *c, int l, int g, int32_t *out) { return util_head_positions(c, l, g, out); }

/* a fork of base with kvzap (opts, budget) adopting share */
static kvb_ctx *adopt(kvb_ctx *base, kvb_share *share, const char *budget, const char *opts, kvb_method **m) {
    char err[512];
    kvb_ctx *c = kvb_ctx_fork(base, 0, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    *m = util_make_method("kvzap", c, budget, opts);
    int rc = kvb_method_adopt(*m, c, share, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s\n", err);
    CU_ASSERT_FATAL(rc == 0);
    return c;
}

static void test_threshold_keeps_what_dms_keeps(void) {
    static scorer s;
    draw(&s, HID);
    char path[128], opts[256];
    snprintf(path, sizeof path, "%s/dms.safetensors", dir);
    save(&s, path, "F32", L, NULL);
    kvb_ctx *base;
    kvb_share *share;
    prefill_scored(path, &base, &share);
    const double T[] = {-0.5, 0.0, 0.5};
    const int W[] = {16, 0, 250};
    for (int k = 0; k < 3; k++) {
        snprintf(opts, sizeof opts, "scorer=%s,threshold=%g,window=%d", path, T[k], W[k]);
        kvb_method *m;
        kvb_ctx *c = adopt(base, share, "full", opts, &m);
        const float *sc;
        int64_t n, kept = 0, evicted = 0;
        int32_t got[N], want[N];
        for (int l = 0; l < L; l++) {
            sc = kvb_kvzap_scores(kvb_share_kvzap(share), l, &n);
            for (int g = 0; g < NKV; g++) {
                int64_t nw = 0;
                for (int p = 0; p < N; p++) /* DMSPress: evicted when before the window and below T */
                    if (p >= N - W[k] || !(sc[p * NKV + g] < T[k])) want[nw++] = p;
                int64_t ng = held(c, l, g, got);
                CU_ASSERT(ng == nw && !memcmp(got, want, (size_t)nw * sizeof *got));
                kept += ng, evicted += N - ng;
            }
        }
        if (W[k] < N) CU_ASSERT(kept > 0 && evicted > 0); /* the rule did something either way */
        if (W[k] >= N) CU_ASSERT(evicted == 0);
        CU_ASSERT(strstr(m->note, "measured") != NULL);
        char err[256];
        CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0); /* the claim per layer holds */
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
    free_scored(base, share);
}

/* the k best of x (ties to the lower index), sorted ascending */
static void topk(const double *x, int n, int k, int32_t *out) { util_topk_ref(x, n, k, out, NULL, NULL); }

static int cmp_cand(const void *a, const void *b) { /* score descending, then head, then position ascending */
    const double *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? 1 : -1;
    if (x[1] != y[1]) return x[1] < y[1] ? -1 : 1;
    return (x[2] > y[2]) - (x[2] < y[2]);
}

static void test_budget_topk_and_adakv(void) {
    static scorer s;
    draw(&s, 0);
    char path[128], opts[256];
    snprintf(path, sizeof path, "%s/budget.safetensors", dir);
    save(&s, path, "F32", L, NULL);
    kvb_ctx *base;
    kvb_share *share;
    prefill_scored(path, &base, &share);
    const int B = 50;
    for (int ada = 0; ada < 2; ada++) {
        snprintf(opts, sizeof opts, "scorer=%s%s", path, ada ? ",ada=1" : "");
        kvb_method *m;
        kvb_ctx *c = adopt(base, share, "50", opts, &m);
        for (int l = 0; l < L; l++) {
            int64_t n;
            const float *sc = kvb_kvzap_scores(kvb_share_kvzap(share), l, &n);
            double x[NKV][N];
            for (int g = 0; g < NKV; g++)
                for (int p = 0; p < N; p++) x[g][p] = sc[p * NKV + g];
            int32_t want[NKV][N], got[N];
            int nw[NKV] = {0};
            if (!ada)
                for (int g = 0; g < NKV; g++) topk(x[g], N, B, want[g]), nw[g] = B;
            else { /* AdaKVPress: each head's top int(0.2 B) to +inf, then the layer's NKV x B best */
                static double cand[NKV * N][3];
                const int floor_k = (int)(0.2 * B);
                for (int g = 0; g < NKV; g++) {
                    int32_t safe[N];
                    topk(x[g], N, floor_k, safe);
                    for (int p = 0; p < N; p++) cand[g * N + p][0] = x[g][p], cand[g * N + p][1] = g, cand[g * N + p][2] = p;
                    for (int i = 0; i < floor_k; i++) cand[g * N + safe[i]][0] = INFINITY;
                }
                qsort(cand, NKV * N, sizeof cand[0], cmp_cand);
                int mark[NKV][N] = {{0}};
                for (int i = 0; i < NKV * B; i++) mark[(int)cand[i][1]][(int)cand[i][2]] = 1;
                for (int g = 0; g < NKV; g++)
                    for (int p = 0; p < N; p++)
                        if (mark[g][p]) want[g][nw[g]++] = p;
                CU_ASSERT(nw[0] + nw[1] == NKV * B && nw[0] >= floor_k && nw[1] >= floor_k);
            }
            for (int g = 0; g < NKV; g++) {
                int64_t ng = held(c, l, g, got);
                CU_ASSERT(ng == nw[g] && !memcmp(got, want[g], (size_t)ng * sizeof *got));
            }
        }
        char err[256];
        CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
    free_scored(base, share);
}

/* the method's own prefill (its pre_attend hook scoring) keeps what the share's adoption keeps */
static void test_own_prefill_equals_shared(void) {
    static scorer s;
    draw(&s, HID);
    char path[128], opts[256], err[256];
    snprintf(path, sizeof path, "%s/own.safetensors", dir);
    save(&s, path, "F32", L, NULL);
    snprintf(opts, sizeof opts, "scorer=%s,threshold=0.1,window=8", path);
    kvb_ctx *base;
    kvb_share *share;
    prefill_scored(path, &base, &share);
    kvb_method *ma, *mb;
    kvb_ctx *a = adopt(base, share, "full", opts, &ma);
    kvb_ctx *b = util_tiny_ctx(KVB_F32, CTX);
    mb = util_make_method("kvzap", b, "full", opts);
    CU_ASSERT_FATAL(kvb_method_prefill(mb, b, ids, N, err, sizeof err) == 0);
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            int32_t pa[N], pb[N];
            int64_t na = held(a, l, g, pa), nb = held(b, l, g, pb);
            CU_ASSERT(na == nb && !memcmp(pa, pb, (size_t)na * sizeof *pa));
        }
    kvb_method_free(ma, a), kvb_method_free(mb, b);
    kvb_ctx_free(a), kvb_ctx_free(b);
    free_scored(base, share);
}

/* a file of the 8-byte header length (header NULL: none), the header and the data bytes */
static void write_raw(const char *path, const char *header, const char *data) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    if (header) {
        const size_t n = strlen(header);
        for (int i = 0; i < 8; i++) fputc((int)((uint64_t)n >> (8 * i)) & 0xff, f);
        fputs(header, f);
    }
    fputs(data, f);
    fclose(f);
}

/* a file the reader or the scorer refuses: one line naming what is wrong */
static void expect_refused(const char *path, const char *want) {
    char err[512] = "";
    kvb_kvzap *z = kvb_kvzap_open(path, &util_tiny->cfg, err, sizeof err);
    CU_ASSERT(z == NULL && strstr(err, want) != NULL && !strchr(err, '\n'));
    if (z || !strstr(err, want)) fprintf(stderr, "\n  %s: got \"%s\", want \"%s\"\n", path, err, want);
    kvb_kvzap_free(z);
}

static void test_files_that_do_not_fit_are_refused(void) {
    static scorer s;
    draw(&s, HID);
    char path[160];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    save(&s, path, "F32", L - 1, NULL);
    expect_refused(path, "no tensor layers.3.0.weight");
    save(&s, path, "F32", L, "layers.4.0.weight");
    expect_refused(path, "tensor layers.4.0.weight is not part of a 4-layer KVzap MLP scorer");
    save(&s, path, "F32", L, "lm_head.weight");
    expect_refused(path, "tensor lm_head.weight is not part");
    save(&s, path, "I8", L, NULL);
    expect_refused(path, "dtype I8 is not read here");
    float w[3 * E] = {0}, b[3] = {0};
    st_t wide[] = {{"layers.0.weight", "F32", 2, {3, E}, w}, {"layers.0.bias", "F32", 1, {3, 0}, b}};
    write_st(path, wide, 2, 0);
    expect_refused(path, "layers.0.weight is [3 x 64], the model needs [2 x 64]");
    write_st(path, wide, 2, 1 << 20);
    expect_refused(path, "not a safetensors file (its header length does not fit");
    write_raw(path, NULL, "abc");
    expect_refused(path, "not a safetensors file (3 bytes)");
    write_raw(path, "[1,2]", "");
    expect_refused(path, "header is not a JSON object");
    write_raw(path, "{\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[2,64],\"data_offsets\":[0,9999]}}", "");
    expect_refused(path, "data_offsets [0, 9999] outside the file's 0 data bytes");
    write_raw(path, "{\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[2,64],\"data_offsets\":[0,4]}}", "abcd");
    expect_refused(path, "4 bytes for 128 F32 elements");
    /* one name twice: Python's reader keeps the last, this one refuses it */
    write_raw(path, "{\"layers.0.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"layers.0.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
              "abcd");
    expect_refused(path, "tensor layers.0.bias is named twice in the header");
    /* a first matrix whose width is not n_embd is refused before anything is sized by its height */
    static float tall[65536];
    st_t odd[] = {{"layers.0.0.weight", "F32", 2, {65536, 1}, tall}};
    write_st(path, odd, 1, 0);
    expect_refused(path, "layers.0.0.weight is not a [hidden x 64] matrix");
    static scorer s2;
    draw(&s2, HID);
    save(&s2, path, "F32", L, "layers.99999999999999999999.0.weight");
    expect_refused(path, "tensor layers.99999999999999999999.0.weight is not part");
    snprintf(path, sizeof path, "%s/empty_dir", dir);
    CU_ASSERT(mkdir(path, 0755) == 0 || access(path, F_OK) == 0);
    expect_refused(path, "empty_dir/model.safetensors: cannot open");
}

/* the weights are read once per file: two spellings of it share them; a file replaced in place is read again */
static void test_weights_once_per_file_and_again_when_replaced(void) {
    static scorer s;
    char path[160], other[180], kind[40], err[256];
    snprintf(path, sizeof path, "%s/cache.safetensors", dir);
    snprintf(other, sizeof other, "%s/./cache.safetensors", dir);
    draw(&s, HID);
    save(&s, path, "F32", L, NULL);
    kvb_kvzap *a = kvb_kvzap_open(path, &util_tiny->cfg, err, sizeof err), *b = kvb_kvzap_open(other, &util_tiny->cfg, err, sizeof err);
    CU_ASSERT_FATAL(a && b);
    CU_ASSERT(kvb_kvzap_take(b, a, err, sizeof err) == 0); /* the same weights */
    sleep(1); /* a later modification time, whatever the file system's resolution */
    draw(&s, 4);
    save(&s, path, "F32", L, NULL);
    kvb_kvzap *c = kvb_kvzap_open(path, &util_tiny->cfg, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_kvzap_kind(c, kind, sizeof kind);
    CU_ASSERT_STRING_EQUAL(kind, "mlp hidden=4");
    CU_ASSERT(kvb_kvzap_take(c, a, err, sizeof err) == -1 && strstr(err, "the shared prefill scored with scorer="));
    kvb_kvzap_free(a), kvb_kvzap_free(b), kvb_kvzap_free(c);
}

static void test_options_refused_and_share_without_scorer(void) {
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("kvzap", c, "scorer=random,ada=2", "ada must be 0 or 1");
    util_check_refusals("kvzap", c, "scorer=random,window=8", "window is DMS's protected tail");
    util_check_refusals("kvzap", c, "scorer=random,alpha=0.3", "has no option 'alpha'");
    util_check_refusals("kvzap", c, "ada=0", "needs scorer=DIR");
    util_check_refusals("kvzap", c, "scorer=random,ada=1,alpha=2", "alpha must be in [0, 1]");
    char err[256];
    kvb_budget b30 = {KVB_BUDGET_FRACTION, 0.3, 0}, none = {KVB_BUDGET_NONE, 0, 0};
    const char *bad_none[][2] = {{"scorer=random,threshold=inf", "threshold=inf is not a number"},
                                 {"scorer=random,threshold=1,ada=1", "ada=1 shares a budget"},
                                 {"scorer=random,threshold=1,window=-1", "window must be in"}};
    for (int k = 0; k < 3; k++) {
        kvb_opts o = {0};
        CU_ASSERT_FATAL(kvb_opts_add(&o, bad_none[k][0], err, sizeof err) == 0);
        CU_ASSERT(kvb_method_create("kvzap", c, &none, &o, err, sizeof err) == NULL && strstr(err, bad_none[k][1]));
        if (!strstr(err, bad_none[k][1])) fprintf(stderr, "\n  %s: %s\n", bad_none[k][0], err);
    }
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o, "scorer=random,threshold=1", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_create("kvzap", c, &b30, &o, err, sizeof err) == NULL && strstr(err, "give no budget"));
    /* what a shared prefill must run for it */
    kvb_method_needs nd;
    kvb_opts o2 = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o2, "scorer=some/dir", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("kvzap", &o2, &nd, err, sizeof err) == 0 && !strcmp(nd.scorer, "some/dir"));
    CU_ASSERT(kvb_method_needs_of("snapkv", NULL, &nd, err, sizeof err) == 0 && nd.scorer[0] == 0);
    kvb_ctx_free(c);
    /* a share that ran no scorer, or another one */
    for (int k = 0; k < 2; k++) {
        kvb_ctx *base = util_tiny_ctx(KVB_F32, CTX);
        kvb_share *share = kvb_share_create(base, 0, 0, err, sizeof err);
        CU_ASSERT_FATAL(share != NULL);
        if (k) CU_ASSERT_FATAL(kvb_share_run_scorer(share, "random", err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_forward(base, ids, 100, err, sizeof err) == 0);
        kvb_ctx *f = kvb_ctx_fork(base, 0, err, sizeof err);
        static scorer s;
        draw(&s, 0);
        char path[160], opts[200];
        snprintf(path, sizeof path, "%s/other.safetensors", dir);
        save(&s, path, "F32", L, NULL);
        snprintf(opts, sizeof opts, "scorer=%s", path);
        kvb_method *m = util_make_method("kvzap", f, "30%", opts);
        CU_ASSERT(kvb_method_adopt(m, f, share, err, sizeof err) == -1);
        CU_ASSERT(strstr(err, k ? "the shared prefill scored with scorer=" : "did not run one") != NULL);
        kvb_method_free(m, f);
        kvb_ctx_free(f);
        free_scored(base, share);
    }
}

static int setup(void) {
    if (!mkdtemp(dir)) return -1;
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 11) % (V - 10)) + 5;
    const util_tiny_shape shape = {"kvzap", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = system(cmd);
    return util_tiny_teardown() || rc;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("kvzap", setup, teardown);
    CU_add_test(s, "MLP scorer (F32 directory): scores = float64 Linear, exact GELU, Linear of the attention input",
                test_scores_mlp_f32);
    CU_add_test(s, "linear scorer (BF16, F16 files): scores = float64 map of the attention input",
                test_scores_linear_bf16_and_f16);
    CU_add_test(s, "threshold=T: kept = not below T or in the last window, per head (DMSPress)",
                test_threshold_keeps_what_dms_keeps);
    CU_add_test(s, "budget: top-k per head; ada=1: AdaKVPress's allocation, as float64", test_budget_topk_and_adakv);
    CU_add_test(s, "its own prefill keeps what the shared prefill's adoption keeps", test_own_prefill_equals_shared);
    CU_add_test(s, "scorer files that do not fit the model or the format: one line each",
                test_files_that_do_not_fit_are_refused);
    CU_add_test(s, "weights read once per file, again when it is replaced", test_weights_once_per_file_and_again_when_replaced);
    CU_add_test(s, "options refused; a share without its scorer refused", test_options_refused_and_share_without_scorer);
    return util_run_suites();
}
