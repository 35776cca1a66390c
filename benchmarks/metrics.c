/* metrics.c — LongBench's official English metrics (metrics.h), written from the Python originals'
 * behaviour: same tokenisation, same set/multiset semantics, same float expressions. */
#include "benchmarks/metrics.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- code points ---- */

typedef struct { uint32_t *c; int n; } cps;

/* UTF-8 -> code points (an invalid byte becomes U+FFFD). n = -1 when out of memory. */
static cps decode(const char *s) {
    size_t len = strlen(s);
    cps r = {malloc((len + 1) * sizeof(uint32_t)), 0};
    if (!r.c) { r.n = -1; return r; }
    const unsigned char *p = (const unsigned char *)s, *e = p + len;
    while (p < e) {
        uint32_t c = *p;
        int k = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (k < 0) { r.c[r.n++] = 0xFFFD; p++; continue; }
        if (k) c &= 0x3F >> k;
        int ok = 1;
        for (int i = 1; i <= k; i++) {
            if (p + i >= e || (p[i] & 0xC0) != 0x80) { ok = 0; break; }
            c = (c << 6) | (p[i] & 0x3F);
        }
        if (!ok) { r.c[r.n++] = 0xFFFD; p++; continue; }
        r.c[r.n++] = c;
        p += k + 1;
    }
    return r;
}

/* Python's str.isspace() */
static int is_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* str.lower() for the scripts benchmarks use (ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic). */
static uint32_t to_lower(uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x130 || c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17F) return c;
        if (c == 0x178) return 0xFF;
        int odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        return (c & 1) == (uint32_t)odd_upper ? c + 1 : c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

/* Python 3's \w: ASCII alphanumerics and '_', and non-ASCII letters and digits (approximated by excluding the
 * punctuation, symbol, combining-mark and emoji blocks). */
static int is_word(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    if (c <= 0xBF) return c == 0xAA || c == 0xB2 || c == 0xB3 || c == 0xB5 || c == 0xB9 || c == 0xBA || (c >= 0xBC && c <= 0xBE);
    if (c == 0xD7 || c == 0xF7) return 0;
    if (c >= 0x300 && c <= 0x36F) return 0;
    if ((c >= 0x2000 && c <= 0x206F) || (c >= 0x20A0 && c <= 0x20CF) || (c >= 0x2190 && c <= 0x23FF) ||
        (c >= 0x2500 && c <= 0x27BF) || (c >= 0x2E00 && c <= 0x2E7F) || (c >= 0x3000 && c <= 0x3004) ||
        (c >= 0x3008 && c <= 0x303F) || (c >= 0xFE30 && c <= 0xFE6F) || (c >= 0xFF00 && c <= 0xFF0F) ||
        (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) || (c >= 0xFF5B && c <= 0xFF65) ||
        (c >= 0x1F000 && c <= 0x1FAFF))
        return 0;
    return 1;
}

/* A token: a slice of a code point array. */
typedef struct { const uint32_t *c; int n; } tok;

static int tok_eq(tok a, tok b) { return a.n == b.n && !memcmp(a.c, b.c, (size_t)a.n * sizeof(uint32_t)); }

/* str.split(): whitespace-separated tokens of c[0..n). Returns the count; *out malloc'd (NULL when 0). */
static int ws_split(const uint32_t *c, int n, tok **out) {
    tok *v = malloc(((size_t)n / 2 + 1) * sizeof *v);
    int k = 0;
    for (int i = 0; v && i < n;) {
        while (i < n && is_space(c[i])) i++;
        int s = i;
        while (i < n && !is_space(c[i])) i++;
        if (i > s) v[k++] = (tok){c + s, i - s};
    }
    *out = v;
    return v ? k : -1;
}

/* ---- qa_f1 ---- */

static int is_ascii_punct(uint32_t c) { return c < 0x80 && strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", (int)c) && c; }

/* normalize_answer's lower + remove_punc + remove_articles, in place; returns the new length. */
static int squad_normalize(uint32_t *c, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        uint32_t x = to_lower(c[i]);
        if (!is_ascii_punct(x)) c[k++] = x;
    }
    /* \b(a|an|the)\b: a maximal run of word characters equal to an article becomes one space */
    static const char *const art[] = {"a", "an", "the"};
    int o = 0;
    for (int i = 0; i < k;) {
        if (!is_word(c[i])) { c[o++] = c[i++]; continue; }
        int s = i;
        while (i < k && is_word(c[i])) i++;
        int is_art = 0;
        for (int a = 0; a < 3 && !is_art; a++) {
            int l = (int)strlen(art[a]);
            if (i - s != l) continue;
            is_art = 1;
            for (int j = 0; j < l; j++) is_art &= c[s + j] == (uint32_t)art[a][j];
        }
        if (is_art) c[o++] = ' ';
        else for (int j = s; j < i; j++) c[o++] = c[j];
    }
    return o;
}

