/* test_nvtx.c — kvbench's NVTX timeline, read without Nsight: NVTX v3 loads tests/nvtx_inject.c (path in
 * KVB_NVTX_INJECT, set by CTest) through NVTX_INJECTION64_PATH, and it writes every event to a log this test reads.
 *
 * In this process: the profiler's ranges, end marks and copy marks as profile.c documents them, and the copy
 * counters (prof_add_copies / prof_copies) in the table and the trace. Through `kvbench generate` with every method
 * on the default model: per forward step and layer the five phases in order, select / h2d / d2h where the method
 * selects and moves data, and every range's token and byte counts equal to the Chrome trace the same run wrote.
 * No events recorded is a failure. One decode step per method is printed (the compact timeline). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/profile.h"
#include "util_common.h"

static const char *bin, *inject;
static char model[1024], dir[64], self_log[128];

static const char *PHASES[5] = {"calc_qkv_and_rope", "update_cache", "attn_forward", "attn_output", "mlp"};

/* ---- the injection library's log (format in tests/nvtx_inject.c) ---- */

typedef struct {
    char kind[16], domain[32], cat[32], msg[160], payload[32];
} nv_event;

typedef struct {
    nv_event *e;
    int n;
} nv_log;

static void field(char *dst, size_t cap, const char *src, size_t len) {
    if (len >= cap) len = cap - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

/* parses the log at path; n = -1 when it cannot be read */
static nv_log read_log(const char *path) {
    nv_log g = {NULL, -1};
    char *text = util_read_file(path, NULL);
    if (!text) return g;
    int lines = 0;
    for (const char *s = text; *s; s++) lines += *s == '\n';
    g.e = calloc((size_t)lines + 1, sizeof *g.e);
    g.n = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) break;
        const char *f[7];
        size_t len[7];
        int k = 0;
        for (char *s = line; k < 7 && s <= nl; k++) {
            char *tab = memchr(s, '\t', (size_t)(nl - s));
            char *stop = tab ? tab : nl;
            f[k] = s;
            len[k] = (size_t)(stop - s);
            s = stop + 1;
        }
        if (k == 7) {
            nv_event *e = &g.e[g.n++];
            field(e->kind, sizeof e->kind, f[0], len[0]);
            field(e->domain, sizeof e->domain, f[2], len[2]);
            field(e->cat, sizeof e->cat, f[3], len[3]);
            field(e->msg, sizeof e->msg, f[4], len[4]);
            field(e->payload, sizeof e->payload, f[5], len[5]);
        }
        line = nl + 1;
    }
    free(text);
    return g;
}

/* "L07 mlp" -> layer 7, "mlp"; "select" -> layer -1. The phase name is copied into phase (cap 32). */
static void split_name(const char *msg, int *layer, char *phase) {
    int l, used = 0;
    if (msg[0] == 'L' && sscanf(msg, "L%d %n", &l, &used) == 1 && used > 0) *layer = l;
    else *layer = -1, used = 0;
    sscanf(msg + used, "%31s", phase);
}

/* an end mark "NAME tokens=T bytes=B" (NAME possibly "L07 mlp"): 1 and its parts */
static int end_mark(const nv_event *e, int *layer, char *phase, long long *tokens, long long *bytes) {
    if (strcmp(e->kind, "mark") || !strncmp(e->msg, "copies ", 7)) return 0;
    const char *t = strstr(e->msg, " tokens=");
    if (!t || sscanf(t, " tokens=%lld bytes=%lld", tokens, bytes) != 2) return 0;
    char name[64];
    field(name, sizeof name, e->msg, (size_t)(t - e->msg));
    split_name(name, layer, phase);
    return 1;
}

/* ---- in this process: the profiler's own events ---- */

