/* jieba.c — jieba.cut(s, cut_all=False, HMM=...) over jieba's own dictionary and HMM (jieba.h). Written from the
 * behaviour of jieba 0.42.1, not from its code: prefix dictionary, DAG, right-to-left route, the two block cutters,
 * finalseg's Viterbi. */
#include "benchmarks/jieba.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fsutil.h"

/* finalseg's states, indexed in the order of their letters (B < E < M < S), so "the later letter wins a tie" is
 * "the larger index wins". */
enum { ST_B, ST_E, ST_M, ST_S, N_ST };
static const char ST_LETTER[N_ST] = {'B', 'E', 'M', 'S'};
/* finalseg's PrevStatus: the states a state may follow */
static const int PREV[N_ST][2] = {[ST_B] = {ST_E, ST_S}, [ST_E] = {ST_B, ST_M}, [ST_M] = {ST_M, ST_B},
                                  [ST_S] = {ST_S, ST_E}};
static const double MIN_FLOAT = -3.14e100; /* finalseg's score of a missing emission or transition */

typedef struct {
    const char *key; /* into dict_text */
    uint32_t len, hash;
    int64_t freq; /* 0: only a prefix of a word */
} dict_entry;

typedef struct {
    uint32_t *cp;
    double *lp;
    size_t n;
} emit_table;

struct kvb_jieba {
    char *dict_text;
    dict_entry *tab;
    size_t cap, n;
    int64_t words, total;
    double log_total;
    double start[N_ST], trans[N_ST][N_ST];
    unsigned char has_start[N_ST], has_trans[N_ST][N_ST];
    emit_table emit[N_ST];
};

