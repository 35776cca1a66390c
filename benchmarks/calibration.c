/* calibration.c — the calibration of `kvbench calibrate` and of a run (calibration.h): the papers' analyses on calibration inputs
 * (methods/calibrate.h), printed as a curve, saved as CSV for plotting, and stored in the model's profile
 * (methods/profile.h) that Round Attention, OmniKV and PoD read by default.
 *
 * Inputs: --prompt-file texts (tokenized as is; rounds = --chunk-token chunks from the start, the last chunk
 * is the question), or --samples synthetic multi-round recall dialogues (recall_generate, seed 1, --rounds
 * rounds) rendered with the model's chat template one round per segment (benchmarks/prompt.h), the final
 * question + assistant prompt being the question round. An input longer than --max-tokens drops its middle
 * rounds (head and tail rounds are kept alternately while they fit; the question is always kept).
 *
 * Rules (the choices the papers leave to reading their figures):
 *   round:  curve(l) = mean over l' > l of KL(P_q^l || P_q^l') (eps-smoothed), averaged over inputs; the
 *           watershed layer w is the first layer from which the curve stays below --frac (0.5) x its maximum
 *           (kvb_cal_watershed); stored lw = w + 1 (layers 0..w attend to every round, the selection uses
 *           layer w's attention). "Stays below" reads the paper's "after reaching a certain layer, the
 *           disparity suddenly diminishes substantially"; half the peak, not less, because the paper also
 *           allows "occasional slight increases" after it: on the default model (recall dialogues, and the
 *           README as 256-token rounds) the curve falls at layer 12 from 0.6-1.0 of its peak to at most 0.28
 *           of it, so every frac in (0.3, 0.6) gives that layer, and 0.25 would not on the README.
 *   omnikv: ability(l) = mean over the next --span layers of the attention mass (mean over heads) they put on
 *           layer l's top --topk tokens of the last query (max over heads). The span defaults to L/4: the paper's
 *           Figure 1a measures "similarity to successive n layers" with n = 8 of 32; averaging over all later
 *           layers (--span 0) favours deep layers, which have only a few near neighbours left, and picks filter
 *           layers so deep that OmniKV's full layers alone exceed the usual budgets. --n-filter layers are
 *           picked greedily by ability among 1..L-3 (a filter layer must leave a sparse layer to serve), never
 *           adjacent (kvb_cal_pick_filters).
 *   pod:    sim_g(a, b) = 1 - mean JS (log base 2) over the group's query heads and the last --q queries:
 *           the paper calls its averaged JS "similarity" with "similar when sim >= delta" and 0 <= sim <= 1;
 *           we read it as 1 - JS so that similar layers score high. Blocks by Algorithm 1 with --delta. On a
 *           hybrid model over the global layers only (PoD's blocks are; the profile's "layers" names them).
 *   qfilter: every input prefilled whole (the dialogues or texts above, flattened); per layer and KV head the
 *           first right singular vector of all its query heads' post-RoPE queries over all inputs, signed so the
 *           mean query projects positively (Q-Filters sec. 3; methods/qfilter.c). The CSV gives each head's top
 *           eigenvalue share of Q^T Q's trace: the anisotropy the paper builds on.
 *   duo:    --samples synthetic passkey prompts of --max-tokens tokens (the passkey-retrieval filler, a 5-digit
 *           key at depths (i + 0.5) / samples, seed 1, no chat template), each ending in the question "What is
 *           the pass key? The pass key is"; a head's retrieval score = the attention mass the question's rows
 *           put on the key's tokens, mean over the KV head's query heads, the rows and the prompts. This
 *           replaces DuoAttention's trained gates (the authors optimise them on synthetic passkey data) by a
 *           training-free retrieval-head score on the same kind of data (methods/duo.c). */
#include "benchmarks/calibration.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/loaders.h"
#include "benchmarks/prompt.h"
#include "engine/tokenizer.h"
#include "base/fsutil.h"
#include "methods/calibrate.h"
#include "methods/profile.h"

typedef kvb_rounds cal_input; /* round r = [round_end[r-1], round_end[r]); the last round is the question */

typedef kvb_cal_opts cal_opts;

/* The error of an analysis step into o->err; 1 (the steps' failure value). */
static int fail(const cal_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const cal_opts *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->err, o->err_len, fmt, ap);
    va_end(ap);
    return 1;
}

void kvb_cal_defaults(kvb_cal_opts *o) {
    *o = (kvb_cal_opts){.out_dir = ".", .samples = KVB_CAL_SAMPLES, .rounds = KVB_CAL_ROUNDS, .chunk = 256,
                    .max_tokens = 2500, .n_filter = 3, .span = -1, .q = 16, .frac = 0.5, .eps = 1e-6, .topk = 0.1,
                    .delta = 0.5};
}

