/* report.c — summary.csv, report.md and the charts of a run (see report.h). Choices: scores are shown x100;
 * a cell is "mean ± half-width" where the half-width is half the 95% percentile bootstrap interval (the
 * exact bounds are in summary.csv); deltas to full are taken before rounding; Avg is the mean of a row's
 * task means; cost means skip failed samples (results.h). */
#include "reports/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fsutil.h"
#include "reports/ratio_chart.h"
#include "reports/serve_rows.h"
#include "reports/stats.h"
#include "reports/svg.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

/* ---- formatting ---- */

/* Markdown-safe text: '|' escaped, newlines flattened. */
static void md(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n' || *s == '\r') fputc(' ', f);
        else if ((unsigned char)*s < 0x20 || *s == 0x7f) fprintf(f, "\\x%02x", (unsigned char)*s); /* not for a terminal */
        else fputc(*s, f);
    }
}

/* "snapkv@30% (KV 31%)": the budget asked for and the device KV measured after prefill (% of full), so
 * rows that held different memory are never read as equal-memory rows. Full rows stay "full@full". */
static void row_name(FILE *f, const kvb_row *r) {
    md(f, r->method);
    fputc('@', f);
    md(f, r->budget);
    if (!kvb_row_is_full(r) && isfinite(r->kv_device_pct)) fprintf(f, " (KV %.0f%%)", r->kv_device_pct);
}

/* Full attention below this mean score on a task: the model cannot do the task, so differences between
 * methods there measure nothing. */
#define UNINFORMATIVE_BELOW 0.2

/* One line naming the tasks full attention scores below UNINFORMATIVE_BELOW on (nothing when none). */
static void uninformative_note(const kvb_summary *s, FILE *f) {
    int n = 0;
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *rc = kvb_summary_at(s, s->ref_row, j);
        if (!rc || !rc->n_scored || !(rc->mean < UNINFORMATIVE_BELOW)) continue;
        fputs(n++ ? ", " : "\n**Uninformative for this model:** ", f);
        md(f, s->cols[j].task), fprintf(f, " (full scores %.1f)", 100 * rc->mean);
    }
    if (n) fprintf(f, ". Full attention scores below %.0f there, so the model cannot do %s and the methods' scores on %s "
                      "measure nothing.\n", 100 * UNINFORMATIVE_BELOW, n > 1 ? "these tasks" : "this task", n > 1 ? "them" : "it");
}

/* One line warning that the machine was busier than its cores while the run ran (nothing otherwise). */
static void load_warning(const kvb_run *run, FILE *f) {
    if (!run->n_load_sessions || !run->cpus || !(run->load_max > run->cpus)) return;
    fprintf(f, "\n**Warning: timings taken under load.** The 1-minute load average reached %.2f on %d CPUs (%d threads "
               "for the run) while it ran: other processes shared the cores, so TTFT, ms/token and speedups are not "
               "reliable; re-run on an idle machine to measure them.\n", run->load_max, run->cpus, run->threads);
}

/* A difference in points, one decimal, with a real minus sign: "+1.0", "−2.1". */
static void delta(FILE *f, double d) {
    double r = round(d * 10) / 10;
    if (r < 0) fprintf(f, "\u2212%.1f", -r);
    else fprintf(f, "+%.1f", r + 0.0);
}

static void num(FILE *f, const char *fmt, double v) {
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputc('-', f);
}

void kvb_report_safe_name(const char *name, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = name; *p && n + 4 < cap; p++) {
        char c = *p;
        if (c == '%') {
            memcpy(out + n, "pct", 3), n += 3;
            continue;
        }
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
        out[n] = ok && !(c == '.' && n == 0) ? c : '_';
        n++;
    }
    out[n] = 0;
}

/* ---- summary.csv ---- */

static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, const char *fmt, double v) {
    fputc(',', f);
    if (isfinite(v)) fprintf(f, fmt, v);
}

/* Close an open_memstream stream: its text, or NULL (freed) when a write failed. */
static char *close_mem(FILE *f, char **buf) {
    int bad = ferror(f);
    if (fclose(f) || bad) {
        free(*buf);
        *buf = NULL;
    }
    return *buf;
}

char *kvb_report_csv(const kvb_summary *s) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fputs("method,budget,benchmark,task,n,n_scored,mean,ci95_low,ci95_high,judge_errors,sample_errors,ttft_ms,"
          "decode_ms_per_token,kv_device_mib,kv_device_end_mib,kv_host_mib,kv_full_mib,moved_mib,attended_per_layer\n", f);
    for (int i = 0; i < s->n_rows; i++)
        for (int j = 0; j < s->n_cols; j++) {
            const kvb_cell *c = kvb_summary_at(s, i, j);
            if (!c) continue;
            const char *names[] = {c->method, c->budget, c->benchmark, c->task};
            for (int k = 0; k < 4; k++) {
                if (k) fputc(',', f);
                csv_field(f, names[k]);
            }
            fprintf(f, ",%zu,%zu", c->n, c->n_scored);
            csv_num(f, "%.6f", c->mean), csv_num(f, "%.6f", c->ci_lo), csv_num(f, "%.6f", c->ci_hi);
            fprintf(f, ",%d,%d", c->judge_errors, c->sample_errors);
            csv_num(f, "%.3f", c->ttft_ms), csv_num(f, "%.4f", c->decode_ms_per_token);
            csv_num(f, "%.4f", c->kv_device_mib), csv_num(f, "%.4f", c->kv_device_end_mib), csv_num(f, "%.4f", c->kv_host_mib);
            csv_num(f, "%.4f", c->kv_full_mib), csv_num(f, "%.4f", c->moved_mib), csv_num(f, "%.1f", c->attended_per_layer);
            fputc('\n', f);
        }
    return close_mem(f, &buf);
}

