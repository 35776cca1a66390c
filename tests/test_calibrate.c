/* test_calibrate.c — the calibration analyses (methods/calibrate.h) and `kvbench calibrate`.
 *
 * The math against naive float64 code on hand-built distributions: KL with smoothing, JS (log base 2, both
 * forms), the round curve, the watershed rule, the filter ability and the filter choice, PoD's JS matrix and
 * Algorithm 1's blocks. Then the command end to end on the default model (one short synthetic dialogue per
 * kind, profile in a temporary KVB_PROFILE_DIR): the profile holds values the methods accept, and Round
 * Attention, OmniKV and PoD then run from it without flags; bad input is a one-line error. And `kvbench run`
 * on a model without a profile: it calibrates what its suite needs once (then a second run does not), errors
 * with --no-calibrate, and two concurrent shards calibrate once between them. Runs the binary from KVB_BIN (set
 * by CTest). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "methods/calibrate.h"

static const char *bin;
static char model[1024];
static char tmp_dir[256];

/* ---- naive float64 references ---- */

static double naive_kl(const double *p, const double *q, int n, double eps) {
    double sp = 0, sq = 0, kl = 0;
    for (int i = 0; i < n; i++) sp += p[i] + eps, sq += q[i] + eps;
    for (int i = 0; i < n; i++) {
        double a = (p[i] + eps) / sp, b = (q[i] + eps) / sq;
        if (a > 0) kl += a * log(a / b);
    }
    return kl;
}

static double naive_js(const double *p, const double *q, int n) {
    double m[64], kl_pm = 0, kl_qm = 0;
    for (int i = 0; i < n; i++) m[i] = 0.5 * (p[i] + q[i]);
    for (int i = 0; i < n; i++) {
        if (p[i] > 0) kl_pm += p[i] * log(p[i] / m[i]) / log(2.0);
        if (q[i] > 0) kl_qm += q[i] * log(q[i] / m[i]) / log(2.0);
    }
    return 0.5 * (kl_pm + kl_qm);
}

static void to_f(const double *d, float *f, int n) {
    for (int i = 0; i < n; i++) f[i] = (float)d[i];
}

/* ---- pure functions ---- */

static void test_kl_matches_float64_with_and_without_smoothing(void) {
    double p[5] = {0.5, 0.2, 0.0, 0.25, 0.05}, q[5] = {0.1, 0.4, 0.3, 0.1, 0.1};
    float pf[5], qf[5];
    to_f(p, pf, 5);
    to_f(q, qf, 5);
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_kl(pf, qf, 5, 0), naive_kl(p, q, 5, 0), 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_kl(pf, qf, 5, 1e-6), naive_kl(p, q, 5, 1e-6), 1e-6);
    /* q empty where p is not: finite with smoothing, and large */
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_kl(qf, pf, 5, 1e-6), naive_kl(q, p, 5, 1e-6), 1e-5);
    CU_ASSERT(kvb_cal_kl(qf, pf, 5, 1e-6) > 1.0 && isfinite(kvb_cal_kl(qf, pf, 5, 1e-6)));
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_kl(pf, pf, 5, 1e-6), 0.0, 1e-9);
}

static void test_js_is_base2_bounded_and_both_forms_agree(void) {
    double p[6] = {0.4, 0.3, 0.0, 0.2, 0.1, 0.0}, q[6] = {0.05, 0.05, 0.5, 0.2, 0.0, 0.2};
    float pf[6], qf[6];
    to_f(p, pf, 6);
    to_f(q, qf, 6);
    double ref = naive_js(p, q, 6);
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_js(pf, qf, 6), ref, 1e-6);
    double hp = kvb_cal_entropy2(pf, 6), hq = kvb_cal_entropy2(qf, 6), hp_ref = 0;
    for (int i = 0; i < 6; i++)
        if (p[i] > 0) hp_ref -= p[i] * log2(p[i]);
    CU_ASSERT_DOUBLE_EQUAL(hp, hp_ref, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_js_h(pf, qf, 6, hp, hq), ref, 1e-6);
    /* identical = 0, disjoint = 1 (log base 2), symmetric */
    float a[4] = {0.5f, 0.5f, 0, 0}, b[4] = {0, 0, 0.25f, 0.75f};
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_js(a, a, 4), 0.0, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_js(a, b, 4), 1.0, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_js_h(a, b, 4, kvb_cal_entropy2(a, 4), kvb_cal_entropy2(b, 4)), 1.0, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(kvb_cal_js(qf, pf, 6), kvb_cal_js(pf, qf, 6), 1e-12);
}

