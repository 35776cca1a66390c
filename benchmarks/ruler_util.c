/* ruler_util.c — what RULER's generators (ruler.c, ruler_qa.c) share: template formatting, random sampling
 * without replacement, the word lists and essays, fitting a haystack to a token length, and turning a built
 * input into a kvbench sample. Recipes and choices: ruler.c's header. */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"
#include "benchmarks/ruler_impl.h"

/* ---- text helpers ---- */

void ruler_fmt(kvb_sb *b, const char *tmpl, const char *const *names, const char *const *values, int n) {
    for (const char *p = tmpl; *p;) {
        int hit = -1;
        if (*p == '{')
            for (int i = 0; i < n && hit < 0; i++) {
                size_t l = strlen(names[i]);
                if (!strncmp(p + 1, names[i], l) && p[1 + l] == '}') hit = i;
            }
        if (hit >= 0) {
            kvb_sb_adds(b, values[hit]);
            p += strlen(names[hit]) + 2;
        } else kvb_sb_add(b, p++, 1);
    }
}

/* Splits template t at "{context}" and formats both halves into pre / post. */
void ruler_fmt_split(const char *t, const char *const *names, const char *const *values, int n, char **pre, char **post) {
    const char *c = strstr(t, "{context}");
    size_t l = c ? (size_t)(c - t) : strlen(t);
    char *head = malloc(l + 1);
    kvb_sb a = {0}, b = {0};
    if (head) {
        memcpy(head, t, l);
        head[l] = 0;
        ruler_fmt(&a, head, names, values, n);
        if (c) ruler_fmt(&b, c + 9, names, values, n);
    }
    free(head);
    *pre = head ? kvb_sb_take(&a) : NULL;
    *post = head ? kvb_sb_take(&b) : NULL;
    if (!head) kvb_sb_free(&a), kvb_sb_free(&b);
}

/* random.sample(range(n), k) as a set: k distinct indices in [0, n) (partial Fisher-Yates), unsorted. */
int ruler_sample_indices(uint64_t *rng, int n, int k, int *out) {
    if (k > n || k < 0) return -1;
    int *all = malloc((size_t)(n > 0 ? n : 1) * sizeof *all);
    if (!all) return -1;
    for (int i = 0; i < n; i++) all[i] = i;
    for (int i = 0; i < k; i++) {
        int j = i + (int)kvb_rng_below(rng, (uint64_t)(n - i));
        int t = all[i];
        all[i] = all[j];
        all[j] = t;
        out[i] = all[i];
    }
    free(all);
    return 0;
}


/* ---- resources ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted, deduplicated list in place; returns the new count. */
static int dedup_sorted(char **v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && !strcmp(v[m - 1], v[i])) { free(v[i]); continue; }
        v[m++] = v[i];
    }
    return m;
}

/* One word per line, trailing whitespace stripped (wonderwords' _get_words_from_text_file). */
static int read_words(const char *dir, const char *file, ruler_words *w, char *err, size_t err_len) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    size_t len;
    char *buf = kvb_read_file(path, &len, err, err_len);
    if (!buf) return -1;
    int rc = 0;
    for (char *save, *line = strtok_r(buf, "\n", &save); line && !rc; line = strtok_r(NULL, "\n", &save)) {
        size_t l = strlen(line);
        while (l && isspace((unsigned char)line[l - 1])) line[--l] = 0;
        if (!l) continue;
        if (w->n == w->cap) {
            int cap = w->cap ? 2 * w->cap : 1024;
            char **nv = realloc(w->v, (size_t)cap * sizeof *nv);
            if (!nv) { rc = -1; break; }
            w->v = nv;
            w->cap = cap;
        }
        if (!(w->v[w->n] = kvb_strdup(line))) rc = -1;
        else w->n++;
    }
    free(buf);
    if (rc) kvb_seterr(err, err_len, "%s: out of memory", path);
    return rc;
}

void ruler_words_free(ruler_words *w) {
    for (int i = 0; i < w->n; i++) free(w->v[i]);
    free(w->v);
    memset(w, 0, sizeof *w);
}