/* ---- main score table ---- */

/* Mean of the row's task means (x100) over the tasks it has scores for. *ref_avg: the reference row's mean
 * over the same tasks, NAN unless it has them all. */
static double row_avg(const kvb_summary *s, int row, double *ref_avg) {
    double sum = 0, ref_sum = 0;
    int n = 0, n_ref = 0;
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *c = kvb_summary_at(s, row, j), *rc = kvb_summary_at(s, s->ref_row, j);
        if (!c || !c->n_scored) continue;
        sum += 100 * c->mean, n++;
        if (rc && rc->n_scored) ref_sum += 100 * rc->mean, n_ref++;
    }
    if (ref_avg) *ref_avg = n && n_ref == n ? ref_sum / n : NAN;
    return n ? sum / n : NAN;
}

static void main_cell(FILE *f, const kvb_summary *s, int row, int col) {
    const kvb_cell *c = kvb_summary_at(s, row, col), *rc = kvb_summary_at(s, s->ref_row, col);
    if (!c || !c->n_scored) {
        fputs(" - |", f);
        return;
    }
    fprintf(f, " %.1f ± %.1f", 100 * c->mean, 100 * (c->ci_hi - c->ci_lo) / 2);
    if (row != s->ref_row && rc && rc->n_scored) {
        fputs(" (", f);
        delta(f, 100 * (c->mean - rc->mean));
        fputc(')', f);
    }
    fputs(" |", f);
}

void kvb_report_main_table(const kvb_summary *s, FILE *f) {
    if (!s->n_cells) {
        fputs("(no records)\n", f);
        return;
    }
    fputs("| method@budget |", f);
    for (int j = 0; j < s->n_cols; j++) fputc(' ', f), md(f, s->cols[j].task), fputs(" |", f);
    fputs(" Avg |\n|---|", f);
    for (int j = 0; j <= s->n_cols; j++) fputs("---:|", f);
    fputc('\n', f);
    for (int i = 0; i < s->n_rows; i++) {
        fputs("| ", f), row_name(f, &s->rows[i]), fputs(" |", f);
        for (int j = 0; j < s->n_cols; j++) main_cell(f, s, i, j);
        double ref, avg = row_avg(s, i, &ref);
        fputc(' ', f), num(f, "%.1f", avg);
        if (i != s->ref_row && isfinite(avg) && isfinite(ref)) fputs(" (", f), delta(f, avg - ref), fputc(')', f);
        fputs(" |\n", f);
    }
    uninformative_note(s, f);
    fputs("\nColumns by benchmark:", f);
    for (int j = 0; j < s->n_cols; j++) {
        int first = !j || strcmp(s->cols[j].benchmark, s->cols[j - 1].benchmark);
        fputs(first ? (j ? "; **" : " **") : ", ", f);
        if (first) md(f, s->cols[j].benchmark), fputs("**: ", f);
        md(f, s->cols[j].task);
    }
    fputs(".\n", f);
}

/* ---- efficiency ---- */

typedef struct { double sum; size_t n; } acc;

static void add(acc *a, double v, int positive_only) {
    if (isfinite(v) && (!positive_only || v > 0)) a->sum += v, a->n++;
}

static double avg_of(const acc *a) { return a->n ? a->sum / (double)a->n : NAN; }

typedef struct { acc ttft, decode, dev, dev_end, host, moved, attended, frac; size_t n; } row_cost;

static row_cost cost_of(const kvb_run *run, const kvb_summary *s, int row) {
    row_cost rc;
    memset(&rc, 0, sizeof rc);
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *c = kvb_summary_at(s, row, j);
        for (size_t k = 0; c && k < c->n; k++) {
            const kvb_record *r = &run->rec[c->rec[k]];
            rc.n++;
            if (r->error) continue;
            add(&rc.ttft, r->ttft_ms, 1), add(&rc.decode, r->decode_ms_per_token, 1), add(&rc.attended, r->attended_per_layer, 0);
            add(&rc.dev, r->kv_device_bytes, 0), add(&rc.dev_end, r->kv_device_bytes_end, 0), add(&rc.host, r->kv_host_bytes, 0);
            add(&rc.moved, r->moved_bytes, 0);
            if (r->kv_full_bytes > 0) add(&rc.frac, r->kv_device_bytes / r->kv_full_bytes, 0);
        }
    }
    return rc;
}

void kvb_report_efficiency_table(const kvb_run *run, const kvb_summary *s, FILE *f) {
    const double MIB = 1024.0 * 1024.0;
    double ref_decode = NAN;
    if (s->ref_row >= 0) {
        row_cost ref = cost_of(run, s, s->ref_row);
        ref_decode = avg_of(&ref.decode);
    }
    fputs("| method@budget | samples | TTFT ms | decode ms/token | decode speedup vs full | KV device MiB (prefill) | "
          "KV device MiB (end) | % of full | KV host MiB | moved MiB | attended/layer |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", f);
    for (int i = 0; i < s->n_rows; i++) {
        row_cost c = cost_of(run, s, i);
        double dec = avg_of(&c.decode);
        fputs("| ", f), row_name(f, &s->rows[i]), fprintf(f, " | %zu | ", c.n);
        num(f, "%.1f", avg_of(&c.ttft)), fputs(" | ", f), num(f, "%.2f", dec), fputs(" | ", f);
        num(f, "%.2f×", ref_decode / dec), fputs(" | ", f);
        num(f, "%.2f", avg_of(&c.dev) / MIB), fputs(" | ", f), num(f, "%.2f", avg_of(&c.dev_end) / MIB), fputs(" | ", f);
        num(f, "%.1f", 100 * avg_of(&c.frac)), fputs(" | ", f), num(f, "%.2f", avg_of(&c.host) / MIB), fputs(" | ", f);
        num(f, "%.2f", avg_of(&c.moved) / MIB), fputs(" | ", f), num(f, "%.0f", avg_of(&c.attended)), fputs(" |\n", f);
    }
}