static void test_round_curve_is_mean_kl_to_later_layers(void) {
    enum { L = 4, R = 3 };
    double P[L][R] = {{0.7, 0.2, 0.1}, {0.1, 0.1, 0.8}, {0.2, 0.1, 0.7}, {0.25, 0.05, 0.7}};
    float Pf[L * R];
    to_f(&P[0][0], Pf, L * R);
    double curve[L];
    kvb_cal_round_curve(Pf, L, R, 1e-6, curve);
    for (int l = 0; l < L - 1; l++) {
        double s = 0;
        for (int m = l + 1; m < L; m++) s += naive_kl(P[l], P[m], R, 1e-6);
        CU_ASSERT_DOUBLE_EQUAL(curve[l], s / (L - 1 - l), 1e-6);
    }
    CU_ASSERT_EQUAL(curve[L - 1], 0.0);
    CU_ASSERT(curve[0] > 5 * curve[1]); /* layer 0 differs from the rest, layers 1..3 agree */
}

static void test_watershed_is_where_the_curve_drops_and_stays_low(void) {
    double sharp[8] = {0.8, 0.9, 1.2, 1.0, 0.15, 0.1, 0.2, 0.05};
    CU_ASSERT_EQUAL(kvb_cal_watershed(sharp, 8, 0.25), 4);
    /* a dip that comes back above the cut does not count: the low part must last */
    double bump[8] = {1.0, 0.9, 0.1, 0.1, 0.5, 0.1, 0.1, 0.05};
    CU_ASSERT_EQUAL(kvb_cal_watershed(bump, 8, 0.25), 5);
    /* a small late rise below the cut is tolerated (the paper's "occasional slight increases") */
    double wiggle[6] = {1.0, 1.1, 0.1, 0.2, 0.12, 0.26};
    CU_ASSERT_EQUAL(kvb_cal_watershed(wiggle, 6, 0.25), 2);
    double flat[4] = {0, 0, 0, 0};
    CU_ASSERT_EQUAL(kvb_cal_watershed(flat, 4, 0.25), 0);
}

