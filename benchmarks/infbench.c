/* infbench.c — InfiniteBench's scorers (infbench.h), following OpenBMB/InfiniteBench src/compute_scores.py
 * (get_score_one_* functions; read, not copied). */
#include "benchmarks/infbench.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/metrics.h"
#include "benchmarks/rouge.h"
#include "benchmarks/sample.h"

static const char *const TASKS[] = {"passkey",         "number_string",       "kv_retrieval", "longbook_choice_eng",
                                    "longbook_qa_eng", "longdialogue_qa_eng", "code_debug",   "math_find",
                                    "longbook_sum_eng"};

int infbench_has_scorer(const char *task) {
    for (size_t i = 0; task && i < sizeof TASKS / sizeof *TASKS; i++)
        if (!strcmp(task, TASKS[i])) return 1;
    return 0;
}

/* label[0] when a list (the official scorers' `if isinstance(label, list)`), else label. */
static const cJSON *first(const cJSON *label) { return cJSON_IsArray(label) ? cJSON_GetArrayItem(label, 0) : label; }

/* Python's str.strip() on ASCII whitespace: a malloc'd copy. */
static char *strip_dup(const char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) n--;
    return strndup(s, n);
}

/* Every occurrence of each string in from[] replaced by a space, in order (str.replace chains); malloc'd. */
static char *replace_with_space(const char *s, const char *const *from, int n) {
    char *cur = strdup(s);
    for (int i = 0; cur && i < n; i++) {
        kvb_sb b = {0};
        size_t fl = strlen(from[i]);
        for (const char *p = cur;;) {
            const char *q = strstr(p, from[i]);
            if (!q) { kvb_sb_adds(&b, p); break; }
            kvb_sb_add(&b, p, (size_t)(q - p));
            kvb_sb_add(&b, " ", 1);
            p = q + fl;
        }
        free(cur);
        cur = kvb_sb_take(&b);
    }
    return cur;
}

/* while "  " in pred: pred = pred.replace("  ", " ") — runs of spaces become one (in place). */
static void squeeze_spaces(char *s) {
    char *w = s;
    for (char *r = s; *r; r++)
        if (!(*r == ' ' && w > s && w[-1] == ' ')) *w++ = *r;
    *w = 0;
}

/* Whitespace-split words of s (modified in place); count in *n; malloc'd array. */
static char **split_words(char *s, int *n) {
    char **v = malloc((strlen(s) / 2 + 2) * sizeof *v);
    *n = 0;
    if (!v) return NULL;
    for (char *p = s; *p;) {
        while (*p && isspace((unsigned char)*p)) *p++ = 0;
        if (!*p) break;
        v[(*n)++] = p;
        while (*p && !isspace((unsigned char)*p)) p++;
    }
    return v;
}

static int word_in(const char *pred, const char *label, const char *const *chars, int n_chars, int upper) {
    char *s = replace_with_space(pred, chars, n_chars);
    if (!s) return 0;
    int n, hit = 0;
    char **w = split_words(s, &n);
    for (int i = 0; w && i < n && !hit; i++) {
        if (upper)
            for (char *c = w[i]; *c; c++) *c = (char)toupper((unsigned char)*c);
        hit = !strcmp(w[i], label);
    }
    free(w);
    free(s);
    return hit;
}

/* first_int_match: the first non-empty piece of re.split("[^0-9]", pred) == label. */
static int first_int_is(const char *pred, const char *label) {
    const char *p = pred;
    while (*p && !isdigit((unsigned char)*p)) p++;
    size_t n = 0;
    while (isdigit((unsigned char)p[n])) n++;
    return strlen(label) == n && !strncmp(p, label, n);
}

static int choice(const char *pred0, const cJSON *label) {
    char *pred = strip_dup(pred0);
    int r = 0;
    if (!pred || !*pred) goto done;
    char c0[2] = {pred[0], 0};
    const cJSON *l;
    if (strchr("ABCD", pred[0])) { /* pred[0] in label: equal to an element */
        cJSON_ArrayForEach(l, label) r |= cJSON_IsString(l) && !strcmp(l->valuestring, c0);
        goto done;
    }
    cJSON_ArrayForEach(l, label) r |= cJSON_IsString(l) && !strcmp(l->valuestring, pred);
    if (r) goto done;
    static const char *const CH[] = {"\n", "\"", "'", ".", ",", "?", "!", "{", "}"};
    char *s = replace_with_space(pred, CH, 9);
    if (!s) goto done;
    squeeze_spaces(s);
    static const char *const PRE[] = {"answer is:", "answer:", "answer is", "option is"};
    for (int i = 0; i < 4; i++) {
        const char *at = strstr(s, PRE[i]);
        if (!at) continue;
        size_t idx = (size_t)(at - s) + strlen(PRE[i]) + 1;
        if (strlen(s) >= idx)
            cJSON_ArrayForEach(l, label) r |= cJSON_IsString(l) && !strncmp(s + idx, l->valuestring, strlen(l->valuestring));
        free(s);
        goto done;
    }
    int n;
    char **w = split_words(s, &n);
    for (int i = 0; w && i < n; i++)
        if (strstr("ABCD", w[i])) { /* `word in "ABCD"`: a substring of it */
            cJSON_ArrayForEach(l, label) r |= cJSON_IsString(l) && !strcmp(l->valuestring, w[i]);
            break;
        }
    free(w);
    free(s);
done:
    free(pred);
    return r;
}