/* What the command prints (f: stdout for results, stderr for progress); nothing when quiet. */
static void say(const cal_opts *o, FILE *f, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(const cal_opts *o, FILE *f, const char *fmt, ...) {
    if (o->quiet) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
}

static void set_result(const cal_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_result(const cal_opts *o, const char *fmt, ...) {
    if (!o->result) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->result, o->result_cap, fmt, ap);
    va_end(ap);
}

static void inputs_free(cal_input *in, int n) {
    for (int i = 0; i < n; i++) kvb_rounds_free(&in[i]);
    free(in);
}

/* Keep the question and alternately head and tail history rounds while they fit max_tokens. */
static int cap_input(cal_input *in, int64_t max_tokens, char *err, size_t err_len) {
    if (in->n <= max_tokens) return 0;
    int R = in->n_rounds;
    int64_t *len = malloc((size_t)R * sizeof *len);
    char *keep = calloc((size_t)R, 1);
    int32_t *ids = malloc((size_t)in->n * sizeof *ids);
    int64_t *ends = malloc((size_t)R * sizeof *ends);
    int rc = 0;
    if (!len || !keep || !ids || !ends) { rc = snprintf(err, err_len, "out of memory"); goto done; }
    for (int r = 0; r < R; r++) len[r] = in->round_end[r] - (r ? in->round_end[r - 1] : 0);
    int64_t used = len[R - 1];
    if (used > max_tokens) { rc = snprintf(err, err_len, "the question round alone has %lld tokens, more than --max-tokens %lld", (long long)used, (long long)max_tokens); goto done; }
    keep[R - 1] = 1;
    int i = 0, j = R - 2, head = 1, tail = 1;
    while ((head || tail) && i <= j) {
        if (head && (head = used + len[i] <= max_tokens)) used += len[i], keep[i++] = 1;
        if (tail && i <= j && (tail = used + len[j] <= max_tokens)) used += len[j], keep[j--] = 1;
    }
    int64_t n = 0;
    int nr = 0;
    for (int r = 0; r < R; r++) {
        if (!keep[r]) continue;
        int64_t from = r ? in->round_end[r - 1] : 0;
        memcpy(ids + n, in->ids + from, (size_t)len[r] * sizeof *ids);
        n += len[r];
        ends[nr++] = n;
    }
    free(in->ids);
    free(in->round_end);
    in->ids = ids, in->round_end = ends, in->n = n, in->n_rounds = nr, in->truncated = 1;
    ids = NULL, ends = NULL;
done:
    free(len);
    free(keep);
    free(ids);
    free(ends);
    return rc ? -1 : 0;
}

static int file_input(kvb_model *m, const char *path, long chunk, cal_input *in, char *err, size_t err_len) {
    size_t len = 0;
    char *text = kvb_read_file(path, &len, err, err_len);
    if (!text) return -1;
    int n = 0;
    int rc = tok_encode(m->tok, text, len, 1, 0, &in->ids, &n, err, err_len);
    free(text);
    if (rc) return -1;
    if (n < 2) return snprintf(err, err_len, "%s: fewer than 2 tokens", path), -1;
    in->n = n;
    return kvb_rounds_chunk(in, chunk, err, err_len);
}

static int dialogue_input(kvb_model *m, const kvb_sample *s, cal_input *in, char *err, size_t err_len) {
    return kvb_prompt_build(m, s, (int64_t)1 << 30, 0, in, err, err_len);
}

/* The calibration inputs, capped; NULL + o->err on failure. */
static cal_input *build_inputs(kvb_model *m, const cal_opts *o, int *n_out) {
    char err[512];
    int n = o->n_files ? o->n_files : (int)o->samples;
    cal_input *in = calloc((size_t)n, sizeof *in);
    kvb_samples ss = {0};
    if (!in) return fail(o, "calibrate: out of memory"), NULL;
    if (!o->n_files && recall_generate(1, n, (int)o->rounds, &ss, err, sizeof err)) {
        fail(o, "calibrate: %s", err);
        inputs_free(in, n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        int rc = o->n_files ? file_input(m, o->files[i], o->chunk, &in[i], err, sizeof err)
                            : dialogue_input(m, &ss.v[i], &in[i], err, sizeof err);
        if (!rc) rc = cap_input(&in[i], o->max_tokens, err, sizeof err);
        if (rc) {
            fail(o, "calibrate: input %d: %s", i + 1, err);
            kvb_samples_free(&ss);
            inputs_free(in, n);
            return NULL;
        }
    }
    kvb_samples_free(&ss);
    *n_out = n;
    return in;
}

static FILE *open_csv(const cal_opts *o, const char *suffix, char *path, size_t cap) {
    if (kvb_mkdirs(o->out_dir)) {
        fail(o, "calibrate: cannot create %s: %s", o->out_dir, strerror(errno));
        return NULL;
    }
    snprintf(path, cap, "%s/calibrate-%s%s.csv", o->out_dir, o->kind, suffix);
    FILE *f = fopen(path, "w");
    if (!f) fail(o, "calibrate: cannot write %s: %s", path, strerror(errno));
    return f;
}

static int close_csv(const cal_opts *o, FILE *f, const char *path) {
    if (fclose(f)) return fail(o, "calibrate: cannot write %s: %s", path, strerror(errno));
    say(o, stderr, "calibrate: wrote %s\n", path);
    return 0;
}

/* The per-layer table goes to DIR/calibrate-KIND.md, not stdout: ~30-90 lines would bury the result line. */
static FILE *open_table(const cal_opts *o, char *path, size_t cap) {
    snprintf(path, cap, "%s/calibrate-%s.md", o->out_dir, o->kind);
    FILE *f = fopen(path, "w"); /* out_dir exists: open_csv made it */
    if (!f) fail(o, "calibrate: cannot write %s: %s", path, strerror(errno));
    return f;
}

static int close_table(const cal_opts *o, FILE *f, const char *path) {
    if (fclose(f)) return fail(o, "calibrate: cannot write %s: %s", path, strerror(errno));
    say(o, stdout, "per-layer table: %s\n", path);
    return 0;
}

static int store(const kvb_model *m, const cal_opts *o, cJSON *section) {
    char err[512], path[1024];
    int rc = 0;
    if (!section) rc = fail(o, "calibrate: out of memory");
    else if (o->dry_run) say(o, stdout, "dry run: profile not written\n");
    else if (kvb_profile_store(m, o->kind, section, err, sizeof err) || kvb_profile_path(m, path, sizeof path, err, sizeof err))
        rc = fail(o, "calibrate: %s", err);
    else say(o, stdout, "profile: %s (section \"%s\")\n", path, o->kind);
    cJSON_Delete(section);
    return rc;
}

static cJSON *doubles(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(round(v[i] * 1e6) / 1e6));
    return a;
}

static cJSON *ints(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *base_section(const cal_opts *o, int n_inputs) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "inputs", o->n_files ? "prompt files" : "recall dialogues (seed 1)");
    cJSON_AddNumberToObject(s, "n_inputs", n_inputs);
    cJSON_AddNumberToObject(s, "max_tokens", (double)o->max_tokens);
    return s;
}