static void test_filter_ability_is_later_layers_mass_on_top_k(void) {
    enum { L = 3, H = 2, N = 4 };
    /* layer 0 picks token 2 (max over heads 0.9), layer 1 picks token 0 */
    float probs[L][H][N] = {{{0.1f, 0.0f, 0.9f, 0.0f}, {0.4f, 0.3f, 0.2f, 0.1f}},
                            {{0.6f, 0.2f, 0.1f, 0.1f}, {0.7f, 0.1f, 0.1f, 0.1f}},
                            {{0.1f, 0.1f, 0.5f, 0.3f}, {0.3f, 0.1f, 0.3f, 0.3f}}};
    double ab[L];
    CU_ASSERT_FATAL(kvb_cal_filter_ability(&probs[0][0][0], L, H, N, 1, 0, ab) == 0);
    CU_ASSERT_DOUBLE_EQUAL(ab[0], 0.5 * ((0.1 + 0.1) / 2 + (0.5 + 0.3) / 2), 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(ab[1], (0.1 + 0.3) / 2, 1e-6);
    CU_ASSERT_EQUAL(ab[2], 0.0);
    /* span 1: only the next layer */
    CU_ASSERT_FATAL(kvb_cal_filter_ability(&probs[0][0][0], L, H, N, 1, 1, ab) == 0);
    CU_ASSERT_DOUBLE_EQUAL(ab[0], (0.1 + 0.1) / 2, 1e-6);
    /* k = 2: layer 0 picks tokens 2 and 0 */
    CU_ASSERT_FATAL(kvb_cal_filter_ability(&probs[0][0][0], L, H, N, 2, 1, ab) == 0);
    CU_ASSERT_DOUBLE_EQUAL(ab[0], (0.7 + 0.8) / 2, 1e-6);
}

static void test_filter_choice_skips_layer_0_the_last_two_and_neighbours(void) {
    double ability[10] = {9, 1, 8, 7.9, 2, 7, 0.5, 0.1, 10, 10};
    int out[3];
    CU_ASSERT_EQUAL_FATAL(kvb_cal_pick_filters(ability, 10, 3, out), 3);
    CU_ASSERT(out[0] == 2 && out[1] == 5 && out[2] == 7);
    for (int i = 1; i < 3; i++) CU_ASSERT(out[i] - out[i - 1] >= 2);
    /* too few layers for three: as many as fit */
    double small[5] = {0, 3, 2, 1, 0};
    CU_ASSERT_EQUAL(kvb_cal_pick_filters(small, 5, 3, out), 1);
    CU_ASSERT_EQUAL(out[0], 1);
}

static void test_grouping_needs_similarity_to_every_layer_of_the_block(void) {
    enum { L = 7 };
    double sim[L][L];
    for (int a = 0; a < L; a++)
        for (int b = 0; b < L; b++) sim[a][b] = a == b ? 1.0 : 0.1;
#define S(a, b, v) (sim[a][b] = sim[b][a] = (v))
    S(0, 1, 0.9);
    S(1, 2, 0.9); /* 2 is like 1 but not like 0: a new block at 2 */
    S(2, 3, 0.6);
    S(2, 4, 0.5);
    S(3, 4, 0.7); /* 4 >= delta with 2 and 3: joins (>= is inclusive) */
    S(4, 5, 0.45); /* just under delta: new block at 5 */
    S(5, 6, 0.8);
#undef S
    int base[L], want[L] = {0, 0, 2, 2, 2, 5, 5};
    CU_ASSERT_EQUAL(kvb_cal_group(&sim[0][0], L, 0.5, base), 3);
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(base[l], want[l]);
    CU_ASSERT_EQUAL(kvb_cal_group(&sim[0][0], L, 0.95, base), L); /* strict: every layer its own block */
    CU_ASSERT_EQUAL(kvb_cal_group(&sim[0][0], L, 0.0, base), 1);
}

static void test_pod_js_sums_group_heads_and_causal_rows(void) {
    enum { L = 3, H = 4, HK = 2, Q = 2, N = 5 };
    static float S[L][H][Q][N];
    uint64_t rng = 7;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < Q; t++) {
                int vis = N - Q + t + 1;
                double tot = 0;
                for (int j = 0; j < vis; j++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    S[l][h][t][j] = (float)((rng >> 40) % 1000 + 1);
                    tot += S[l][h][t][j];
                }
                for (int j = 0; j < vis; j++) S[l][h][t][j] = (float)(S[l][h][t][j] / tot);
            }
    double js[HK][L][L] = {{{0}}};
    CU_ASSERT_FATAL(kvb_cal_pod_js(&S[0][0][0][0], L, H, HK, Q, N, &js[0][0][0]) == 0);
    for (int g = 0; g < HK; g++)
        for (int a = 0; a < L; a++)
            for (int b = 0; b < L; b++) {
                double ref = 0;
                for (int h = g * 2; h < g * 2 + 2; h++)
                    for (int t = 0; t < Q; t++) {
                        double p[N], q[N];
                        for (int j = 0; j < N; j++) p[j] = S[a][h][t][j], q[j] = S[b][h][t][j];
                        ref += a == b ? 0 : naive_js(p, q, N);
                    }
                CU_ASSERT_DOUBLE_EQUAL(js[g][a][b], ref, 1e-5);
            }
}

/* ---- the command ---- */

typedef struct {
    int exit_code;
    char out[1 << 16];
    char err[1 << 14];
} run_result;

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
}

/* Runs `kvbench ARGS` with KVB_PROFILE_DIR=profile_dir, capturing stdout, stderr and the exit status. */
static void run(run_result *r, const char *profile_dir, const char *args) {
    char cmd[4096], o[300], e[300];
    snprintf(o, sizeof o, "%s/out.txt", tmp_dir);
    snprintf(e, sizeof e, "%s/err.txt", tmp_dir);
    snprintf(cmd, sizeof cmd, "KVB_PROFILE_DIR='%s' '%s' %s >'%s' 2>'%s'", profile_dir, bin, args, o, e);
    int st = system(cmd);
    r->exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp(o, r->out, sizeof r->out);
    slurp(e, r->err, sizeof r->err);
}