/* ---- breakdowns by a record field (LongMemEval question types, LongBench-E length bins) ---- */

enum { MAX_GROUPS = 64 };

static const char *field_str(const kvb_record *r, size_t off) { return *(char *const *)((const char *)r + off); }

/* Distinct values of a string field among records of bench: the canonical ones present first, in their
 * order, then the others by first appearance. */
static int distinct(const kvb_run *run, const char *bench, size_t off, const char *const *canon, int n_canon, const char **out) {
    int n = 0;
    for (int k = 0; k <= n_canon; k++) /* k < n_canon: canonical value k; k == n_canon: every other value */
        for (size_t i = 0; i < run->n_rec && n < MAX_GROUPS; i++) {
            const char *v = field_str(&run->rec[i], off);
            if (!v || strcmp(run->rec[i].benchmark, bench) || (k < n_canon && strcmp(v, canon[k]))) continue;
            int seen = 0;
            for (int j = 0; j < n && !seen; j++) seen = !strcmp(out[j], v);
            if (!seen) out[n++] = v;
        }
    return n;
}

/* Scores of one row's records of bench (and of column col unless -1), split by the values of a field. */
static void group_scores(const kvb_run *run, const kvb_summary *s, int row, int col, const char *bench, size_t off,
                         const char **names, int n, acc *per, acc *all, acc *abst) {
    memset(per, 0, (size_t)n * sizeof *per);
    memset(all, 0, sizeof *all), memset(abst, 0, sizeof *abst);
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *c = kvb_summary_at(s, row, j);
        if (!c || (col >= 0 && j != col) || strcmp(c->benchmark, bench)) continue;
        for (size_t k = 0; k < c->n; k++) {
            const kvb_record *r = &run->rec[c->rec[k]];
            const char *v = field_str(r, off);
            add(all, r->score, 0);
            if (r->abstention) add(abst, r->score, 0);
            for (int g = 0; v && g < n; g++)
                if (!strcmp(v, names[g])) add(&per[g], r->score, 0);
        }
    }
}

static void pct_cell(FILE *f, const acc *a, int with_n) {
    fputc(' ', f);
    num(f, "%.1f", 100 * avg_of(a));
    if (with_n && a->n) fprintf(f, " (%zu)", a->n);
    fputs(" |", f);
}

static void lme_section(const kvb_run *run, const kvb_summary *s, FILE *f) {
    static const char *const canon[] = {"single-session-user", "single-session-assistant", "single-session-preference",
                                        "multi-session", "knowledge-update", "temporal-reasoning"};
    const char *types[MAX_GROUPS];
    acc per[MAX_GROUPS], all, abst;
    int n = distinct(run, "longmemeval", offsetof(kvb_record, qtype), canon, 6, types);
    if (!n) return;
    fputs("\n## LongMemEval by question type\n\nAccuracy x100. Task-avg = mean of the question-type accuracies; "
          "abstention = the questions whose answer is not in the history.\n\n| method@budget |", f);
    for (int g = 0; g < n; g++) fputc(' ', f), md(f, types[g]), fputs(" |", f);
    fputs(" Overall | Task-avg | Abstention |\n|---|", f);
    for (int g = 0; g < n + 3; g++) fputs("---:|", f);
    fputc('\n', f);
    for (int i = 0; i < s->n_rows; i++) {
        group_scores(run, s, i, -1, "longmemeval", offsetof(kvb_record, qtype), types, n, per, &all, &abst);
        if (!all.n) continue;
        acc task_avg = {0, 0};
        fputs("| ", f), row_name(f, &s->rows[i]), fputs(" |", f);
        for (int g = 0; g < n; g++) pct_cell(f, &per[g], 0), add(&task_avg, avg_of(&per[g]), 0);
        pct_cell(f, &all, 1), pct_cell(f, &task_avg, 0), pct_cell(f, &abst, 1);
        fputc('\n', f);
    }
}

static void length_bin_section(const kvb_run *run, const kvb_summary *s, FILE *f) {
    static const char *const canon[] = {"0-4k", "4-8k", "8k+"};
    const char *bins[MAX_GROUPS];
    acc per[MAX_GROUPS], all, abst;
    int n = distinct(run, "longbench", offsetof(kvb_record, length_bin), canon, 3, bins);
    if (!n) return;
    fputs("\n## LongBench-E by length\n\nScore x100 (samples) per context-length bin.\n\n| task | method@budget |", f);
    for (int g = 0; g < n; g++) fputc(' ', f), md(f, bins[g]), fputs(" |", f);
    fputs("\n|---|---|", f);
    for (int g = 0; g < n; g++) fputs("---:|", f);
    fputc('\n', f);
    for (int j = 0; j < s->n_cols; j++)
        for (int i = 0; i < s->n_rows; i++) {
            group_scores(run, s, i, j, "longbench", offsetof(kvb_record, length_bin), bins, n, per, &all, &abst);
            int any = 0;
            for (int g = 0; g < n; g++) any |= per[g].n > 0;
            if (!any) continue;
            fputs("| ", f), md(f, s->cols[j].task), fputs(" | ", f), row_name(f, &s->rows[i]), fputs(" |", f);
            for (int g = 0; g < n; g++) pct_cell(f, &per[g], 1);
            fputc('\n', f);
        }
}

