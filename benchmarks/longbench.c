/* longbench.c — LongBench v1 loader. Follows THUDM/LongBench LongBench/pred.py (prompt =
 * dataset2prompt[task].format(**record); max_new_tokens = dataset2maxlen[task]; no chat template for
 * trec, triviaqa, samsum, lsht, lcc, repobench-p; samsum stops at "\n"; middle truncation keeping
 * int(max_length/2) tokens at each end) and LongBench/eval.py (first-line cut for trec, triviaqa, samsum,
 * lsht; LongBench-E bins 0-4k / 4-8k / 8k+). Records follow the official schema (BENCHMARKS.md §1).
 * Choices where the official code is silent: the "_e" suffix of a LongBench-E task name is stripped;
 * a record's "dataset" field, when a string, must name the task (or the task + "_e"); _id and length
 * may be null (MiniLongBench reconstructions): the id is then the 1-based line number, length -1;
 * template fields may be strings or integers (str.format would accept anything; nothing else is used).
 * The Chinese tasks (multifieldqa_zh, dureader, vcsum, lsht, passage_retrieval_zh) load the same way; their
 * metrics (benchmarks/metrics.h) need jieba's data for three of them (benchmarks/jieba.h), which the suite
 * loader checks (kvb_score_check_task). */
#include "benchmarks/loaders.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"

static const char *const NO_CHAT[] = {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"};
static const char *const FIRST_LINE[] = {"trec", "triviaqa", "samsum", "lsht"};

static int in_list(const char *task, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(task, list[i])) return 1;
    return 0;
}

int lb_task_uses_chat(const char *task) {
    return !in_list(task, NO_CHAT, sizeof NO_CHAT / sizeof *NO_CHAT);
}

int lb_task_first_line(const char *task) {
    return in_list(task, FIRST_LINE, sizeof FIRST_LINE / sizeof *FIRST_LINE);
}

const char *lb_task_stop(const char *task) {
    return !strcmp(task, "samsum") ? "\n" : NULL;
}

const char *lb_e_bin(int64_t length) {
    if (length < 0) return NULL;
    return length < 4000 ? "0-4k" : length < 8000 ? "4-8k" : "8k+";
}

int lb_data_path(const char *data_dir, const char *task, int longbench_e, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s/%s%s.jsonl", data_dir, task, longbench_e ? "_e" : "");
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int64_t lb_truncate_middle(const int32_t *ids, int64_t n, int64_t max_len, int32_t *out) {
    if (n < 0 || max_len < 0) return -1;
    int64_t half = max_len / 2;
    if (n <= max_len || half == 0) { /* half 0: Python's ids[:0] + ids[-0:] is all of ids */
        memmove(out, ids, (size_t)n * sizeof *ids);
        return n;
    }
    memmove(out, ids, (size_t)half * sizeof *ids); /* memmove: truncating in place (out == ids) is fine */
    memmove(out + half, ids + (n - half), (size_t)half * sizeof *ids);
    return 2 * half;
}

/* ---- config ---- */

typedef struct {
    char *prompts_path, *maxlen_path;
    cJSON *prompts, *maxlen;
} lb_config;

static void config_free(lb_config *c) {
    free(c->prompts_path);
    free(c->maxlen_path);
    cJSON_Delete(c->prompts);
    cJSON_Delete(c->maxlen);
}

static cJSON *load_json_object(const char *path, char *err, size_t err_len) {
    size_t len;
    char *text = kvb_read_file(path, &len, err, err_len);
    if (!text) return NULL;
    cJSON *v = kvb_json_parse(path, 1, text, len, err, err_len);
    free(text);
    if (v && !cJSON_IsObject(v)) {
        kvb_seterr(err, err_len, "%s:1: expected a JSON object", path);
        cJSON_Delete(v);
        v = NULL;
    }
    return v;
}

static char *join_path(const char *dir, const char *name) {
    kvb_sb b = {0};
    kvb_sb_addf(&b, "%s/%s", dir, name);
    return kvb_sb_take(&b);
}

static int config_load(lb_config *c, const char *dir, char *err, size_t err_len) {
    memset(c, 0, sizeof *c);
    c->prompts_path = join_path(dir, "dataset2prompt.json");
    c->maxlen_path = join_path(dir, "dataset2maxlen.json");
    if (!c->prompts_path || !c->maxlen_path) {
        kvb_seterr(err, err_len, "%s: out of memory", dir);
        return -1;
    }
    c->prompts = load_json_object(c->prompts_path, err, err_len);
    if (!c->prompts) return -1;
    c->maxlen = load_json_object(c->maxlen_path, err, err_len);
    return c->maxlen ? 0 : -1;
}

/* The base task (the "_e" suffix stripped when only the base is known), written into base[cap]. */
static int resolve_task(const lb_config *c, const char *task, char *base, size_t cap, char *err, size_t err_len) {
    size_t n = strlen(task);
    if (n + 1 > cap) n = cap - 1;
    memcpy(base, task, n);
    base[n] = 0;
    if (!cJSON_IsString(kvb_json_get(c->prompts, base)) && n > 2 && !strcmp(base + n - 2, "_e")) base[n - 2] = 0;
    if (!cJSON_IsString(kvb_json_get(c->prompts, base))) {
        kvb_seterr(err, err_len, "%s: unknown LongBench task '%s'", c->prompts_path, task);
        return -1;
    }
    const cJSON *ml = kvb_json_get(c->maxlen, base);
    if (!cJSON_IsNumber(ml) || ml->valuedouble < 1 || ml->valuedouble > 1e6
        || ml->valuedouble != floor(ml->valuedouble)) {
        kvb_seterr(err, err_len, "%s: no positive integer max length for task '%s'", c->maxlen_path, base);
        return -1;
    }
    return 0;
}

/* ---- template ---- */

/* Appends the value of field name (len bytes) of rec, as str.format would print a str or an int. */
static int add_field(kvb_sb *b, const cJSON *rec, const char *name, size_t len, const char *where, char *err,
                     size_t err_len) {
    char key[128];
    if (len == 0 || len >= sizeof key || memchr(name, '.', len) || memchr(name, '[', len) || memchr(name, '!', len)
        || memchr(name, ':', len)) {
        kvb_seterr(err, err_len, "%s: unsupported template placeholder '{%.*s}'", where, (int)(len < 60 ? len : 60),
                   name);
        return -1;
    }
    memcpy(key, name, len);
    key[len] = 0;
    const cJSON *v = kvb_json_get(rec, key);
    if (cJSON_IsString(v)) {
        kvb_sb_adds(b, v->valuestring);
    } else if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9e15) {
        kvb_sb_addf(b, "%.0f", v->valuedouble);
    } else {
        kvb_seterr(err, err_len, "%s: field '%s' used by the template is %s", where, key,
                   v ? "not a string" : "missing");
        return -1;
    }
    return 0;
}