static void test_profiler_emits_ranges_end_marks_and_copy_marks(void) {
    prof *p = prof_create(2, 0, 0); /* timing off: NVTX is emitted all the same */
    CU_ASSERT_FATAL(p != NULL);
    prof_set_stage(p, PROF_PREFILL);
    prof_begin(p, PROF_MLP, 1);
    prof_begin(p, PROF_H2D, 1);
    prof_end(p, PROF_H2D, 1, 7, 4096);
    prof_end(p, PROF_MLP, 1, 16, 0);
    prof_set_stage(p, PROF_DECODE);
    prof_begin(p, PROF_SAMPLE, -1);
    prof_end(p, PROF_SAMPLE, -1, 1, 0);
    prof_add_copies(p, 1, 2, 8192);
    prof_add_copies(p, 0, 0, 0); /* nothing moved: no mark */
    prof_free(p);

    nv_log g = read_log(self_log);
    if (g.n <= 0) fprintf(stderr, "\n  no NVTX events recorded in %s\n", self_log);
    CU_ASSERT_FATAL(g.n > 0); /* no events: NVTX emission or the injection is broken */
    static const char *want[][5] = {
        {"domain_create", "kvbench", "-", "-", "-"},
        {"category", "kvbench", "1", "prefill", "-"},
        {"category", "kvbench", "2", "decode", "-"},
        {"push", "kvbench", "prefill", "L01 mlp", "-"},
        {"push", "kvbench", "prefill", "L01 h2d", "-"},
        {"mark", "kvbench", "prefill", "L01 h2d tokens=7 bytes=4096", "7"},
        {"pop", "kvbench", "-", "L01 h2d", "-"},
        {"mark", "kvbench", "prefill", "L01 mlp tokens=16 bytes=0", "16"},
        {"pop", "kvbench", "-", "L01 mlp", "-"},
        {"push", "kvbench", "decode", "sample", "-"},
        {"mark", "kvbench", "decode", "sample tokens=1 bytes=0", "1"},
        {"pop", "kvbench", "-", "sample", "-"},
        {"mark", "kvbench", "decode", "copies d2h n=2 bytes=8192", "8192"},
        {"domain_destroy", "kvbench", "-", "-", "-"},
    };
    int n_want = (int)(sizeof want / sizeof want[0]), ok = g.n == n_want;
    for (int i = 0; ok && i < n_want; i++) {
        const nv_event *e = &g.e[i];
        ok = !strcmp(e->kind, want[i][0]) && !strcmp(e->domain, want[i][1]) && !strcmp(e->cat, want[i][2]) &&
             !strcmp(e->msg, want[i][3]) && !strcmp(e->payload, want[i][4]);
        if (!ok) fprintf(stderr, "\n  event %d: %s %s %s '%s' %s, want %s %s %s '%s' %s\n", i, e->kind, e->domain,
                         e->cat, e->msg, e->payload, want[i][0], want[i][1], want[i][2], want[i][3], want[i][4]);
    }
    if (g.n != n_want) fprintf(stderr, "\n  %d events, want %d (log %s)\n", g.n, n_want, self_log);
    CU_ASSERT(ok);
    free(g.e);
}

static void test_copies_are_counted_per_stage_and_direction_in_table_and_trace(void) {
    prof *p = prof_create(1, 1, 1);
    CU_ASSERT_FATAL(p != NULL);
    prof_set_stage(p, PROF_PREFILL);
    prof_add_copies(p, 1, 3, 3 << 20);
    prof_set_stage(p, PROF_DECODE);
    prof_add_copies(p, 0, 2, 1 << 20);
    prof_add_copies(p, 0, 1, 1 << 19);
    prof_add_copies(p, 2, 1, 64);
    prof_add_copies(p, 3, 1, 64); /* no such direction: ignored */
    prof_begin(p, PROF_SAMPLE, -1);
    prof_end(p, PROF_SAMPLE, -1, 1, 0);
    int64_t n, bytes;
    prof_copies(p, PROF_DECODE, 0, &n, &bytes);
    CU_ASSERT(n == 3 && bytes == (1 << 20) + (1 << 19));
    prof_copies(p, PROF_PREFILL, 1, &n, &bytes);
    CU_ASSERT(n == 3 && bytes == 3 << 20);
    prof_copies(p, PROF_PREFILL, 0, &n, &bytes);
    CU_ASSERT(n == 0 && bytes == 0);
    prof_copies(p, PROF_DECODE, 2, &n, &bytes);
    CU_ASSERT(n == 1 && bytes == 64);
    prof_copies(NULL, PROF_DECODE, 0, &n, &bytes);
    CU_ASSERT(n == 0 && bytes == 0);
    prof_add_copies(NULL, 0, 1, 1); /* a NULL profiler is a no-op */

    char path[128];
    snprintf(path, sizeof path, "%s/table.md", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    prof_print_table(p, f);
    fclose(f);
    char *table = util_read_file(path, NULL);
    CU_ASSERT_FATAL(table != NULL);
    CU_ASSERT(strstr(table, "| copies | 0 | 3 | 0 | 3 | 0 | 1 |\n") != NULL);
    CU_ASSERT(strstr(table, "| MiB | 0.000 | 3.000 | 0.000 | 1.500 | 0.000 | 0.000 |\n") != NULL);
    free(table);

    char err[256];
    snprintf(path, sizeof path, "%s/copies.json", dir);
    CU_ASSERT_FATAL(prof_write_trace(p, path, err, sizeof err) == 0);
    char *text = util_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CU_ASSERT_FATAL(j != NULL);
    cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "otherData"), "copies");
    cJSON *h2d = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "decode"), "h2d");
    cJSON *d2h = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "prefill"), "d2h");
    CU_ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(h2d, "n")) == 3);
    CU_ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(h2d, "bytes")) == (1 << 20) + (1 << 19));
    CU_ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(d2h, "bytes")) == 3 << 20);
    cJSON_Delete(j);
    free(text);
    prof_free(p);
}

