/* rouge.c — ROUGE-Lsum of Google's rouge_score (rouge.h), following rouge_score/rouge_scorer.py and
 * tokenize.py (read, not copied). Tokens are interned to small integers so the LCS tables compare ints and the
 * double-counting guard is two count arrays. */
#include "benchmarks/rouge.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char **key;  /* interned token text, NULL = empty slot */
    int *id;
    size_t cap;  /* power of two */
    int n;
} interner;

typedef struct { int *ids; int n; } sentence;
typedef struct { sentence *s; int n; int64_t total; } doc;

static uint64_t hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int intern_grow(interner *t) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    char **key = calloc(cap, sizeof *key);
    int *id = calloc(cap, sizeof *id);
    if (!key || !id) { free(key); free(id); return -1; }
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->key[i]) continue;
        size_t j = hash(t->key[i], strlen(t->key[i])) & (cap - 1);
        while (key[j]) j = (j + 1) & (cap - 1);
        key[j] = t->key[i];
        id[j] = t->id[i];
    }
    free(t->key);
    free(t->id);
    t->key = key, t->id = id, t->cap = cap;
    return 0;
}

/* The id of token s[0..n), a new one the first time; -1 on OOM. */
static int intern(interner *t, const char *s, size_t n) {
    if ((size_t)(t->n + 1) * 2 > t->cap && intern_grow(t)) return -1;
    size_t j = hash(s, n) & (t->cap - 1);
    for (; t->key[j]; j = (j + 1) & (t->cap - 1))
        if (!strncmp(t->key[j], s, n) && !t->key[j][n]) return t->id[j];
    if (!(t->key[j] = strndup(s, n))) return -1;
    return t->id[j] = t->n++;
}

static void intern_free(interner *t) {
    for (size_t i = 0; i < t->cap; i++) free(t->key[i]);
    free(t->key);
    free(t->id);
}

static void doc_free(doc *d) {
    for (int i = 0; i < d->n; i++) free(d->s[i].ids);
    free(d->s);
    memset(d, 0, sizeof *d);
}

static int push_id(sentence *s, int *cap, int id) {
    if (id < 0) return -1;
    if (s->n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        int *v = realloc(s->ids, (size_t)nc * sizeof *v);
        if (!v) return -1;
        s->ids = v, *cap = nc;
    }
    s->ids[s->n++] = id;
    return 0;
}

/* tokenize.py on one sentence [p, end): lower-case, [^a-z0-9]+ separates, empty tokens dropped. */
static int tokenize(interner *t, const char *p, const char *end, sentence *s) {
    char buf[256];
    size_t len = 0;
    char *big = NULL; /* a token longer than buf */
    int cap = 0, rc = 0;
    for (; p <= end && !rc; p++) {
        char c = 0;
        int close = 0;
        if (p == end) close = 1;
        else if ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')) c = *p;
        else if (*p >= 'A' && *p <= 'Z') c = (char)(*p - 'A' + 'a');
        else if (end - p >= 3 && !memcmp(p, "\xe2\x84\xaa", 3)) c = 'k', p += 2; /* KELVIN SIGN -> "k" */
        else if (end - p >= 2 && !memcmp(p, "\xc4\xb0", 2)) c = 'i', close = 1, p += 1; /* U+0130 -> "i" + U+0307 */
        else close = 1;
        if (c) {
            if (len + 1 >= sizeof buf && !big) {
                if (!(big = malloc(end - p + sizeof buf + 1))) return -1;
                memcpy(big, buf, len);
            }
            (big ? big : buf)[len++] = c;
        }
        if (close && len) {
            rc = push_id(s, &cap, intern(t, big ? big : buf, len));
            len = 0;
            free(big);
            big = NULL;
        }
    }
    free(big);
    return rc;
}

/* get_sents: split at "\n", empty pieces dropped; then each sentence tokenized (its tokens may be none). */
static int split_doc(interner *t, const char *text, doc *d) {
    for (const char *p = text;;) {
        const char *nl = strchr(p, '\n');
        const char *end = nl ? nl : p + strlen(p);
        if (end > p) {
            sentence *v = realloc(d->s, (size_t)(d->n + 1) * sizeof *v);
            if (!v) return -1;
            d->s = v;
            d->s[d->n] = (sentence){0};
            if (tokenize(t, p, end, &d->s[d->n++])) return -1;
            d->total += d->s[d->n - 1].n;
        }
        if (!nl) return 0;
        p = nl + 1;
    }
}