/* result.py's table (Overall, Easy, Hard, Short, Medium, Long) and the same accuracy by domain, per task (zero-shot
 * and CoT apart) and row */
static void lbv2_section(const kvb_run *run, const kvb_summary *s, FILE *f) {
    static const char *const diff_canon[] = {"easy", "hard"}, *const len_canon[] = {"short", "medium", "long"};
    static const char *const dom_canon[] = {"Single-Document QA", "Multi-Document QA", "Long In-context Learning",
                                            "Long-dialogue History Understanding", "Code Repository Understanding",
                                            "Long Structured Data Understanding"};
    const char *diffs[MAX_GROUPS], *lens[MAX_GROUPS], *doms[MAX_GROUPS];
    size_t off_diff = offsetof(kvb_record, difficulty), off_len = offsetof(kvb_record, length_bin),
           off_dom = offsetof(kvb_record, domain);
    int nd = distinct(run, "longbench_v2", off_diff, diff_canon, 2, diffs);
    int nl = distinct(run, "longbench_v2", off_len, len_canon, 3, lens);
    int nm = distinct(run, "longbench_v2", off_dom, dom_canon, 6, doms);
    if (!nd && !nl && !nm) return;
    fputs("\n## LongBench v2 by difficulty, length and domain\n\nAccuracy x100 (samples), as result.py reports it, "
          "and by domain.\n\n| task | method@budget | Overall |", f);
    const char **groups[3] = {diffs, lens, doms};
    int ns[3] = {nd, nl, nm};
    size_t offs[3] = {off_diff, off_len, off_dom};
    for (int k = 0; k < 3; k++)
        for (int g = 0; g < ns[k]; g++) fputc(' ', f), md(f, groups[k][g]), fputs(" |", f);
    fputs("\n|---|---|---:|", f);
    for (int g = 0; g < nd + nl + nm; g++) fputs("---:|", f);
    fputc('\n', f);
    acc per[MAX_GROUPS], all, abst;
    for (int j = 0; j < s->n_cols; j++)
        for (int i = 0; i < s->n_rows; i++) {
            group_scores(run, s, i, j, "longbench_v2", off_diff, diffs, nd, per, &all, &abst);
            if (!all.n) continue;
            fputs("| ", f), md(f, s->cols[j].task), fputs(" | ", f), row_name(f, &s->rows[i]), fputs(" |", f);
            pct_cell(f, &all, 1);
            for (int k = 0; k < 3; k++) {
                group_scores(run, s, i, j, "longbench_v2", offs[k], groups[k], ns[k], per, &all, &abst);
                for (int g = 0; g < ns[k]; g++) pct_cell(f, &per[g], 1);
            }
            fputc('\n', f);
        }
}

/* SCBench (benchmarks/scbench.h): each task's score per turn (compute_scores' per-turn figures; records carry the
 * turn as qtype "turn=<k>"), and each row's score by capability group (the records' domain) over its SCBench tasks */
static void scbench_section(const kvb_run *run, const kvb_summary *s, FILE *f) {
    static const char *const turn_canon[] = {"turn=1", "turn=2", "turn=3", "turn=4", "turn=5"},
                             *const grp_canon[] = {"String Retrieval", "Semantic Retrieval", "Global Information", "Multi-tasking"};
    const char *turns[MAX_GROUPS], *grps[MAX_GROUPS];
    size_t off_t = offsetof(kvb_record, qtype), off_g = offsetof(kvb_record, domain);
    int nt = distinct(run, "scbench", off_t, turn_canon, 5, turns), ng = distinct(run, "scbench", off_g, grp_canon, 4, grps);
    if (!nt) return;
    acc per[MAX_GROUPS], all, abst;
    fputs("\n## SCBench by turn and capability group\n\nScore x100 (samples) of each turn, as compute_scores gives it per "
          "turn, and over all turns. Prefill: the tokens and seconds the task's records prefilled, summed: a multi-request "
          "task with the question hidden counts each record's shared context once (its first query), a multi-turn task "
          "with KV cache reuse (_reuse) its first turn's prompt once (its first turn) and each later turn's own part, "
          "every other record its whole prompt.\n\n| task | method@budget | prefill tokens | prefill s | all |", f);
    for (int g = 0; g < nt; g++) fputc(' ', f), md(f, turns[g]), fputs(" |", f);
    fputs("\n|---|---|---:|---:|---:|", f);
    for (int g = 0; g < nt; g++) fputs("---:|", f);
    fputc('\n', f);
    for (int j = 0; j < s->n_cols; j++)
        for (int i = 0; i < s->n_rows; i++) {
            group_scores(run, s, i, j, "scbench", off_t, turns, nt, per, &all, &abst);
            if (!all.n) continue;
            double tok = 0, ms = 0;
            const kvb_cell *c = kvb_summary_at(s, i, j);
            for (size_t k = 0; c && k < c->n; k++) {
                const kvb_record *r = &run->rec[c->rec[k]];
                if (isfinite(r->prefill_tokens)) tok += r->prefill_tokens;
                if (isfinite(r->prefill_ms)) ms += r->prefill_ms;
            }
            fputs("| ", f), md(f, s->cols[j].task), fputs(" | ", f), row_name(f, &s->rows[i]);
            fprintf(f, " | %.0f | %.1f |", tok, ms / 1e3);
            pct_cell(f, &all, 1);
            for (int g = 0; g < nt; g++) pct_cell(f, &per[g], 1);
            fputc('\n', f);
        }
    fputs("\nBy capability group (every SCBench task of the row, every turn):\n\n| method@budget | all |", f);
    for (int g = 0; g < ng; g++) fputc(' ', f), md(f, grps[g]), fputs(" |", f);
    fputs("\n|---|---:|", f);
    for (int g = 0; g < ng; g++) fputs("---:|", f);
    fputc('\n', f);
    for (int i = 0; i < s->n_rows; i++) {
        group_scores(run, s, i, -1, "scbench", off_g, grps, ng, per, &all, &abst);
        if (!all.n) continue;
        fputs("| ", f), row_name(f, &s->rows[i]), fputs(" |", f);
        pct_cell(f, &all, 1);
        for (int g = 0; g < ng; g++) pct_cell(f, &per[g], 1);
        fputc('\n', f);
    }
}