int ruler_load_words(ruler_gen *g, char *err, size_t err_len) {
    const char *d = g->o->words_dir;
    if (!d) {
        kvb_seterr(err, err_len, "ruler %s: needs the wonderwords word lists (\"words_dir\"; scripts/fetch-datasets.sh ruler)", g->o->task);
        return -1;
    }
    ruler_words verbs = {0};
    if (read_words(d, "nounlist.txt", &g->nouns, err, err_len) || read_words(d, "adjectivelist.txt", &g->adjs, err, err_len) ||
        read_words(d, "verblist.txt", &verbs, err, err_len)) {
        ruler_words_free(&verbs);
        return -1;
    }
    if (!g->nouns.n || !g->adjs.n || !verbs.n) {
        ruler_words_free(&verbs);
        kvb_seterr(err, err_len, "%s: a word list is empty", d);
        return -1;
    }
    /* cwe: sorted(set(nouns + adjs + verbs)) */
    ruler_words all = {0};
    int rc = 0;
    const ruler_words *src[3] = {&g->nouns, &g->adjs, &verbs};
    for (int s = 0; s < 3 && !rc; s++)
        for (int i = 0; i < src[s]->n && !rc; i++) {
            if (all.n == all.cap) {
                int cap = all.cap ? 2 * all.cap : 4096;
                char **nv = realloc(all.v, (size_t)cap * sizeof *nv);
                if (!nv) { rc = -1; break; }
                all.v = nv;
                all.cap = cap;
            }
            if (!(all.v[all.n] = kvb_strdup(src[s]->v[i]))) rc = -1;
            else all.n++;
        }
    ruler_words_free(&verbs);
    if (rc) {
        ruler_words_free(&all);
        kvb_seterr(err, err_len, "ruler: out of memory");
        return -1;
    }
    all.n = dedup_sorted(all.v, all.n);
    g->nouns.n = dedup_sorted(g->nouns.v, g->nouns.n);
    g->adjs.n = dedup_sorted(g->adjs.v, g->adjs.n);
    g->all = all;
    return 0;
}

/* The essays as RULER's haystack: whitespace runs collapsed, split into words. */
int ruler_load_essays(ruler_gen *g, char *err, size_t err_len) {
    const char *dir = g->o->essay_dir;
    if (!dir) {
        kvb_seterr(err, err_len, "ruler %s: needs the Paul Graham essays (\"haystack\": a directory of *.txt)", g->o->task);
        return -1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        kvb_seterr(err, err_len, "%s: cannot open the essay directory", dir);
        return -1;
    }
    ruler_words names = {0};
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 4, ".txt")) continue;
        if (names.n == names.cap) {
            int cap = names.cap ? 2 * names.cap : 64;
            char **nv = realloc(names.v, (size_t)cap * sizeof *nv);
            if (!nv) { rc = -1; break; }
            names.v = nv;
            names.cap = cap;
        }
        if (!(names.v[names.n] = kvb_strdup(e->d_name))) rc = -1;
        else names.n++;
    }
    closedir(d);
    if (!rc && names.n) qsort(names.v, (size_t)names.n, sizeof *names.v, cmp_str); /* names.v is NULL when none */
    kvb_sb text = {0};
    for (int i = 0; i < names.n && !rc; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, names.v[i]);
        size_t len;
        char *buf = kvb_read_file(path, &len, err, err_len);
        if (!buf) { rc = -2; break; }
        kvb_sb_add(&text, buf, len);
        free(buf);
    }
    ruler_words_free(&names);
    if (rc || text.oom) {
        if (rc != -2) kvb_seterr(err, err_len, "%s: out of memory", dir);
        kvb_sb_free(&text);
        return -1;
    }
    /* collapse whitespace and cut into words in place */
    char *buf = kvb_sb_take(&text);
    size_t w = 0;
    int nw = 0;
    for (size_t r = 0; buf && buf[r]; r++) {
        if (isspace((unsigned char)buf[r])) {
            if (w && buf[w - 1] != 0) buf[w++] = 0, nw++;
        } else buf[w++] = buf[r];
    }
    if (buf && w && buf[w - 1] != 0) buf[w++] = 0, nw++;
    if (!buf || nw == 0) {
        free(buf);
        kvb_seterr(err, err_len, "%s: no essay text in any *.txt file", dir);
        return -1;
    }
    g->essay_buf = buf;
    g->essay = malloc((size_t)nw * sizeof *g->essay);
    if (!g->essay) {
        kvb_seterr(err, err_len, "%s: out of memory", dir);
        return -1;
    }
    char *p = buf;
    for (int i = 0; i < nw; i++) {
        g->essay[i] = p;
        p += strlen(p) + 1;
    }
    g->n_essay = nw;
    return 0;
}

/* ---- fitting the haystack to the length ---- */

static int64_t count(const ruler_gen *g, const char *text) {
    return g->o->count_tokens ? g->o->count_tokens(g->o->tok_ctx, text) : niah_count_words(NULL, text);
}

void ruler_built_free(ruler_built *b) {
    free(b->pre);
    free(b->context);
    free(b->post);
    free(b->prefix);
    for (int i = 0; i < b->n_answers; i++) free(b->answers[i]);
    free(b->answers);
    for (int i = 0; i < b->n_queries; i++) free(b->queries[i]);
    free(b->queries);
    memset(b, 0, sizeof *b);
}

int ruler_built_add_answer(ruler_built *b, const char *a) {
    char **nv = realloc(b->answers, (size_t)(b->n_answers + 1) * sizeof *nv);
    if (!nv) return -1;
    b->answers = nv;
    return (b->answers[b->n_answers] = kvb_strdup(a)) ? (b->n_answers++, 0) : -1;
}

