/* test_reports.c — the reports layer on hand-made run directories: the bootstrap against a float64
 * recomputation with its own splitmix64, summary.csv (means, counts, intervals, determinism), report.md
 * (row order, cells and deltas to full, efficiency, LongMemEval, length bins, NIAH, errors), the SVG
 * files, the main table printed to a stream, compare's verdicts within and beyond each tolerance, and the
 * loader's handling of malformed, truncated and duplicated records. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "reports/compare.h"
#include "reports/report.h"
#include "reports/results.h"
#include "reports/stats.h"
#include "reports/svg.h"

static char root[64] = "/tmp/kvb_reports_XXXXXX";
static char err[512];

/* ---- building run directories ---- */

static const char *dir_of(const char *name) {
    static char d[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(d[k], sizeof d[k], "%s/%s", root, name);
    return d[k];
}

static char *read_in(const char *name, const char *file) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir_of(name), file);
    return util_read_file(p, NULL);
}

/* Create RUN_DIR with its run.json; returns results.jsonl opened for writing. */
static FILE *new_run(const char *name, const char *suite, const char *sha) {
    char p[400];
    mkdir(dir_of(name), 0755);
    snprintf(p, sizeof p, "%s/run.json", dir_of(name));
    FILE *f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"suite\":\"%s\",\"model\":\"m.gguf\",\"model_sha256\":\"%s\",\"git_commit\":\"abc123\",\"host\":\"h\","
               "\"backend\":\"cpu\",\"flags\":\"--x\",\"created\":\"2026-01-01T00:00:00Z\"}\n", suite, sha);
    fclose(f);
    snprintf(p, sizeof p, "%s/results.jsonl", dir_of(name));
    f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    return f;
}

/* One record; score NAN is written null; extra is appended inside the object (",\"k\":v..."). */
static void rec(FILE *f, const char *method, const char *budget, const char *bench, const char *task, int id, double score,
                double decode_ms, double kv_bytes, const char *extra) {
    char sc[40] = "null";
    if (!isnan(score)) snprintf(sc, sizeof sc, "%.17g", score);
    fprintf(f, "{\"method\":\"%s\",\"budget\":\"%s\",\"benchmark\":\"%s\",\"task\":\"%s\",\"sample_id\":\"%d\",\"score\":%s,"
               "\"ttft_ms\":100,\"decode_ms_per_token\":%.17g,\"kv_device_bytes\":%.17g,\"kv_device_bytes_end\":%.17g,"
               "\"kv_host_bytes\":0,\"kv_full_bytes\":1048576,\"moved_bytes\":0,\"attended_per_layer\":50,\"prompt_tokens\":%d%s}\n",
            method, budget, bench, task, id, sc, decode_ms, kv_bytes, kv_bytes, 900 + 300 * id, extra ? extra : "");
}

/* The main run: snapkv@30% written first (full must still lead), two tasks, a judge error, a sample error. */
static void make_main_run(const char *name) {
    static const double full_hp[6] = {1, 1, 0, 1, 1, 0}, snap_hp[6] = {1, 0, 0, 1, 0, 0};
    static const double full_2s[4] = {1, 1, 1, 1}, snap_2s[4] = {1, 1, 0.5, 0.5};
    FILE *f = new_run(name, "quick", "sha-a");
    for (int i = 0; i < 6; i++) rec(f, "snapkv", "30%", "longbench", "hotpotqa", i, snap_hp[i], 5, 314572.8, NULL);
    rec(f, "snapkv", "30%", "longbench", "hotpotqa", 6, NAN, 5, 314572.8, ",\"judge\":{\"model\":\"j\",\"error\":\"timeout\"}");
    rec(f, "snapkv", "30%", "longbench", "hotpotqa", 7, NAN, 0, 0, ",\"error\":\"prompt too long\"");
    for (int i = 0; i < 6; i++) rec(f, "full", "full", "longbench", "hotpotqa", i, full_hp[i], 10, 1048576, ",\"judge\":null,\"error\":null");
    for (int i = 0; i < 4; i++) rec(f, "full", "full", "2stage", "2stage", i, full_2s[i], 10, 1048576, NULL);
    for (int i = 0; i < 4; i++) rec(f, "snapkv", "30%", "2stage", "2stage", i, snap_2s[i], 5, 314572.8, NULL);
    fclose(f);
}

/* ---- statistics ---- */

static uint64_t naive_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void naive_ci(const double *v, int n, int B, uint64_t seed, double *lo, double *hi) {
    double *m = malloc((size_t)B * sizeof *m);
    uint64_t s = seed;
    for (int b = 0; b < B; b++) {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += v[naive_splitmix(&s) % (uint64_t)n];
        m[b] = sum / n;
    }
    for (int i = 1; i < B; i++) /* insertion sort */
        for (int j = i; j > 0 && m[j - 1] > m[j]; j--) {
            double t = m[j];
            m[j] = m[j - 1], m[j - 1] = t;
        }
    double q[2] = {0.025, 0.975}, out[2];
    for (int k = 0; k < 2; k++) {
        double h = q[k] * (B - 1);
        int i = (int)h;
        out[k] = m[i] + (h - i) * (m[i + 1] - m[i]);
    }
    *lo = out[0], *hi = out[1];
    free(m);
}