double kvb_metric_qa_f1(const char *pred, const char *gold) {
    cps p = decode(pred), g = decode(gold);
    tok *pt = NULL, *gt = NULL;
    double f1 = 0;
    if (p.n < 0 || g.n < 0) goto done;
    int np = ws_split(p.c, squad_normalize(p.c, p.n), &pt), ng = ws_split(g.c, squad_normalize(g.c, g.n), &gt);
    if (np <= 0 || ng <= 0) goto done;
    /* Counter(pred) & Counter(gold): each gold token matches at most one prediction token */
    char *used = calloc((size_t)ng, 1);
    int same = 0;
    for (int i = 0; used && i < np; i++)
        for (int j = 0; j < ng; j++)
            if (!used[j] && tok_eq(pt[i], gt[j])) { used[j] = 1, same++; break; }
    free(used);
    if (same) {
        double precision = 1.0 * same / np, recall = 1.0 * same / ng;
        f1 = (2 * precision * recall) / (precision + recall);
    }
done:
    free(pt), free(gt), free(p.c), free(g.c);
    return f1;
}

/* ---- Rouge-L (the `rouge` package, summary level, exclusive) ---- */

/* Python frames below the first _recon call when eval.py scores (module, scorer, rouge_score, get_scores,
 * _get_avg_scores, lambda, rouge_l_summary_level, _union_lcs, _recon_lcs) and the default recursion limit:
 * a reconstruction path of more calls raises RecursionError, which rouge_score turns into 0. */
enum { PY_BASE_FRAMES = 9, PY_RECURSION_LIMIT = 1000 };

typedef struct { tok *w; int n; } sentence;
typedef struct { sentence *s; int n; tok *all; int n_all; } doc;

/* text.split(".") keeping non-empty parts, each " ".join(part.split()), then split(" ") into words: a part of
 * only whitespace is one empty word. */
static int split_doc(const cps *t, doc *d) {
    memset(d, 0, sizeof *d);
    d->s = malloc(((size_t)t->n + 1) * sizeof *d->s);
    d->all = malloc(((size_t)t->n + 1) * sizeof *d->all);
    if (!d->s || !d->all) return -1;
    for (int i = 0; i <= t->n;) {
        int s = i;
        while (i < t->n && t->c[i] != '.') i++;
        if (i > s) {
            sentence *se = &d->s[d->n++];
            se->n = ws_split(t->c + s, i - s, &se->w);
            if (se->n < 0) return -1;
            if (se->n == 0) {
                free(se->w);
                if (!(se->w = malloc(sizeof *se->w))) return -1;
                se->w[0] = (tok){t->c + s, 0};
                se->n = 1;
            }
            for (int k = 0; k < se->n; k++) d->all[d->n_all++] = se->w[k];
        }
        i++;
    }
    return 0;
}

static void free_doc(doc *d) {
    for (int i = 0; i < d->n; i++) free(d->s[i].w);
    free(d->s);
    free(d->all);
}

/* Add t to the distinct set v (capacity enough); returns 1 if it was new. */
static int set_add(tok *v, int *n, tok t) {
    for (int i = 0; i < *n; i++)
        if (tok_eq(v[i], t)) return 0;
    v[(*n)++] = t;
    return 1;
}

static int distinct(const tok *w, int n, tok *scratch) {
    int k = 0;
    for (int i = 0; i < n; i++) set_add(scratch, &k, w[i]);
    return k;
}

