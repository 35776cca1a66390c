/* sample.c — the benchmark sample: ownership, the round builder, and the helpers every loader shares
 * (string builder, one-line errors, splitmix64). Follows no external code; see sample.h. */
#include "benchmarks/sample.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void free_strv(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

void kvb_sample_free(kvb_sample *s) {
    if (!s) return;
    free(s->id);
    free(s->task);
    free(s->prompt);
    for (int i = 0; i < s->n_turns; i++) {
        free(s->turns[i].role);
        free(s->turns[i].content);
        free(s->turns[i].date);
    }
    free(s->turns);
    free(s->question);
    free_strv(s->answers, s->n_answers);
    free_strv(s->all_classes, s->n_classes);
    free(s->stop);
    free(s->qtype);
    free(s->system);
    free(s->prefill);
    free(s->context);
    free(s->date);
    free(s->group);
    free(s->difficulty);
    free(s->domain);
    free(s->followup);
    free(s->followup_slot);
    memset(s, 0, sizeof *s);
}

void kvb_samples_free(kvb_samples *s) {
    if (!s) return;
    kvb_samples_truncate(s, 0);
    free(s->v);
    memset(s, 0, sizeof *s);
}

typedef struct { const char *id; int at; } id_at;

static int cmp_id_at(const void *a, const void *b) {
    const id_at *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

int kvb_samples_find_dup_id(const kvb_samples *v, int from, int *first, int *second) {
    int n = v->n - from, found = 0;
    if (n < 2) return 0;
    id_at *ix = malloc((size_t)n * sizeof *ix);
    if (!ix) return -1;
    for (int i = 0; i < n; i++) ix[i] = (id_at){v->v[from + i].id ? v->v[from + i].id : "", from + i};
    qsort(ix, (size_t)n, sizeof *ix, cmp_id_at);
    /* sorted by (id, index): a run of equal ids starts with its earliest sample, then its first repeat */
    for (int i = 1; i < n; i++)
        if (!strcmp(ix[i].id, ix[i - 1].id) && (i == 1 || strcmp(ix[i - 1].id, ix[i - 2].id)) && (!found || ix[i].at < *second))
            *first = ix[i - 1].at, *second = ix[i].at, found = 1;
    free(ix);
    return found;
}

void kvb_samples_truncate(kvb_samples *v, int from) {
    if (from < 0) from = 0;
    for (int i = from; i < v->n; i++) kvb_sample_free(&v->v[i]);
    if (v->n > from) v->n = from;
    if (v->n == 0) { /* nothing left: a failed load into an empty set leaves no allocation behind */
        free(v->v);
        v->v = NULL;
        v->cap = 0;
    }
}

void kvb_sample_init(kvb_sample *s) {
    memset(s, 0, sizeof *s);
    s->length = -1;
}

int kvb_samples_push(kvb_samples *v, kvb_sample *s) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 16;
        kvb_sample *nv = cap > v->cap ? realloc(v->v, (size_t)cap * sizeof *nv) : NULL;
        if (!nv) {
            kvb_sample_free(s);
            return -1;
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = *s;
    memset(s, 0, sizeof *s);
    return 0;
}

char *kvb_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int push_str(char ***v, int *n, const char *s) {
    char *d = kvb_strdup(s);
    char **nv = d ? realloc(*v, (size_t)(*n + 1) * sizeof *nv) : NULL;
    if (!nv) {
        free(d);
        return -1;
    }
    nv[(*n)++] = d;
    *v = nv;
    return 0;
}

int kvb_sample_add_answer(kvb_sample *s, const char *a) {
    return push_str(&s->answers, &s->n_answers, a);
}

int kvb_sample_add_turn(kvb_sample *s, const char *role, const char *content, const char *date) {
    kvb_turn t = {kvb_strdup(role), kvb_strdup(content), kvb_strdup(date), -1, 0};
    kvb_turn *nv = realloc(s->turns, (size_t)(s->n_turns + 1) * sizeof *nv);
    if (!t.role || !t.content || (date && !t.date) || !nv) {
        free(t.role);
        free(t.content);
        free(t.date);
        if (nv) s->turns = nv;
        return -1;
    }
    nv[s->n_turns++] = t;
    s->turns = nv;
    return 0;
}

static const char *last_role(const kvb_sample *s) {
    return s->n_turns ? s->turns[s->n_turns - 1].role : NULL;
}

int kvb_sample_add_message(kvb_sample *s, const char *role, const char *content, const char *date) {
    const char *last = last_role(s);
    if (!strcmp(role, "system")) {
        if (last) return 1;
        return kvb_sample_add_turn(s, role, content, date);
    }
    int user = !strcmp(role, "user");
    int user_due = !last || strcmp(last, "user") != 0; /* after system, assistant, or at the start */
    if (user && !user_due && kvb_sample_add_turn(s, "assistant", "", date)) return -1;
    if (!user && user_due && kvb_sample_add_turn(s, "user", "", date)) return -1;
    return kvb_sample_add_turn(s, user ? "user" : "assistant", content, date);
}

int kvb_sample_close_rounds(kvb_sample *s) {
    const char *last = last_role(s);
    if (last && !strcmp(last, "user")) return kvb_sample_add_turn(s, "assistant", "", s->turns[s->n_turns - 1].date);
    return 0;
}

int kvb_sample_n_rounds(const kvb_sample *s) {
    int n = 0;
    for (int i = 0; i + 1 < s->n_turns; i++)
        if (!strcmp(s->turns[i].role, "user") && !strcmp(s->turns[i + 1].role, "assistant")) n++, i++;
    return n;
}

void kvb_seterr(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || !err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    for (char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20) *p = ' ';
}

static int sb_reserve(kvb_sb *b, size_t extra) {
    if (b->oom) return -1;
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return -1;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void kvb_sb_add(kvb_sb *b, const char *s, size_t len) {
    if (sb_reserve(b, len)) return;
    if (len) memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

void kvb_sb_adds(kvb_sb *b, const char *s) {
    kvb_sb_add(b, s, strlen(s));
}

void kvb_sb_addf(kvb_sb *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || sb_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

char *kvb_sb_take(kvb_sb *b) {
    if (!b->oom && !b->p) kvb_sb_add(b, "", 0);
    char *p = b->oom ? NULL : b->p;
    if (!p) free(b->p);
    memset(b, 0, sizeof *b);
    return p;
}

void kvb_sb_free(kvb_sb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

uint64_t kvb_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t kvb_rng_below(uint64_t *state, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t limit = -n % n; /* 2^64 mod n: values below it would bias the modulo */
    for (;;) {
        uint64_t x = kvb_rng_next(state);
        if (x >= limit) return x % n;
    }
}

/* Bytes of a Python whitespace character (str.isspace) at s, or 0: ASCII \t\n\v\f\r, \x1c-\x1f and space,
 * U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. */
static int py_space(const unsigned char *s, const unsigned char *end) {
    if (s >= end) return 0;
    if ((*s >= 9 && *s <= 13) || (*s >= 0x1c && *s <= 0x20)) return 1;
    if (end - s >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (end - s < 3) return 0;
    if (s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3;
    if (s[0] == 0xe2 && s[1] == 0x80 && (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf)) return 3;
    if (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3;
    if (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3;
    return 0;
}

char *kvb_py_strip(const char *text) {
    const unsigned char *b = (const unsigned char *)text, *e = b + strlen(text);
    for (int k; (k = py_space(b, e)) > 0;) b += k;
    while (e > b) { /* the last character: step back over continuation bytes */
        const unsigned char *c = e - 1;
        while (c > b && (*c & 0xc0) == 0x80 && e - c < 4) c--;
        int k = py_space(c, e);
        if (k == 0 || c + k != e) break;
        e = c;
    }
    return strndup((const char *)b, (size_t)(e - b));
}

char *kvb_replace_all(const char *s, const char *from, const char *to) {
    kvb_sb b = {0};
    size_t fl = strlen(from);
    for (const char *p = s;;) {
        const char *q = strstr(p, from);
        if (!q) { kvb_sb_adds(&b, p); break; }
        kvb_sb_add(&b, p, (size_t)(q - p));
        kvb_sb_adds(&b, to);
        p = q + fl;
    }
    return kvb_sb_take(&b);
}

char *kvb_sample_followup_prompt(const kvb_sample *s, const char *reply) {
    if (!s->followup || !s->followup_slot || !*s->followup_slot) return NULL;
    char *r = kvb_py_strip(reply ? reply : ""), *out = r ? kvb_replace_all(s->followup, s->followup_slot, r) : NULL;
    free(r);
    return out;
}