/* ---- through kvbench generate ---- */

typedef struct {
    char name[32], cat[16];
    int layer;
    long long tokens, bytes;
} trace_event;

typedef struct {
    trace_event *e;
    int n;
    long long copies[2][3][2]; /* [stage][dir][n, bytes] */
} trace;

static int read_trace(const char *path, trace *t) {
    memset(t, 0, sizeof *t);
    char *text = util_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!j) return -1;
    cJSON *evs = cJSON_GetObjectItem(j, "traceEvents"), *ev;
    t->e = calloc((size_t)cJSON_GetArraySize(evs) + 1, sizeof *t->e);
    cJSON_ArrayForEach(ev, evs) {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "ph"));
        if (!ph || strcmp(ph, "X")) continue;
        trace_event *e = &t->e[t->n++];
        cJSON *args = cJSON_GetObjectItem(ev, "args");
        snprintf(e->name, sizeof e->name, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(ev, "name")));
        snprintf(e->cat, sizeof e->cat, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(ev, "cat")));
        e->layer = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(args, "layer"));
        e->tokens = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(args, "tokens"));
        e->bytes = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(args, "bytes"));
    }
    static const char *stages[2] = {"prefill", "decode"}, *dirs[3] = {"h2d", "d2h", "d2d"};
    cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "otherData"), "copies");
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < 3; d++) {
            cJSON *x = cJSON_GetObjectItem(cJSON_GetObjectItem(c, stages[s]), dirs[d]);
            t->copies[s][d][0] = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "n"));
            t->copies[s][d][1] = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "bytes"));
        }
    cJSON_Delete(j);
    return c ? 0 : -1;
}

/* What a method's timeline must show beyond the phases: a select range after prefill (every compressing
 * method decides what to keep there), per-layer selects in decode, packed loads (h2d) in decode, offloads
 * (d2h) in prefill; and, for the methods that move nothing after prefill, that their decode is the phases only. */
typedef struct {
    const char *method, *budget;
    int prefill_select, decode_select, decode_h2d, prefill_d2h, decode_phases_only;
    const char *opts; /* the parameters calibration gives (pinned: a clean machine has no profile) */
} method_case;

static const method_case CASES[] = {
    /* method       budget  prefill_select decode_select decode_h2d prefill_d2h decode_phases_only */
    {"full",         NULL,  0, 0, 0, 0, 1, NULL},
    {"snapkv",       "30%", 1, 0, 0, 0, 1, NULL},
    {"omnikv",       "30%", 1, 1, 1, 1, 0, NULL},
    {"streamingllm", "30%", 1, 1, 0, 0, 0, NULL},
    {"h2o",          "30%", 1, 0, 0, 0, 0, NULL},
    {"round",        "30%", 1, 1, 0, 0, 0, "lw=8"},
    {"pod",          "30%", 1, 1, 0, 0, 0, "block=3"},
    {"random",       "30%", 1, 0, 0, 0, 1, NULL},
};

enum { GEN_TOKENS = 3 };