/* lcs_ind: one LCS of r and c by the package's backtrack (a match steps diagonally; else left when the left cell
 * is strictly larger, otherwise up); marks the indices of r it uses in mark. tab holds (|r|+1)(|c|+1) ints. */
static void lcs_mark(const sentence *r, const sentence *c, int32_t *tab, unsigned char *mark) {
    size_t w = (size_t)c->n + 1;
    for (size_t j = 0; j < w; j++) tab[j] = 0;
    for (int i = 1; i <= r->n; i++) {
        int32_t *row = tab + (size_t)i * w, *up = row - w;
        row[0] = 0;
        for (int j = 1; j <= c->n; j++)
            row[j] = r->ids[i - 1] == c->ids[j - 1] ? up[j - 1] + 1 : (up[j] > row[j - 1] ? up[j] : row[j - 1]);
    }
    for (int i = r->n, j = c->n; i > 0 && j > 0;) {
        if (r->ids[i - 1] == c->ids[j - 1]) mark[--i] = 1, j--;
        else if (tab[(size_t)i * w + j - 1] > tab[(size_t)(i - 1) * w + j]) j--;
        else i--;
    }
}

/* _summary_level_lcs: union-LCS hits, each token counted at most as often as both sides hold it. */
static double summary_lcs(const doc *ref, const doc *can, int n_ids) {
    if (!ref->n || !can->n || !ref->total || !can->total) return 0;
    int max_r = 0, max_c = 0;
    for (int i = 0; i < ref->n; i++) max_r = ref->s[i].n > max_r ? ref->s[i].n : max_r;
    for (int i = 0; i < can->n; i++) max_c = can->s[i].n > max_c ? can->s[i].n : max_c;
    size_t cells = ((size_t)max_r + 1) * ((size_t)max_c + 1);
    int32_t *tab = malloc(cells * sizeof *tab);
    int *cnt_r = calloc((size_t)n_ids + 1, sizeof *cnt_r), *cnt_c = calloc((size_t)n_ids + 1, sizeof *cnt_c);
    unsigned char *mark = malloc((size_t)max_r + 1);
    double f = -1;
    if (!tab || !cnt_r || !cnt_c || !mark) goto done;
    for (int i = 0; i < ref->n; i++)
        for (int k = 0; k < ref->s[i].n; k++) cnt_r[ref->s[i].ids[k]]++;
    for (int i = 0; i < can->n; i++)
        for (int k = 0; k < can->s[i].n; k++) cnt_c[can->s[i].ids[k]]++;
    int64_t hits = 0;
    for (int i = 0; i < ref->n; i++) {
        const sentence *r = &ref->s[i];
        memset(mark, 0, (size_t)r->n + 1);
        for (int j = 0; j < can->n; j++) lcs_mark(r, &can->s[j], tab, mark);
        for (int k = 0; k < r->n; k++) {
            int t = r->ids[k];
            if (mark[k] && cnt_c[t] > 0 && cnt_r[t] > 0) hits++, cnt_c[t]--, cnt_r[t]--;
        }
    }
    double recall = (double)hits / (double)ref->total, precision = (double)hits / (double)can->total;
    f = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0.0;
done:
    free(tab);
    free(cnt_r);
    free(cnt_c);
    free(mark);
    return f;
}

double kvb_rouge_lsum(const char *pred, const char *const *refs, int n_refs) {
    interner t = {0};
    doc can = {0};
    double best = 0;
    if (split_doc(&t, pred, &can)) best = -1;
    for (int i = 0; i < n_refs && best >= 0; i++) {
        doc ref = {0};
        double f = split_doc(&t, refs[i], &ref) ? -1 : summary_lcs(&ref, &can, t.n);
        doc_free(&ref);
        if (f < 0) best = -1;
        else if (f > best) best = f;
    }
    doc_free(&can);
    intern_free(&t);
    return best;
}