/* The global layers' numbers in order (every layer on a model without sliding windows); their count. Round's and
 * OmniKV's analyses run over them: a sliding-window layer attends only its window and runs no capture hook. */
static int global_layers(const kvb_config *cfg, int *gl) {
    int n = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        if (!kvb_layer_window(cfg, l)) gl[n++] = l;
    return n;
}

/* ---- round ---- */

static int run_round(kvb_model *m, kvb_ctx *c, const cal_opts *o, const cal_input *in, int n_in) {
    int gl[KVB_MAX_LAYERS];
    const int L = global_layers(&m->cfg, gl); /* the analysis' layers: the global ones */
    if (L < 2)
        return fail(o, "calibrate round: the model has %d global layer(s) (the others are sliding-window layers); "
                       "Round Attention needs a global watershed layer and one after it", L);
    char err[512];
    double *curve = calloc((size_t)L, sizeof *curve), *one = calloc((size_t)L, sizeof *one);
    float *P = NULL;
    int rc = 0;
    for (int i = 0; i < n_in && !rc; i++) {
        say(o, stderr, "calibrate round: input %d/%d: %lld tokens, %d rounds%s\n", i + 1, n_in, (long long)in[i].n,
            in[i].n_rounds, in[i].truncated ? " (middle rounds dropped)" : "");
        free(P);
        const int R = in[i].n_rounds > 1 ? in[i].n_rounds - 1 : 1;
        P = malloc((size_t)m->cfg.n_layer * R * sizeof *P);
        if (!curve || !one || !P) rc = fail(o, "calibrate: out of memory");
        else if (kvb_cal_round_run(c, &in[i], P, err, sizeof err))
            rc = fail(o, "calibrate: input %d: %s", i + 1, err);
        else {
            for (int g = 0; g < L; g++) memmove(P + (size_t)g * R, P + (size_t)gl[g] * R, (size_t)R * sizeof *P);
            kvb_cal_round_curve(P, L, in[i].n_rounds - 1, o->eps, one);
            for (int l = 0; l < L; l++) curve[l] += one[l] / n_in;
        }
    }
    free(P);
    free(one);
    if (rc) { free(curve); return rc; }
    const int w = gl[kvb_cal_watershed(curve, L - 1, o->frac)], n_layer = m->cfg.n_layer;
    double mx = 0;
    for (int l = 0; l < L - 1; l++) mx = curve[l] > mx ? curve[l] : mx;
    char path[1024];
    FILE *f = open_csv(o, "", path, sizeof path);
    if (!f) { free(curve); return 1; }
    fprintf(f, "layer,mean_kl_to_later_layers\n");
    char tpath[1024];
    FILE *t = open_table(o, tpath, sizeof tpath);
    if (!t) { fclose(f); free(curve); return 1; }
    fprintf(t, "round attention: mean KL(P_q^l || P_q^l') over later layers l' (%d inputs)\n\n| layer | mean KL |\n|---|---|\n", n_in);
    for (int g = 0; g < L - 1; g++) { /* rows name the model's layers (global ones only on a hybrid model) */
        fprintf(f, "%d,%.6f\n", gl[g], curve[g]);
        fprintf(t, "| %d | %.4f%s |\n", gl[g], curve[g], gl[g] == w ? " <- watershed" : "");
    }
    rc = close_csv(o, f, path);
    if (close_table(o, t, tpath)) rc = 1;
    say(o, stdout, "\nwatershed layer %d (0-based; the curve stays below %.2f x max %.4f from it on): lw = %d of %d layers%s\n",
        w, o->frac, mx, w + 1, n_layer, L < n_layer ? " (over the global layers; the others keep their windows)" : "");
    set_result(o, "watershed layer %d (lw = %d of %d layers)", w, w + 1, n_layer);
    cJSON *s = base_section(o, n_in);
    cJSON_AddNumberToObject(s, "lw", w + 1);
    cJSON_AddNumberToObject(s, "watershed_layer", w);
    cJSON_AddStringToObject(s, "rule", "first layer from which mean KL to later layers stays below frac x its maximum; lw = that layer + 1");
    cJSON_AddNumberToObject(s, "frac", o->frac);
    cJSON_AddNumberToObject(s, "eps", o->eps);
    cJSON_AddItemToObject(s, "curve", doubles(curve, L - 1));
    free(curve);
    return rc ? rc : store(m, o, s);
}