/* ---- errors ---- */

static void error_messages(const kvb_run *run, const kvb_summary *s, int row, FILE *f) {
    enum { MAX_SHOWN = 5 };
    const char *msg[MAX_SHOWN];
    int count[MAX_SHOWN], n = 0;
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *c = kvb_summary_at(s, row, j);
        for (size_t k = 0; c && k < c->n; k++) {
            const kvb_record *r = &run->rec[c->rec[k]];
            const char *texts[2] = {r->error, r->judge_error};
            for (int t = 0; t < 2; t++) {
                if (!texts[t]) continue;
                int g = 0;
                while (g < n && strcmp(msg[g], texts[t])) g++;
                if (g < n) count[g]++;
                else if (n < MAX_SHOWN) msg[n] = texts[t], count[n++] = 1;
            }
        }
    }
    for (int g = 0; g < n; g++) {
        fputs("- ", f), row_name(f, &s->rows[row]), fprintf(f, " ×%d: `", count[g]);
        for (const char *p = msg[g]; *p && p - msg[g] < 200; p++) fputc(*p == '`' || *p == '\n' ? '\'' : *p, f);
        fputs("`\n", f);
    }
}

static void errors_section(const kvb_run *run, const kvb_summary *s, FILE *f) {
    fputs("\n## Errors\n\nJudge errors leave a sample unscored; sample errors are failures of the run itself (their "
          "costs are left out of the means).\n\n| method@budget | samples | scored | judge errors | sample errors |\n"
          "|---|---:|---:|---:|---:|\n", f);
    int any = 0;
    for (int i = 0; i < s->n_rows; i++) {
        size_t n = 0, scored = 0;
        int je = 0, se = 0;
        for (int j = 0; j < s->n_cols; j++) {
            const kvb_cell *c = kvb_summary_at(s, i, j);
            if (c) n += c->n, scored += c->n_scored, je += c->judge_errors, se += c->sample_errors;
        }
        any |= je || se;
        fputs("| ", f), row_name(f, &s->rows[i]), fprintf(f, " | %zu | %zu | %d | %d |\n", n, scored, je, se);
    }
    if (!any) return;
    fputs("\nFirst distinct messages:\n\n", f);
    for (int i = 0; i < s->n_rows; i++) error_messages(run, s, i, f);
}

/* ---- NIAH heatmaps ---- */

/* A needle record's (context length, depth): the record's fields, else its qtype "len=L,depth=D". */
static int niah_point(const kvb_record *r, double *len, double *depth) {
    if (strcmp(r->benchmark, "niah") || isnan(r->score)) return 0;
    if (isfinite(r->ctx_len) && isfinite(r->depth)) {
        *len = r->ctx_len, *depth = r->depth;
        return 1;
    }
    return r->qtype && sscanf(r->qtype, "len=%lf,depth=%lf", len, depth) == 2;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Distinct context lengths and depths of the run's needle records (shared by every row's heatmap). */
static int niah_axes(const kvb_run *run, double **xs, int *nx, double **ys, int *ny) {
    *xs = malloc((run->n_rec + 1) * sizeof **xs), *ys = malloc((run->n_rec + 1) * sizeof **ys);
    if (!*xs || !*ys) return -1;
    size_t n = 0;
    for (size_t i = 0; i < run->n_rec; i++) n += niah_point(&run->rec[i], &(*xs)[n], &(*ys)[n]);
    double *v[2] = {*xs, *ys};
    int *cnt[2] = {nx, ny};
    for (int a = 0; a < 2; a++) {
        qsort(v[a], n, sizeof *v[a], cmp_double);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (!m || v[a][m - 1] != v[a][i]) v[a][m++] = v[a][i];
        *cnt[a] = (int)m;
    }
    return 0;
}

static int index_of(const double *v, int n, double x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    return -1;
}

/* Mean score per (depth, length) of one row; 0 when the row has no needle records. */
static int niah_grid(const kvb_run *run, const kvb_summary *s, int row, const double *xs, int nx, const double *ys, int ny,
                     acc *grid, double *v) {
    memset(grid, 0, (size_t)nx * (size_t)ny * sizeof *grid);
    int any = 0;
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *c = kvb_summary_at(s, row, j);
        for (size_t k = 0; c && k < c->n; k++) {
            double len, depth;
            const kvb_record *r = &run->rec[c->rec[k]];
            if (!niah_point(r, &len, &depth)) continue;
            add(&grid[index_of(ys, ny, depth) * nx + index_of(xs, nx, len)], r->score, 0), any = 1;
        }
    }
    for (int i = 0; i < nx * ny; i++) v[i] = avg_of(&grid[i]);
    return any;
}