/* _recon_lcs(x, y): the words of the reconstructed LCS (x's) into the union set. -1 = Python would raise. */
static int recon_into(const sentence *x, const sentence *y, tok *uni, int *n_uni) {
    int nx = x->n, ny = y->n;
    if ((nx < ny ? nx : ny) + 1 + PY_BASE_FRAMES > PY_RECURSION_LIMIT) return -1;
    size_t W = (size_t)ny + 1;
    int32_t *t = calloc(((size_t)nx + 1) * W, sizeof *t);
    if (!t) return -1;
    for (int i = 1; i <= nx; i++)
        for (int j = 1; j <= ny; j++)
            t[i * W + j] = tok_eq(x->w[i - 1], y->w[j - 1]) ? t[(i - 1) * W + j - 1] + 1
                         : t[(i - 1) * W + j] > t[i * W + j - 1] ? t[(i - 1) * W + j] : t[i * W + j - 1];
    int i = nx, j = ny, steps = 0;
    while (i > 0 && j > 0) {
        steps++;
        if (tok_eq(x->w[i - 1], y->w[j - 1])) set_add(uni, n_uni, x->w[i - 1]), i--, j--;
        else if (t[(i - 1) * W + j] > t[i * W + j - 1]) i--;
        else j--;
    }
    free(t);
    return steps + 1 + PY_BASE_FRAMES > PY_RECURSION_LIMIT ? -1 : 0;
}

double kvb_metric_rouge_l(const char *pred, const char *gold) {
    cps h = decode(pred), r = decode(gold);
    doc hd = {0}, rd = {0};
    tok *scratch = NULL;
    double f = 0;
    if (h.n < 0 || r.n < 0 || split_doc(&h, &hd) || split_doc(&r, &rd)) goto done;
    if (hd.n == 0 || rd.n == 0) goto done; /* "Hypothesis is empty." / "Reference is empty." */
    scratch = malloc(((size_t)hd.n_all + rd.n_all + 1) * sizeof *scratch);
    if (!scratch) goto done;
    int m = distinct(rd.all, rd.n_all, scratch), n = distinct(hd.all, hd.n_all, scratch);
    int llcs = 0;
    for (int i = 0; i < rd.n; i++)
        for (int k = 0; k < hd.n; k++)
            if (recon_into(&rd.s[i], &hd.s[k], scratch, &llcs)) goto done;
    double r_lcs = (double)llcs / m, p_lcs = (double)llcs / n;
    f = 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8));
done:
    free(scratch);
    free_doc(&hd), free_doc(&rd);
    free(h.c), free(r.c);
    return f;
}

/* ---- classification, retrieval, count ---- */

double kvb_metric_classification(const char *pred, const char *gold, const char *const *all_classes, int n_classes) {
    const char **m = malloc(((size_t)n_classes + 1) * sizeof *m);
    if (!m) return 0;
    int n = 0;
    for (int i = 0; i < n_classes; i++)
        if (strstr(pred, all_classes[i])) m[n++] = all_classes[i];
    /* `for match_term in em_match_list: ... em_match_list.remove(match_term)`: list.remove drops the first equal
     * element, and the loop's index moves on regardless, skipping the element that slid into place */
    for (int i = 0; i < n; i++) {
        const char *term = m[i];
        if (strstr(gold, term) && strcmp(term, gold)) {
            int k = 0;
            while (strcmp(m[k], term)) k++;
            memmove(m + k, m + k + 1, (size_t)(n - k - 1) * sizeof *m);
            n--;
        }
    }
    double score = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(m[i], gold)) { score = 1.0 / n; break; }
    free(m);
    return score;
}

/* Share of the digit runs (\d+) in pred that equal want. */
static double number_share(const char *pred, const char *want, size_t want_len) {
    int total = 0, right = 0;
    for (const char *p = pred; *p;) {
        if (*p < '0' || *p > '9') { p++; continue; }
        const char *s = p;
        while (*p >= '0' && *p <= '9') p++;
        total++;
        right += (size_t)(p - s) == want_len && !memcmp(s, want, want_len);
    }
    return total ? (double)right / total : 0.0;
}

double kvb_metric_retrieval(const char *pred, const char *gold) {
    for (const char *p = strstr(gold, "Paragraph "); p; p = strstr(p + 1, "Paragraph ")) {
        const char *d = p + 10, *e = d;
        while (*e >= '0' && *e <= '9') e++;
        if (e > d) return number_share(pred, d, (size_t)(e - d));
    }
    return 0.0; /* the official code raises IndexError here */
}

double kvb_metric_count(const char *pred, const char *gold) { return number_share(pred, gold, strlen(gold)); }

/* ---- code_sim: fuzz.ratio with difflib.SequenceMatcher ---- */