static void test_bootstrap_matches_naive_float64_recomputation(void) {
    double v[37];
    uint64_t s = 42;
    for (int i = 0; i < 37; i++) v[i] = (double)(naive_splitmix(&s) % 1000) / 999.0;
    double lo, hi, nlo, nhi, sum = 0;
    for (int i = 0; i < 37; i++) sum += v[i];
    CU_ASSERT_DOUBLE_EQUAL(kvb_stats_mean(v, 37), sum / 37, 1e-15);
    CU_ASSERT(kvb_stats_bootstrap_ci(v, 37, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &lo, &hi) == 0);
    naive_ci(v, 37, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &nlo, &nhi);
    CU_ASSERT_DOUBLE_EQUAL(lo, nlo, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(hi, nhi, 1e-12);
    CU_ASSERT(lo < sum / 37 && sum / 37 < hi);
    /* the normal approximation gives a half-width of 1.96 sd/sqrt(n): the bootstrap lands near it */
    double var = 0;
    for (int i = 0; i < 37; i++) var += (v[i] - sum / 37) * (v[i] - sum / 37);
    double hw = 1.96 * sqrt(var / 36 / 37);
    CU_ASSERT((hi - lo) / 2 > 0.8 * hw && (hi - lo) / 2 < 1.2 * hw);
}

static void test_bootstrap_is_deterministic_and_seeded(void) {
    double v[5] = {0, 1, 1, 0, 1}, a, b, c, d, e, g;
    kvb_stats_bootstrap_ci(v, 5, 1000, 7, &a, &b);
    kvb_stats_bootstrap_ci(v, 5, 1000, 7, &c, &d);
    CU_ASSERT(a == c && b == d);
    kvb_stats_bootstrap_ci(v, 5, 1000, KVB_BOOT_SEED, &e, &g);
    CU_ASSERT(e <= 0.6 && g >= 0.6);
}

static void test_bootstrap_of_constant_scores_is_zero_width(void) {
    double v[9], lo, hi;
    for (int i = 0; i < 9; i++) v[i] = 0.7;
    kvb_stats_bootstrap_ci(v, 9, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &lo, &hi);
    CU_ASSERT(lo == hi && lo == kvb_stats_mean(v, 9));
    kvb_stats_bootstrap_ci(v, 1, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &lo, &hi);
    CU_ASSERT(lo == 0.7 && hi == 0.7);
    kvb_stats_bootstrap_ci(v, 0, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &lo, &hi);
    CU_ASSERT(isnan(lo) && isnan(hi) && isnan(kvb_stats_mean(v, 0)));
}

/* ---- summary.csv and report.md ---- */

static void test_summary_csv_has_counts_means_and_intervals(void) {
    make_main_run("main");
    CU_ASSERT_FATAL(kvb_report_write(dir_of("main"), err, sizeof err) == 0);
    char *csv = read_in("main", "summary.csv");
    CU_ASSERT_FATAL(csv != NULL);
    CU_ASSERT(strncmp(csv, "method,budget,benchmark,task,n,n_scored,mean,ci95_low,ci95_high,judge_errors,sample_errors,", 90) == 0);
    CU_ASSERT(strstr(csv, "\nfull,full,longbench,hotpotqa,6,6,0.666667,") != NULL);
    CU_ASSERT(strstr(csv, "\nfull,full,2stage,2stage,4,4,1.000000,1.000000,1.000000,0,0,") != NULL); /* zero width */
    const char *line = strstr(csv, "\nsnapkv,30%,longbench,hotpotqa,");
    CU_ASSERT_FATAL(line != NULL);
    double m, lo, hi, ttft, dec, kv;
    int je, se;
    CU_ASSERT_FATAL(sscanf(line, "\nsnapkv,30%%,longbench,hotpotqa,8,6,%lf,%lf,%lf,%d,%d,%lf,%lf,%lf", &m, &lo, &hi, &je, &se, &ttft,
                           &dec, &kv) == 8);
    CU_ASSERT_DOUBLE_EQUAL(m, 1.0 / 3, 1e-6);
    CU_ASSERT(lo <= m && m <= hi && hi - lo > 0.2);
    CU_ASSERT(je == 1 && se == 1);
    CU_ASSERT_DOUBLE_EQUAL(dec, 5, 1e-9); /* the failed sample's 0 ms is left out */
    CU_ASSERT_DOUBLE_EQUAL(kv, 0.3, 1e-4);
    /* the interval is the bootstrap of the scores in sample order */
    double v[6] = {1, 0, 0, 1, 0, 0}, blo, bhi;
    kvb_stats_bootstrap_ci(v, 6, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &blo, &bhi);
    CU_ASSERT_DOUBLE_EQUAL(lo, blo, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(hi, bhi, 1e-6);
    /* deterministic: a second report is byte-identical */
    CU_ASSERT_FATAL(kvb_report_write(dir_of("main"), err, sizeof err) == 0);
    char *again = read_in("main", "summary.csv");
    CU_ASSERT(again && !strcmp(csv, again));
    free(again);
    free(csv);
}

static void test_report_md_has_rows_in_order_and_deltas_to_full(void) {
    char *md = read_in("main", "report.md");
    CU_ASSERT_FATAL(md != NULL);
    double v[6] = {1, 0, 0, 1, 0, 0}, lo, hi;
    kvb_stats_bootstrap_ci(v, 6, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &lo, &hi);
    char want[128];
    snprintf(want, sizeof want, "| snapkv@30%% (KV 30%%) | 33.3 ± %.1f (\u221233.3) | 75.0 ± ", 100 * (hi - lo) / 2);
    CU_ASSERT(strstr(md, "| method@budget | hotpotqa | 2stage | Avg |") != NULL);
    CU_ASSERT(strstr(md, want) != NULL);
    CU_ASSERT(strstr(md, "(\u221225.0) | 54.2 (\u221229.2) |") != NULL); /* 75 vs 100; Avg 54.2 vs 83.3 */
    const char *full = strstr(md, "| full@full | 66.7 ± "), *snap = strstr(md, "| snapkv@30% (KV 30%) | 33.3");
    CU_ASSERT(full && snap && full < snap);
    CU_ASSERT(strstr(md, "| 100.0 ± 0.0 | 83.3 |") != NULL);
    CU_ASSERT(strstr(md, "**longbench**: hotpotqa; **2stage**: 2stage") != NULL);
    /* efficiency: 8 samples, 2x decode speedup, 30% of full */
    CU_ASSERT(strstr(md, "| snapkv@30% (KV 30%) | 12 | 100.0 | 5.00 | 2.00× | 0.30 | 0.30 | 30.0 | 0.00 | 0.00 | 50 |") != NULL);
    CU_ASSERT(strstr(md, "| full@full | 10 | 100.0 | 10.00 | 1.00× | 1.00 | 1.00 | 100.0 |") != NULL);
    /* errors per method, with the messages */
    CU_ASSERT(strstr(md, "| snapkv@30% (KV 30%) | 12 | 10 | 1 | 1 |") != NULL);
    CU_ASSERT(strstr(md, "`prompt too long`") && strstr(md, "`timeout`"));
    CU_ASSERT(strstr(md, "| model sha256 | sha-a |") != NULL);
    free(md);
}

static int well_formed_svg(const char *name, const char *file) {
    char *s = read_in(name, file);
    if (!s) return 0;
    size_t n = strlen(s);
    int ok = !strncmp(s, "<svg", 4) && n > 8 && !strcmp(s + n - 7, "</svg>\n");
    int open = 0, close = 0;
    for (const char *p = s; (p = strstr(p, "<text")); p++) open++;
    for (const char *p = s; (p = strstr(p, "</text>")); p++) close++;
    free(s);
    return ok && open == close && open > 0;
}

static void test_report_sections_and_svg_charts(void) {
    FILE *f = new_run("sections", "paper", "sha-a");
    static const char *types[3] = {"multi-session", "single-session-user", "temporal-reasoning"};
    const char *methods[2] = {"full", "snapkv"}, *budgets[2] = {"full", "30%"};
    for (int m = 0; m < 2; m++) {
        char extra[160];
        for (int i = 0; i < 6; i++) {
            snprintf(extra, sizeof extra, ",\"qtype\":\"%s\",\"abstention\":%s", types[i % 3], i == 5 ? "true" : "false");
            rec(f, methods[m], budgets[m], "longmemeval", "longmemeval_oracle", i, i % 2 ? 1 : m ? 0 : 1, 10 - 5 * m, 1048576, extra);
        }
        for (int i = 0; i < 4; i++) {
            snprintf(extra, sizeof extra, ",\"length_bin\":\"%s\"", i < 2 ? "0-4k" : "8k+");
            rec(f, methods[m], budgets[m], "longbench", "qasper", i, i < 2 ? 0.5 : 0.25, 10 - 5 * m, 1048576, extra);
        }
        for (int len = 1000; len <= 4000; len *= 2)
            for (int d = 0; d <= 100; d += 50) {
                snprintf(extra, sizeof extra, ",\"qtype\":\"len=%d,depth=%d\",\"ctx_len\":%d,\"depth\":%d", len, d, len, d);
                rec(f, methods[m], budgets[m], "niah", "niah", len + d, m && d == 50 ? 0 : 1, 10 - 5 * m, 1048576, extra);
            }
    }
    for (int i = 0; i < 3; i++) rec(f, "snapkv", "50%", "longbench", "qasper", i, 0.5, 6, 524288, NULL);
    rec(f, "h2o", "30%", "longbench", "qasper", 0, 0.1, 6, 524288, NULL);
    fclose(f);
    CU_ASSERT_FATAL(kvb_report_write(dir_of("sections"), err, sizeof err) == 0);
    char *md = read_in("sections", "report.md");
    CU_ASSERT_FATAL(md != NULL);
    CU_ASSERT(strstr(md, "| method@budget | single-session-user | multi-session | temporal-reasoning | Overall | Task-avg | Abstention |") != NULL);
    /* snapkv: odd samples score 1 -> ssu {1:1,4:0}=50, ms {0:0,3:1}=50, tr {2:0,5:1}=50; abstention = sample 5 */
    CU_ASSERT(strstr(md, "| snapkv@30% (KV 100%) | 50.0 | 50.0 | 50.0 | 50.0 (6) | 50.0 | 100.0 (1) |") != NULL);
    CU_ASSERT(strstr(md, "| method@budget | 0-4k | 8k+ |") != NULL);
    CU_ASSERT(strstr(md, "| qasper | full@full | 50.0 (2) | 25.0 (2) |") != NULL);
    CU_ASSERT(strstr(md, "[niah-snapkv-30pct.svg](niah-snapkv-30pct.svg)") != NULL);
    CU_ASSERT(strstr(md, "[niah-full-full.svg](niah-full-full.svg)") != NULL);
    CU_ASSERT(strstr(md, "accuracy-vs-budget.svg") && strstr(md, "latency-vs-context.svg"));
    /* rows: full, then budgets ascending, methods by first appearance */
    const char *a = strstr(md, "| full@full |"), *b = strstr(md, "| snapkv@30% (KV 100%) |"), *c = strstr(md, "| h2o@30% (KV 50%) |"),
               *d = strstr(md, "| snapkv@50% (KV 50%) |");
    CU_ASSERT(a && b && c && d && a < b && b < c && c < d);
    free(md);
    CU_ASSERT(well_formed_svg("sections", "niah-snapkv-30pct.svg"));
    CU_ASSERT(well_formed_svg("sections", "niah-full-full.svg"));
    CU_ASSERT(well_formed_svg("sections", "accuracy-vs-budget.svg"));
    CU_ASSERT(well_formed_svg("sections", "latency-vs-context.svg"));
    char *heat = read_in("sections", "niah-snapkv-30pct.svg");
    CU_ASSERT(heat && strstr(heat, ">2000</text>") && strstr(heat, "#d73027")); /* the 0-score row is red */
    free(heat);
    char p[400];
    snprintf(p, sizeof p, "ls %s | grep -q '[.]tmp'", dir_of("sections"));
    CU_ASSERT(system(p) != 0); /* written to a temporary, then renamed: none stays */
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p++) n++;
    return n;
}

/* snapkv asked 30% but held 100% of full (the records' bytes), snapkv@50% and h2o@30% held 50%: the chart
 * plots them there, the polyline runs by measured KV, and a one-point series gets a marker but no line. */
static void test_accuracy_chart_plots_measured_kv_and_legends_only_what_is_drawn(void) {
    char *svg = read_in("sections", "accuracy-vs-budget.svg");
    CU_ASSERT_FATAL(svg != NULL);
    /* snapkv@30%: (50 + 37.5 + 66.7) / 3 = 51.4 at 100% measured; snapkv@50%: 50 at 50%; h2o@30%: 10 at 50% */
    const char *p50 = strstr(svg, "<title>snapkv: (50, 50)</title>"), *p100 = strstr(svg, "<title>snapkv: (100, 51.4)</title>");
    CU_ASSERT(p50 && p100 && p50 < p100);
    CU_ASSERT(strstr(svg, "<title>h2o: (50, 10)</title>") != NULL);
    CU_ASSERT(strstr(svg, "(30,") == NULL); /* nothing at the budget asked for */
    CU_ASSERT(strstr(svg, "measured") != NULL);
    CU_ASSERT_EQUAL(count_of(svg, "<polyline"), 1); /* snapkv only: h2o has one point */
    /* full's dashed line in the plot and in the legend, snapkv's legend line; none for h2o */
    CU_ASSERT_EQUAL(count_of(svg, "stroke-width=\"2\"/>") + count_of(svg, "stroke-dasharray=\"6 4\"/>"), 3);
    /* markers are hollow outlines, one shape per series, so points at the same place stay visible */
    CU_ASSERT(strstr(svg, "<circle") == NULL);
    CU_ASSERT(count_of(svg, "<path fill=\"none\"") == 3 + 2); /* 3 points + 2 legend markers */
    CU_ASSERT(strstr(svg, "stroke=\"#ff7f0e\" stroke-width=\"2\" d=\"M") != NULL);
    free(svg);
}

/* The leaderboard's plot: a method with two % budgets is a line over kvpress's compression ratio (1 - budget,
 * as asked, not as measured), left to right; full is the dashed reference; report.md links it. A run without a
 * sweep (the main run: one budget) has no such chart. */
static void test_ratio_chart_plots_avg_score_vs_compression_ratio_per_method(void) {
    char *svg = read_in("sections", "score-vs-compression-ratio.svg");
    CU_ASSERT_FATAL(svg != NULL);
    CU_ASSERT(well_formed_svg("sections", "score-vs-compression-ratio.svg"));
    /* snapkv@50%: 50 at ratio 0.5; snapkv@30%: 51.4 at ratio 0.7 (the same Avg as report.md's) */
    const char *p5 = strstr(svg, "<title>snapkv: (0.5, 50)</title>"), *p7 = strstr(svg, "<title>snapkv: (0.7, 51.4)</title>");
    CU_ASSERT(p5 && p7 && p5 < p7);
    CU_ASSERT(strstr(svg, "<title>h2o: (0.7, 10)</title>") != NULL);
    CU_ASSERT(strstr(svg, "compression ratio") != NULL);
    CU_ASSERT_EQUAL(count_of(svg, "<polyline"), 1); /* snapkv only: h2o has one point */
    CU_ASSERT(strstr(svg, "full (reference)") != NULL);
    free(svg);
    char *md = read_in("sections", "report.md");
    CU_ASSERT(md && strstr(md, "![score vs compression ratio](score-vs-compression-ratio.svg)"));
    free(md);
    make_main_run("noratio");
    CU_ASSERT_FATAL(kvb_report_write(dir_of("noratio"), err, sizeof err) == 0);
    char *none = read_in("noratio", "score-vs-compression-ratio.svg");
    CU_ASSERT_PTR_NULL(none);
    free(none);
    md = read_in("noratio", "report.md");
    CU_ASSERT(md && !strstr(md, "score-vs-compression-ratio"));
    free(md);
}

/* A heatmap is as wide as its title needs, however long the method@budget in it. */
static void test_heatmap_is_wide_enough_for_its_title(void) {
    double xs[2] = {1000, 2000}, ys[1] = {50}, v[2] = {1, 0};
    const char *title = "Needle in a haystack: streamingllm@30% (KV 31%) (score x100)";
    char *svg = kvb_svg_heatmap(title, "context length (tokens)", "needle depth (%)", 2, xs, 1, ys, v);
    CU_ASSERT_FATAL(svg != NULL);
    int w = 0;
    CU_ASSERT(sscanf(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\"", &w) == 1);
    /* bold 15 px sans-serif: about 0.6 em a character on average */
    CU_ASSERT(w >= (int)(strlen(title) * 15 * 0.6) + 20);
    free(svg);
}

/* A run whose full attention scores below 20% on a task, on a machine loaded beyond its cores. */
static void test_uninformative_tasks_and_load_beyond_the_cores_are_flagged(void) {
    FILE *f = new_run("loaded", "quick", "sha-a");
    for (int i = 0; i < 10; i++) {
        rec(f, "full", "full", "2stage", "2stage", i, i == 0 ? 1 : 0, 10, 1048576, NULL);   /* 10% */
        rec(f, "full", "full", "recall", "recall", i, i < 2 ? 1 : 0, 10, 1048576, NULL);    /* 20%: not below */
        rec(f, "snapkv", "30%", "2stage", "2stage", i, 0, 5, 314572.8, NULL);
        rec(f, "snapkv", "30%", "recall", "recall", i, 0, 5, 314572.8, NULL);
    }
    fclose(f);
    char p[400];
    snprintf(p, sizeof p, "%s/run.json", dir_of("loaded"));
    f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{\"suite\":\"quick\",\"model_sha256\":\"sha-a\",\"host_load\":["
          "{\"cpus\":2,\"threads\":2,\"load_start\":0.5,\"load_max\":1.5,\"load_end\":1.2},"
          "{\"cpus\":2,\"threads\":2,\"load_start\":1.0,\"load_max\":4.75,\"load_end\":null}]}\n", f);
    fclose(f);
    CU_ASSERT_FATAL(kvb_report_write(dir_of("loaded"), err, sizeof err) == 0);
    char *md = read_in("loaded", "report.md");
    CU_ASSERT_FATAL(md != NULL);
    CU_ASSERT(strstr(md, "**Uninformative for this model:** 2stage (full scores 10.0).") != NULL);
    CU_ASSERT(strstr(md, "recall (full") == NULL);
    CU_ASSERT(strstr(md, "| CPUs, threads | 2, 2 |") != NULL);
    CU_ASSERT(strstr(md, "| load average (1 min) | 0.50 at start, 4.75 at most (2 sessions) |") != NULL);
    CU_ASSERT(strstr(md, "load average reached 4.75 on 2 CPUs") != NULL);
    free(md);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    CU_ASSERT_FATAL(kvb_report_print_main(dir_of("loaded"), m, err, sizeof err) == 0);
    fclose(m);
    CU_ASSERT(strstr(buf, "Uninformative for this model") && strstr(buf, "timings taken under load"));
    free(buf);
    /* an idle machine (load at most the core count) gets no warning; a bad field is an error naming it */
    f = fopen(p, "w");
    fputs("{\"suite\":\"quick\",\"host_load\":[{\"cpus\":2,\"threads\":2,\"load_start\":0.1,\"load_max\":2.0}]}\n", f);
    fclose(f);
    CU_ASSERT_FATAL(kvb_report_write(dir_of("loaded"), err, sizeof err) == 0);
    md = read_in("loaded", "report.md");
    CU_ASSERT(md && strstr(md, "| CPUs, threads | 2, 2 |") && !strstr(md, "under load"));
    free(md);
    f = fopen(p, "w");
    fputs("{\"suite\":\"quick\",\"host_load\":[{\"cpus\":\"two\"}]}\n", f);
    fclose(f);
    CU_ASSERT(kvb_report_write(dir_of("loaded"), err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "run.json") && strstr(err, "\"cpus\""));
}

static void test_print_main_table_to_a_stream(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CU_ASSERT_FATAL(kvb_report_print_main(dir_of("main"), f, err, sizeof err) == 0);
    fclose(f);
    CU_ASSERT(strstr(buf, "| method@budget | hotpotqa | 2stage | Avg |") && strstr(buf, "| full@full | 66.7 ± "));
    CU_ASSERT(strstr(buf, "decode ms/token") != NULL);
    free(buf);
}

static void test_safe_file_names(void) {
    char out[64];
    kvb_report_safe_name("30%", out, sizeof out);
    CU_ASSERT_STRING_EQUAL(out, "30pct");
    kvb_report_safe_name("../a b/c", out, sizeof out);
    CU_ASSERT_STRING_EQUAL(out, "_._a_b_c");
    kvb_report_safe_name("snap.kv-2_x", out, sizeof out);
    CU_ASSERT_STRING_EQUAL(out, "snap.kv-2_x");
}

/* ---- compare ---- */

static void make_cmp_run(const char *name, const char *suite, const char *sha, const double *snap, double snap_ms, double snap_kv,
                         int extra_cell) {
    FILE *f = new_run(name, suite, sha);
    for (int i = 0; i < 4; i++) {
        rec(f, "full", "full", "longbench", "hotpotqa", i, 1, 10, 1048576, NULL);
        rec(f, "snapkv", "30%", "longbench", "hotpotqa", i, snap[i], snap_ms, snap_kv, NULL);
        if (extra_cell) rec(f, "h2o", "30%", "longbench", "hotpotqa", i, 0.5, 5, 300000, NULL);
    }
    fclose(f);
}

static int cmp(const char *a, const char *b, double drop, double slow, double mem, int allow, char **text) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = kvb_compare(dir_of(a), dir_of(b), drop, slow, mem, allow, f, err, sizeof err);
    fclose(f);
    if (text) *text = buf;
    else free(buf);
    return rc;
}