static int code_debug(const char *pred0, const cJSON *label) {
    const cJSON *fn = cJSON_GetArrayItem(label, 0), *lc = cJSON_GetArrayItem(label, 1);
    if (!cJSON_IsString(fn) || !cJSON_IsString(lc)) return -1;
    char *pred = strip_dup(pred0);
    if (!pred) return 0;
    size_t cl = strlen(lc->valuestring);
    if (cl == 1 && pred[0] == lc->valuestring[0] && (pred[1] == '.' || pred[1] == ':')) { free(pred); return 1; }
    static const char *const CH[] = {"\n", "`", "'", "\"", "-", "*", "Option", "option"};
    char *s = replace_with_space(pred, CH, 8);
    free(pred);
    if (!s) return 0;
    squeeze_spaces(s);
    static const char *const PRE[] = {"answer is:", "is:", "answer:", "correct option is:"};
    int r = 0;
    for (int i = 0; i < 4; i++) {
        const char *at = strstr(s, PRE[i]);
        if (!at) continue;
        size_t idx = (size_t)(at - s) + strlen(PRE[i]) + 1;
        if (strlen(s) >= idx)
            r = !strncmp(s + idx, lc->valuestring, cl) || !strncmp(s + idx, fn->valuestring, strlen(fn->valuestring));
        break;
    }
    free(s);
    return r;
}

/* re.search(r"\d+\.\d+|\d+", pred): the first number, with its fraction when one follows. */
static int first_number(const char *pred, char *buf, size_t cap) {
    const char *p = pred;
    while (*p && !isdigit((unsigned char)*p)) p++;
    if (!*p) return -1;
    size_t n = 0;
    while (isdigit((unsigned char)p[n])) n++;
    if (p[n] == '.' && isdigit((unsigned char)p[n + 1])) {
        n++;
        while (isdigit((unsigned char)p[n])) n++;
    }
    if (n >= cap) return -1;
    memcpy(buf, p, n);
    buf[n] = 0;
    return 0;
}

static int math_find(const char *pred, const cJSON *label) {
    label = first(label);
    if (!cJSON_IsNumber(label)) return -1;
    char num[64];
    if (first_number(pred, num, sizeof num)) return 0;
    double lv = label->valuedouble;
    /* an integral label is an int: int("3.5") raises in the official code (no score); cJSON cannot tell 88 from
     * 88.0, so an integral float label is read as an int too */
    if (lv == (double)(long long)lv && strchr(num, '.')) return 0;
    return strtod(num, NULL) == lv;
}

/* evaluate's rouge: a list label is several references (score_multi), a string one. */
static int sum_eng(const char *pred, const cJSON *label, double *score) {
    const char *one[1];
    const char **refs = one;
    int n = 0;
    if (cJSON_IsString(label)) {
        one[n++] = label->valuestring;
    } else if (cJSON_IsArray(label) && cJSON_GetArraySize(label) > 0) {
        if (!(refs = malloc((size_t)cJSON_GetArraySize(label) * sizeof *refs))) return -1;
        const cJSON *l;
        cJSON_ArrayForEach(l, label) {
            if (!cJSON_IsString(l)) { free(refs); return -1; }
            refs[n++] = l->valuestring;
        }
    } else {
        return -1;
    }
    double f = kvb_rouge_lsum(pred, refs, n);
    if (refs != one) free(refs);
    if (f < 0) return -1;
    *score = f;
    return 0;
}

int infbench_score(const char *task, const char *pred, const cJSON *label, double *score) {
    if (!infbench_has_scorer(task) || !label) return -1;
    int r = -1;
    if (!strcmp(task, "passkey") || !strcmp(task, "number_string")) {
        const cJSON *l = first(label);
        if (cJSON_IsString(l)) r = first_int_is(pred, l->valuestring);
    } else if (!strcmp(task, "kv_retrieval")) {
        static const char *const CH[] = {"\n", ":", "\"", "'", ".", ",", "?", "!", "{", "}"};
        if (cJSON_IsString(label)) r = word_in(pred, label->valuestring, CH, 10, 0);
    } else if (!strcmp(task, "longdialogue_qa_eng")) {
        static const char *const CH[] = {"\n", ":", "\"", "'", ".", ",", "?", "!", "{", "}"};
        const cJSON *l = cJSON_GetArrayItem(label, 0);
        if (cJSON_IsString(l)) {
            char *p = strip_dup(pred);
            r = p ? word_in(p, l->valuestring, CH, 10, 1) : 0;
            free(p);
        }
    } else if (!strcmp(task, "longbook_choice_eng")) {
        if (cJSON_IsArray(label)) r = choice(pred, label);
    } else if (!strcmp(task, "longbook_qa_eng")) {
        if (cJSON_IsArray(label)) {
            double best = 0;
            const cJSON *l;
            cJSON_ArrayForEach(l, label) {
                if (!cJSON_IsString(l)) return -1;
                double f = kvb_metric_qa_f1(pred, l->valuestring);
                best = f > best ? f : best;
            }
            *score = best;
            return 0;
        }
    } else if (!strcmp(task, "code_debug")) {
        if (cJSON_IsArray(label)) r = code_debug(pred, label);
    } else if (!strcmp(task, "math_find")) {
        r = math_find(pred, label);
    } else if (!strcmp(task, "longbook_sum_eng")) {
        return sum_eng(pred, label, score);
    }
    if (r < 0) return -1;
    *score = r;
    return 0;
}

int infbench_score_answers(const char *task, const char *pred, const char *const *answers, int n_answers, double *score) {
    if (n_answers < 1) return -1;
    cJSON *label = NULL;
    if (!strcmp(task, "passkey") || !strcmp(task, "number_string") || !strcmp(task, "kv_retrieval"))
        label = cJSON_CreateString(answers[0]);
    else if (!strcmp(task, "math_find"))
        label = cJSON_CreateNumber(strtod(answers[0], NULL));
    else
        label = cJSON_CreateStringArray(answers, n_answers);
    int rc = label ? infbench_score(task, pred, label, score) : -1;
    cJSON_Delete(label);
    return rc;
}