/* ---- omnikv ---- */

static int run_omnikv(kvb_model *m, kvb_ctx *c, const cal_opts *o, const cal_input *in, int n_in) {
    int gl[KVB_MAX_LAYERS];
    const int L = global_layers(&m->cfg, gl); /* the analysis' layers: the global ones (kvb_cal_omnikv_run) */
    char err[512];
    double *ab = calloc((size_t)L, sizeof *ab), *one = calloc((size_t)L, sizeof *one);
    int rc = !ab || !one ? fail(o, "calibrate: out of memory") : 0;
    for (int i = 0; i < n_in && !rc; i++) {
        say(o, stderr, "calibrate omnikv: input %d/%d: %lld tokens%s\n", i + 1, n_in, (long long)in[i].n,
            in[i].truncated ? " (middle rounds dropped)" : "");
        if (kvb_cal_omnikv_run(c, in[i].ids, in[i].n, o->topk, (int)o->span, one, err, sizeof err))
            rc = fail(o, "calibrate: input %d: %s", i + 1, err);
        for (int l = 0; l < L && !rc; l++) ab[l] += one[l] / n_in;
    }
    free(one);
    int layers[16], nf = 0;
    if (!rc) nf = kvb_cal_pick_filters(ab, L, (int)o->n_filter, layers);
    if (!rc && nf < 1) rc = fail(o, "calibrate: the model has too few %slayers for a filter layer", L < m->cfg.n_layer ? "global " : "");
    for (int k = 0; k < nf; k++) layers[k] = gl[layers[k]]; /* the model's layer numbers */
    char path[1024];
    FILE *f = rc ? NULL : open_csv(o, "", path, sizeof path);
    if (!f) { free(ab); return 1; }
    fprintf(f, "layer,filter_ability\n");
    char span[48] = "all later layers";
    if (o->span > 0) snprintf(span, sizeof span, "the next %ld layers", o->span);
    char tpath[1024];
    FILE *t = open_table(o, tpath, sizeof tpath);
    if (!t) { fclose(f); free(ab); return 1; }
    fprintf(t, "filter ability: mean attention mass %s put on a layer's top %.0f%% tokens (%d inputs)\n\n"
               "| layer | ability |\n|---|---|\n", span, 100 * o->topk, n_in);
    for (int g = 0; g < L - 1; g++) {
        int chosen = 0;
        for (int k = 0; k < nf; k++) chosen |= layers[k] == gl[g];
        fprintf(f, "%d,%.6f\n", gl[g], ab[g]);
        fprintf(t, "| %d | %.4f%s |\n", gl[g], ab[g], chosen ? " <- filter" : "");
    }
    rc = close_csv(o, f, path);
    if (close_table(o, t, tpath)) rc = 1;
    char chosen[64] = "";
    for (int k = 0, at = 0; k < nf; k++) at += snprintf(chosen + at, sizeof chosen - (size_t)at, "%s%d", k ? ";" : "", layers[k]);
    say(o, stdout, "\nfilter layers: %s (highest ability among %slayers 1..%d, no two adjacent)\n", chosen,
        L < m->cfg.n_layer ? "the global layers' " : "", L - 3);
    set_result(o, "filter layers %s (used with --method-opt layers=profile)", chosen);
    cJSON *s = base_section(o, n_in);
    cJSON_AddItemToObject(s, "layers", ints(layers, nf));
    cJSON_AddStringToObject(s, "rule", "greedy by descending filter ability among layers 1..L-3, no two adjacent");
    cJSON_AddNumberToObject(s, "topk_frac", o->topk);
    cJSON_AddNumberToObject(s, "span", (double)o->span);
    cJSON_AddItemToObject(s, "curve", doubles(ab, L - 1));
    free(ab);
    return rc ? rc : store(m, o, s);
}

/* ---- pod ---- */

/* sim is [HK][L][L] over the analysed layers gl[0..L) (the global ones); rows name the model's layers */
static int write_pod_csv(const cal_opts *o, const double *sim, const int *gl, int L, int HK) {
    char path[1024];
    FILE *f = open_csv(o, "", path, sizeof path);
    if (!f) return 1;
    fprintf(f, "layer,prev_layer");
    for (int g = 0; g < HK; g++) fprintf(f, ",sim_prev_kv%d", g);
    fputc('\n', f);
    for (int l = 1; l < L; l++) {
        fprintf(f, "%d,%d", gl[l], gl[l - 1]);
        for (int g = 0; g < HK; g++) fprintf(f, ",%.6f", sim[((int64_t)g * L + l) * L + l - 1]);
        fputc('\n', f);
    }
    if (close_csv(o, f, path)) return 1;
    if (!(f = open_csv(o, "-matrix", path, sizeof path))) return 1;
    fprintf(f, "kv_head,layer_a,layer_b,similarity\n");
    for (int g = 0; g < HK; g++)
        for (int a = 0; a < L; a++)
            for (int b = 0; b < L; b++) fprintf(f, "%d,%d,%d,%.6f\n", g, gl[a], gl[b], sim[((int64_t)g * L + a) * L + b]);
    return close_csv(o, f, path);
}