static void seterr(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || !err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* ---- the prefix dictionary: open addressing on FNV-1a ---- */

static uint32_t fnv1a(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static const dict_entry *dict_find(const kvb_jieba *j, const char *s, size_t n) {
    if (!j->cap) return NULL;
    uint32_t h = fnv1a(s, n);
    for (size_t i = h & (j->cap - 1);; i = (i + 1) & (j->cap - 1)) {
        const dict_entry *e = &j->tab[i];
        if (!e->key) return NULL;
        if (e->hash == h && e->len == n && !memcmp(e->key, s, n)) return e;
    }
}

static int dict_grow(kvb_jieba *j) {
    size_t cap = j->cap ? 2 * j->cap : (size_t)1 << 16;
    dict_entry *t = calloc(cap, sizeof *t);
    if (!t) return -1;
    for (size_t i = 0; i < j->cap; i++) {
        if (!j->tab[i].key) continue;
        size_t k = j->tab[i].hash & (cap - 1);
        while (t[k].key) k = (k + 1) & (cap - 1);
        t[k] = j->tab[i];
    }
    free(j->tab);
    j->tab = t, j->cap = cap;
    return 0;
}

/* lfreq[key] = freq when overwrite or key is absent. */
static int dict_put(kvb_jieba *j, const char *s, size_t n, int64_t freq, int overwrite) {
    if ((j->n + 1) * 10 > j->cap * 7 && dict_grow(j)) return -1;
    uint32_t h = fnv1a(s, n);
    size_t i = h & (j->cap - 1);
    for (; j->tab[i].key; i = (i + 1) & (j->cap - 1))
        if (j->tab[i].hash == h && j->tab[i].len == n && !memcmp(j->tab[i].key, s, n)) {
            if (overwrite) j->tab[i].freq = freq;
            return 0;
        }
    j->tab[i] = (dict_entry){s, (uint32_t)n, h, freq};
    j->n++;
    return 0;
}

/* Length of the UTF-8 sequence at s[0..n) (1-4), or 0 when it is not valid UTF-8 (overlong forms, surrogates and
 * code points past U+10FFFF included, as Python's strict decoder refuses them). */
static int utf8_len(const unsigned char *s, size_t n) {
    int k = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    if (!k || (size_t)k > n) return 0;
    uint32_t v = k == 1 ? s[0] : s[0] & (0x3F >> (k - 1));
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_of[k] || (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) return 0;
    return k;
}

static int is_py_bytes_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* gen_pfdict: one line "word freq [tag]" (bytes.strip()ed, split at ' ') per entry. */
static int load_dict(kvb_jieba *j, const char *path, char *err, size_t err_len) {
    size_t len;
    j->dict_text = kvb_read_file(path, &len, err, err_len);
    if (!j->dict_text) return -1;
    char *p = j->dict_text, *end = p + len;
    for (int line = 1; p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end, *next = nl ? nl + 1 : end;
        char *s = p;
        while (s < e && is_py_bytes_space(*s)) s++;
        while (e > s && is_py_bytes_space(e[-1])) e--;
        char *sp = memchr(s, ' ', (size_t)(e - s));
        int ok = sp != NULL && sp > s;
        int64_t freq = 0;
        if (ok) { /* int() of the field between the first and second space */
            char *f = sp + 1, *fe = memchr(f, ' ', (size_t)(e - f));
            if (!fe) fe = e;
            char *q = f;
            int neg = q < fe && (*q == '-' || *q == '+') ? *q++ == '-' : 0;
            ok = q < fe;
            for (; ok && q < fe; q++) {
                ok = *q >= '0' && *q <= '9' && freq <= (INT64_MAX - 9) / 10;
                freq = freq * 10 + (*q - '0');
            }
            if (neg) freq = -freq;
        }
        for (const char *w = s; ok && w < sp;) { /* the word decodes as UTF-8 */
            int k = utf8_len((const unsigned char *)w, (size_t)(sp - w));
            ok = k > 0;
            w += k;
        }
        if (!ok) {
            seterr(err, err_len, "%s:%d: invalid dictionary entry (expected \"word count [tag]\")", path, line);
            return -1;
        }
        if (j->total > INT64_MAX - (freq > 0 ? freq : 0)) {
            seterr(err, err_len, "%s:%d: the counts overflow", path, line);
            return -1;
        }
        j->total += freq;
        j->words++;
        if (dict_put(j, s, (size_t)(sp - s), freq, 1)) goto oom;
        for (const char *w = s; w < sp;) { /* every prefix, as count 0 unless already there */
            w += utf8_len((const unsigned char *)w, (size_t)(sp - w));
            if (dict_put(j, s, (size_t)(w - s), 0, 0)) goto oom;
        }
        p = next;
    }
    if (j->total <= 0) {
        seterr(err, err_len, "%s: no words with a positive count", path);
        return -1;
    }
    j->log_total = log((double)j->total);
    return 0;
oom:
    seterr(err, err_len, "%s: out of memory", path);
    return -1;
}

/* ---- finalseg's tables: a Python file "P={...}" of str -> float or str -> {str -> float} ---- */

typedef struct {
    const char *p, *end, *path;
    int line;
} pyparse;

static void py_ws(pyparse *x) {
    for (; x->p < x->end; x->p++) {
        if (*x->p == '\n') x->line++;
        else if (*x->p == '#') {
            while (x->p < x->end && *x->p != '\n') x->p++;
            x->p--;
        } else if (*x->p != ' ' && *x->p != '\t' && *x->p != '\r') break;
    }
}

/* A one-character string literal ('x', "x", '\uXXXX', '\UXXXXXXXX', '\xXX'): its code point, or -1. */
static int64_t py_char(pyparse *x) {
    py_ws(x);
    if (x->p >= x->end || (*x->p != '\'' && *x->p != '"')) return -1;
    char q = *x->p++;
    int64_t c = -1;
    if (x->p < x->end && *x->p == '\\') {
        x->p++;
        int digits = x->p < x->end ? (*x->p == 'u' ? 4 : *x->p == 'U' ? 8 : *x->p == 'x' ? 2 : 0) : 0;
        if (digits) {
            char hex[9] = {0};
            if (x->end - x->p < digits + 1) return -1;
            memcpy(hex, x->p + 1, (size_t)digits);
            char *e;
            c = (int64_t)strtoul(hex, &e, 16);
            if (*e) return -1;
            x->p += 1 + digits;
        } else if (x->p < x->end && (*x->p == '\\' || *x->p == '\'' || *x->p == '"')) {
            c = (unsigned char)*x->p++;
        } else {
            return -1;
        }
    } else if (x->p < x->end) {
        const unsigned char *u = (const unsigned char *)x->p;
        int k = utf8_len(u, (size_t)(x->end - x->p));
        if (!k) return -1;
        c = k == 1 ? u[0] : u[0] & (0x3F >> (k - 1));
        for (int i = 1; i < k; i++) c = (c << 6) | (u[i] & 0x3F);
        x->p += k;
    }
    if (x->p >= x->end || *x->p != q) return -1;
    x->p++;
    return c;
}

static int py_expect(pyparse *x, char c) {
    py_ws(x);
    if (x->p < x->end && *x->p == c) { x->p++; return 0; }
    return -1;
}

static int state_of(int64_t c) {
    for (int s = 0; s < N_ST; s++)
        if (c == ST_LETTER[s]) return s;
    return -1;
}

typedef struct {
    uint32_t cp;
    double lp;
    size_t order;
} emit_row;

static int cmp_emit_row(const void *a, const void *b) {
    const emit_row *x = a, *y = b;
    if (x->cp != y->cp) return x->cp < y->cp ? -1 : 1;
    return x->order < y->order ? -1 : 1;
}

/* which: 0 = prob_start (state -> float), 1 = prob_trans (state -> {state -> float}), 2 = prob_emit (state ->
 * {char -> float}). */
static int load_prob(kvb_jieba *j, const char *path, int which, char *err, size_t err_len) {
    size_t len;
    char *text = kvb_read_file(path, &len, err, err_len);
    if (!text) return -1;
    pyparse x = {text, text + len, path, 1};
    emit_row *rows[N_ST] = {0};
    size_t n_rows[N_ST] = {0}, cap_rows[N_ST] = {0}, order = 0;
    int rc = -1;
    /* the assignment "P=" at the start of a line */
    const char *a = text;
    while (a < x.end && !(a[0] == 'P' && (a == text || a[-1] == '\n'))) x.line += *a++ == '\n';
    if (a == x.end) { seterr(err, err_len, "%s: no \"P=\" assignment", path); goto done; }
    x.p = a + 1;
    if (py_expect(&x, '=') || py_expect(&x, '{')) goto bad;
    for (;;) {
        py_ws(&x);
        if (x.p < x.end && *x.p == '}') { x.p++; break; }
        int s = state_of(py_char(&x));
        if (s < 0 || py_expect(&x, ':')) goto bad;
        if (which == 0) {
            char *e;
            py_ws(&x);
            double v = strtod(x.p, &e);
            if (e == x.p || e > x.end) goto bad;
            x.p = e;
            j->start[s] = v, j->has_start[s] = 1;
        } else {
            if (py_expect(&x, '{')) goto bad;
            for (;;) {
                py_ws(&x);
                if (x.p < x.end && *x.p == '}') { x.p++; break; }
                int64_t c = py_char(&x);
                if (c < 0 || c > 0x10FFFF || py_expect(&x, ':')) goto bad;
                py_ws(&x);
                char *e;
                double v = strtod(x.p, &e);
                if (e == x.p || e > x.end) goto bad;
                x.p = e;
                if (which == 1) {
                    int t = state_of(c);
                    if (t < 0) goto bad;
                    j->trans[s][t] = v, j->has_trans[s][t] = 1;
                } else {
                    if (n_rows[s] == cap_rows[s]) {
                        size_t cap = cap_rows[s] ? 2 * cap_rows[s] : 1024;
                        emit_row *r = realloc(rows[s], cap * sizeof *r);
                        if (!r) { seterr(err, err_len, "%s: out of memory", path); goto done; }
                        rows[s] = r, cap_rows[s] = cap;
                    }
                    rows[s][n_rows[s]++] = (emit_row){(uint32_t)c, v, order++};
                }
                py_ws(&x);
                if (x.p < x.end && *x.p == ',') x.p++;
            }
        }
        py_ws(&x);
        if (x.p < x.end && *x.p == ',') x.p++;
    }
    for (int s = 0; which == 2 && s < N_ST; s++) { /* sorted by code point; a repeated key keeps its last value */
        emit_table *t = &j->emit[s];
        t->cp = malloc((n_rows[s] + 1) * sizeof *t->cp);
        t->lp = malloc((n_rows[s] + 1) * sizeof *t->lp);
        if (!t->cp || !t->lp) { seterr(err, err_len, "%s: out of memory", path); goto done; }
        if (n_rows[s]) qsort(rows[s], n_rows[s], sizeof *rows[s], cmp_emit_row);
        for (size_t i = 0; i < n_rows[s]; i++) {
            if (t->n && t->cp[t->n - 1] == rows[s][i].cp) t->n--;
            t->cp[t->n] = rows[s][i].cp, t->lp[t->n] = rows[s][i].lp, t->n++;
        }
    }
    for (int s = 0; which == 0 && s < N_ST; s++)
        if (!j->has_start[s]) { seterr(err, err_len, "%s: no start probability for state %c", path, ST_LETTER[s]); goto done; }
    rc = 0;
    goto done;
bad:
    seterr(err, err_len, "%s:%d: not the dictionary literal jieba's finalseg holds", path, x.line);
done:
    for (int s = 0; s < N_ST; s++) free(rows[s]);
    free(text);
    return rc;
}

static double emit_lp(const kvb_jieba *j, int s, uint32_t c) {
    const emit_table *t = &j->emit[s];
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->cp[mid] < c) lo = mid + 1; else hi = mid;
    }
    return lo < t->n && t->cp[lo] == c ? t->lp[lo] : MIN_FLOAT;
}