static void test_compare_flags_regressions_beyond_each_tolerance(void) {
    double base[4] = {1, 1, 0, 0}, worse[4] = {1, 0, 0, 0}, slightly[4] = {1, 0.95, 0, 0};
    make_cmp_run("base", "nightly", "sha-a", base, 5, 300000, 0);
    make_cmp_run("same", "nightly", "sha-a", base, 5, 300000, 0);
    make_cmp_run("worse", "nightly", "sha-a", worse, 5, 300000, 0);       /* -25 points */
    make_cmp_run("slightly", "nightly", "sha-a", slightly, 5, 300000, 0); /* -1.25 points */
    make_cmp_run("slower", "nightly", "sha-a", base, 6, 300000, 0);       /* +20% */
    make_cmp_run("bigger", "nightly", "sha-a", base, 5, 330000, 0);       /* +10% */
    make_cmp_run("more", "nightly", "sha-a", base, 5, 300000, 1);         /* one more cell */
    char *text = NULL;
    CU_ASSERT(cmp("base", "same", 2, 10, 1, 0, &text) == 0);
    CU_ASSERT(text && strstr(text, "| snapkv@30% | hotpotqa | 50.0 | 50.0 | +0.0 |") && !strstr(text, "✗"));
    free(text);
    CU_ASSERT(cmp("base", "worse", 2, 10, 1, 0, &text) == 1);
    CU_ASSERT(text && strstr(text, "| 50.0 | 25.0 | \u221225.0 ✗ |") && strstr(text, "1 regression(s)"));
    free(text);
    CU_ASSERT(cmp("base", "worse", 30, 10, 1, 0, NULL) == 0);
    CU_ASSERT(cmp("base", "slightly", 2, 10, 1, 0, NULL) == 0);
    CU_ASSERT(cmp("base", "slightly", 1, 10, 1, 0, NULL) == 1);
    CU_ASSERT(cmp("base", "slower", 2, 10, 1, 0, &text) == 1);
    CU_ASSERT(text && strstr(text, "+20.0% ✗") != NULL);
    free(text);
    CU_ASSERT(cmp("base", "slower", 2, 25, 1, 0, NULL) == 0);
    CU_ASSERT(cmp("base", "slower", 2, 20, 1, 0, NULL) == 0); /* exactly the tolerance passes */
    CU_ASSERT(cmp("base", "bigger", 2, 10, 1, 0, NULL) == 1);
    CU_ASSERT(cmp("base", "bigger", 2, 10, 15, 0, NULL) == 0);
    CU_ASSERT(cmp("base", "more", 2, 10, 1, 0, &text) == 0);
    CU_ASSERT(text && strstr(text, "Only in new:") && strstr(text, "- h2o@30% hotpotqa"));
    free(text);
    CU_ASSERT(cmp("more", "base", 2, 10, 1, 0, &text) == 0);
    CU_ASSERT(text && strstr(text, "Only in base:") != NULL);
    free(text);    double none[4] = {NAN, NAN, NAN, NAN};
    make_cmp_run("unscored", "nightly", "sha-a", none, 5, 300000, 0); /* every judge call failed */
    CU_ASSERT(cmp("base", "unscored", 100, 10, 1, 0, &text) == 1);
    CU_ASSERT(text && strstr(text, "| 50.0 | - | - ✗ |") != NULL);
    free(text);
}

