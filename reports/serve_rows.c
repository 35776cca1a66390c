/* serve_rows.c — a run's serving-throughput rows (serve_rows.h). */
#include "reports/serve_rows.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "kernels/backend.h" /* kvb_errf */
#include "reports/serve_chart.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int same_row(const kvb_serve_rec *a, const kvb_serve_rec *b) {
    return !strcmp(a->method, b->method) && !strcmp(a->budget, b->budget) &&
           ((isnan(a->pool_mib) && isnan(b->pool_mib)) || fabs(a->pool_mib - b->pool_mib) < 1e-6);
}

int kvb_serve_rows_load(const char *run_dir, kvb_serve_rec **rows, int *n, char *err, size_t err_len) {
    *rows = NULL;
    *n = 0;
    char *path = kvb_path_join(run_dir, "serve.jsonl");
    if (!path) return ERR("%s: out of memory", run_dir);
    if (access(path, F_OK) != 0) {
        free(path);
        return 0;
    }
    size_t len;
    char *text = kvb_read_file(path, &len, err, err_len);
    int rc = text ? 0 : -1, line = 0, cap = 0;
    for (char *p = text, *nl; !rc && p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl) *nl = 0;
        line++;
        if (!*p) continue;
        cJSON *j = cJSON_Parse(p);
        const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "method"));
        const char *b = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "budget"));
        if (!j || !m || !b || isnan(num(j, "requests")) || isnan(num(j, "ok"))) {
            if (!nl) { /* a torn last line (a crash while it was written): that cell runs again */
                cJSON_Delete(j);
                break;
            }
            rc = ERR("%s:%d: not a serve row (JSON with method, budget, requests, ok)", path, line);
            cJSON_Delete(j);
            break;
        }
        kvb_serve_rec r;
        memset(&r, 0, sizeof r);
        snprintf(r.method, sizeof r.method, "%s", m);
        snprintf(r.budget, sizeof r.budget, "%s", b);
        r.pool_mib = num(j, "pool_mib");
        r.requests = (int)num(j, "requests"), r.ok = (int)num(j, "ok");
        r.failed = isnan(num(j, "failed")) ? 0 : (int)num(j, "failed");
        r.lost = isnan(num(j, "lost")) ? 0 : (int)num(j, "lost");
        r.req_s = num(j, "requests_per_s"), r.tok_s = num(j, "output_tokens_per_s");
        r.ttft50 = num(j, "ttft_p50_ms"), r.ttft90 = num(j, "ttft_p90_ms"), r.ttft99 = num(j, "ttft_p99_ms");
        r.tpot50 = num(j, "tpot_p50_ms"), r.tpot90 = num(j, "tpot_p90_ms"), r.tpot99 = num(j, "tpot_p99_ms");
        r.mean_seqs = num(j, "mean_seqs"), r.max_seqs = num(j, "max_seqs"), r.pool_mean = num(j, "pool_promised_mean_pct");
        cJSON_Delete(j);
        int k = 0;
        while (k < *n && !same_row(&(*rows)[k], &r)) k++;
        if (k == *n) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 16;
                kvb_serve_rec *g = realloc(*rows, (size_t)cap * sizeof *g);
                if (!g) {
                    rc = ERR("%s: out of memory", path);
                    break;
                }
                *rows = g;
            }
            (*n)++;
        }
        (*rows)[k] = r; /* the last of a cell kept */
    }
    free(text);
    free(path);
    if (rc) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

static void cell(FILE *f, double v, const char *fmt) {
    if (isnan(v)) fputs(" - |", f);
    else {
        fputc(' ', f);
        fprintf(f, fmt, v);
        fputs(" |", f);
    }
}

void kvb_serve_rows_md(const kvb_serve_rec *rows, int n, FILE *f) {
    if (n == 0) return;
    fputs("\n## Serving throughput\n\nThe suite's \"serve\" block: its load (closed-loop clients, or open-loop arrivals) on the "
          "in-process continuous-batching server, one KV pool per row (docs/serving.md). Wall-clock times on this machine.\n\n"
          "| method | budget | pool MiB | ok/requests | failed | lost | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | "
          "TPOT p50 ms | TPOT p99 ms | mean seqs | max seqs | pool promised mean % |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", f);
    for (int i = 0; i < n; i++) {
        const kvb_serve_rec *r = &rows[i];
        fprintf(f, "| %s | %s |", r->method, r->budget);
        cell(f, r->pool_mib, "%.1f");
        fprintf(f, " %d/%d | %d | %d |", r->ok, r->requests, r->failed, r->lost);
        cell(f, r->req_s, "%.2f");
        cell(f, r->tok_s, "%.1f");
        cell(f, r->ttft50, "%.0f");
        cell(f, r->ttft99, "%.0f");
        cell(f, r->tpot50, "%.1f");
        cell(f, r->tpot99, "%.1f");
        cell(f, r->mean_seqs, "%.2f");
        cell(f, r->max_seqs, "%.0f");
        cell(f, r->pool_mean, "%.0f");
        fputc('\n', f);
    }
}