/* one KV head's blocks, base[] over the analysed layers gl[0..L) in the model's layer numbers */
static void print_blocks(const cal_opts *o, const int *base, const int *gl, int L, int n_layer, int g) {
    say(o, stdout, "kv head %d:", g);
    for (int i = 0; i < L; i++)
        if (base[i] == gl[i]) {
            int e = i;
            while (e + 1 < L && base[e + 1] == gl[i]) e++;
            say(o, stdout, e > i ? " [%d-%d]" : " [%d]", gl[i], gl[e]);
        }
    int nb = 0;
    for (int i = 0; i < L; i++) nb += base[i] == gl[i];
    say(o, stdout, "  (%d blocks, key saving %.1f%% of %slayers)\n", nb, 100.0 * (L - nb) / L, L < n_layer ? "global " : "");
}

/* The analysis runs over the global layers (kvb_cal_pod_run): PoD's blocks are formed over them, a sliding-window
 * layer keeping its window (methods/pod.c); the profile names the layers it covers ("layers"). */
static int run_pod(kvb_model *m, kvb_ctx *c, const cal_opts *o, const cal_input *in, int n_in) {
    const int HK = m->cfg.n_head_kv, G = m->cfg.n_head / HK;
    int gl[KVB_MAX_LAYERS];
    const int L = global_layers(&m->cfg, gl);
    if (L < 1) return fail(o, "calibrate pod: the model has no global layer (every layer is a sliding-window layer)");
    char err[512];
    double *sim = calloc((size_t)HK * L * L, sizeof *sim);
    int *bases = calloc((size_t)HK * L, sizeof *bases);
    int rc = !sim || !bases ? fail(o, "calibrate: out of memory") : 0;
    for (int i = 0; i < n_in && !rc; i++) {
        say(o, stderr, "calibrate pod: input %d/%d: %lld tokens, last %ld queries%s\n", i + 1, n_in,
            (long long)in[i].n, o->q, in[i].truncated ? " (middle rounds dropped)" : "");
        if (kvb_cal_pod_run(c, in[i].ids, in[i].n, (int)o->q, sim, err, sizeof err))
            rc = fail(o, "calibrate: input %d: %s", i + 1, err);
    }
    if (!rc) { /* JS sums -> similarity 1 - mean JS */
        double rows = (double)n_in * G * o->q;
        for (int64_t k = 0; k < (int64_t)HK * L * L; k++) sim[k] = 1.0 - sim[k] / rows;
        rc = write_pod_csv(o, sim, gl, L, HK);
    }
    char tpath[1024];
    FILE *t = rc ? NULL : open_table(o, tpath, sizeof tpath);
    if (!t) { free(sim); free(bases); return 1; }
    fprintf(t, "head-wise similarity of consecutive %slayers (1 - mean JS, %d inputs x %ld queries)\n\n| layers |",
            L < m->cfg.n_layer ? "global " : "", n_in, o->q);
    for (int g = 0; g < HK; g++) fprintf(t, " kv%d |", g);
    fprintf(t, "\n|---|");
    for (int g = 0; g < HK; g++) fprintf(t, "---|");
    for (int l = 1; l < L; l++) {
        fprintf(t, "\n| %d-%d |", gl[l - 1], gl[l]);
        for (int g = 0; g < HK; g++) fprintf(t, " %.3f |", sim[((int64_t)g * L + l) * L + l - 1]);
    }
    fputc('\n', t);
    if (close_table(o, t, tpath)) { free(sim); free(bases); return 1; }
    say(o, stdout, "\nblocks (delta %.2f%s):\n", o->delta, L < m->cfg.n_layer ? ", over the global layers; the others keep their windows" : "");
    char savings[128] = "";
    cJSON *b = cJSON_CreateArray(), *curve = cJSON_CreateArray(), *saving = cJSON_CreateArray();
    double *cons = malloc((size_t)L * sizeof *cons);
    for (int g = 0; g < HK && cons; g++) {
        int *base = bases + (int64_t)g * L;
        int nb = kvb_cal_group(sim + (int64_t)g * L * L, L, o->delta, base);
        for (int i = 0; i < L; i++) base[i] = gl[base[i]]; /* the model's layer numbers */
        print_blocks(o, base, gl, L, m->cfg.n_layer, g);
        size_t at = strlen(savings);
        snprintf(savings + at, sizeof savings - at, "%s%.0f%%", g ? ", " : "", 100.0 * (L - nb) / L);
        cJSON_AddItemToArray(b, ints(base, L));
        for (int l = 1; l < L; l++) cons[l - 1] = sim[((int64_t)g * L + l) * L + l - 1];
        cJSON_AddItemToArray(curve, doubles(cons, L - 1));
        cJSON_AddItemToArray(saving, cJSON_CreateNumber(round(1e6 * (L - nb) / L) / 1e6));
    }
    if (!cons) { fail(o, "calibrate: out of memory"); cJSON_Delete(b), cJSON_Delete(curve), cJSON_Delete(saving); free(sim); free(bases); return 1; }
    free(cons);
    free(sim);
    free(bases);
    set_result(o, "layer blocks of %d KV heads (delta %.2f): key saving %s of %slayers", HK, o->delta, savings,
               L < m->cfg.n_layer ? "global " : "");
    cJSON *s = base_section(o, n_in);
    cJSON_AddItemToObject(s, "layers", ints(gl, L));
    cJSON_AddItemToObject(s, "bases", b);
    cJSON_AddNumberToObject(s, "delta", o->delta);
    cJSON_AddNumberToObject(s, "q", (double)o->q);
    cJSON_AddStringToObject(s, "rule", "sim = 1 - mean JS (log2) over the layers named in layers (the global ones); Algorithm 1: a layer joins the block when sim >= delta with every layer in it");
    cJSON_AddItemToObject(s, "key_saving", saving);
    cJSON_AddItemToObject(s, "curve", curve);
    return store(m, o, s);
}