static int phase_index(const char *phase) {
    for (int i = 0; i < 5; i++)
        if (!strcmp(phase, PHASES[i])) return i;
    return -1;
}

/* One decode step as text, a line per run of layers with the same ranges, e.g.
 *   L03-L05  calc_qkv_and_rope update_cache select(h2d[7 tok])[1 tok] attn_forward attn_output mlp
 * A range's children follow it in parentheses; select/h2d/d2h carry their end marks' counts. */
typedef struct {
    int layer;
    char text[512];
} step_line;

static void append(char *dst, size_t cap, const char *s) {
    size_t n = strlen(dst);
    snprintf(dst + n, cap - n, "%s", s);
}

static void print_step(const char *method, const nv_log *g, int from, int to) {
    enum { MAX_LINES = 256 };
    static step_line lines[MAX_LINES];
    int n = 0, depth = 0, has_children[16] = {0};
    for (int i = from; i <= to; i++) {
        const nv_event *e = &g->e[i];
        int layer;
        char phase[32], text[96];
        long long tokens, bytes;
        if (!strcmp(e->kind, "push")) {
            split_name(e->msg, &layer, phase);
            if (depth == 0 && (n == 0 || layer < 0 || lines[n - 1].layer != layer) && n < MAX_LINES) {
                lines[n].layer = layer;
                lines[n++].text[0] = 0;
            }
            if (n == 0) continue;
            char *line = lines[n - 1].text;
            if (depth > 0 && depth < 16 && !has_children[depth - 1]++) append(line, sizeof lines[0].text, "(");
            else if (line[0]) append(line, sizeof lines[0].text, " ");
            append(line, sizeof lines[0].text, phase);
            if (depth < 16) has_children[depth] = 0;
            depth++;
        } else if (!strcmp(e->kind, "pop") && depth > 0) {
            depth--;
            if (n && depth < 16 && has_children[depth]) append(lines[n - 1].text, sizeof lines[0].text, ")");
        } else if (n && end_mark(e, &layer, phase, &tokens, &bytes) &&
                   (!strcmp(phase, "select") || !strcmp(phase, "h2d") || !strcmp(phase, "d2h"))) {
            if (bytes) snprintf(text, sizeof text, "[%lld tok %lld B]", tokens, bytes);
            else snprintf(text, sizeof text, "[%lld tok]", tokens);
            append(lines[n - 1].text, sizeof lines[0].text, text);
        }
    }
    printf("\n%s: one decode step\n", method);
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && lines[i].layer >= 0 && lines[j].layer >= 0 && !strcmp(lines[j].text, lines[i].text)) j++;
        char label[32] = "";
        if (lines[i].layer >= 0 && j - 1 > i) snprintf(label, sizeof label, "L%02d-L%02d", lines[i].layer, lines[j - 1].layer);
        else if (lines[i].layer >= 0) snprintf(label, sizeof label, "L%02d", lines[i].layer);
        printf("  %-8s %s\n", label, lines[i].text);
        i = j;
    }
}