/* str.format(**rec) on tmpl: values are copied in literally (never re-scanned for braces). */
static char *render_template(const char *tmpl, const cJSON *rec, const char *where, char *err, size_t err_len) {
    kvb_sb b = {0};
    const char *p = tmpl;
    while (*p) {
        const char *q = p + strcspn(p, "{}");
        kvb_sb_add(&b, p, (size_t)(q - p));
        if (!*q) break;
        if (q[0] == q[1]) { /* "{{" or "}}" */
            kvb_sb_add(&b, q, 1);
            p = q + 2;
            continue;
        }
        const char *close = q[0] == '{' ? strchr(q + 1, '}') : NULL;
        if (!close) {
            kvb_seterr(err, err_len, "%s: unbalanced '%c' in the template", where, q[0]);
            goto fail;
        }
        if (add_field(&b, rec, q + 1, (size_t)(close - q - 1), where, err, err_len)) goto fail;
        p = close + 1;
    }
    char *s = kvb_sb_take(&b);
    if (!s) kvb_seterr(err, err_len, "%s: out of memory", where);
    return s;
fail:
    kvb_sb_free(&b);
    return NULL;
}

/* ---- records ---- */

static int is_null_or_absent(const cJSON *v) {
    return !v || cJSON_IsNull(v);
}

static int copy_str_array(const cJSON *arr, char ***out, int *n) {
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char *d = kvb_strdup(it->valuestring);
        char **nv = d ? realloc(*out, (size_t)(*n + 1) * sizeof *nv) : NULL;
        if (!nv) {
            free(d);
            return -1;
        }
        nv[(*n)++] = d;
        *out = nv;
    }
    return 0;
}

static int all_strings(const cJSON *arr) {
    const cJSON *it;
    if (!cJSON_IsArray(arr)) return 0;
    cJSON_ArrayForEach(it, arr)
        if (!cJSON_IsString(it)) return 0;
    return 1;
}