/* The heatmap file of a row: niah-<method>-<budget>.svg, made unique against earlier rows' names. */
static void niah_name(char names[][160], int row, const kvb_row *r) {
    char m[64], b[48];
    kvb_report_safe_name(r->method, m, sizeof m), kvb_report_safe_name(r->budget, b, sizeof b);
    snprintf(names[row], 160, "niah-%s-%s.svg", m, b);
    for (int i = 0, k = 2; i < row; i++)
        if (!strcmp(names[i], names[row])) snprintf(names[row], 160, "niah-%s-%s-%d.svg", m, b, k++), i = -1;
}

static int write_svg(const char *dir, const char *name, char *svg, char *err, size_t err_len) {
    if (!svg) return ERR("%s/%s: out of memory", dir, name);
    char *path = kvb_path_join(dir, name);
    int rc = path ? kvb_write_file_atomic(path, svg, err, err_len) : ERR("%s/%s: out of memory", dir, name);
    free(svg), free(path);
    return rc;
}

/* Write one heatmap per row with needle records; names[row] is "" for rows without. */
static int niah_write(const kvb_run *run, const kvb_summary *s, char names[][160], char *err, size_t err_len) {
    double *xs = NULL, *ys = NULL;
    int nx = 0, ny = 0, rc = niah_axes(run, &xs, &nx, &ys, &ny) ? ERR("out of memory") : 0;
    if ((size_t)nx * (size_t)ny > 100000) nx = ny = 0; /* not a needle grid: no heatmap rather than a huge one */
    acc *grid = rc ? NULL : malloc(((size_t)nx * (size_t)ny + 1) * sizeof *grid);
    double *v = grid ? malloc(((size_t)nx * (size_t)ny + 1) * sizeof *v) : NULL;
    if (!rc && !v) rc = ERR("out of memory");
    for (int i = 0; !rc && i < s->n_rows; i++) {
        names[i][0] = 0;
        if (!nx || !niah_grid(run, s, i, xs, nx, ys, ny, grid, v)) continue;
        niah_name(names, i, &s->rows[i]);
        char title[200], kv[32] = "";
        if (!kvb_row_is_full(&s->rows[i]) && isfinite(s->rows[i].kv_device_pct)) snprintf(kv, sizeof kv, " (KV %.0f%%)", s->rows[i].kv_device_pct);
        snprintf(title, sizeof title, "Needle in a haystack: %s@%s%s, score x100", s->rows[i].method, s->rows[i].budget, kv);
        rc = write_svg(run->dir, names[i], kvb_svg_heatmap(title, "context length (tokens)", "needle depth (%)", nx, xs, ny, ys, v),
                       err, err_len);
    }
    free(xs), free(ys), free(grid), free(v);
    return rc;
}

/* ---- accuracy vs budget, latency vs context ---- */

/* A row the budget chart plots: a compressing method with a measured device KV %. */
static int plotted_row(const kvb_summary *s, int i) {
    return i != s->ref_row && !kvb_row_is_full(&s->rows[i]) && isfinite(s->rows[i].kv_device_pct);
}

/* One series per method, its points at the device KV each row really held (not the budget asked for: a
 * method that held 78% at "30%" is drawn at 78%), sorted by it; full as a reference line. 1 written, 0
 * nothing to draw, -1 error. */
static int budget_chart(const kvb_run *run, const kvb_summary *s, char *err, size_t err_len) {
    kvb_svg_series *se = calloc((size_t)s->n_rows + 1, sizeof *se);
    double *x = malloc(((size_t)s->n_rows + 1) * sizeof *x), *y = malloc(((size_t)s->n_rows + 1) * sizeof *y);
    int n_se = 0, n_pts = 0, rc = se && x && y ? 0 : ERR("out of memory");
    if (!rc && s->ref_row >= 0) se[n_se++] = (kvb_svg_series){"full (reference)", NULL, NULL, 0, row_avg(s, s->ref_row, NULL)};
    int first = n_se;
    for (int i = 0; !rc && i < s->n_rows; i++) {
        if (!plotted_row(s, i) || !isfinite(row_avg(s, i, NULL))) continue;
        int k = first;
        while (k < n_se && strcmp(se[k].name, s->rows[i].method)) k++;
        if (k == n_se) se[n_se++] = (kvb_svg_series){s->rows[i].method, NULL, NULL, 0, NAN};
    }
    for (int k = first; !rc && k < n_se; k++) {
        double *sx = x + n_pts, *sy = y + n_pts;
        se[k].x = sx, se[k].y = sy;
        for (int i = 0; i < s->n_rows; i++) {
            double avg = row_avg(s, i, NULL), kv = s->rows[i].kv_device_pct;
            if (!plotted_row(s, i) || !isfinite(avg) || strcmp(s->rows[i].method, se[k].name)) continue;
            int at = se[k].n++; /* insertion by measured KV: the polyline runs left to right */
            for (; at > 0 && sx[at - 1] > kv; at--) {
                sx[at] = sx[at - 1];
                sy[at] = sy[at - 1];
            }
            sx[at] = kv;
            sy[at] = avg;
            n_pts++;
        }
    }
    if (!rc && n_pts) {
        kvb_svg_chart c = {"Accuracy vs measured KV", "device KV held after prefill (% of full, measured)", "Avg score (x100)",
                           0, 0, 100, 0, 100, se, n_se};
        rc = write_svg(run->dir, "accuracy-vs-budget.svg", kvb_svg_line_chart(&c), err, err_len);
    }
    free(se), free(x), free(y);
    return rc || !n_pts ? rc : 1;
}

enum { N_BUCKETS = 64 };