/* Tokens of input + answer prefix + tokens_to_generate for haystack size n; -1 on failure. */
static int64_t total_tokens(ruler_gen *g, ruler_build_fn build, int n, uint64_t rng, int64_t gen_tokens) {
    ruler_built b = {0};
    if (build(g, n, rng, &b)) { ruler_built_free(&b); return -1; }
    kvb_sb t = {0};
    kvb_sb_adds(&t, b.pre);
    kvb_sb_adds(&t, b.context);
    kvb_sb_adds(&t, b.post);
    kvb_sb_adds(&t, b.prefix);
    char *s = kvb_sb_take(&t);
    int64_t c = s ? count(g, s) : -1;
    free(s);
    ruler_built_free(&b);
    return c < 0 ? -1 : c + gen_tokens;
}

int ruler_fit(ruler_gen *g, ruler_build_fn build, int inc, uint64_t rng, int64_t gen_tokens, int hint, int max_n,
              int *out, char *err, size_t err_len) {
    int64_t L = g->o->length;
    int lo = inc, hi;
    int64_t t = total_tokens(g, build, inc, rng, gen_tokens);
    if (t < 0) return kvb_seterr(err, err_len, "ruler %s: cannot build a sample (token counter or memory)", g->o->task), -1;
    if (t > L) {
        kvb_seterr(err, err_len, "ruler %s: length %lld is too short: the smallest haystack already takes %lld tokens",
                   g->o->task, (long long)L, (long long)t);
        return -1;
    }
    if (hint > inc) { /* the previous sample's size: search a window around it first */
        int a = hint - hint / 8 > inc ? hint - hint / 8 : inc, z = hint + hint / 8 + inc;
        int64_t ta = total_tokens(g, build, a, rng, gen_tokens), tz = total_tokens(g, build, z, rng, gen_tokens);
        if (ta >= 0 && ta <= L && tz > L) lo = a, hi = z - 1;
        else hi = (int)((double)L / ((double)t / inc) * 3) + 2 * inc;
    } else
        hi = (int)((double)L / ((double)t / inc) * 3) + 2 * inc;
    if (max_n > 0 && hi > max_n) hi = max_n;
    /* the estimate from the smallest size can fall short (fwe: the template dominates it): grow until too long */
    for (int64_t th; (max_n <= 0 || hi < max_n) && hi < (1 << 28) && (th = total_tokens(g, build, hi, rng, gen_tokens)) >= 0 && th <= L;) {
        lo = hi;
        hi = max_n > 0 && 2 * hi > max_n ? max_n : 2 * hi;
    }
    int best = lo;
    while (lo <= hi) { /* largest n that fits, as RULER's binary search */
        int mid = lo + (hi - lo) / 2;
        int64_t tm = total_tokens(g, build, mid, rng, gen_tokens);
        if (tm < 0) return kvb_seterr(err, err_len, "ruler %s: cannot build a sample", g->o->task), -1;
        if (tm <= L) best = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    *out = best;
    return 0;
}

/* ---- samples ---- */

int ruler_emit(ruler_gen *g, int index, int query, const ruler_built *b, int gen_tokens, kvb_samples *out) {
    kvb_sample s;
    kvb_sample_init(&s);
    char id[96], qtype[32];
    snprintf(id, sizeof id, "%s_%d_%d", g->o->task, g->o->length, index);
    if (query >= 0) {
        s.group = kvb_strdup(id);
        size_t l = strlen(id);
        snprintf(id + l, sizeof id - l, "_q%d", query);
    }
    snprintf(qtype, sizeof qtype, "len=%d", g->o->length);
    kvb_sb pb = {0};
    kvb_sb_adds(&pb, b->pre);
    kvb_sb_adds(&pb, b->context);
    kvb_sb_adds(&pb, b->post);
    s.prompt = kvb_sb_take(&pb);
    s.context = kvb_strdup(b->context);
    s.question = kvb_strdup(b->post);
    s.prefill = kvb_strdup(b->prefix);
    s.id = kvb_strdup(id);
    s.task = kvb_strdup(g->o->task);
    s.qtype = kvb_strdup(qtype);
    s.max_new_tokens = gen_tokens;
    s.use_chat = 1;
    s.ctx_tokens = g->o->length;
    s.depth = b->depth;
    kvb_sb fb = {0};
    kvb_sb_adds(&fb, s.prompt ? s.prompt : "");
    kvb_sb_adds(&fb, b->prefix);
    char *full = kvb_sb_take(&fb);
    int64_t t = full ? count(g, full) : -1;
    free(full);
    s.length = t < 0 ? -1 : t + gen_tokens;
    int rc = !s.prompt || !s.context || !s.question || !s.prefill || !s.id || !s.task || !s.qtype || t < 0 ||
             (query >= 0 && !s.group);
    for (int i = 0; i < b->n_answers && !rc; i++) rc = kvb_sample_add_answer(&s, b->answers[i]);
    if (rc) {
        kvb_sample_free(&s);
        return -1;
    }
    return kvb_samples_push(out, &s);
}

uint64_t ruler_stream(const ruler_opts *o, int index) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a of the task: each task its own draws */
    for (const char *p = o->task; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return o->seed * 0x9e3779b97f4a7c15ULL + (uint64_t)index * 0xd1b54a32d192ed03ULL + h;
}