static void check_method(const method_case *mc) {
    char log_path[128], trace_path[128], prompt[128], cmd[4096];
    snprintf(log_path, sizeof log_path, "%s/%s.tsv", dir, mc->method);
    snprintf(trace_path, sizeof trace_path, "%s/%s.json", dir, mc->method);
    snprintf(prompt, sizeof prompt, "%s/prompt.txt", dir);
    char budget[128] = "";
    if (mc->budget) snprintf(budget, sizeof budget, "--budget %s", mc->budget);
    if (mc->opts) snprintf(budget + strlen(budget), sizeof budget - strlen(budget), " --method-opt %s", mc->opts);
    snprintf(cmd, sizeof cmd,
             "NVTX_INJECTION64_PATH='%s' KVB_NVTX_LOG='%s' '%s' generate --model '%s' --prompt-file '%s' -n %d "
             "--ignore-eos --method %s %s --trace '%s' >'%s/out.txt' 2>'%s/err.txt'",
             inject, log_path, bin, model, prompt, GEN_TOKENS, mc->method, budget, trace_path, dir, dir);
    int st = system(cmd);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        char errp[128];
        snprintf(errp, sizeof errp, "%s/err.txt", dir);
        char *e = util_read_file(errp, NULL);
        fprintf(stderr, "\n  %s failed: %s\n", cmd, e ? e : "");
        free(e);
        CU_FAIL_FATAL("kvbench generate failed");
    }
    nv_log g = read_log(log_path);
    trace t;
    CU_ASSERT_FATAL(read_trace(trace_path, &t) == 0);
    int ranges = 0;
    for (int i = 0; i < g.n; i++) ranges += !strcmp(g.e[i].kind, "push");
    if (ranges == 0) fprintf(stderr, "\n  %s: no NVTX ranges recorded in %s\n", mc->method, log_path);
    CU_ASSERT_FATAL(ranges > 0); /* nothing recorded: NVTX emission is broken */

    /* ranges balanced and in domain "kvbench", with the stage as a named category */
    int depth = 0, bad = 0, kvbench_domain = 0;
    for (int i = 0; i < g.n; i++) {
        const nv_event *e = &g.e[i];
        kvbench_domain |= !strcmp(e->kind, "domain_create") && !strcmp(e->domain, "kvbench");
        if (strcmp(e->kind, "push") && strcmp(e->kind, "pop") && strcmp(e->kind, "mark")) continue;
        if (strcmp(e->domain, "kvbench") || e->msg[0] == '!') bad++;
        if (strcmp(e->kind, "pop") && strcmp(e->cat, "prefill") && strcmp(e->cat, "decode")) bad++;
        depth += !strcmp(e->kind, "push") - !strcmp(e->kind, "pop");
        if (depth < 0) bad++;
    }
    CU_ASSERT(kvbench_domain);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(depth, 0);

    /* every range closes with its end mark just before the pop; the marks, in order, are the trace's events */
    int m = 0, mismatch = 0;
    long long copies[2][3][2] = {{{0}}};
    for (int i = 0; i < g.n; i++) {
        const nv_event *e = &g.e[i];
        int layer, s = !strcmp(e->cat, "decode");
        char phase[32], dname[8];
        long long tokens, bytes, n_copies;
        if (!strcmp(e->kind, "pop") && (i == 0 || strncmp(g.e[i - 1].msg, e->msg, strlen(e->msg)) ||
                                          strncmp(g.e[i - 1].msg + strlen(e->msg), " tokens=", 8)))
            mismatch++;
        if (!strcmp(e->kind, "mark") && sscanf(e->msg, "copies %7s n=%lld bytes=%lld", dname, &n_copies, &bytes) == 3) {
            int d = !strcmp(dname, "h2d") ? 0 : !strcmp(dname, "d2h") ? 1 : 2;
            copies[s][d][0] += n_copies;
            copies[s][d][1] += bytes;
            if (atoll(e->payload) != bytes) mismatch++;
        }
        if (!end_mark(e, &layer, phase, &tokens, &bytes)) continue;
        if (m >= t.n) {
            mismatch++;
            continue;
        }
        const trace_event *te = &t.e[m++];
        int same = !strcmp(te->name, phase) && te->layer == layer && !strcmp(te->cat, e->cat) &&
                   te->tokens == tokens && te->bytes == bytes && atoll(e->payload) == tokens;
        if (!same && mismatch < 5)
            fprintf(stderr, "\n  %s: mark '%s' payload %s (%s) vs trace %s layer %d tokens %lld bytes %lld (%s)\n",
                    mc->method, e->msg, e->payload, e->cat, te->name, te->layer, te->tokens, te->bytes, te->cat);
        mismatch += !same;
    }
    CU_ASSERT_EQUAL(m, t.n);
    CU_ASSERT_EQUAL(mismatch, 0);
    CU_ASSERT(memcmp(copies, t.copies, sizeof copies) == 0);

    /* per forward step (from one "embed" push to the next): the five phases per layer in order, and the
     * method's own ranges */
    int steps = 0, decode_steps = 0, n_layer = -1, last_step_from = -1, last_step_to = -1;
    for (int i = 0; i < g.n; i++) {
        if (strcmp(g.e[i].kind, "push") || strcmp(g.e[i].msg, "embed")) continue;
        int end = i + 1;
        while (end < g.n && !(strcmp(g.e[end].kind, "push") == 0 && strcmp(g.e[end].msg, "embed") == 0)) end++;
        int decode = !strcmp(g.e[i].cat, "decode");
        int seen = 0, order_ok = 1, select_layers = 0, select_all = 0, h2d = 0, d2h = 0, other = 0;
        for (int k = i; k < end; k++) {
            const nv_event *e = &g.e[k];
            if (strcmp(e->kind, "push")) continue;
            int layer;
            char phase[32];
            split_name(e->msg, &layer, phase);
            int p = phase_index(phase);
            if (p >= 0) {
                if (layer != seen / 5 || p != seen % 5 || strcmp(e->cat, g.e[i].cat)) order_ok = 0;
                seen++;
            } else if (!strcmp(phase, "select")) {
                select_layers += layer >= 0;
                select_all += layer < 0;
            } else if (!strcmp(phase, "h2d")) {
                h2d++;
            } else if (!strcmp(phase, "d2h")) {
                d2h++;
            } else if (strcmp(phase, "embed") && strcmp(phase, "lm_head") && strcmp(phase, "sample")) {
                other++;
            }
        }
        if (n_layer < 0) n_layer = seen / 5;
        if (!order_ok || seen != 5 * n_layer || seen == 0 || other)
            fprintf(stderr, "\n  %s step %d: %d phase ranges (want 5 x %d in order: %s), %d unknown\n", mc->method,
                    steps, seen, n_layer, order_ok ? "ok" : "out of order", other);
        CU_ASSERT(order_ok && seen == 5 * n_layer && seen > 0 && !other);
        if (!decode) {
            if (mc->prefill_d2h) CU_ASSERT(d2h > 0);
        } else {
            decode_steps++;
            last_step_from = i;
            last_step_to = end - 1;
            if (mc->decode_select) CU_ASSERT(select_layers > 0);
            if (mc->decode_h2d) CU_ASSERT(h2d > 0);
            if (mc->decode_phases_only) CU_ASSERT(select_layers + select_all + h2d + d2h == 0);
        }
        steps++;
        i = end - 1;
    }
    CU_ASSERT_EQUAL(decode_steps, GEN_TOKENS - 1); /* the first token comes from the prompt's logits */
    int after_prefill_select = 0;
    for (int i = 0; i < g.n; i++)
        after_prefill_select += !strcmp(g.e[i].kind, "push") && !strcmp(g.e[i].msg, "select");
    CU_ASSERT_EQUAL(after_prefill_select, mc->prefill_select);
    if (last_step_from >= 0) print_step(mc->method, &g, last_step_from, last_step_to);
    free(g.e);
    free(t.e);
}