static void test_compare_refuses_runs_of_different_suites_or_models(void) {
    double base[4] = {1, 1, 0, 0};
    make_cmp_run("other-suite", "quick", "sha-a", base, 5, 300000, 0);
    make_cmp_run("other-model", "nightly", "sha-b", base, 5, 300000, 0);
    CU_ASSERT(cmp("base", "other-suite", 2, 10, 1, 0, NULL) == -1);
    CU_ASSERT(strstr(err, "different suites: 'nightly'") && strstr(err, "'quick'") && strstr(err, "allow_mismatch"));
    CU_ASSERT(strchr(err, '\n') == NULL);
    CU_ASSERT(cmp("base", "other-suite", 2, 10, 1, 1, NULL) == 0);
    CU_ASSERT(cmp("base", "other-model", 2, 10, 1, 0, NULL) == -1);
    CU_ASSERT(strstr(err, "different models") != NULL);
    CU_ASSERT(cmp("base", "missing", 2, 10, 1, 0, NULL) == -1);
    CU_ASSERT(strstr(err, "missing/run.json") != NULL);
}

/* ---- the loader ---- */

static void write_raw(const char *name, const char *lines) {
    FILE *f = new_run(name, "nightly", "sha-a");
    fputs(lines, f);
    fclose(f);
}