/* The only *.json in dir, parsed (NULL when none). */
static cJSON *load_profile(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return NULL;
    struct dirent *ent;
    cJSON *j = NULL;
    while (!j && (ent = readdir(d))) {
        size_t n = strlen(ent->d_name);
        if (n < 6 || strcmp(ent->d_name + n - 5, ".json")) continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        char *text = util_read_file(path, NULL);
        j = text ? cJSON_Parse(text) : NULL;
        free(text);
    }
    closedir(d);
    return j;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void expect_clean_failure(const char *args, const char *needle) {
    run_result *r = malloc(sizeof *r);
    run(r, tmp_dir, args);
    int ok = r->exit_code > 0 && r->exit_code < 126 && count_lines(r->err) == 1 && !strncmp(r->err, "kvbench:", 8) &&
             strstr(r->err, needle);
    if (!ok) fprintf(stderr, "\n  args: %s\n  exit %d, stderr: %s\n", args, r->exit_code, r->err);
    CU_ASSERT(ok);
    free(r);
}

static void test_calibrate_writes_profiles_the_methods_run_from(void) {
    UTIL_REQUIRE_FILE(model);
    char prof[300], args[600];
    snprintf(prof, sizeof prof, "%s/profiles", tmp_dir);
    run_result *r = malloc(sizeof *r);
    static const char *kinds[] = {"round", "omnikv", "pod"};
    for (int k = 0; k < 3; k++) {
        snprintf(args, sizeof args, "calibrate %s --samples 1 --threads 2 --out-dir '%s/csv'", kinds[k], tmp_dir);
        run(r, prof, args);
        if (r->exit_code) fprintf(stderr, "\n  %s: exit %d: %s\n", kinds[k], r->exit_code, r->err);
        CU_ASSERT_EQUAL_FATAL(r->exit_code, 0);
        char csv[400];
        snprintf(csv, sizeof csv, "%s/csv/calibrate-%s.csv", tmp_dir, kinds[k]);
        char *text = util_read_file(csv, NULL);
        CU_ASSERT(text && count_lines(text) >= 29); /* header + a row per layer of the 30-layer model */
        free(text);
        /* the per-layer table is in a file; stdout keeps the result lines and the paths */
        snprintf(csv, sizeof csv, "%s/csv/calibrate-%s.md", tmp_dir, kinds[k]);
        text = util_read_file(csv, NULL);
        CU_ASSERT(text && count_lines(text) >= 29 && strstr(text, "| 12"));
        free(text);
        CU_ASSERT(count_lines(r->out) <= 10 && strstr(r->out, "per-layer table:") && !strstr(r->out, "| 12"));
        if (count_lines(r->out) > 10) fprintf(stderr, "\n  %s stdout: %s\n", kinds[k], r->out);
    }
    CU_ASSERT(strstr(r->out, "kv head 2:") && strstr(r->out, "key saving"));
    cJSON *j = load_profile(prof);
    CU_ASSERT_FATAL(j != NULL);
    const int L = 30, HK = 3;
    cJSON *lw = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "round"), "lw");
    CU_ASSERT(cJSON_IsNumber(lw) && lw->valueint >= 1 && lw->valueint <= L - 1);
    cJSON *layers = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "omnikv"), "layers");
    CU_ASSERT(cJSON_GetArraySize(layers) == 3);
    for (int i = 0; i < cJSON_GetArraySize(layers); i++) {
        int l = cJSON_GetArrayItem(layers, i)->valueint;
        CU_ASSERT(l >= 1 && l <= L - 3 && (i == 0 || l - cJSON_GetArrayItem(layers, i - 1)->valueint >= 2));
    }
    cJSON *bases = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pod"), "bases");
    CU_ASSERT_FATAL(cJSON_GetArraySize(bases) == HK);
    for (int g = 0; g < HK; g++) {
        cJSON *row = cJSON_GetArrayItem(bases, g);
        CU_ASSERT_FATAL(cJSON_GetArraySize(row) == L);
        for (int l = 0; l < L; l++) {
            int b = cJSON_GetArrayItem(row, l)->valueint;
            CU_ASSERT(b == l || (l > 0 && b == cJSON_GetArrayItem(row, l - 1)->valueint));
        }
    }
    /* the methods read the profile: no lw=, layers= or block= given */
    char want[64];
    snprintf(want, sizeof want, "lw=%d ", lw ? lw->valueint : -1);
    run(r, prof, "generate --method round --budget 30% -n 4 --prompt hi --threads 2");
    CU_ASSERT(r->exit_code == 0 && strstr(r->err, want));
    /* omnikv: the paper's layers scaled to 30 layers by default (as the quick suite pins), the profile on request */
    run(r, prof, "generate --method omnikv --budget 100% -n 2 --prompt hi --threads 2");
    CU_ASSERT(r->exit_code == 0 && strstr(r->err, "layers=2;8;17 "));
    char want_l[64] = "layers=";
    for (int i = 0; i < cJSON_GetArraySize(layers); i++)
        snprintf(want_l + strlen(want_l), sizeof want_l - strlen(want_l), "%s%d", i ? ";" : "", cJSON_GetArrayItem(layers, i)->valueint);
    strcat(want_l, " ");
    run(r, prof, "generate --method omnikv --method-opt layers=profile --budget 100% -n 2 --prompt hi --threads 2");
    CU_ASSERT(r->exit_code == 0 && strstr(r->err, want_l));
    run(r, prof, "generate --method pod --budget 30% -n 2 --prompt hi --threads 2");
    CU_ASSERT(r->exit_code == 0 && strstr(r->err, "blocks=profile"));
    cJSON_Delete(j);
    free(r);
}