/* A row's decode ms/token by prompt length, in power-of-two buckets: (mean prompt tokens, mean ms). */
static int latency_points(const kvb_run *run, const kvb_summary *s, int row, double *x, double *y) {
    acc tok[N_BUCKETS], ms[N_BUCKETS];
    memset(tok, 0, sizeof tok), memset(ms, 0, sizeof ms);
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *c = kvb_summary_at(s, row, j);
        for (size_t k = 0; c && k < c->n; k++) {
            const kvb_record *r = &run->rec[c->rec[k]];
            if (r->error || !(r->prompt_tokens >= 1) || !(r->decode_ms_per_token > 0) || !isfinite(r->decode_ms_per_token)) continue;
            int b = (int)floor(log2(r->prompt_tokens));
            if (b >= N_BUCKETS) b = N_BUCKETS - 1;
            add(&tok[b], r->prompt_tokens, 1), add(&ms[b], r->decode_ms_per_token, 1);
        }
    }
    int n = 0;
    for (int b = 0; b < N_BUCKETS; b++)
        if (ms[b].n) x[n] = avg_of(&tok[b]), y[n] = avg_of(&ms[b]), n++;
    return n;
}

/* One series per method@budget. 1 written, 0 nothing to draw, -1 error. */
static int latency_chart(const kvb_run *run, const kvb_summary *s, char *err, size_t err_len) {
    size_t cap = ((size_t)s->n_rows + 1) * N_BUCKETS;
    kvb_svg_series *se = calloc((size_t)s->n_rows + 1, sizeof *se);
    char (*names)[160] = calloc((size_t)s->n_rows + 1, sizeof *names);
    double *x = malloc(cap * sizeof *x), *y = malloc(cap * sizeof *y);
    int n_se = 0, rc = se && names && x && y ? 0 : ERR("out of memory");
    for (int i = 0, used = 0; !rc && i < s->n_rows; i++) {
        int n = latency_points(run, s, i, x + used, y + used);
        if (!n) continue;
        const kvb_row *r = &s->rows[i];
        if (!kvb_row_is_full(r) && isfinite(r->kv_device_pct))
            snprintf(names[n_se], 160, "%s@%s (KV %.0f%%)", r->method, r->budget, r->kv_device_pct);
        else snprintf(names[n_se], 160, "%s@%s", r->method, r->budget);
        se[n_se] = (kvb_svg_series){names[n_se], x + used, y + used, n, NAN};
        n_se++;
        used += n;
    }
    if (!rc && n_se) {
        kvb_svg_chart c = {"Decode latency vs context", "prompt tokens (power-of-two buckets)", "decode ms/token", 1,
                           NAN, NAN, 0, NAN, se, n_se};
        rc = write_svg(run->dir, "latency-vs-context.svg", kvb_svg_line_chart(&c), err, err_len);
    }
    free(se), free(names), free(x), free(y);
    return rc || !n_se ? rc : 1;
}

/* ---- report.md ---- */

static const char *or_unknown(const char *s) { return s && *s ? s : "?"; }

static void md_header(const kvb_run *run, const kvb_summary *s, FILE *f) {
    fputs("# kvbench report: ", f), md(f, or_unknown(run->suite)), fputs("\n\n| | |\n|---|---|\n", f);
    const char *keys[] = {"model", "model sha256", "git commit", "host", "backend", "flags", "created"};
    const char *vals[] = {run->model, run->model_sha256, run->git_commit, run->host, run->backend, run->flags, run->created};
    for (int i = 0; i < 7; i++) fprintf(f, "| %s | ", keys[i]), md(f, or_unknown(vals[i])), fputs(" |\n", f);
    fprintf(f, "| records | %zu", run->n_rec);
    if (run->n_torn) fprintf(f, " (warning: %d torn last line ignored)", run->n_torn);
    if (s->n_duplicates) fprintf(f, " (warning: %zu duplicate records, the last of each kept)", s->n_duplicates);
    if (run->n_unplanned) fprintf(f, " (warning: %zu records of cells plan.jsonl does not have: ", run->n_unplanned), md(f, run->unplanned),
                          fprintf(f, "%s)", run->n_unplanned > 3 ? ", ..." : "");
    fputs(" |\n", f);
    if (run->n_load_sessions) {
        fprintf(f, "| CPUs, threads | %d, %d |\n| load average (1 min) | ", run->cpus, run->threads);
        num(f, "%.2f at start", run->load_start), fputs(", ", f), num(f, "%.2f at most", run->load_max);
        fprintf(f, " (%d session%s) |\n", run->n_load_sessions, run->n_load_sessions > 1 ? "s" : "");
    }
    load_warning(run, f);
}

static void md_body(const kvb_run *run, const kvb_summary *s, char names[][160], int have_budget, int have_latency,
                    int have_ratio, FILE *f) {
    md_header(run, s, f);
    fprintf(f, "\n## Scores\n\nScore x100: mean ± half-width of the 95%% bootstrap interval (%d resamples, fixed seed; "
               "bounds in summary.csv). (±d): difference to %s, before rounding. Avg: mean of the task means. Rows: method@budget asked for, "
               "(KV n%%) the device KV it held after prefill, measured, as %% of full attention's.\n\n",
            KVB_BOOT_RESAMPLES, s->ref_row >= 0 ? "full attention on the same task" : "full attention (none in this run)");
    kvb_report_main_table(s, f);
    fputs("\n## Efficiency\n\nMeans over samples that ran; KV bytes as measured in the run. % of full: device KV after "
          "prefill over the sample's full-attention KV. Speedup: full's decode ms/token over the row's.\n\n", f);
    kvb_report_efficiency_table(run, s, f);
    lme_section(run, s, f);
    length_bin_section(run, s, f);
    lbv2_section(run, s, f);
    scbench_section(run, s, f);
    int niah = 0;
    for (int i = 0; i < s->n_rows; i++)
        if (names[i][0]) {
            if (!niah++) fputs("\n## Needle in a haystack\n\nScore x100 over context length x needle depth.\n\n", f);
            fputs("- ", f), row_name(f, &s->rows[i]), fprintf(f, ": [%s](%s)\n\n  ![](%s)\n", names[i], names[i], names[i]);
        }
    if (have_budget || have_latency || have_ratio) fputs("\n## Charts\n\n", f);
    if (have_budget) fputs("![accuracy vs budget](accuracy-vs-budget.svg)\n\n", f);
    if (have_ratio) fputs("![score vs compression ratio](score-vs-compression-ratio.svg)\n\n", f);
    if (have_latency) fputs("![decode latency vs context](latency-vs-context.svg)\n", f);
    errors_section(run, s, f);
}