#define GOOD "{\"method\":\"full\",\"budget\":\"full\",\"benchmark\":\"niah\",\"task\":\"niah\",\"sample_id\":\"1\",\"score\":1}\n"

static void test_malformed_line_is_an_error_naming_file_and_line(void) {
    write_raw("bad-json", GOOD GOOD "{\"method\": oops}\n" GOOD);
    CU_ASSERT(kvb_report_write(dir_of("bad-json"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "bad-json/results.jsonl:3: not valid JSON") != NULL);
    CU_ASSERT(cmp("base", "bad-json", 2, 10, 1, 1, NULL) == -1);
    CU_ASSERT(strstr(err, "bad-json/results.jsonl:3:") != NULL);
    write_raw("no-method", GOOD "{\"budget\":\"full\",\"task\":\"niah\",\"score\":1}\n");
    CU_ASSERT(kvb_report_write(dir_of("no-method"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "results.jsonl:2: field \"method\" is missing") != NULL);
    write_raw("bad-score", "\n" GOOD "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"score\":1.5}\n");
    CU_ASSERT(kvb_report_write(dir_of("bad-score"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "results.jsonl:3: field \"score\" = 1.5 is outside [0, 1]") != NULL);
    write_raw("bad-type", "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"ttft_ms\":\"fast\"}\n");
    CU_ASSERT(kvb_report_write(dir_of("bad-type"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "results.jsonl:1: field \"ttft_ms\" is not a number") != NULL);
    write_raw("not-object", "[1,2]\n");
    CU_ASSERT(kvb_report_write(dir_of("not-object"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "results.jsonl:1: not a JSON object") != NULL);
}

/* Report and compare read results.jsonl with the reader run and merge use (reports/results.h), by the same
 * rules: a NUL byte (report and compare used only the records before it, and exited 0), text after a record and a
 * number that is not finite anywhere in a record are errors naming the line; a blank line is skipped. */
static void test_nul_bytes_trailing_text_and_non_finite_numbers_are_errors_naming_the_line(void) {
    static const char nul[] = GOOD "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"score\":0}\0" GOOD GOOD;
    FILE *f = new_run("nul", "nightly", "sha-a");
    fwrite(nul, 1, sizeof nul - 1, f);
    fclose(f);
    CU_ASSERT(kvb_report_write(dir_of("nul"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "nul/results.jsonl:2: a NUL byte at column 58") != NULL && !strchr(err, '\n'));
    CU_ASSERT(cmp("base", "nul", 2, 10, 1, 1, NULL) == -1);
    CU_ASSERT(strstr(err, "nul/results.jsonl:2: a NUL byte") != NULL);
    write_raw("trailing", GOOD "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"score\":1}x\n");
    CU_ASSERT(kvb_report_write(dir_of("trailing"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "trailing/results.jsonl:2: unexpected text after the record") != NULL);
    write_raw("inf", GOOD "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"niah\",\"breakdown\":{\"decode\":{\"mlp\":-1e400}}}\n");
    CU_ASSERT(kvb_report_write(dir_of("inf"), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "inf/results.jsonl:2: field \"breakdown\" holds a number that is not finite") != NULL);
    write_raw("blank", "\n" GOOD " \t\n\n" GOOD);
    kvb_run run;
    CU_ASSERT_FATAL(kvb_run_load(dir_of("blank"), &run, err, sizeof err) == 0);
    CU_ASSERT(run.n_rec == 2 && run.rec[0].line == 2 && run.rec[1].line == 5 && run.n_torn == 0);
    kvb_run_free(&run);
}

/* Records of cells the run's plan.jsonl does not have (an edited suite, records appended from another run) are
 * kept but named in a warning, in report.md and on the printed table (they became rows without a word). */
static void test_records_of_cells_the_plan_lacks_are_named(void) {
    write_raw("unplanned", GOOD "{\"method\":\"magic\",\"budget\":\"30%\",\"benchmark\":\"niah\",\"task\":\"niah\",\"sample_id\":\"1\",\"score\":1}\n");
    char p[400];
    snprintf(p, sizeof p, "%s/plan.jsonl", dir_of("unplanned"));
    FILE *f = fopen(p, "w");
    fputs("[\"full\",\"full\",\"niah\",\"niah\",\"1\",0]\n", f);
    fclose(f);
    CU_ASSERT_FATAL(kvb_report_write(dir_of("unplanned"), err, sizeof err) == 0);
    char *md = read_in("unplanned", "report.md");
    CU_ASSERT(md && strstr(md, "(warning: 1 records of cells plan.jsonl does not have: magic@30% niah/niah #1)"));
    free(md);
    char *out = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&out, &len);
    CU_ASSERT_FATAL(kvb_report_print_main(dir_of("unplanned"), mf, err, sizeof err) == 0);
    fclose(mf);
    CU_ASSERT(out && strstr(out, "warning: 1 records are of cells ") && strstr(out, "magic@30% niah/niah #1"));
    free(out);
    /* a planned run has no such warning */
    f = fopen(p, "a");
    fputs("[\"magic\",\"30%\",\"niah\",\"niah\",\"1\",0]\n", f);
    fclose(f);
    CU_ASSERT_FATAL(kvb_report_write(dir_of("unplanned"), err, sizeof err) == 0);
    md = read_in("unplanned", "report.md");
    CU_ASSERT(md && !strstr(md, "plan.jsonl does not have"));
    free(md);
}

static void test_truncated_last_line_is_ignored_and_counted(void) {
    write_raw("torn", GOOD "{\"method\":\"full\",\"budget\":\"full\",\"benchmark\":\"niah\",\"task\":\"niah\",\"sample_id\":\"2\",\"score\":0}\n"
                       "{\"method\":\"full\",\"bud");
    kvb_run run;
    CU_ASSERT_FATAL(kvb_run_load(dir_of("torn"), &run, err, sizeof err) == 0);
    CU_ASSERT(run.n_rec == 2 && run.n_torn == 1);
    CU_ASSERT(run.rec[1].line == 2 && run.rec[1].score == 0 && isnan(run.rec[1].ttft_ms));
    kvb_run_free(&run);
    CU_ASSERT(kvb_report_write(dir_of("torn"), err, sizeof err) == 0);
    char *md = read_in("torn", "report.md"), *csv = read_in("torn", "summary.csv");
    CU_ASSERT(md && strstr(md, "| records | 2 (warning: 1 torn last line ignored)"));
    CU_ASSERT(csv && strstr(csv, "\nfull,full,niah,niah,2,2,0.500000,"));
    free(md), free(csv);
}

static void test_duplicate_records_keep_the_last(void) {
    write_raw("dup", GOOD "{\"method\":\"full\",\"budget\":\"full\",\"benchmark\":\"niah\",\"task\":\"niah\",\"sample_id\":\"1\",\"score\":0}\n");
    kvb_run run;
    kvb_summary s;
    CU_ASSERT_FATAL(kvb_run_load(dir_of("dup"), &run, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_summary_build(&run, &s, err, sizeof err) == 0);
    CU_ASSERT(s.n_duplicates == 1 && s.n_cells == 1 && s.cells[0].n == 1 && s.cells[0].mean == 0);
    CU_ASSERT(s.ref_row == 0 && kvb_summary_find(&s, "full", "full", "niah") == &s.cells[0]);
    kvb_summary_free(&s);
    kvb_run_free(&run);
}

static void test_empty_run_writes_empty_tables(void) {
    write_raw("empty", "");
    CU_ASSERT(kvb_report_write(dir_of("empty"), err, sizeof err) == 0);
    char *md = read_in("empty", "report.md");
    CU_ASSERT(md && strstr(md, "(no records)"));
    free(md);
}

int main(void) {
    if (!mkdtemp(root)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("reports", NULL, NULL);
    CU_add_test(s, "bootstrap matches a naive float64 recomputation", test_bootstrap_matches_naive_float64_recomputation);
    CU_add_test(s, "bootstrap is deterministic and seeded", test_bootstrap_is_deterministic_and_seeded);
    CU_add_test(s, "bootstrap of constant scores is zero width", test_bootstrap_of_constant_scores_is_zero_width);
    CU_add_test(s, "summary.csv has counts, means and intervals", test_summary_csv_has_counts_means_and_intervals);
    CU_add_test(s, "report.md has rows in order and deltas to full", test_report_md_has_rows_in_order_and_deltas_to_full);
    CU_add_test(s, "report sections and SVG charts", test_report_sections_and_svg_charts);
    CU_add_test(s, "accuracy chart plots measured KV and legends only what is drawn",
                test_accuracy_chart_plots_measured_kv_and_legends_only_what_is_drawn);
    CU_add_test(s, "ratio chart plots Avg score vs compression ratio per method", test_ratio_chart_plots_avg_score_vs_compression_ratio_per_method);
    CU_add_test(s, "heatmap is wide enough for its title", test_heatmap_is_wide_enough_for_its_title);
    CU_add_test(s, "uninformative tasks and load beyond the cores are flagged", test_uninformative_tasks_and_load_beyond_the_cores_are_flagged);
    CU_add_test(s, "print main table to a stream", test_print_main_table_to_a_stream);
    CU_add_test(s, "safe file names", test_safe_file_names);
    CU_add_test(s, "compare flags regressions beyond each tolerance", test_compare_flags_regressions_beyond_each_tolerance);
    CU_add_test(s, "compare refuses runs of different suites or models", test_compare_refuses_runs_of_different_suites_or_models);
    CU_add_test(s, "malformed line is an error naming file and line", test_malformed_line_is_an_error_naming_file_and_line);
    CU_add_test(s, "truncated last line is ignored and counted", test_truncated_last_line_is_ignored_and_counted);
    CU_add_test(s, "records of cells the plan lacks are named", test_records_of_cells_the_plan_lacks_are_named);
    CU_add_test(s, "NUL bytes, trailing text and non-finite numbers are errors naming the line",
                test_nul_bytes_trailing_text_and_non_finite_numbers_are_errors_naming_the_line);
    CU_add_test(s, "duplicate records keep the last", test_duplicate_records_keep_the_last);
    CU_add_test(s, "empty run writes empty tables", test_empty_run_writes_empty_tables);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) rc = 1;
    return rc;
}