/* qfilter and duo through the command on the default model: a filter (unit vector) per layer and KV head, a retrieval
 * score per layer and KV head, both in the profile, and the methods run from them without their window options. */
static void test_calibrate_qfilter_and_duo_profiles(void) {
    UTIL_REQUIRE_FILE(model);
    char prof[300], args[600];
    snprintf(prof, sizeof prof, "%s/heads", tmp_dir);
    run_result *r = malloc(sizeof *r);
    snprintf(args, sizeof args, "calibrate qfilter --samples 1 --max-tokens 600 --threads 2 --out-dir '%s/csv'", tmp_dir);
    run(r, prof, args);
    CU_ASSERT_EQUAL_FATAL(r->exit_code, 0);
    CU_ASSERT(strstr(r->out, "Q-Filters of 30 layers x 3 KV heads") != NULL);
    snprintf(args, sizeof args, "calibrate duo --samples 2 --max-tokens 400 --threads 2 --out-dir '%s/csv'", tmp_dir);
    run(r, prof, args);
    CU_ASSERT_EQUAL_FATAL(r->exit_code, 0);
    CU_ASSERT(strstr(r->out, "retrieval scores of 30 layers x 3 KV heads") != NULL);
    cJSON *j = load_profile(prof);
    CU_ASSERT_FATAL(j != NULL);
    cJSON *f = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "qfilter"), "filters");
    CU_ASSERT_FATAL(cJSON_GetArraySize(f) == 30);
    for (int l = 0; l < 30; l++)
        for (int g = 0; g < 3; g++) {
            cJSON *dir = cJSON_GetArrayItem(cJSON_GetArrayItem(f, l), g);
            double norm = 0;
            for (int e = 0; e < cJSON_GetArraySize(dir); e++) norm += pow(cJSON_GetArrayItem(dir, e)->valuedouble, 2);
            CU_ASSERT(cJSON_GetArraySize(dir) == 64 && fabs(norm - 1) < 1e-4);
        }
    cJSON *sc = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "duo"), "scores");
    CU_ASSERT_FATAL(cJSON_GetArraySize(sc) == 30);
    for (int l = 0; l < 30; l++)
        for (int g = 0; g < 3; g++) {
            double x = cJSON_GetArrayItem(cJSON_GetArrayItem(sc, l), g)->valuedouble;
            CU_ASSERT(x >= 0 && x <= 1);
        }
    run(r, prof, "generate --method qfilter --budget 30% -n 2 --prompt hi --threads 2");
    CU_ASSERT(r->exit_code == 0 && strstr(r->err, "filters=profile"));
    run(r, prof, "generate --method duo --budget 30% -n 2 --prompt hi --threads 2");
    CU_ASSERT(r->exit_code == 0 && strstr(r->err, "split=profile"));
    cJSON_Delete(j);
    free(r);
    expect_clean_failure("calibrate duo --prompt-file x.txt", "drop --prompt-file");
}