/* Type checks of the official schema; the first violation is reported. */
static int check_record(const cJSON *rec, const char *base, const char *where, char *err, size_t err_len) {
    const cJSON *ds = kvb_json_get(rec, "dataset"), *len = kvb_json_get(rec, "length");
    const cJSON *cls = kvb_json_get(rec, "all_classes"), *id = kvb_json_get(rec, "_id");
    const cJSON *lang = kvb_json_get(rec, "language");
    const char *bad = !cJSON_IsObject(rec)                              ? "the record is not a JSON object"
                    : !cJSON_IsString(kvb_json_get(rec, "context"))     ? "'context' is missing or not a string"
                    : !cJSON_IsString(kvb_json_get(rec, "input"))       ? "'input' is missing or not a string"
                    : !all_strings(kvb_json_get(rec, "answers"))        ? "'answers' is not a list of strings"
                    : !is_null_or_absent(len) && (!cJSON_IsNumber(len) || len->valuedouble != floor(len->valuedouble))
                                                                        ? "'length' is not an integer"
                    : !is_null_or_absent(cls) && !all_strings(cls)      ? "'all_classes' is not a list of strings"
                    : !is_null_or_absent(id) && !cJSON_IsString(id)     ? "'_id' is not a string"
                    : !is_null_or_absent(lang) && !cJSON_IsString(lang) ? "'language' is not a string"
                    : !is_null_or_absent(ds) && !cJSON_IsString(ds)     ? "'dataset' is not a string"
                                                                        : NULL;
    if (bad) {
        kvb_seterr(err, err_len, "%s: %s", where, bad);
        return -1;
    }
    if (cJSON_IsString(ds) && strcmp(ds->valuestring, base)
        && !(!strncmp(ds->valuestring, base, strlen(base)) && !strcmp(ds->valuestring + strlen(base), "_e"))) {
        kvb_seterr(err, err_len, "%s: record of dataset '%.60s', expected '%s'", where, ds->valuestring, base);
        return -1;
    }
    return 0;
}

static int fill_sample(kvb_sample *s, const cJSON *rec, const char *base, const char *tmpl, int max_new, long line,
                       int hidden, const char *where, char *err, size_t err_len) {
    const cJSON *id = kvb_json_get(rec, "_id"), *len = kvb_json_get(rec, "length");
    const cJSON *cls = kvb_json_get(rec, "all_classes");
    char num[32];
    snprintf(num, sizeof num, "%ld", line);
    s->prompt = render_template(tmpl, rec, where, err, err_len);
    if (!s->prompt) return -1;
    if (hidden) { /* the template split after its {context}: context and question render separately */
        const char *at = strstr(tmpl, "{context}");
        char *head = at ? strndup(tmpl, (size_t)(at - tmpl) + strlen("{context}")) : NULL;
        if (!at) return kvb_seterr(err, err_len, "%s: the %s template has no {context}: the question cannot be hidden", where, base), -1;
        if (!head) return kvb_seterr(err, err_len, "%s: out of memory", where), -1;
        s->context = render_template(head, rec, where, err, err_len);
        free(head);
        if (!s->context) return -1;
        s->question = render_template(at + strlen("{context}"), rec, where, err, err_len);
        if (!s->question) return -1;
    }
    s->id = kvb_strdup(cJSON_IsString(id) ? id->valuestring : num);
    s->task = kvb_strdup(base);
    s->stop = kvb_strdup(lb_task_stop(base));
    s->max_new_tokens = max_new;
    s->use_chat = lb_task_uses_chat(base);
    s->first_line = lb_task_first_line(base);
    s->length = cJSON_IsNumber(len) ? (int64_t)len->valuedouble : -1;
    if (!s->id || !s->task || (lb_task_stop(base) && !s->stop)
        || copy_str_array(kvb_json_get(rec, "answers"), &s->answers, &s->n_answers)
        || (cJSON_IsArray(cls) && copy_str_array(cls, &s->all_classes, &s->n_classes))) {
        kvb_seterr(err, err_len, "%s: out of memory", where);
        return -1;
    }
    return 0;
}

/* Two records with one _id would be one cell of every method: the second's result silently standing for both.
 * lines[i] is the line of out->v[from + i]. */
static int refuse_dup_ids(const char *path, const kvb_samples *out, int from, const long *lines, char *err, size_t err_len) {
    int a, b, dup = kvb_samples_find_dup_id(out, from, &a, &b);
    if (dup < 0) return kvb_seterr(err, err_len, "%s: out of memory", path), -1;
    if (dup)
        return kvb_seterr(err, err_len, "%s:%ld: duplicate _id '%.80s%s' (line %ld has it too): every sample needs its own id",
                          path, lines[b - from], out->v[b].id, strlen(out->v[b].id) > 80 ? "..." : "", lines[a - from]), -1;
    return 0;
}