static void csv_num(FILE *f, double v) {
    fputc(',', f);
    if (!isnan(v)) fprintf(f, "%.6g", v);
}

int kvb_serve_rows_write(const char *run_dir, const kvb_serve_rec *rows, int n, char *err, size_t err_len) {
    if (n == 0) return 0;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return ERR("%s: out of memory", run_dir);
    fputs("method,budget,pool_mib,requests,ok,failed,lost,requests_per_s,output_tokens_per_s,ttft_p50_ms,ttft_p90_ms,"
          "ttft_p99_ms,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms,mean_seqs,max_seqs,pool_promised_mean_pct\n", f);
    for (int i = 0; i < n; i++) {
        const kvb_serve_rec *r = &rows[i];
        fprintf(f, "%s,%s", r->method, r->budget);
        csv_num(f, r->pool_mib);
        fprintf(f, ",%d,%d,%d,%d", r->requests, r->ok, r->failed, r->lost);
        const double v[] = {r->req_s, r->tok_s, r->ttft50, r->ttft90, r->ttft99, r->tpot50, r->tpot90, r->tpot99,
                            r->mean_seqs, r->max_seqs, r->pool_mean};
        for (size_t k = 0; k < sizeof v / sizeof *v; k++) csv_num(f, v[k]);
        fputc('\n', f);
    }
    if (fclose(f) || !text) {
        free(text);
        return ERR("%s: out of memory", run_dir);
    }
    char *path = kvb_path_join(run_dir, "serve.csv");
    int rc = path ? kvb_write_file_atomic(path, text, err, err_len) : ERR("%s: out of memory", run_dir);
    free(text), free(path);
    if (rc) return -1;
    /* the chart: one line per method@budget over the distinct pool sizes, in increasing order */
    double pools[64];
    int np = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(rows[i].pool_mib)) continue;
        int k = 0;
        while (k < np && fabs(pools[k] - rows[i].pool_mib) > 1e-6) k++;
        if (k == np && np < 64) {
            int at = np++;
            for (; at > 0 && pools[at - 1] > rows[i].pool_mib; at--) pools[at] = pools[at - 1];
            pools[at] = rows[i].pool_mib;
        }
    }
    if (np < 2) return 0;
    char (*labels)[100] = calloc((size_t)n, sizeof *labels);
    const char **names = calloc((size_t)n, sizeof *names);
    double *tok = malloc((size_t)n * np * sizeof *tok);
    int ns = 0;
    rc = labels && names && tok ? 0 : ERR("%s: out of memory", run_dir);
    for (int i = 0; !rc && i < n; i++) {
        char l[100];
        if (strcmp(rows[i].budget, "-") && strcmp(rows[i].budget, "full")) snprintf(l, sizeof l, "%s@%s", rows[i].method, rows[i].budget);
        else snprintf(l, sizeof l, "%s", rows[i].method);
        int s = 0;
        while (s < ns && strcmp(labels[s], l)) s++;
        if (s == ns) {
            snprintf(labels[ns], sizeof labels[ns], "%s", l);
            names[ns] = labels[ns];
            for (int k = 0; k < np; k++) tok[(size_t)ns * np + k] = NAN;
            ns++;
        }
        for (int k = 0; k < np; k++)
            if (fabs(pools[k] - rows[i].pool_mib) < 1e-6) tok[(size_t)s * np + k] = rows[i].tok_s;
    }
    path = rc ? NULL : kvb_path_join(run_dir, "throughput-vs-pool.svg");
    if (!rc) rc = path ? kvb_serve_chart_write(path, names, ns, pools, np, tok, err, err_len) : ERR("%s: out of memory", run_dir);
    free(path), free(labels), free(names), free(tok);
    return rc ? -1 : 1;
}