static void test_dry_run_leaves_the_profile_alone(void) {
    UTIL_REQUIRE_FILE(model);
    char prof[300], args[600];
    snprintf(prof, sizeof prof, "%s/dry", tmp_dir);
    snprintf(args, sizeof args, "calibrate round --samples 1 --threads 2 --dry-run --out-dir '%s'", tmp_dir);
    run_result *r = malloc(sizeof *r);
    run(r, prof, args);
    CU_ASSERT(r->exit_code == 0 && strstr(r->out, "watershed layer") && strstr(r->out, "dry run"));
    cJSON *j = load_profile(prof);
    CU_ASSERT(j == NULL);
    cJSON_Delete(j);
    free(r);
}

/* ---- `kvbench run` calibrates what its suite needs ---- */

/* A suite of Round Attention (no lw=: reads the profile) and OmniKV (its default layers: reads none) on one short
 * recall dialogue, calibrated with one 4-round dialogue; written to tmp_dir/NAME.json, results under tmp_dir/NAME. */
static void write_suite(const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s.json", tmp_dir, name);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"%s\", \"model\": \"default\", \"output\": \"%s/%s\", \"seed\": 1,\n"
               " \"calibration\": {\"samples\": 1, \"rounds\": 4},\n"
               " \"methods\": [{\"name\": \"round\"}, {\"name\": \"omnikv\"}], \"budgets\": [\"30%%\"],\n"
               " \"benchmarks\": [{\"type\": \"recall\", \"dialogues\": 1, \"rounds\": 3, \"max_new_tokens\": 2}]}\n",
            name, tmp_dir, name);
    fclose(f);
}

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The first run calibrates round once (one line saying so, one with the result, tables in OUT/calibration) and
 * stores it; omnikv's default layers and the absent pod need nothing; the second run finds the profile. */
static void test_run_calibrates_what_the_suite_needs_once(void) {
    UTIL_REQUIRE_FILE(model);
    char suite[300], prof[300], args[700], path[400];
    write_suite("autocal", suite, sizeof suite);
    snprintf(prof, sizeof prof, "%s/autocal-profiles", tmp_dir);
    snprintf(args, sizeof args, "run '%s' --quiet --threads 2", suite);
    run_result *r = malloc(sizeof *r);
    run(r, prof, args);
    if (r->exit_code) fprintf(stderr, "\n  exit %d: %s\n", r->exit_code, r->err);
    CU_ASSERT_EQUAL_FATAL(r->exit_code, 0);
    CU_ASSERT(count_of(r->err, "run: no round calibration for SmolLM2") == 1 && count_of(r->err, "calibrating (1 dialogue of 4 rounds)") == 1);
    CU_ASSERT(strstr(r->err, "round: watershed layer ") != NULL && !strstr(r->err, "pod") && !strstr(r->err, "omnikv calibration"));
    snprintf(path, sizeof path, "%s/autocal/calibration/calibrate-round.md", tmp_dir);
    char *table = util_read_file(path, NULL);
    CU_ASSERT(table && strstr(table, "<- watershed"));
    free(table);
    cJSON *j = load_profile(prof);
    CU_ASSERT_FATAL(j != NULL);
    CU_ASSERT(cJSON_GetObjectItem(j, "round") && !cJSON_GetObjectItem(j, "pod") && !cJSON_GetObjectItem(j, "omnikv"));
    cJSON_Delete(j);
    run(r, prof, args); /* every cell recorded: only the calibration check runs again */
    CU_ASSERT(r->exit_code == 0 && !strstr(r->err, "calibrat"));
    if (strstr(r->err, "calibrat")) fprintf(stderr, "\n  second run: %s\n", r->err);
    free(r);
}

/* --no-calibrate: a missing section is a one-line error naming the command; the options that decide it are the
 * merged ones (omnikv reads the profile only with --method-opt layers=profile). */
static void test_run_no_calibrate_names_the_command(void) {
    UTIL_REQUIRE_FILE(model);
    char suite[300], args[700];
    write_suite("nocal", suite, sizeof suite);
    snprintf(args, sizeof args, "run '%s' --quiet --no-calibrate", suite);
    expect_clean_failure(args, "no round calibration for SmolLM2-135M-Instruct.Q4_1.gguf: run `kvbench calibrate round --model ");
    snprintf(args, sizeof args, "run '%s' --quiet --no-calibrate --methods omnikv --method-opt omnikv:layers=profile", suite);
    expect_clean_failure(args, "`kvbench calibrate omnikv --model ");
}