/* ---- qfilter ---- */

static int run_qfilter(kvb_model *m, kvb_ctx *c, const cal_opts *o, const cal_input *in, int n_in) {
    const int L = m->cfg.n_layer, HK = m->cfg.n_head_kv, d = m->cfg.head_dim;
    char err[512];
    if (d > 1024) return fail(o, "calibrate qfilter: head_dim %d is over 1024", d);
    const size_t heads = (size_t)L * HK;
    double *S = calloc(heads * d * d, sizeof *S), *sum = calloc(heads * d, sizeof *sum), *v = malloc((size_t)d * sizeof *v);
    double *share = calloc(heads, sizeof *share);
    float *f = malloc(heads * d * sizeof *f);
    int rc = S && sum && v && share && f ? 0 : fail(o, "calibrate: out of memory");
    for (int i = 0; i < n_in && !rc; i++) {
        say(o, stderr, "calibrate qfilter: input %d/%d: %lld tokens%s\n", i + 1, n_in, (long long)in[i].n,
            in[i].truncated ? " (middle rounds dropped)" : "");
        if (kvb_cal_qfilter_run(c, in[i].ids, in[i].n, S, sum, err, sizeof err)) rc = fail(o, "calibrate: input %d: %s", i + 1, err);
    }
    for (int l = 0; l < L && !rc; l++) {
        if (kvb_cal_qfilter_dirs(S + (size_t)l * HK * d * d, sum + (size_t)l * HK * d, HK, d, f + (size_t)l * HK * d))
            rc = fail(o, "calibrate: out of memory");
        for (int g = 0; g < HK && !rc; g++) {
            const double *a = S + ((size_t)l * HK + g) * d * d;
            double lambda = 0, trace = 0;
            for (int e = 0; e < d; e++) trace += a[(size_t)e * d + e];
            if (kvb_cal_top_eigvec(a, d, v, &lambda)) rc = fail(o, "calibrate: out of memory");
            share[(size_t)l * HK + g] = trace > 0 ? lambda / trace : 0;
        }
    }
    char path[1024], tpath[1024];
    FILE *csv = rc ? NULL : open_csv(o, "", path, sizeof path), *t = csv ? open_table(o, tpath, sizeof tpath) : NULL;
    if (!t) {
        if (csv) fclose(csv);
        free(S), free(sum), free(v), free(share), free(f);
        return 1;
    }
    fprintf(csv, "layer,kv_head,top_eigenvalue_share\n");
    fprintf(t, "Q-Filters: share of the top eigenvalue in the trace of Q^T Q per KV head (%d inputs; -: a sliding-window "
               "layer, never compressed)\n\n| layer |", n_in);
    for (int g = 0; g < HK; g++) fprintf(t, " kv%d |", g);
    fprintf(t, "\n|---|");
    for (int g = 0; g < HK; g++) fprintf(t, "---|");
    double lo = 1, hi = 0;
    for (int l = 0; l < L; l++) {
        fprintf(t, "\n| %d |", l);
        for (int g = 0; g < HK; g++) {
            double x = share[(size_t)l * HK + g];
            fprintf(csv, "%d,%d,%.6f\n", l, g, x);
            if (kvb_layer_window(&m->cfg, l)) { /* a sliding-window layer runs no method hook: no queries, no filter */
                fprintf(t, " - |");
                continue;
            }
            fprintf(t, " %.3f |", x);
            lo = x < lo ? x : lo, hi = x > hi ? x : hi;
        }
    }
    fputc('\n', t);
    rc = close_csv(o, csv, path);
    if (close_table(o, t, tpath)) rc = 1;
    say(o, stdout, "\nQ-Filters of %d layers x %d KV heads: the top direction holds %.0f%% .. %.0f%% of the queries' energy\n",
        L, HK, 100 * lo, 100 * hi);
    set_result(o, "Q-Filters of %d x %d heads (top direction %.0f%%..%.0f%% of the queries' energy)", L, HK, 100 * lo, 100 * hi);
    cJSON *sec = base_section(o, n_in), *filters = cJSON_CreateArray();
    for (int l = 0; l < L && filters; l++) {
        cJSON *row = cJSON_CreateArray();
        for (int g = 0; g < HK && row; g++) {
            double dir[1024];
            for (int e = 0; e < d && e < 1024; e++) dir[e] = f[((size_t)l * HK + g) * d + e];
            cJSON_AddItemToArray(row, doubles(dir, d));
        }
        cJSON_AddItemToArray(filters, row);
    }
    cJSON_AddItemToObject(sec, "filters", filters);
    cJSON_AddStringToObject(sec, "rule", "per layer and KV head: first right singular vector of its query heads' post-RoPE queries, signed so the mean query projects positively");
    cJSON_AddItemToObject(sec, "top_eigenvalue_share", doubles(share, (int)heads));
    free(S), free(sum), free(v), free(share), free(f);
    return rc ? rc : store(m, o, sec);
}