static int write_all(const kvb_run *run, const kvb_summary *s, char *err, size_t err_len) {
    char *csv = kvb_report_csv(s), *path = kvb_path_join(run->dir, "summary.csv");
    int rc = csv && path ? kvb_write_file_atomic(path, csv, err, err_len) : ERR("%s: out of memory", run->dir);
    free(csv), free(path);
    path = NULL;
    char (*names)[160] = calloc((size_t)s->n_rows + 1, sizeof *names);
    if (!rc && !names) rc = ERR("%s: out of memory", run->dir);
    if (!rc) rc = niah_write(run, s, names, err, err_len);
    int have_budget = rc ? -1 : budget_chart(run, s, err, err_len);
    int have_latency = have_budget < 0 ? -1 : latency_chart(run, s, err, err_len);
    int have_ratio = have_latency < 0 ? -1 : kvb_ratio_chart_write(run->dir, s, err, err_len);
    if (!rc && (have_budget < 0 || have_latency < 0 || have_ratio < 0)) rc = -1;
    char *text = NULL;
    size_t len = 0;
    FILE *f = rc ? NULL : open_memstream(&text, &len);
    if (!rc && !f) rc = ERR("%s: out of memory", run->dir);
    kvb_serve_rec *serve = NULL; /* a suite's "serve" block: its throughput rows (serve_rows.h) */
    int n_serve = 0, have_serve_chart = 0;
    if (!rc && kvb_serve_rows_load(run->dir, &serve, &n_serve, err, err_len)) rc = -1;
    if (!rc && (have_serve_chart = kvb_serve_rows_write(run->dir, serve, n_serve, err, err_len)) < 0) rc = -1;
    if (f && rc) fclose(f), f = NULL;
    if (f) {
        md_body(run, s, names, have_budget, have_latency, have_ratio, f);
        kvb_serve_rows_md(serve, n_serve, f);
        if (have_serve_chart > 0) fputs("\n![output tokens/s vs KV pool size](throughput-vs-pool.svg)\n", f);
        if (!close_mem(f, &text)) rc = ERR("%s: out of memory", run->dir);
    }
    free(serve);
    if (!rc) rc = (path = kvb_path_join(run->dir, "report.md")) ? kvb_write_file_atomic(path, text, err, err_len)
                                                                 : ERR("%s: out of memory", run->dir);
    free(text), free(names), free(path);
    return rc;
}

static int load(const char *run_dir, kvb_run *run, kvb_summary *s, char *err, size_t err_len) {
    if (kvb_run_load(run_dir, run, err, err_len)) return -1;
    if (kvb_summary_build(run, s, err, err_len)) {
        kvb_run_free(run);
        return -1;
    }
    return 0;
}

int kvb_report_write(const char *run_dir, char *err, size_t err_len) {
    kvb_run run;
    kvb_summary s;
    if (load(run_dir, &run, &s, err, err_len)) return -1;
    int rc = write_all(&run, &s, err, err_len);
    kvb_summary_free(&s);
    kvb_run_free(&run);
    return rc;
}

int kvb_report_print_main(const char *run_dir, FILE *out, char *err, size_t err_len) {
    kvb_run run;
    kvb_summary s;
    if (load(run_dir, &run, &s, err, err_len)) return -1;
    char shown[96];
    fprintf(out, "\n%s: score x100, mean ± 95%% CI half-width (difference to full)\n\n",
            kvb_str_shown(or_unknown(run.suite), shown, sizeof shown));
    kvb_report_main_table(&s, out);
    fputc('\n', out);
    kvb_report_efficiency_table(&run, &s, out);
    kvb_serve_rec *serve = NULL;
    int n_serve = 0;
    if (kvb_serve_rows_load(run_dir, &serve, &n_serve, err, err_len) == 0) kvb_serve_rows_md(serve, n_serve, out);
    free(serve);
    load_warning(&run, out);
    if (run.n_torn) fprintf(out, "\nwarning: %s/results.jsonl: a torn last line (cut by a crash) was ignored\n", run_dir);
    if (s.n_duplicates) fprintf(out, "\nwarning: %zu duplicate records, the last of each kept\n", s.n_duplicates);
    if (run.n_unplanned)
        fprintf(out, "\nwarning: %zu records are of cells %s/plan.jsonl does not have (an edited suite, or records from elsewhere; "
                     "they are in the tables): %s%s\n", run.n_unplanned, run_dir, run.unplanned, run.n_unplanned > 3 ? ", ..." : "");
    fprintf(out, "\n(%s/report.md, %s/summary.csv)\n", run_dir, run_dir);
    kvb_summary_free(&s);
    kvb_run_free(&run);
    return 0;
}