/* bench --method and fidelity calibrate what their methods read, as run does: a fresh profile directory gets round's
 * section once (one line saying so, one with the result naming the tables' folder, which holds the table), the
 * second command finds it; --no-calibrate is a one-line error naming the command, before any prefill. */
static void test_bench_and_fidelity_calibrate_what_their_methods_read(void) {
    UTIL_REQUIRE_FILE(model);
    char prof[300], args[900], prompt[300];
    snprintf(prof, sizeof prof, "%s/bench-profiles", tmp_dir);
    run_result *r = malloc(sizeof *r);
    run(r, prof, "bench --model default --method round,omnikv --ctx-len 200 -n 2 --threads 2");
    if (r->exit_code) fprintf(stderr, "\n  exit %d: %s\n", r->exit_code, r->err);
    CU_ASSERT_EQUAL_FATAL(r->exit_code, 0);
    CU_ASSERT(count_of(r->err, "bench: no round calibration for SmolLM2") == 1 && count_of(r->err, "calibrating") == 1);
    const char *tables = strstr(r->err, "tables in /tmp/kvb_calibration_");
    CU_ASSERT_FATAL(tables != NULL && strstr(r->err, "round: watershed layer ") != NULL);
    char dir[200] = "", path[300];
    sscanf(tables, "tables in %199s", dir);
    snprintf(path, sizeof path, "%s/calibrate-round.md", dir);
    char *table = util_read_file(path, NULL);
    CU_ASSERT(table && strstr(table, "<- watershed"));
    free(table);
    snprintf(args, sizeof args, "rm -rf '%s'", dir);
    CU_ASSERT(strlen(dir) > 20 && system(args) == 0);
    CU_ASSERT(strstr(r->out, "| round |") != NULL && strstr(r->out, "lw=") != NULL);
    cJSON *j = load_profile(prof);
    CU_ASSERT(j && cJSON_GetObjectItem(j, "round") && !cJSON_GetObjectItem(j, "omnikv"));
    cJSON_Delete(j);
    snprintf(prompt, sizeof prompt, "%s/fid-prompt.txt", tmp_dir);
    FILE *f = fopen(prompt, "w");
    CU_ASSERT_FATAL(f != NULL);
    for (int i = 0; i < 30; i++) fprintf(f, "Line %d of a short note about rivers and the sea. ", i);
    fclose(f);
    snprintf(args, sizeof args, "fidelity --model default --methods round --prompt-file '%s' -n 2 --threads 2", prompt);
    run(r, prof, args); /* the profile has round now */
    CU_ASSERT(r->exit_code == 0 && !strstr(r->err, "calibrat"));
    if (r->exit_code || strstr(r->err, "calibrat")) fprintf(stderr, "\n  fidelity: exit %d: %s\n", r->exit_code, r->err);
    free(r);
    expect_clean_failure("bench --model default --method snapkv,pod --ctx-len 200 -n 2 --no-calibrate",
                         "bench: no pod calibration for SmolLM2-135M-Instruct.Q4_1.gguf: run `kvbench calibrate pod --model ");
    snprintf(args, sizeof args, "fidelity --model default --methods qfilter --prompt-file '%s' -n 2 --no-calibrate", prompt);
    expect_clean_failure(args, "fidelity: no qfilter calibration for SmolLM2-135M-Instruct.Q4_1.gguf: run `kvbench calibrate qfilter");
    /* a synthetic model has no text to calibrate on: not attempted, the method names its option */
    run_result *syn = malloc(sizeof *syn);
    run(syn, tmp_dir, "bench --model synthetic:tiny --method round --ctx-len 64 -n 2");
    CU_ASSERT(syn->exit_code == 1 && strstr(syn->err, "--method-opt lw=N") && !strstr(syn->err, "calibrating"));
    free(syn);
}

/* Two shards started together on an empty profile directory: one calibrates under the profile's lock, the other
 * waits and reuses it; both finish. */