static void test_generate_timeline_per_method_matches_the_profiler(void) {
    UTIL_REQUIRE_FILE(model);
    UTIL_REQUIRE_FILE(inject);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_method(&CASES[i]);
}

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    bin = getenv("KVB_BIN");
    if (!bin) bin = "build/kvbench";
    inject = getenv("KVB_NVTX_INJECT");
    if (!inject) inject = "build/libkvb_nvtx_inject.so";
    util_default_model(model, sizeof model);
    snprintf(dir, sizeof dir, "/tmp/kvb_nvtx_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    /* this process's own NVTX events go to self_log: NVTX reads the variables at its first call */
    snprintf(self_log, sizeof self_log, "%s/self.tsv", dir);
    setenv("NVTX_INJECTION64_PATH", inject, 1);
    setenv("KVB_NVTX_LOG", self_log, 1);
    FILE *f;
    char prompt[128];
    snprintf(prompt, sizeof prompt, "%s/prompt.txt", dir);
    if (!(f = fopen(prompt, "w"))) return 1;
    fputs("Kevin keeps a small notebook of facts about the harbour town where he grew up. Summarise it.\n", f);
    fclose(f);
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("nvtx", NULL, NULL);
    CU_add_test(s, "profiler emits ranges, end marks and copy marks", test_profiler_emits_ranges_end_marks_and_copy_marks);
    CU_add_test(s, "copies are counted per stage and direction, in table and trace",
                test_copies_are_counted_per_stage_and_direction_in_table_and_trace);
    CU_add_test(s, "generate timeline per method matches the profiler", test_generate_timeline_per_method_matches_the_profiler);
    int rc = util_run_suites();
    if (!rc) remove_dir();
    else fprintf(stderr, "logs kept in %s\n", dir);
    return rc;
}