static int load_records(kvb_jsonl *r, const lb_config *c, const char *base, int limit, int hidden, kvb_samples *out,
                        char *err, size_t err_len) {
    const char *tmpl = kvb_json_get(c->prompts, base)->valuestring;
    int max_new = (int)kvb_json_get(c->maxlen, base)->valuedouble;
    int got = 0, rc = 0, from = out->n;
    long *lines = NULL;
    cJSON *rec;
    while ((limit <= 0 || got < limit) && (rc = kvb_jsonl_next(r, &rec, err, err_len)) == 1) {
        char where[512];
        snprintf(where, sizeof where, "%s:%ld", r->path, r->lineno);
        kvb_sample s;
        kvb_sample_init(&s);
        int bad = check_record(rec, base, where, err, err_len)
               || fill_sample(&s, rec, base, tmpl, max_new, r->lineno, hidden, where, err, err_len);
        cJSON_Delete(rec);
        long *nl = bad ? NULL : realloc(lines, (size_t)(got + 1) * sizeof *lines);
        if (!bad && !nl) kvb_seterr(err, err_len, "%s: out of memory", where);
        if (bad || !nl) {
            kvb_sample_free(&s);
            free(lines);
            return -1;
        }
        lines = nl;
        lines[got] = r->lineno;
        if (kvb_samples_push(out, &s)) {
            kvb_seterr(err, err_len, "%s: out of memory", where);
            free(lines);
            return -1;
        }
        got++;
    }
    if (rc >= 0 && refuse_dup_ids(r->path, out, from, lines, err, err_len)) rc = -1;
    free(lines);
    return rc < 0 ? -1 : limit > 0 && got >= limit ? 0 : rc;
}

/* Keeps the n records at i*total/n of v[from..), in order. */
static void keep_spread(kvb_samples *v, int from, int n) {
    int total = v->n - from;
    if (n <= 0 || n >= total) return;
    for (int i = 0, at = from; i < total; i++) {
        kvb_sample *s = &v->v[from + i];
        int take = at - from < n && (int)((int64_t)(at - from) * total / n) == i;
        if (!take) { kvb_sample_free(s); continue; }
        v->v[at++] = *s;
    }
    v->n = from + n;
}

/* Samples of v[from..) with equal contexts get group "ctx-<id of the first>" and follow it; 0 / -1. */
static int group_contexts(kvb_samples *v, int from, char *err, size_t err_len) {
    int n = v->n - from;
    kvb_sample *src = v->v + from, *dst = n ? malloc((size_t)n * sizeof *dst) : NULL;
    char *placed = n ? calloc((size_t)n, 1) : NULL;
    if (n && (!dst || !placed)) { free(dst), free(placed); return kvb_seterr(err, err_len, "out of memory"), -1; }
    int at = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        if (placed[i]) continue;
        int first = at;
        dst[at++] = src[i], placed[i] = 1;
        for (int j = i + 1; j < n; j++)
            if (!placed[j] && !strcmp(src[j].context, src[i].context)) dst[at++] = src[j], placed[j] = 1;
        for (int k = first; at - first > 1 && k < at && !rc; k++) {
            size_t len = strlen(dst[first].id) + 5;
            if (!(dst[k].group = malloc(len))) {
                kvb_seterr(err, err_len, "out of memory");
                rc = -1;
            } else snprintf(dst[k].group, len, "ctx-%s", dst[first].id);
        }
    }
    memcpy(src, dst, (size_t)n * sizeof *dst);
    free(dst), free(placed);
    return rc;
}

int lb_load_ex(const char *jsonl_path, const char *task, const char *config_dir, int limit, int flags,
               kvb_samples *out, char *err, size_t err_len) {
    lb_config c;
    char base[128];
    int n0 = out->n, rc = -1;
    kvb_jsonl r = {0};
    if (config_load(&c, config_dir, err, err_len) == 0 && resolve_task(&c, task, base, sizeof base, err, err_len) == 0
        && kvb_jsonl_open(&r, jsonl_path, err, err_len) == 0)
        rc = load_records(&r, &c, base, flags & LB_SPREAD ? 0 : limit, !!(flags & LB_HIDDEN), out, err, err_len);
    kvb_jsonl_close(&r);
    config_free(&c);
    if (!rc && (flags & LB_SPREAD)) keep_spread(out, n0, limit);
    if (!rc && (flags & LB_HIDDEN)) rc = group_contexts(out, n0, err, err_len);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}

int lb_load(const char *jsonl_path, const char *task, const char *config_dir, int limit, kvb_samples *out,
            char *err, size_t err_len) {
    return lb_load_ex(jsonl_path, task, config_dir, limit, 0, out, err, err_len);
}
