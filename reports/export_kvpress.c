/* export_kvpress.c — a run directory in kvpress's evaluation layout (see export_kvpress.h). The names and
 * formats follow kvpress's evaluation/evaluate.py (get_results_dir, save_config, _save_results,
 * _calculate_and_save_metrics), evaluate_registry.py (PRESS_REGISTRY, DATASET_REGISTRY) and the scorers under
 * evaluation/benchmarks/, read at NVIDIA/kvpress 8bb29b9; no code of theirs is used.
 *
 * Choices: predictions.csv carries the columns kvbench has (task, answer(s), predicted_answer,
 * compression_ratio) plus sample_id and score, kvbench's per-sample score that metrics.json averages; the
 * dataset's prompt columns (question, answer_prefix, max_new_tokens) are not in a record and are left out.
 * press_init_command names kvpress's class and says which kvbench method and parameters made the rows. */
#include "reports/export_kvpress.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

#include "base/fsutil.h"
#include "kernels/backend.h" /* kvb_errf */
#include "reports/results.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* kvbench method -> kvpress PRESS_REGISTRY key and class (evaluate_registry.py). A method with a base is
 * matched on its base=; expected on ada= (the registry's "expected_attention" is AdaKV over it); compactor on its
 * mode= and ada= (param: space-separated words the record's params must all hold; the first row that matches). */
static const struct {
    const char *method, *param, *press_name, *press_class;
} PRESSES[] = {
    {"full", NULL, "no_press", "None"},
    {"snapkv", NULL, "snapkv", "SnapKVPress"},
    {"knorm", NULL, "knorm", "KnormPress"},
    {"keydiff", NULL, "keydiff", "KeyDiffPress"},
    {"observed", NULL, "observed_attention", "ObservedAttentionPress"},
    {"streamingllm", NULL, "streaming_llm", "StreamingLLMPress"},
    {"tova", NULL, "tova", "TOVAPress"},
    {"pyramidkv", NULL, "pyramidkv", "PyramidKVPress"},
    {"random", NULL, "random", "RandomPress"},
    {"adakv", "base=snapkv", "adakv_snapkv", "AdaKVPress(SnapKVPress)"},
    {"chunkkv", "base=snapkv", "chunkkv", "ChunkKVPress(SnapKVPress)"},
    {"expected", "ada=1", "expected_attention", "AdaKVPress(ExpectedAttentionPress)"},
    /* ExpectedAttentionPress alone has no registry key; kvpress's press_name for it would be its own */
    {"expected", NULL, "expected_attention_no_ada", "ExpectedAttentionPress"},
    {"decoding", "base=knorm", "decoding_knorm", "DecodingPress(KnormPress)"},
    {"decoding", "base=keydiff", "decoding_keydiff", "DecodingPress(KeyDiffPress)"},
    {"cur", NULL, "cur", "CURPress"},
    {"lagkv", NULL, "lagkv", "LagKVPress"},
    {"kvzip", NULL, "kvzip", "KVzipPress"},
    {"finch", NULL, "finch", "FinchPress"},
    /* kvbench's filters and head split come from its own calibration (kvbench calibrate qfilter|duo), not the
     * authors' downloads: the rows stand for the presses, docs/methods.md says how they differ */
    {"qfilter", NULL, "qfilter", "QFilterPress"},
    {"duo", NULL, "duo_attention", "DuoAttentionPress"},
    {"criticalkv", "base=snapkv", "critical_snapkv", "CriticalKVPress(SnapKVPress)"},
    {"criticalkv", "base=adakv", "critical_adakv_snapkv", "CriticalAdaKVPress(SnapKVPress)"},
    {"think", "base=none", "think", "ThinKPress"},
    {"think", "base=snapkv", "snap_think", "ComposedPress([SnapKVPress, ThinKPress])"},
    /* compactor's mode=compactor is CompactorPress (the exact leverage where kvpress sketches it, docs/methods.md);
     * its default mode=leverage is LeverageScorePress, which has no registry key: no row */
    {"compactor", "mode=compactor ada=1", "adakv_compactor", "AdaKVPress(CompactorPress)"},
    {"compactor", "mode=compactor", "compactor", "CompactorPress"},
    /* kvzap: a threshold is DMSPress over it (the leaderboard's rows; the directory and config name the threshold,
     * predictions.csv the compression each sample measured); a budget is KVzapPress alone or under AdaKV. The
     * registry has these for the MLP scorer only; scorer=random has none */
    {"kvzap", "scorer=mlp threshold", "kvzap_mlp", "DMSPress(KVzapPress)"},
    {"kvzap", "scorer=linear threshold", "kvzap_linear", "DMSPress(KVzapPress)"},
    {"kvzap", "scorer=mlp ada=1", "kvzap_mlp_layer", "AdaKVPress(KVzapPress)"},
    {"kvzap", "scorer=mlp", "kvzap_mlp_head", "KVzapPress"},
};

/* 1 if every space-separated "key=value" word of kvs is one of params' space-separated words, and every bare
 * "key" word the key of one of them */
static int has_param(const char *params, const char *kvs) {
    for (const char *kv = kvs; *kv;) {
        const size_t n = strcspn(kv, " ");
        const int bare = !memchr(kv, '=', n);
        int found = 0;
        for (const char *p = params ? params : ""; *p && !found;) {
            const size_t m = strcspn(p, " ");
            found = bare ? m > n && p[n] == '=' && !strncmp(p, kv, n) : m == n && !strncmp(p, kv, n);
            p += m + (p[m] == ' ');
        }
        if (!found) return 0;
        kv += n + (kv[n] == ' ');
    }
    return 1;
}

int kvb_kvpress_press(const char *method, const char *method_params, const char **press_name, const char **press_class) {
    for (size_t i = 0; method && i < sizeof PRESSES / sizeof *PRESSES; i++) {
        if (strcmp(method, PRESSES[i].method)) continue;
        if (PRESSES[i].param && !has_param(method_params, PRESSES[i].param)) continue;
        if (!PRESSES[i].param && (!strcmp(method, "adakv") || !strcmp(method, "chunkkv") || !strcmp(method, "decoding") ||
                                  !strcmp(method, "criticalkv") || !strcmp(method, "think") || !strcmp(method, "kvzap")))
            continue;
        *press_name = PRESSES[i].press_name;
        *press_class = PRESSES[i].press_class;
        return 0;
    }
    return -1;
}

/* InfiniteBench's tasks in kvpress's dataset (evaluation/benchmarks/infinite_bench) */
static const char *const INFBENCH[] = {"passkey",   "kv_retrieval",    "number_string",       "code_run",           "code_debug",
                                       "math_find", "longbook_qa_eng", "longdialogue_qa_eng", "longbook_choice_eng"};

static int put(char *dst, size_t cap, const char *s, size_t n) {
    if (n >= cap) return -1;
    memcpy(dst, s, n);
    dst[n] = 0;
    return 0;
}

int kvb_kvpress_dataset(const char *benchmark, const char *task, char *dataset, size_t dataset_cap, char *data_dir,
                        size_t data_dir_cap, char *kv_task, size_t kv_task_cap) {
    if (!benchmark || !task) return -1;
    char bare[256]; /* "+hidden": the runner's mark of a task run with the question hidden (the record says it too) */
    size_t tl = strlen(task);
    if (tl >= sizeof bare) return -1;
    memcpy(bare, task, tl + 1);
    if (tl > 7 && !strcmp(bare + tl - 7, "+hidden")) bare[tl - 7] = 0;
    task = bare;
    if (!strcmp(benchmark, "ruler")) { /* kvbench's "<task>_<length>"; "+per_query" has no kvpress row */
        const char *us = strrchr(task, '_');
        if (!us || us == task || !us[1] || strspn(us + 1, "0123456789") != strlen(us + 1)) return -1;
        return put(dataset, dataset_cap, "ruler", 5) || put(data_dir, data_dir_cap, us + 1, strlen(us + 1)) ||
                       put(kv_task, kv_task_cap, task, (size_t)(us - task))
                   ? -1
                   : 0;
    }
    if (!strcmp(benchmark, "longbench")) /* kvpress: one config per task, data_dir = the task */
        return put(dataset, dataset_cap, "longbench", 9) || put(data_dir, data_dir_cap, task, strlen(task)) ||
                       put(kv_task, kv_task_cap, task, strlen(task))
                   ? -1
                   : 0;
    if (!strcmp(benchmark, "infinitebench")) /* the official tasks only; kvbench's generated "<task>_<length>" are not its data */
        for (size_t i = 0; i < sizeof INFBENCH / sizeof *INFBENCH; i++)
            if (!strcmp(task, INFBENCH[i]))
                return put(dataset, dataset_cap, "infinitebench", 13) || put(data_dir, data_dir_cap, task, strlen(task)) ||
                               put(kv_task, kv_task_cap, task, strlen(task))
                           ? -1
                           : 0;
    return -1;
}

/* ---- text builders ---- */

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }
static void sb_addf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_addf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_addn(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A float as Python's repr writes it: the shortest digits that read back, positional for exponents -4..15
 * with ".0" when integral, else 1.5e-05. */
static void py_float(char *buf, size_t cap, double v) {
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, cap, "%.*e", p - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    int e = atoi(strchr(buf, 'e') + 1);
    if (e < -4 || e >= 16) return;
    snprintf(buf, cap, "%.*f", p - 1 - e > 0 ? p - 1 - e : 0, v);
    if (!strchr(buf, '.')) strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* Python's round(v, 2) of a value (the decimal nearest the binary value, ties to even as printf does). */
static double round2(double v) {
    char t[64];
    snprintf(t, sizeof t, "%.2f", v);
    return strtod(t, NULL);
}

/* Python's repr of a str: single quotes unless the text has ' and no ", escapes for \ and control characters;
 * other characters (UTF-8 included) as they are. */
static void py_repr(sbuf *b, const char *s) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    sb_addn(b, &q, 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\') sb_add(b, "\\\\");
        else if (*p == (unsigned char)q) sb_add(b, q == '\'' ? "\\'" : "\\\"");
        else if (*p == '\n') sb_add(b, "\\n");
        else if (*p == '\r') sb_add(b, "\\r");
        else if (*p == '\t') sb_add(b, "\\t");
        else if (*p < 0x20 || *p == 0x7f) sb_addf(b, "\\x%02x", *p);
        else sb_addn(b, (const char *)p, 1);
    }
    sb_addn(b, &q, 1);
}

/* A CSV field as pandas writes it (csv.QUOTE_MINIMAL): quoted when it holds , " \n or \r, quotes doubled. */
static void csv_field(sbuf *b, const char *s) {
    if (!strpbrk(s, ",\"\n\r")) {
        sb_add(b, s);
        return;
    }
    sb_add(b, "\"");
    for (const char *p = s; *p; p++) sb_add(b, *p == '"' ? "\"\"" : (char[2]){*p, 0});
    sb_add(b, "\"");
}

/* A JSON string (metrics.json's keys) */
static void json_str(sbuf *b, const char *s) {
    sb_add(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') sb_addf(b, "\\%c", *p);
        else if (*p < 0x20) sb_addf(b, "\\u%04x", *p);
        else sb_addn(b, (const char *)p, 1);
    }
    sb_add(b, "\"");
}

/* A YAML scalar as yaml.dump writes a str: plain when it cannot be read as anything else (no leading indicator,
 * no ": " or " #", no edge spaces, not a number, bool or null), else single-quoted; non-ASCII is quoted too. */
static void yaml_str(sbuf *b, const char *s) {
    static const char *const WORDS[] = {"null", "Null", "NULL", "~", "true", "True", "TRUE", "false", "False", "FALSE",
                                        "yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF",
                                        "y", "Y", "n", "N"};
    size_t n = strlen(s);
    int plain = n && !strchr("-?:,[]{}#&*!|>'\"%@` ", s[0]) && s[n - 1] != ' ' && s[n - 1] != ':' && !strstr(s, ": ") &&
                !strstr(s, " #");
    for (const unsigned char *p = (const unsigned char *)s; plain && *p; p++) plain = *p >= 0x20 && *p < 0x7f;
    char *end;
    if (plain) {
        strtod(s, &end);
        if (end != s && !*end) plain = 0; /* a number */
        for (size_t i = 0; plain && i < sizeof WORDS / sizeof *WORDS; i++) plain = strcmp(s, WORDS[i]) != 0;
    }
    if (plain) {
        sb_add(b, s);
        return;
    }
    sb_add(b, "'");
    for (const char *p = s; *p; p++) *p == '\'' ? sb_add(b, "''") : sb_addn(b, p, 1);
    sb_add(b, "'");
}

/* ---- the export ---- */

/* One kvpress results directory: its components and the records (indices into the run) it holds. */
typedef struct {
    char dataset[32], data_dir[128], press_name[48];
    const char *press_class, *method, *budget, *method_params;
    double ratio;
    double threshold; /* DMSPress's (kvzap threshold=), NAN: none */
    int query_aware;
    size_t *rec, n;
} kp_dir;

static int out_ready(const char *out, int force, char *err, size_t err_len) {
    struct stat st;
    if (stat(out, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return ERR("%s: exists and is not a directory", out);
        DIR *d = opendir(out);
        if (!d) return ERR("%s: cannot open: %s", out, strerror(errno));
        int empty = 1;
        for (struct dirent *e; empty && (e = readdir(d));) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
        closedir(d);
        if (!empty && !force) return ERR("%s: exists and is not empty (--force writes into it)", out);
        return 0;
    }
    if (errno != ENOENT) return ERR("%s: cannot create: %s", out, strerror(errno));
    if (kvb_mkdirs(out)) return ERR("%s: cannot create: %s", out, strerror(errno));
    return 0;
}

/* The model's name: o->model, else the run's model file name without its directory and ".gguf". */
static void model_name(const kvb_run *run, const kvb_kvpress_opts *o, char *buf, size_t cap) {
    const char *m = o && o->model ? o->model : run->model ? run->model : "unknown-model";
    if (!(o && o->model)) {
        const char *slash = strrchr(m, '/');
        if (slash && slash[1]) m = slash + 1;
    }
    size_t at = 0;
    for (const char *p = m; *p && at + 3 < cap; p++) /* kvpress: model.replace("/", "--") */
        if (*p == '/') buf[at++] = '-', buf[at++] = '-';
        else buf[at++] = *p;
    buf[at] = 0;
    size_t n = strlen(buf);
    if (!(o && o->model) && n > 5 && !strcmp(buf + n - 5, ".gguf")) buf[n - 5] = 0;
}

static int write_dir(const char *out, const char *model_shown, const char *model_cfg, const kvb_run *run,
                     const kvb_record *recs, const kp_dir *d, char *err, size_t err_len) {
    char ratio[32], name[512];
    const int dms = !isnan(d->threshold); /* evaluate.py: the threshold stands where the ratio would */
    snprintf(ratio, sizeof ratio, "%.2f", dms ? d->threshold : d->ratio);
    int nn = snprintf(name, sizeof name, "%s__%s%s%s__%s__%s%s", d->dataset, d->data_dir, d->data_dir[0] ? "__" : "",
                      model_shown, d->press_name, ratio, d->query_aware ? "__query_aware" : "");
    if (nn < 0 || (size_t)nn >= sizeof name) return ERR("%s: directory name too long", model_shown);
    if (!d->data_dir[0]) /* "ruler____m": filter(None, ...) drops the empty data_dir */
        snprintf(name, sizeof name, "%s__%s__%s__%s%s", d->dataset, model_shown, d->press_name, ratio, d->query_aware ? "__query_aware" : "");
    char *dir = kvb_path_join(out, name), *csv_p = dir ? kvb_path_join(dir, "predictions.csv") : NULL;
    char *met_p = dir ? kvb_path_join(dir, "metrics.json") : NULL, *cfg_p = dir ? kvb_path_join(dir, "config.yaml") : NULL;
    sbuf csv = {0}, met = {0}, cfg = {0};
    int rc = cfg_p ? 0 : ERR("%s: out of memory", out);
    if (!rc && kvb_mkdirs(dir)) rc = ERR("%s: cannot create: %s", dir, strerror(errno));
    int ruler = !strcmp(d->dataset, "ruler"), longbench = !strcmp(d->dataset, "longbench");
    char f[64];
    py_float(f, sizeof f, d->ratio);
    /* predictions.csv */
    sb_add(&csv, longbench ? "task,answers,predicted_answer,compression_ratio,sample_id,score\n"
                           : "task,answer,predicted_answer,compression_ratio,sample_id,score\n");
    for (size_t i = 0; !rc && i < d->n; i++) {
        const kvb_record *r = &recs[d->rec[i]];
        char task[128], ds[32], dd[128], sc[64];
        kvb_kvpress_dataset(r->benchmark, r->task, ds, sizeof ds, dd, sizeof dd, task, sizeof task);
        sbuf ans = {0};
        sb_add(&ans, "[");
        for (int k = 0; k < r->answers.n; k++) sb_add(&ans, k ? ", " : ""), py_repr(&ans, r->answers.v[k]);
        sb_add(&ans, "]");
        py_float(sc, sizeof sc, r->score);
        csv_field(&csv, task), sb_add(&csv, ",");
        csv_field(&csv, ans.oom ? "" : ans.s), sb_add(&csv, ",");
        csv_field(&csv, r->prediction ? r->prediction : ""), sb_add(&csv, ",");
        if (dms) { /* the press's compression_ratio after the sample: the share of the context's KV it evicted, as the
                    * method measured it (its "evicted="; else the record's KV after prefill, the question included) */
            char cr[64];
            const char *ev = r->method_params ? strstr(r->method_params, "evicted=") : NULL;
            py_float(cr, sizeof cr, ev && (ev == r->method_params || ev[-1] == ' ') ? strtod(ev + 8, NULL)
                                    : r->kv_full_bytes > 0 ? 1.0 - r->kv_device_bytes / r->kv_full_bytes : 0.0);
            sb_add(&csv, cr), sb_add(&csv, ",");
        } else
            sb_add(&csv, f), sb_add(&csv, ",");
        csv_field(&csv, r->sample_id ? r->sample_id : ""), sb_add(&csv, ",");
        sb_add(&csv, sc), sb_add(&csv, "\n");
        if (ans.oom) csv.oom = 1;
        free(ans.s);
    }
    /* metrics.json: ruler {task: {"string_match": x}}, the others one number (their scorers' shapes) */
    if (ruler) {
        sb_add(&met, "{");
        /* tasks in sorted order, as pandas' groupby("task") visits them, each averaged over its records */
        const char *prev = NULL;
        for (int first = 1;; first = 0) {
            const kvb_record *next = NULL;
            for (size_t i = 0; i < d->n; i++) {
                const kvb_record *r = &recs[d->rec[i]];
                if ((!prev || strcmp(r->task, prev) > 0) && (!next || strcmp(r->task, next->task) < 0)) next = r;
            }
            if (!next) break;
            prev = next->task;
            double sum = 0;
            size_t n = 0;
            for (size_t k = 0; k < d->n; k++)
                if (!strcmp(recs[d->rec[k]].task, prev)) sum += recs[d->rec[k]].score, n++;
            char task[128], ds[32], dd[128], v[64];
            kvb_kvpress_dataset(next->benchmark, next->task, ds, sizeof ds, dd, sizeof dd, task, sizeof task);
            py_float(v, sizeof v, round2(100.0 * sum / (double)n));
            sb_add(&met, first ? "\n    " : ",\n    "), json_str(&met, task);
            sb_addf(&met, ": {\n        \"string_match\": %s\n    }", v);
        }
        sb_add(&met, "\n}");
    } else {
        double sum = 0;
        for (size_t i = 0; i < d->n; i++) sum += recs[d->rec[i]].score;
        char v[64];
        py_float(v, sizeof v, round2(100.0 * sum / (double)d->n));
        sb_add(&met, v);
    }
    /* config.yaml: EvaluationConfig in field order; head_compression_ratio and threshold dropped when None */
    const kvb_record *r0 = &recs[d->rec[0]];
    sb_add(&cfg, "dataset: "), yaml_str(&cfg, d->dataset);
    sb_add(&cfg, "\ndata_dir: ");
    d->data_dir[0] ? yaml_str(&cfg, d->data_dir) : sb_add(&cfg, "null");
    sb_add(&cfg, "\nmodel: "), yaml_str(&cfg, model_cfg);
    sb_add(&cfg, "\ndevice: "), yaml_str(&cfg, run->backend ? run->backend : "cpu");
    sb_add(&cfg, "\npress_name: "), yaml_str(&cfg, d->press_name);
    char thr[64] = "";
    if (dms) py_float(thr, sizeof thr, d->threshold);
    if (!dms) sb_addf(&cfg, "\ncompression_ratio: %s", f); /* save_config drops it where a threshold is set */
    sb_add(&cfg, "\nkey_channel_compression_ratio: null");
    if (dms) sb_addf(&cfg, "\nthreshold: %s", thr);
    sb_addf(&cfg, "\nfraction: 1.0\nmax_new_tokens: null\n"
                  "max_context_length: null\nquery_aware: %s\nneedle_depth: null\ncompression_interval: null\ntarget_size: null\n"
                  "hidden_states_buffer_size: null\noutput_dir: ",
            d->query_aware ? "true" : "false");
    yaml_str(&cfg, out);
    sb_add(&cfg, "\nlog_level: INFO\nmodel_kwargs: {}\npress_init_command: ");
    {
        sbuf pic = {0};
        sb_add(&pic, d->press_class);
        if (dms) sb_addf(&pic, "(threshold=%s)", thr);
        else if (strcmp(d->press_class, "None")) sb_addf(&pic, "(compression_ratio=%s)", f);
        sb_addf(&pic, " from kvbench %s@%s", d->method, d->budget);
        if (d->method_params && *d->method_params) sb_add(&pic, " ("), sb_add(&pic, d->method_params), sb_add(&pic, ")");
        yaml_str(&cfg, pic.oom ? "" : pic.s);
        if (pic.oom) cfg.oom = 1;
        free(pic.s);
    }
    sb_addf(&cfg, "\nseed: %lld\nfp8: false\n", isfinite(r0->seed) ? (long long)r0->seed : 42LL);
    sb_add(&met, "");
    if (!rc && (csv.oom || met.oom || cfg.oom)) rc = ERR("%s: out of memory", dir);
    if (!rc) rc = kvb_write_file_atomic(csv_p, csv.s, err, err_len);
    if (!rc) rc = kvb_write_file_atomic(met_p, met.s, err, err_len);
    if (!rc) rc = kvb_write_file_atomic(cfg_p, cfg.s, err, err_len);
    free(csv.s), free(met.s), free(cfg.s), free(dir), free(csv_p), free(met_p), free(cfg_p);
    return rc;
}

/* The run's records with every field (kvb_run_load reads them lean): the same reader, so the same records in
 * the same order as run->rec. */
static int load_full(const kvb_run *run, kvb_record **out, size_t *n_out, char *err, size_t err_len) {
    char *path = kvb_path_join(run->dir, "results.jsonl");
    kvb_results_reader rd;
    if (!path) return ERR("%s: out of memory", run->dir);
    int rc = kvb_results_open(&rd, path, err, err_len), opened = !rc;
    kvb_record *recs = rc ? NULL : calloc(run->n_rec ? run->n_rec : 1, sizeof *recs);
    size_t n = 0;
    if (!rc && !recs) rc = ERR("%s: out of memory", path);
    while (!rc) {
        kvb_record r;
        int got = kvb_results_next(&rd, &r, NULL, err, err_len);
        if (got < 0) rc = -1;
        if (got <= 0) break;
        if (n == run->n_rec) {
            kvb_record_free(&r);
            rc = ERR("%s: changed while it was read", path);
            break;
        }
        recs[n++] = r;
    }
    if (!rc && n != run->n_rec) rc = ERR("%s: changed while it was read", path);
    if (opened) kvb_results_close(&rd);
    free(path);
    if (rc) {
        for (size_t i = 0; i < n; i++) kvb_record_free(&recs[i]);
        free(recs);
        return -1;
    }
    *out = recs, *n_out = n;
    return 0;
}

/* Add name to the comma-separated list (once). */
static void note(char *list, size_t cap, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p++)
        if ((p == list || p[-1] == ' ') && (p[n] == ',' || !p[n])) return;
    size_t at = strlen(list);
    snprintf(list + at, cap - at, "%s%s", at ? ", " : "", name);
}

int kvb_export_kvpress(const char *run_dir, const char *out_dir, const kvb_kvpress_opts *o, kvb_kvpress_stats *st,
                       char *err, size_t err_len) {
    memset(st, 0, sizeof *st);
    kvb_run run;
    kvb_summary s = {0};
    kvb_record *recs = NULL;
    size_t n_recs = 0, n_dirs = 0;
    kp_dir *dirs = NULL;
    int rc = kvb_run_load(run_dir, &run, err, err_len);
    if (rc) return -1;
    if (!rc) rc = load_full(&run, &recs, &n_recs, err, err_len);
    if (!rc) rc = kvb_summary_build(&run, &s, err, err_len);
    if (!rc && !(dirs = calloc((size_t)s.n_cells + 1, sizeof *dirs))) rc = ERR("out of memory");
    char no_press[160] = "", no_data[160] = "";
    int token_budgets = 0;
    for (int c = 0; !rc && c < s.n_cells; c++) {
        const kvb_cell *cell = &s.cells[c];
        const kvb_record *r0 = &recs[cell->rec[0]];
        const char *pn, *pc;
        char ds[32], dd[128], task[128];
        double pct = NAN;
        kvb_rbudget_kind bk = kvb_rbudget_parse(cell->budget, &pct);
        int full = !strcmp(cell->method, "full") || !strcmp(cell->method, "flash");
        if (kvb_kvpress_press(full ? "full" : cell->method, r0->method_params, &pn, &pc)) {
            st->n_unrepresentable += cell->n, note(no_press, sizeof no_press, cell->method);
            continue;
        }
        if (kvb_kvpress_dataset(cell->benchmark, cell->task, ds, sizeof ds, dd, sizeof dd, task, sizeof task)) {
            st->n_unrepresentable += cell->n, note(no_data, sizeof no_data, cell->benchmark ? cell->benchmark : "other");
            continue;
        }
        const char *tp = r0->method_params ? strstr(r0->method_params, "threshold=") : NULL;
        const double threshold = tp && (tp == r0->method_params || tp[-1] == ' ') ? strtod(tp + 10, NULL) : NAN;
        double ratio = full || !isnan(threshold) ? 0.0 : bk == KVB_RB_PERCENT ? 1.0 - pct / 100.0 : NAN;
        if (!(ratio >= 0 && ratio <= 1)) {
            st->n_unrepresentable += cell->n, token_budgets = 1;
            continue;
        }
        const char *q = r0->question;
        size_t tl = strlen(cell->task);
        int query_aware = !(q && !strcmp(q, "hidden")) && !(tl > 7 && !strcmp(cell->task + tl - 7, "+hidden"));
        size_t k = 0;
        for (; k < n_dirs; k++)
            if (!strcmp(dirs[k].dataset, ds) && !strcmp(dirs[k].data_dir, dd) && !strcmp(dirs[k].press_name, pn) &&
                fabs(dirs[k].ratio - ratio) < 1e-9 && dirs[k].query_aware == query_aware &&
                (isnan(threshold) ? isnan(dirs[k].threshold) : dirs[k].threshold == threshold))
                break;
        if (k == n_dirs) {
            kp_dir *d = &dirs[n_dirs++];
            snprintf(d->dataset, sizeof d->dataset, "%s", ds);
            snprintf(d->data_dir, sizeof d->data_dir, "%s", dd);
            snprintf(d->press_name, sizeof d->press_name, "%s", pn);
            d->press_class = pc, d->method = cell->method, d->budget = cell->budget, d->method_params = r0->method_params;
            d->ratio = ratio, d->query_aware = query_aware, d->threshold = threshold;
            if (!(d->rec = malloc(n_recs * sizeof *d->rec))) rc = ERR("out of memory");
        }
        for (size_t i = 0; !rc && i < cell->n; i++) {
            const kvb_record *r = &recs[cell->rec[i]];
            if (r->error || !isfinite(r->score)) st->n_failed++;
            else dirs[k].rec[dirs[k].n++] = cell->rec[i];
        }
    }
    /* a directory whose every record failed is not written */
    size_t kept = 0;
    for (size_t k = 0; k < n_dirs; k++) {
        st->n_exported += dirs[k].n;
        if (dirs[k].n) kept++;
    }
    if (!rc) {
        int at = 0;
        if (st->n_unrepresentable)
            at = snprintf(st->skipped, sizeof st->skipped, "%zu record%s kvpress cannot represent (%s%s%s%s%s%s%s)",
                          st->n_unrepresentable, st->n_unrepresentable == 1 ? "" : "s", no_press[0] ? "no press for " : "",
                          no_press, no_press[0] && (no_data[0] || token_budgets) ? "; " : "", no_data[0] ? "no dataset for " : "",
                          no_data, no_data[0] && token_budgets ? "; " : "", token_budgets ? "token budgets" : "");
        if (st->n_failed && at >= 0 && (size_t)at < sizeof st->skipped)
            snprintf(st->skipped + at, sizeof st->skipped - (size_t)at, "%s%zu failed or unscored sample%s", at ? ", " : "",
                     st->n_failed, st->n_failed == 1 ? "" : "s");
    }
    if (!rc && !st->n_exported)
        rc = ERR("%s: no record kvpress can represent%s%s", run_dir, st->skipped[0] ? ": skipped " : "", st->skipped);
    if (!rc) rc = out_ready(out_dir, o && o->force, err, err_len);
    char shown[256], cfg_model[256];
    if (!rc) {
        model_name(&run, o, shown, sizeof shown);
        snprintf(cfg_model, sizeof cfg_model, "%s", o && o->model ? o->model : shown);
    }
    for (size_t k = 0; !rc && k < n_dirs; k++)
        if (dirs[k].n) rc = write_dir(out_dir, shown, cfg_model, &run, recs, &dirs[k], err, err_len);
    if (!rc) st->n_dirs = kept;
    for (size_t k = 0; k < n_dirs; k++) free(dirs[k].rec);
    free(dirs);
    for (size_t i = 0; i < n_recs; i++) kvb_record_free(&recs[i]);
    free(recs);
    kvb_summary_free(&s);
    kvb_run_free(&run);
    return rc;
}