/* ---- duo ---- */

/* One synthetic passkey prompt of n tokens: intro, filler, the key sentence at depth, filler, question. The key's
 * digits are ids [*from, *to); the question is the last *q tokens. */
static int passkey_prompt(kvb_model *m, int64_t n, double depth, uint64_t *rng, int32_t *ids, int64_t *from, int64_t *to,
                          int *q, char *err, size_t err_len) {
    static const char *intro = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                               "I will quiz you about the important information there.\n";
    static const char *filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
    *rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
    char key[16], post[64];
    snprintf(key, sizeof key, "%05u", (unsigned)((*rng >> 33) % 100000));
    snprintf(post, sizeof post, ". Remember it. %s is the pass key.\n", key);
    const char *text[6] = {intro, filler, "The pass key is ", key, post, "\nWhat is the pass key? The pass key is"};
    int32_t *piece[6] = {0};
    int len[6] = {0}, rc = 0;
    for (int k = 0; k < 6 && !rc; k++) rc = tok_encode(m->tok, text[k], strlen(text[k]), k == 0, 0, &piece[k], &len[k], err, err_len);
    int64_t fixed = len[0] + len[2] + len[3] + len[4] + len[5], fill = n - fixed;
    if (!rc && (fill < 2 || len[1] < 1)) rc = snprintf(err, err_len, "a passkey prompt of %lld tokens has no room for filler (--max-tokens)", (long long)n) > 0;
    if (!rc) {
        int64_t before = (int64_t)(depth * (double)fill), at = 0;
        memcpy(ids, piece[0], (size_t)len[0] * sizeof *ids), at = len[0];
        for (int64_t i = 0; i < before; i++) ids[at++] = piece[1][i % len[1]];
        memcpy(ids + at, piece[2], (size_t)len[2] * sizeof *ids), at += len[2];
        *from = at;
        memcpy(ids + at, piece[3], (size_t)len[3] * sizeof *ids), at += len[3];
        *to = at;
        memcpy(ids + at, piece[4], (size_t)len[4] * sizeof *ids), at += len[4];
        for (int64_t i = before; i < fill; i++) ids[at++] = piece[1][i % len[1]];
        memcpy(ids + at, piece[5], (size_t)len[5] * sizeof *ids), at += len[5];
        *q = len[5];
    }
    for (int k = 0; k < 6; k++) free(piece[k]);
    return rc ? -1 : 0;
}

static int run_duo(kvb_model *m, const kvb_ctx_params *cp, const cal_opts *o) {
    const int L = m->cfg.n_layer, HK = m->cfg.n_head_kv;
    const int64_t n = o->max_tokens;
    int n_ctx = cp->n_ctx > 0 ? cp->n_ctx : m->cfg.n_ctx_train;
    if (n > n_ctx) return fail(o, "calibrate: a passkey prompt of %lld tokens exceeds the context of %d tokens (use --max-tokens or --ctx)", (long long)n, n_ctx);
    kvb_ctx_params p = *cp;
    p.n_ctx = (int)n;
    char err[512];
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    double *mass = calloc((size_t)L * HK, sizeof *mass);
    int rc = !c ? fail(o, "calibrate: %s", err) : !ids || !mass ? fail(o, "calibrate: out of memory") : 0;
    uint64_t rng = 1;
    for (long i = 0; i < o->samples && !rc; i++) {
        int64_t from = 0, to = 0;
        int q = 0;
        double depth = ((double)i + 0.5) / (double)o->samples;
        if (passkey_prompt(m, n, depth, &rng, ids, &from, &to, &q, err, sizeof err)) rc = fail(o, "calibrate duo: %s", err);
        else {
            say(o, stderr, "calibrate duo: passkey prompt %ld/%ld: %lld tokens, key at %.0f%% (tokens %lld..%lld), %d question rows\n",
                i + 1, o->samples, (long long)n, 100 * depth, (long long)from, (long long)to - 1, q);
            if (kvb_cal_duo_run(c, ids, n, q, from, to, mass, err, sizeof err)) rc = fail(o, "calibrate: prompt %ld: %s", i + 1, err);
        }
    }
    kvb_ctx_free(c);
    free(ids);
    for (int k = 0; k < L * HK && !rc; k++) mass[k] /= (double)o->samples;
    char path[1024], tpath[1024];
    FILE *csv = rc ? NULL : open_csv(o, "", path, sizeof path), *t = csv ? open_table(o, tpath, sizeof tpath) : NULL;
    if (!t) {
        if (csv) fclose(csv);
        free(mass);
        return 1;
    }
    fprintf(csv, "layer,kv_head,retrieval_score\n");
    fprintf(t, "DuoAttention: attention mass of the question on the pass key per KV head (%ld prompts of %lld tokens)\n\n| layer |",
            o->samples, (long long)n);
    for (int g = 0; g < HK; g++) fprintf(t, " kv%d |", g);
    fprintf(t, "\n|---|");
    for (int g = 0; g < HK; g++) fprintf(t, "---|");
    int best = 0;
    for (int l = 0; l < L; l++) {
        fprintf(t, "\n| %d |", l);
        for (int g = 0; g < HK; g++) {
            fprintf(csv, "%d,%d,%.6f\n", l, g, mass[l * HK + g]);
            fprintf(t, " %.4f |", mass[l * HK + g]);
            if (mass[l * HK + g] > mass[best]) best = l * HK + g;
        }
    }
    fputc('\n', t);
    rc = close_csv(o, csv, path);
    if (close_table(o, t, tpath)) rc = 1;
    say(o, stdout, "\nretrieval scores of %d layers x %d KV heads; the strongest: layer %d kv head %d (%.3f of the question's attention)\n",
        L, HK, best / HK, best % HK, mass[best]);
    set_result(o, "retrieval scores of %d x %d heads (strongest: layer %d kv %d, %.3f)", L, HK, best / HK, best % HK, mass[best]);
    cJSON *sec = cJSON_CreateObject(), *scores = cJSON_CreateArray();
    cJSON_AddStringToObject(sec, "inputs", "synthetic passkey prompts (seed 1)");
    cJSON_AddNumberToObject(sec, "n_inputs", (double)o->samples);
    cJSON_AddNumberToObject(sec, "max_tokens", (double)o->max_tokens);
    for (int l = 0; l < L && scores; l++) cJSON_AddItemToArray(scores, doubles(mass + (size_t)l * HK, HK));
    cJSON_AddItemToObject(sec, "scores", scores);
    cJSON_AddStringToObject(sec, "rule", "attention mass of the question's rows on the pass key's tokens, mean over the KV head's query heads, the rows and the prompts");
    free(mass);
    return rc ? rc : store(m, o, sec);
}