/* ---- loading ---- */

static const char *const FILES[] = {"dict.txt", "prob_start.py", "prob_trans.py", "prob_emit.py"};

int kvb_jieba_dir(char *buf, size_t cap) {
    const char *d = getenv("KVB_JIEBA_DIR"), *data = getenv("KVB_DATA"), *home = getenv("HOME");
    int n = d && *d ? snprintf(buf, cap, "%s", d)
          : data && *data ? snprintf(buf, cap, "%s/jieba", data)
          : snprintf(buf, cap, "%s/.cache/kvbench/datasets/jieba", home && *home ? home : ".");
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int kvb_jieba_present(const char *dir) {
    for (size_t i = 0; i < sizeof FILES / sizeof *FILES; i++) {
        char *p = kvb_path_join(dir, FILES[i]);
        int ok = p && access(p, R_OK) == 0;
        free(p);
        if (!ok) return 0;
    }
    return 1;
}

kvb_jieba *kvb_jieba_load(const char *dir, char *err, size_t err_len) {
    if (!kvb_jieba_present(dir)) {
        seterr(err, err_len, "jieba's dictionary is not in %s (dict.txt and finalseg's prob_*.py): run %s", dir,
               KVB_JIEBA_FETCH);
        return NULL;
    }
    kvb_jieba *j = calloc(1, sizeof *j);
    if (!j) { seterr(err, err_len, "out of memory"); return NULL; }
    int rc = 0;
    for (int i = 0; i < 4 && !rc; i++) {
        char *p = kvb_path_join(dir, FILES[i]);
        if (!p) { seterr(err, err_len, "out of memory"); rc = -1; break; }
        rc = i == 0 ? load_dict(j, p, err, err_len) : load_prob(j, p, i - 1, err, err_len);
        free(p);
    }
    if (rc) { kvb_jieba_free(j); return NULL; }
    return j;
}

void kvb_jieba_free(kvb_jieba *j) {
    if (!j) return;
    free(j->dict_text);
    free(j->tab);
    for (int s = 0; s < N_ST; s++) free(j->emit[s].cp), free(j->emit[s].lp);
    free(j);
}

static pthread_once_t shared_once = PTHREAD_ONCE_INIT;
static kvb_jieba *shared_j;
static char shared_err[600];

static void shared_load(void) {
    char dir[1024];
    if (kvb_jieba_dir(dir, sizeof dir)) { snprintf(shared_err, sizeof shared_err, "jieba: data directory path too long"); return; }
    shared_j = kvb_jieba_load(dir, shared_err, sizeof shared_err);
}

const kvb_jieba *kvb_jieba_shared(char *err, size_t err_len) {
    pthread_once(&shared_once, shared_load);
    if (!shared_j) seterr(err, err_len, "%s", shared_err);
    return shared_j;
}

int64_t kvb_jieba_words(const kvb_jieba *j) { return j->words; }
int64_t kvb_jieba_entries(const kvb_jieba *j) { return (int64_t)j->n; }
int64_t kvb_jieba_total(const kvb_jieba *j) { return j->total; }

/* ---- cutting ---- */

typedef struct {
    const char *text;
    const uint32_t *cp; /* code points of text; invalid bytes are 0xFFFD */
    const int64_t *boff; /* boff[i]: byte offset of code point i; boff[n] = strlen(text) */
    kvb_jieba_tok *v;
    int64_t n, cap;
    int oom;
} cutter;

static void put(cutter *c, int64_t a, int64_t b) { /* code points [a, b) */
    if (c->oom || b <= a) return;
    if (c->n == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 64;
        kvb_jieba_tok *v = realloc(c->v, (size_t)cap * sizeof *v);
        if (!v) { c->oom = 1; return; }
        c->v = v, c->cap = cap;
    }
    c->v[c->n++] = (kvb_jieba_tok){c->boff[a], c->boff[b] - c->boff[a]};
}

/* The entry of sentence[a:b] in the prefix dictionary, NULL when absent. */
static const dict_entry *lookup(const kvb_jieba *j, const cutter *c, int64_t a, int64_t b) {
    return dict_find(j, c->text + c->boff[a], (size_t)(c->boff[b] - c->boff[a]));
}

static int is_han(uint32_t c) { return c >= 0x4E00 && c <= 0x9FD5; }
static int is_ascii_alnum(uint32_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
/* re_han_default's class */
static int in_block(uint32_t c) {
    return is_han(c) || is_ascii_alnum(c) || c == '+' || c == '#' || c == '&' || c == '.' || c == '_' || c == '%' ||
           c == '-';
}

/* finalseg.__cut of the Chinese run [a, b): Viterbi over B/M/E/S, then the words its states mark. */
static void viterbi_cut(const kvb_jieba *j, cutter *c, int64_t a, int64_t b) {
    int64_t n = b - a;
    double (*V)[N_ST] = malloc((size_t)n * sizeof *V);
    unsigned char (*back)[N_ST] = malloc((size_t)n * sizeof *back);
    unsigned char *st = malloc((size_t)n);
    if (!V || !back || !st) { c->oom = 1; goto done; }
    for (int y = 0; y < N_ST; y++) V[0][y] = j->start[y] + emit_lp(j, y, c->cp[a]);
    for (int64_t t = 1; t < n; t++)
        for (int y = 0; y < N_ST; y++) {
            double em = emit_lp(j, y, c->cp[a + t]), best = 0;
            int from = -1;
            for (int k = 0; k < 2; k++) {
                int y0 = PREV[y][k];
                double p = V[t - 1][y0] + (j->has_trans[y0][y] ? j->trans[y0][y] : MIN_FLOAT) + em;
                if (from < 0 || p > best || (p == best && y0 > from)) best = p, from = y0;
            }
            V[t][y] = best, back[t][y] = (unsigned char)from;
        }
    int last = V[n - 1][ST_S] >= V[n - 1][ST_E] ? ST_S : ST_E; /* max over (prob, state) for E, S */
    st[n - 1] = (unsigned char)last;
    for (int64_t t = n - 1; t > 0; t--) st[t - 1] = back[t][st[t]];
    int64_t begin = 0, next = 0;
    for (int64_t i = 0; i < n; i++) {
        if (st[i] == ST_B) begin = i;
        else if (st[i] == ST_E) put(c, a + begin, a + i + 1), next = i + 1;
        else if (st[i] == ST_S) put(c, a + i, a + i + 1), next = i + 1;
    }
    if (next < n) put(c, a + next, b);
done:
    free(V), free(back), free(st);
}

/* finalseg.cut of [a, b): Chinese runs by Viterbi; elsewhere the matches of [a-zA-Z0-9]+(?:\.\d+)?%? and the text
 * between them, each one token. */
static void finalseg_cut(const kvb_jieba *j, cutter *c, int64_t a, int64_t b) {
    const uint32_t *cp = c->cp;
    for (int64_t i = a; i < b;) {
        int64_t s = i;
        if (is_han(cp[i])) {
            while (i < b && is_han(cp[i])) i++;
            viterbi_cut(j, c, s, i);
            continue;
        }
        while (i < b && !is_han(cp[i])) i++;
        for (int64_t k = s; k < i;) {
            int64_t m = k;
            while (m < i && !is_ascii_alnum(cp[m])) m++;
            put(c, k, m); /* the text before the match (nothing when empty) */
            if (m == i) break;
            int64_t e = m;
            while (e < i && is_ascii_alnum(cp[e])) e++;
            if (e + 1 < i && cp[e] == '.' && cp[e + 1] >= '0' && cp[e + 1] <= '9') {
                e += 2;
                while (e < i && cp[e] >= '0' && cp[e] <= '9') e++;
            }
            if (e < i && cp[e] == '%') e++;
            put(c, m, e);
            k = e;
        }
    }
}

/* The HMM cutter's handling of a run of single-character route pieces [a, b). */
static void flush_singles(const kvb_jieba *j, cutter *c, int64_t a, int64_t b) {
    if (b - a <= 0) return;
    if (b - a == 1) { put(c, a, b); return; }
    const dict_entry *e = lookup(j, c, a, b);
    if (!e || !e->freq) finalseg_cut(j, c, a, b);
    else for (int64_t i = a; i < b; i++) put(c, i, i + 1);
}

/* One block [a, b) of re_han_default: get_DAG, calc, then __cut_DAG (hmm) or __cut_DAG_NO_HMM. */
static void block_cut(const kvb_jieba *j, cutter *c, int64_t a, int64_t b, int hmm) {
    int64_t n = b - a;
    double *rp = malloc(((size_t)n + 1) * sizeof *rp);
    int64_t *rx = malloc(((size_t)n + 1) * sizeof *rx);
    if (!rp || !rx) { c->oom = 1; goto done; }
    rp[n] = 0, rx[n] = 0;
    /* the DAG is walked as calc needs it: the words starting at k, in increasing end order */
    for (int64_t k = n - 1; k >= 0; k--) {
        double best = 0;
        int64_t bx = -1;
        for (int64_t i = k; i < n; i++) {
            const dict_entry *e = lookup(j, c, a + k, a + i + 1);
            if (!e) break;
            if (!e->freq) continue;
            double p = log((double)e->freq) - j->log_total + rp[i + 1];
            if (bx < 0 || p >= best) best = p, bx = i; /* a tie goes to the later end */
        }
        if (bx < 0) { /* no word: the single character, count 1 */
            const dict_entry *e = lookup(j, c, a + k, a + k + 1);
            double f = e && e->freq ? (double)e->freq : 1.0;
            best = log(f) - j->log_total + rp[k + 1], bx = k;
        }
        rp[k] = best, rx[k] = bx;
    }
    int64_t buf = -1; /* start of the pending run, -1 when none */
    for (int64_t x = 0; x < n;) {
        int64_t y = rx[x] + 1;
        int single = y - x == 1;
        if (hmm ? single : single && is_ascii_alnum(c->cp[a + x])) {
            if (buf < 0) buf = x;
        } else {
            if (buf >= 0) {
                if (hmm) flush_singles(j, c, a + buf, a + x);
                else put(c, a + buf, a + x);
                buf = -1;
            }
            put(c, a + x, a + y);
        }
        x = y;
    }
    if (buf >= 0) {
        if (hmm) flush_singles(j, c, a + buf, b);
        else put(c, a + buf, b);
    }
done:
    free(rp), free(rx);
}

int kvb_jieba_cut(const kvb_jieba *j, const char *text, int hmm, kvb_jieba_tok **toks, int64_t *n_toks) {
    size_t len = strlen(text);
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    int64_t *boff = malloc((len + 1) * sizeof *boff);
    cutter c = {text, cp, boff, NULL, 0, 0, 0};
    *toks = NULL, *n_toks = 0;
    if (!cp || !boff) { free(cp), free(boff); return -1; }
    int64_t n = 0;
    for (size_t i = 0; i < len;) {
        const unsigned char *u = (const unsigned char *)text + i;
        int k = utf8_len(u, len - i);
        uint32_t v;
        if (!k) v = 0xFFFD, k = 1;
        else {
            v = k == 1 ? u[0] : u[0] & (0x3F >> (k - 1));
            for (int q = 1; q < k; q++) v = (v << 6) | (u[q] & 0x3F);
        }
        boff[n] = (int64_t)i, cp[n++] = v; /* an invalid byte: U+FFFD, never part of a block */
        i += (size_t)k;
    }
    boff[n] = (int64_t)len;
    for (int64_t i = 0; i < n && !c.oom;) {
        int64_t s = i;
        if (in_block(cp[i])) {
            while (i < n && in_block(cp[i])) i++;
            block_cut(j, &c, s, i, hmm);
        } else if (cp[i] == '\r' && i + 1 < n && cp[i + 1] == '\n') { /* re_skip_default: (\r\n|\s) */
            put(&c, i, i + 2), i += 2;
        } else {
            put(&c, i, i + 1), i++; /* a space, or any other character on its own */
        }
    }
    free(cp), free(boff);
    if (c.oom) { free(c.v); return -1; }
    *toks = c.v, *n_toks = c.n;
    return 0;
}