/* b2j: indices of b sorted by (code point, index), popular elements (autojunk) removed. */
typedef struct { uint32_t c; int j; } cj;

static int cmp_cj(const void *x, const void *y) {
    const cj *a = x, *b = y;
    return a->c != b->c ? (a->c < b->c ? -1 : 1) : a->j - b->j;
}

static int build_b2j(const uint32_t *b, int lb, int **idx, int *n_idx) {
    cj *v = malloc(((size_t)lb + 1) * sizeof *v);
    int *out = malloc(((size_t)lb + 1) * sizeof *out);
    if (!v || !out) { free(v), free(out); return -1; }
    for (int j = 0; j < lb; j++) v[j] = (cj){b[j], j};
    qsort(v, (size_t)lb, sizeof *v, cmp_cj);
    int ntest = lb / 100 + 1, k = 0;
    for (int s = 0; s < lb;) {
        int e = s;
        while (e < lb && v[e].c == v[s].c) e++;
        if (!(lb >= 200 && e - s > ntest)) /* autojunk: an element in more than 1% of a long b is dropped */
            for (int i = s; i < e; i++) out[k++] = v[i].j;
        s = e;
    }
    free(v);
    *idx = out;
    *n_idx = k;
    return 0;
}

/* The run of b2j for code point c (indices ascending), as [*lo, *hi) into idx. */
static void b2j_range(const uint32_t *b, const int *idx, int n, uint32_t c, int *lo, int *hi) {
    int l = 0, h = n;
    while (l < h) { int mid = (l + h) / 2; if (b[idx[mid]] < c) l = mid + 1; else h = mid; }
    *lo = l;
    h = n;
    int l2 = l;
    while (l2 < h) { int mid = (l2 + h) / 2; if (b[idx[mid]] <= c) l2 = mid + 1; else h = mid; }
    *hi = l2;
}

typedef struct { int i, j, k; } match;

static match longest(const uint32_t *a, const uint32_t *b, const int *idx, int n_idx, int alo, int ahi, int blo, int bhi,
                     int *prev, int *pstamp, int *cur, int *cstamp) {
    int besti = alo, bestj = blo, bestsize = 0;
    for (int i = alo; i < ahi; i++) {
        int lo, hi;
        b2j_range(b, idx, n_idx, a[i], &lo, &hi);
        for (int q = lo; q < hi; q++) {
            int j = idx[q];
            if (j < blo) continue;
            if (j >= bhi) break;
            int k = (j > 0 && pstamp[j - 1] == i - 1 ? prev[j - 1] : 0) + 1;
            cur[j] = k, cstamp[j] = i;
            if (k > bestsize) besti = i - k + 1, bestj = j - k + 1, bestsize = k;
        }
        int *t = prev; prev = cur; cur = t;
        t = pstamp; pstamp = cstamp; cstamp = t;
    }
    /* no junk function: extend over equal elements, popular ones included */
    while (besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1]) besti--, bestj--, bestsize++;
    while (besti + bestsize < ahi && bestj + bestsize < bhi && a[besti + bestsize] == b[bestj + bestsize]) bestsize++;
    return (match){besti, bestj, bestsize};
}

/* Total size of get_matching_blocks(). */
static long matching_chars(const uint32_t *a, int la, const uint32_t *b, int lb) {
    int *idx = NULL, n_idx = 0;
    int *buf = malloc(4 * ((size_t)lb + 1) * sizeof *buf);
    int *queue = malloc(4 * ((size_t)la + lb + 2) * sizeof *queue);
    long total = -1;
    if (!buf || !queue || build_b2j(b, lb, &idx, &n_idx)) goto done;
    int *prev = buf, *pstamp = buf + lb + 1, *cur = buf + 2 * (lb + 1), *cstamp = buf + 3 * (lb + 1);
    int nq = 0;
    total = 0;
    queue[nq++] = 0, queue[nq++] = la, queue[nq++] = 0, queue[nq++] = lb;
    while (nq) {
        int bhi = queue[--nq], blo = queue[--nq], ahi = queue[--nq], alo = queue[--nq];
        for (int j = 0; j <= lb; j++) pstamp[j] = cstamp[j] = -2; /* fresh j2len dictionaries */
        match x = longest(a, b, idx, n_idx, alo, ahi, blo, bhi, prev, pstamp, cur, cstamp);
        if (!x.k) continue;
        total += x.k;
        if (alo < x.i && blo < x.j) queue[nq++] = alo, queue[nq++] = x.i, queue[nq++] = blo, queue[nq++] = x.j;
        if (x.i + x.k < ahi && x.j + x.k < bhi)
            queue[nq++] = x.i + x.k, queue[nq++] = ahi, queue[nq++] = x.j + x.k, queue[nq++] = bhi;
    }
done:
    free(idx), free(buf), free(queue);
    return total;
}