static void test_concurrent_shards_calibrate_once(void) {
    UTIL_REQUIRE_FILE(model);
    char suite[300], cmd[2400], path[400], err[2][1 << 12];
    write_suite("shards", suite, sizeof suite);
    snprintf(cmd, sizeof cmd, "for i in 0 1; do (KVB_PROFILE_DIR='%s/shard-profiles' '%s' run '%s' --quiet --threads 1 "
             "--shard $i/2 --out '%s'/shard-$i 2>'%s'/shard-$i.err >/dev/null || echo fail >'%s'/shard-$i.failed) & done; wait",
             tmp_dir, bin, suite, tmp_dir, tmp_dir, tmp_dir);
    CU_ASSERT_FATAL(system(cmd) == 0);
    int calibrations = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/shard-%d.failed", tmp_dir, i);
        CU_ASSERT(access(path, F_OK) != 0);
        snprintf(path, sizeof path, "%s/shard-%d.err", tmp_dir, i);
        slurp(path, err[i], sizeof err[i]);
        calibrations += count_of(err[i], "run: no round calibration");
    }
    CU_ASSERT_EQUAL(calibrations, 1);
    if (calibrations != 1) fprintf(stderr, "\n  shard 0: %s\n  shard 1: %s\n", err[0], err[1]);
}

static void test_bad_input_is_a_one_line_error(void) {
    expect_clean_failure("calibrate", "round, omnikv, pod, qfilter or duo");
    expect_clean_failure("calibrate attention", "unknown kind 'attention'");
    expect_clean_failure("calibrate pod --delta 2", "--delta");
    expect_clean_failure("calibrate pod --bogus 1", "unknown option '--bogus'");
    UTIL_REQUIRE_FILE(model);
    expect_clean_failure("calibrate round --prompt-file /nonexistent/calib.txt", "/nonexistent/calib.txt");
    char path[300], args[600];
    snprintf(path, sizeof path, "%s/short.txt", tmp_dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("A short calibration text that makes a single round.", f);
    fclose(f);
    snprintf(args, sizeof args, "calibrate round --prompt-file '%s'", path);
    expect_clean_failure(args, "at least 2 history rounds");
    snprintf(args, sizeof args, "calibrate pod --prompt-file '%s' --q 64", path);
    expect_clean_failure(args, "--q");
    expect_clean_failure("calibrate omnikv --samples 1 --ctx 200", "exceeds the context of 200 tokens");
}

int main(void) {
    bin = getenv("KVB_BIN");
    if (!bin) bin = "build/kvbench";
    util_default_model(model, sizeof model);
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kvb_calib_XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("calibrate", NULL, NULL);
    CU_add_test(s, "KL matches float64 with and without smoothing", test_kl_matches_float64_with_and_without_smoothing);
    CU_add_test(s, "JS is base 2, bounded, and both forms agree", test_js_is_base2_bounded_and_both_forms_agree);
    CU_add_test(s, "round curve is the mean KL to later layers", test_round_curve_is_mean_kl_to_later_layers);
    CU_add_test(s, "watershed is where the curve drops and stays low", test_watershed_is_where_the_curve_drops_and_stays_low);
    CU_add_test(s, "filter ability is the later layers' mass on the top-k", test_filter_ability_is_later_layers_mass_on_top_k);
    CU_add_test(s, "filter choice skips layer 0, the last two layers and neighbours", test_filter_choice_skips_layer_0_the_last_two_and_neighbours);
    CU_add_test(s, "grouping needs similarity to every layer of the block", test_grouping_needs_similarity_to_every_layer_of_the_block);
    CU_add_test(s, "PoD JS sums the group's heads over causal rows", test_pod_js_sums_group_heads_and_causal_rows);
    CU_add_test(s, "calibrate writes profiles the methods run from", test_calibrate_writes_profiles_the_methods_run_from);
    CU_add_test(s, "calibrate qfilter and duo: filters and retrieval scores the methods run from", test_calibrate_qfilter_and_duo_profiles);
    CU_add_test(s, "dry run leaves the profile alone", test_dry_run_leaves_the_profile_alone);
    CU_add_test(s, "bad input is a one-line error", test_bad_input_is_a_one_line_error);
    CU_add_test(s, "run calibrates what the suite needs, once", test_run_calibrates_what_the_suite_needs_once);
    CU_add_test(s, "run --no-calibrate names the command", test_run_no_calibrate_names_the_command);
    CU_add_test(s, "concurrent shards calibrate once", test_concurrent_shards_calibrate_once);
    CU_add_test(s, "bench --method and fidelity calibrate what their methods read", test_bench_and_fidelity_calibrate_what_their_methods_read);
    int rc = util_run_suites();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", tmp_dir);
    return rc;
}