/* ---- command ---- */

/* What an analysis needs of every input, checked before any run (one-line errors). */
static int check_inputs(const cal_opts *o, const cal_input *in, int n_in) {
    for (int i = 0; i < n_in; i++) {
        if (!strcmp(o->kind, "round") && in[i].n_rounds < 3)
            return fail(o, "calibrate: input %d has %d rounds; round needs at least 2 history rounds and a question "
                            "(a longer text, or a smaller --chunk)", i + 1, in[i].n_rounds);
        if (!strcmp(o->kind, "pod") && in[i].n <= o->q)
            return fail(o, "calibrate: input %d has %lld tokens, not more than --q %ld", i + 1, (long long)in[i].n, o->q);
        if (in[i].n < 2) return fail(o, "calibrate: input %d has fewer than 2 tokens", i + 1);
    }
    return 0;
}

static int run_kind(kvb_model *m, const kvb_ctx_params *cp, const cal_opts *o) {
    int n_in = 0, rc = 1;
    cal_input *in = build_inputs(m, o, &n_in);
    if (!in) return 1;
    int64_t longest = 0;
    for (int i = 0; i < n_in; i++) longest = in[i].n > longest ? in[i].n : longest;
    if (check_inputs(o, in, n_in)) {
        inputs_free(in, n_in);
        return 1;
    }
    kvb_ctx_params p = *cp;
    int n_ctx = p.n_ctx > 0 ? p.n_ctx : m->cfg.n_ctx_train;
    if (longest > n_ctx) {
        fail(o, "calibrate: an input of %lld tokens exceeds the context of %d tokens (use --max-tokens or --ctx)",
                 (long long)longest, n_ctx);
        inputs_free(in, n_in);
        return 1;
    }
    p.n_ctx = (int)longest;
    char err[512];
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    if (!c) fail(o, "calibrate: %s", err);
    else if (!strcmp(o->kind, "round")) rc = run_round(m, c, o, in, n_in);
    else if (!strcmp(o->kind, "omnikv")) rc = run_omnikv(m, c, o, in, n_in);
    else if (!strcmp(o->kind, "qfilter")) rc = run_qfilter(m, c, o, in, n_in);
    else rc = run_pod(m, c, o, in, n_in);
    kvb_ctx_free(c);
    inputs_free(in, n_in);
    return rc;
}

int kvb_calibrate(kvb_model *m, const kvb_ctx_params *cp, kvb_cal_opts *o, char *err, size_t err_len) {
    o->err = err, o->err_len = err_len;
    if (strcmp(o->kind, "round") && strcmp(o->kind, "omnikv") && strcmp(o->kind, "pod") && strcmp(o->kind, "qfilter") &&
        strcmp(o->kind, "duo"))
        return fail(o, "calibrate: unknown kind '%s' (round, omnikv, pod, qfilter or duo)", o->kind), -1;
    if (!m->tok) return fail(o, "calibrate: the model has no tokenizer (synthetic models cannot be calibrated)"), -1;
    if (o->span < 0) o->span = (m->cfg.n_layer + 2) / 4; /* round(L / 4) */
    if (!strcmp(o->kind, "duo")) return run_duo(m, cp, o) ? -1 : 0; /* its own inputs: passkey prompts */
    return run_kind(m, cp, o) ? -1 : 0;
}

int kvb_calibrate_request(kvb_model *m, const kvb_ctx_params *cp, kvb_cal_request *rq, char *err, size_t err_len) {
    kvb_cal_opts o;
    kvb_cal_defaults(&o);
    o.kind = rq->kind, o.out_dir = rq->out_dir, o.quiet = 1, o.result = rq->result, o.result_cap = sizeof rq->result;
    if (rq->samples > 0) o.samples = rq->samples;
    if (rq->rounds > 0) o.rounds = rq->rounds;
    return kvb_calibrate(m, cp, &o, err, err_len);
}