int kvb_serve_rows_merge(const char *out_dir, char *const *dirs, int n, char *err, size_t err_len) {
    char *all = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&all, &len);
    if (!f) return ERR("%s: out of memory", out_dir);
    int rc = 0, any = 0;
    for (int d = 0; d < n && !rc; d++) {
        char *path = kvb_path_join(dirs[d], "serve.jsonl");
        if (!path) {
            rc = ERR("%s: out of memory", out_dir);
            break;
        }
        if (access(path, F_OK) == 0) {
            char *text = kvb_read_file(path, NULL, err, err_len);
            if (!text) rc = -1;
            const char *last_nl = text ? strrchr(text, '\n') : NULL;
            if (last_nl) fwrite(text, 1, (size_t)(last_nl - text) + 1, f); /* a torn last line left out */
            any = 1;
            free(text);
        }
        free(path);
    }
    if (fclose(f) || !all) rc = rc ? rc : ERR("%s: out of memory", out_dir);
    char *out = !rc && any ? kvb_path_join(out_dir, "serve.jsonl") : NULL;
    if (!rc && any) rc = out ? kvb_write_file_atomic(out, all, err, err_len) : ERR("%s: out of memory", out_dir);
    free(out);
    free(all);
    return rc ? -1 : 0;
}

int kvb_serve_rows_compare(const char *base_dir, const char *new_dir, double max_slowdown_pct, FILE *out, char *err,
                           size_t err_len) {
    kvb_serve_rec *a, *b;
    int na, nb;
    if (kvb_serve_rows_load(base_dir, &a, &na, err, err_len)) return -1;
    if (kvb_serve_rows_load(new_dir, &b, &nb, err, err_len)) {
        free(a);
        return -1;
    }
    int bad = 0;
    if (na || nb) {
        fputs("\n### Serving throughput\n\n| method@budget | pool MiB | out tok/s base | new | Δ | TTFT p50 ms base | new | "
              "ok/requests new |\n|---|---:|---:|---:|---:|---:|---:|---:|\n", out);
        int matched = 0;
        for (int i = 0; i < na; i++) {
            const kvb_serve_rec *x = &a[i], *y = NULL;
            for (int k = 0; k < nb && !y; k++)
                if (same_row(x, &b[k])) y = &b[k];
            if (!y) {
                fprintf(out, "| %s@%s | %.1f | %.1f | - | - | - | - | - (only in base) |\n", x->method, x->budget, x->pool_mib, x->tok_s);
                continue;
            }
            matched++;
            const double d = x->tok_s > 0 && isfinite(y->tok_s) ? 100 * (y->tok_s / x->tok_s - 1) : NAN;
            const int slow = x->tok_s > 0 && isfinite(y->tok_s) && (y->tok_s <= 0 || 100 * (x->tok_s / y->tok_s - 1) > max_slowdown_pct + 1e-9);
            const int lost = (y->failed + y->lost) > (x->failed + x->lost);
            bad += slow || lost;
            fprintf(out, "| %s@%s |", x->method, x->budget);
            cell(out, x->pool_mib, "%.1f");
            cell(out, x->tok_s, "%.1f");
            cell(out, y->tok_s, "%.1f");
            if (isnan(d)) fputs(" -", out);
            else fprintf(out, " %s%.1f%%", d < 0 ? "\u2212" : "+", fabs(d));
            fputs(slow ? " ✗ |" : " |", out);
            cell(out, x->ttft50, "%.0f");
            cell(out, y->ttft50, "%.0f");
            fprintf(out, " %d/%d%s |\n", y->ok, y->requests, lost ? " ✗" : "");
        }
        for (int k = 0; k < nb; k++) {
            int seen = 0;
            for (int i = 0; i < na && !seen; i++) seen = same_row(&a[i], &b[k]);
            if (!seen) fprintf(out, "| %s@%s | %.1f | - | %.1f | - | - | - | %d/%d (only in new) |\n", b[k].method,
                               b[k].budget, b[k].pool_mib, b[k].tok_s, b[k].ok, b[k].requests);
        }
        fprintf(out, "\n%d throughput regression(s) in %d matched row(s) (output tokens/s below base by more than the "
                     "decode slowdown tolerance, %.1f%%, or requests failed or lost that base did not).\n",
                bad, matched, max_slowdown_pct);
    }
    free(a), free(b);
    return bad;
}