int kvb_fuzz_ratio(const char *s1, const char *s2) {
    if (!strcmp(s1, s2)) return 100;
    if (!*s1 || !*s2) return 0;
    cps a = decode(s1), b = decode(s2);
    int r = 0;
    if (a.n > 0 && b.n > 0) {
        long M = matching_chars(a.c, a.n, b.c, b.n);
        if (M >= 0) r = (int)rint(100 * (2.0 * (double)M / (double)(a.n + b.n))); /* int(round(x)): half to even */
    }
    free(a.c), free(b.c);
    return r;
}

double kvb_metric_code_sim(const char *pred, const char *gold) {
    while (*pred == '\n') pred++;
    const char *line = "";
    char *copy = NULL;
    for (const char *p = pred;;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int code = 1;
        for (size_t i = 0; i < n && code; i++) code = p[i] != '`' && p[i] != '#' && !(p[i] == '/' && i + 1 < n && p[i + 1] == '/');
        if (code) {
            copy = strndup(p, n);
            line = copy ? copy : "";
            break;
        }
        if (!e) break;
        p = e + 1;
    }
    double s = kvb_fuzz_ratio(line, gold) / 100.0;
    free(copy);
    return s;
}

/* ---- eval.py ---- */

const char *kvb_longbench_metric(const char *task) {
    static const char *const map[][2] = {
        {"narrativeqa", "qa_f1"}, {"qasper", "qa_f1"}, {"multifieldqa_en", "qa_f1"}, {"hotpotqa", "qa_f1"},
        {"2wikimqa", "qa_f1"}, {"musique", "qa_f1"}, {"triviaqa", "qa_f1"}, {"gov_report", "rouge"},
        {"qmsum", "rouge"}, {"multi_news", "rouge"}, {"samsum", "rouge"}, {"trec", "classification"},
        {"passage_retrieval_en", "retrieval"}, {"passage_count", "count"}, {"lcc", "code_sim"},
        {"repobench-p", "code_sim"}};
    size_t n = strlen(task);
    if (n > 2 && !strcmp(task + n - 2, "_e")) n -= 2; /* LongBench-E */
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (strlen(map[i][0]) == n && !strncmp(task, map[i][0], n)) return map[i][1];
    return NULL;
}

int kvb_longbench_score(const char *task, const char *pred, const char *const *answers, int n_answers,
                        const char *const *all_classes, int n_classes, double *score) {
    const char *metric = kvb_longbench_metric(task);
    if (!metric) return -1;
    size_t n = strlen(task);
    if (n > 2 && !strcmp(task + n - 2, "_e")) n -= 2;
    int first_line = (n == 4 && !strncmp(task, "trec", 4)) || (n == 8 && !strncmp(task, "triviaqa", 8)) ||
                     (n == 6 && !strncmp(task, "samsum", 6));
    char *cut = NULL;
    if (first_line) { /* pred.lstrip('\n').split('\n')[0] */
        while (*pred == '\n') pred++;
        cut = strndup(pred, strcspn(pred, "\n"));
        if (!cut) return -1;
        pred = cut;
    }
    double best = 0;
    for (int i = 0; i < n_answers; i++) {
        const char *g = answers[i];
        double s = !strcmp(metric, "qa_f1") ? kvb_metric_qa_f1(pred, g)
                 : !strcmp(metric, "rouge") ? kvb_metric_rouge_l(pred, g)
                 : !strcmp(metric, "classification") ? kvb_metric_classification(pred, g, all_classes, n_classes)
                 : !strcmp(metric, "retrieval") ? kvb_metric_retrieval(pred, g)
                 : !strcmp(metric, "count") ? kvb_metric_count(pred, g)
                 : kvb_metric_code_sim(pred, g);
        if (s > best) best = s;
    }
    free(cut);
    *score = best;
    return 0;
}
