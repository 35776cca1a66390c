/* ruler.c — RULER's synthetic tasks (ruler.h). Recipes followed (NVIDIA/RULER, read, not copied):
 *   scripts/synthetic.yaml, scripts/config_tasks.sh   the 13 default tasks and their arguments;
 *   scripts/data/synthetic/constants.py               templates, answer prefixes, tokens_to_generate;
 *   scripts/data/prepare.py                           template + answer prefix ("base" model template);
 *   scripts/data/synthetic/niah.py                    needles "One of the special magic {v} for {key} is:
 *       {value}.", haystacks noise / essay / needle, depths round(linspace(0,100,40)), 7-digit numbers,
 *       UUID4s, adjective-noun keys from wonderwords, the singular template when one value is asked;
 *   scripts/data/synthetic/variable_tracking.py       chains "VAR X = 12345", "VAR Y = VAR X ", noise
 *       haystack, one in-context example (3-letter names, fitted to 500 tokens) before the input;
 *   scripts/data/synthetic/common_words_extraction.py numbered word list, 10 words x30 + others x3 (x6 / x1
 *       below 4096 tokens), one few-shot example of 40 words;
 *   scripts/data/synthetic/freq_words_extraction.py  6-letter coded words with Zipf(alpha = 2) counts,
 *       vocabulary max_len/50, the top word replaced by '...', answers ranks 2-4;
 *   scripts/eval/evaluate.py, scripts/eval/synthetic/constants.py  postprocess_pred, string_match_all/part.
 * The haystack size (sentences, words, documents) is the largest for which tokens(input + answer prefix) +
 * tokens_to_generate <= length, found by binary search as RULER does.
 * Choices where the sources are silent or where kvbench differs on purpose:
 *   - the PRNG is kvbench's splitmix64 (sample.h), so samples are not RULER's own draws, only its recipe;
 *     each sample draws from its own stream (seed, index), and the haystack size is searched per sample
 *     (RULER searches once and shrinks a sample that overflows), so every sample is within a few tokens of
 *     the target; fwe's size is searched the same way (RULER's walk in steps of max_len/32 words can
 *     leave it several percent short);
 *   - essay haystack: the *.txt files of a directory in sorted name order, concatenated, whitespace runs
 *     collapsed (RULER's PaulGrahamEssays.json holds the same essays); NLTK's sent_tokenize is approximated
 *     by a split after '.', '!' or '?' (and closing quotes/brackets) followed by a space;
 *   - adjective-noun keys are drawn as a uniform adjective and a uniform noun from the deduplicated lists
 *     (RULER: uniform over the set of their products, the same distribution barring hyphen collisions);
 *   - vt's in-context example is drawn afresh per sample with new names and value (RULER draws it once and
 *     renames it per sample with string replacement);
 *   - cwe refuses lengths that need more distinct words than the word list holds (RULER switches to the
 *     Randle word list it ships). */
#include "benchmarks/ruler.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"
#include "benchmarks/ruler_impl.h"

static const char *const TASKS[RULER_N_TASKS] = {
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
    "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"};

static const char NOISE[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
static const char NEEDLE[] = "One of the special magic {type_needle_v} for {key} is: {value}.";
static const char NIAH_T[] = "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize "
                             "it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special "
                             "magic {type_needle_v} for {query} mentioned in the provided text?";
static const char NIAH_P[] = " The special magic {type_needle_v} for {query} mentioned in the provided text are";
static const char VT_T[] = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
                           "Question: Find all variables that are assigned the value {query} in the text above.";
static const char VT_P[] = " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
                           "are assigned the value {query}, they are: ";
static const char CWE_T[] = "Below is a numbered list of words. In these words, some appear more often than others. Memorize "
                            "the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the "
                            "above list?";
static const char CWE_P[] = " Answer: The top 10 words that appear most often in the list are:";
static const char FWE_T[] = "Read the following coded text and track the frequency of each coded word. Find the three most "
                            "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please "
                            "ignore the dots '....'. What are the three most frequently appeared words in the above coded "
                            "text?";
static const char FWE_P[] = " Answer: According to the coded text above, the three most frequently appeared words are:";

enum { HAY_NOISE, HAY_ESSAY, HAY_NEEDLE };
enum { V_NUMBERS, V_WORDS, V_UUIDS };
static const char *const V_NAME[] = {"numbers", "words", "uuids"};

typedef struct { int hay, k_type, v_type, n_k, n_v, n_q; } niah_cfg;

/* synthetic.yaml, niah tasks in TASKS order */
static const niah_cfg NIAH_CFG[8] = {
    {HAY_NOISE, V_WORDS, V_NUMBERS, 1, 1, 1},  {HAY_ESSAY, V_WORDS, V_NUMBERS, 1, 1, 1},
    {HAY_ESSAY, V_WORDS, V_UUIDS, 1, 1, 1},    {HAY_ESSAY, V_WORDS, V_NUMBERS, 4, 1, 1},
    {HAY_NEEDLE, V_WORDS, V_NUMBERS, 1, 1, 1}, {HAY_NEEDLE, V_UUIDS, V_UUIDS, 1, 1, 1},
    {HAY_ESSAY, V_WORDS, V_NUMBERS, 1, 4, 1},  {HAY_ESSAY, V_WORDS, V_NUMBERS, 1, 1, 4}};

const char *ruler_task_name(int i) { return i >= 0 && i < RULER_N_TASKS ? TASKS[i] : NULL; }

static int task_index(const char *task) {
    for (int i = 0; task && i < RULER_N_TASKS; i++)
        if (!strcmp(task, TASKS[i])) return i;
    return -1;
}

int ruler_task_needs(const char *task) {
    int i = task_index(task);
    if (i < 0) return -1;
    if (i < 8) return (NIAH_CFG[i].hay == HAY_ESSAY ? RULER_NEEDS_ESSAY : 0) |
                      (NIAH_CFG[i].k_type == V_WORDS || NIAH_CFG[i].v_type == V_WORDS ? RULER_NEEDS_WORDS : 0);
    if (!strcmp(task, "cwe")) return RULER_NEEDS_WORDS;
    if (!strncmp(task, "qa_", 3)) return RULER_NEEDS_QA;
    return 0;
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* ---- random values ---- */

void ruler_random_value(ruler_gen *g, uint64_t *rng, int type, kvb_sb *b) {
    if (type == V_NUMBERS) {
        kvb_sb_addf(b, "%d", 1000000 + (int)kvb_rng_below(rng, 9000000)); /* randint(10**6, 10**7 - 1) */
    } else if (type == V_WORDS) {
        kvb_sb_addf(b, "%s-%s", g->adjs.v[kvb_rng_below(rng, (uint64_t)g->adjs.n)],
                    g->nouns.v[kvb_rng_below(rng, (uint64_t)g->nouns.n)]);
    } else { /* uuid.UUID(int=getrandbits(128), version=4) */
        uint64_t hi = kvb_rng_next(rng), lo = kvb_rng_next(rng);
        hi = (hi & ~0xf000ULL) | 0x4000ULL;
        lo = (lo & ~(0xc000ULL << 48)) | (0x8000ULL << 48);
        kvb_sb_addf(b, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(hi >> 32), (unsigned)((hi >> 16) & 0xffff),
                    (unsigned)(hi & 0xffff), (unsigned)(lo >> 48), (unsigned long long)(lo & 0xffffffffffffULL));
    }
}

/* ---- niah ---- */

static const niah_cfg *niah_of(const ruler_gen *g) { return &NIAH_CFG[task_index(g->o->task)]; }

/* Sentence ends: after [.!?] (and closing quotes/brackets) followed by a space. Offsets of sentence starts. */
static int split_sentences(const char *text, int **starts) {
    int cap = 256, n = 0;
    int *v = malloc((size_t)cap * sizeof *v);
    if (!v) return -1;
    v[n++] = 0;
    for (const char *p = text; *p; p++) {
        if (*p != '.' && *p != '!' && *p != '?') continue;
        const char *q = p + 1;
        while (*q == '"' || *q == '\'' || *q == ')' || *q == ']') q++;
        if (*q != ' ' || !q[1]) continue;
        if (n == cap) {
            int *nv = realloc(v, (size_t)(cap *= 2) * sizeof *nv);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[n++] = (int)(q + 1 - text);
        p = q;
    }
    *starts = v;
    return n;
}

/* niah.py's question about `query` into out->pre, post (the template split at {context}) and prefix (the answer
 * prefix); singular: one value asked (its singular template: "A special magic number ... is"). 0 / -1 (OOM). */
static int niah_question(const niah_cfg *c, int singular, const char *query, ruler_built *out) {
    char *t = NULL, *p = NULL, vname[16];
    snprintf(vname, sizeof vname, "%s", V_NAME[c->v_type]);
    if (singular) {
        char *t1 = kvb_replace_all(NIAH_T, "Some", "A"), *t2 = t1 ? kvb_replace_all(t1, "are all", "is") : NULL;
        t = t2 ? kvb_replace_all(t2, "are", "is") : NULL;
        char *p1 = kvb_replace_all(NIAH_P, "are all", "is");
        p = p1 ? kvb_replace_all(p1, "are", "is") : NULL;
        free(t1), free(t2), free(p1);
        vname[strlen(vname) - 1] = 0;
    } else {
        t = kvb_strdup(NIAH_T);
        p = kvb_strdup(NIAH_P);
    }
    free(out->pre), free(out->post), free(out->prefix);
    out->pre = out->post = out->prefix = NULL;
    const char *tn[2] = {"type_needle_v", "query"}, *tv[2] = {vname, query};
    if (t && p) {
        ruler_fmt_split(t, tn, tv, 2, &out->pre, &out->post);
        kvb_sb pb = {0};
        ruler_fmt(&pb, p, tn, tv, 2);
        out->prefix = kvb_sb_take(&pb);
    }
    free(t), free(p);
    return out->pre && out->post && out->prefix ? 0 : -1;
}

static int niah_build(ruler_gen *g, int n, uint64_t rng, ruler_built *out) {
    const niah_cfg *c = niah_of(g);
    int n_k = c->n_k > c->n_q ? c->n_k : c->n_q, n_needles = n_k * c->n_v, rc = 0;
    char **keys = calloc((size_t)n_k, sizeof *keys), **needles = calloc((size_t)n_needles, sizeof *needles);
    char **vals = calloc((size_t)n_needles, sizeof *vals);
    int *order = malloc((size_t)n_needles * sizeof *order), *qidx = malloc((size_t)c->n_q * sizeof *qidx);
    int *pos = malloc((size_t)n_needles * sizeof *pos);
    kvb_sb ctx = {0};
    if (!keys || !needles || !vals || !order || !qidx || !pos) { rc = -1; goto done; }
    const char *names[3] = {"type_needle_v", "key", "value"};
    for (int k = 0; k < n_k && !rc; k++) {
        kvb_sb kb = {0};
        ruler_random_value(g, &rng, c->k_type, &kb);
        keys[k] = kvb_sb_take(&kb);
        for (int v = 0; v < c->n_v && keys[k]; v++) {
            kvb_sb vb = {0}, nb = {0};
            ruler_random_value(g, &rng, c->v_type, &vb);
            vals[k * c->n_v + v] = kvb_sb_take(&vb);
            const char *values[3] = {V_NAME[c->v_type], keys[k], vals[k * c->n_v + v] ? vals[k * c->n_v + v] : ""};
            ruler_fmt(&nb, NEEDLE, names, values, 3);
            needles[k * c->n_v + v] = kvb_sb_take(&nb);
            if (!vals[k * c->n_v + v] || !needles[k * c->n_v + v]) rc = -1;
        }
        if (!keys[k]) rc = -1;
    }
    if (rc) goto done;
    for (int i = 0; i < n_needles; i++) order[i] = i;
    for (int i = n_needles - 1; i > 0; i--) { /* random.Random(seed).shuffle(needles) */
        int j = (int)kvb_rng_below(&rng, (uint64_t)i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    out->depth = -1;
    if (c->hay == HAY_ESSAY) {
        kvb_sb hay = {0};
        for (int i = 0; i < n; i++) {
            if (i) kvb_sb_add(&hay, " ", 1);
            kvb_sb_adds(&hay, g->essay[i % g->n_essay]);
        }
        char *text = kvb_sb_take(&hay);
        int *starts = NULL, ns = text ? split_sentences(text, &starts) : -1;
        double depths[40];
        int di[40];
        niah_linspace_round(0, 100, 40, depths);
        if (ns < 0 || n_needles > 40 || ruler_sample_indices(&rng, 40, n_needles, di)) {
            free(text);
            free(starts);
            rc = -1;
            goto done;
        }
        for (int i = 0; i < n_needles; i++) pos[i] = (int)((double)ns * (depths[di[i]] / 100.0));
        qsort(pos, (size_t)n_needles, sizeof *pos, cmp_int);
        int dmin = 100;
        for (int i = 0; i < n_needles; i++) dmin = (int)depths[di[i]] < dmin ? (int)depths[di[i]] : dmin;
        out->depth = dmin;
        /* segments between insertion points, each followed by its needle, all joined by " " */
        size_t tl = strlen(text);
        for (int i = 0; i <= n_needles; i++) {
            int a = i ? pos[i - 1] : 0, z = i < n_needles ? pos[i] : ns;
            size_t from = a < ns ? (size_t)starts[a] : tl, to = z < ns ? (size_t)starts[z] : tl;
            if (i) kvb_sb_add(&ctx, " ", 1);
            size_t seg = to > from ? to - from : 0;
            while (seg && text[from + seg - 1] == ' ') seg--; /* " ".join of the sentences: no trailing space */
            kvb_sb_add(&ctx, text + from, seg);
            if (i < n_needles) {
                kvb_sb_add(&ctx, " ", 1);
                kvb_sb_adds(&ctx, needles[order[i]]);
            }
        }
        free(text);
        free(starts);
    } else {
        if (ruler_sample_indices(&rng, n, n_needles, pos)) { rc = -1; goto done; }
        /* sorted(..., reverse=True) zipped with the needles: the needle at the smallest index is the last one */
        qsort(pos, (size_t)n_needles, sizeof *pos, cmp_int);
        out->depth = 100.0 * pos[0] / n;
        int next = 0;
        for (int i = 0; i < n; i++) {
            while (next < n_needles && pos[next] == i) {
                if (ctx.n) kvb_sb_add(&ctx, "\n", 1);
                kvb_sb_adds(&ctx, needles[order[n_needles - 1 - next]]);
                next++;
            }
            if (ctx.n) kvb_sb_add(&ctx, "\n", 1);
            if (c->hay == HAY_NOISE) kvb_sb_adds(&ctx, NOISE);
            else {
                kvb_sb kb = {0}, vb = {0};
                ruler_random_value(g, &rng, c->k_type, &kb);
                ruler_random_value(g, &rng, c->v_type, &vb);
                char *k = kvb_sb_take(&kb), *v = kvb_sb_take(&vb);
                const char *values[3] = {V_NAME[c->v_type], k ? k : "", v ? v : ""};
                ruler_fmt(&ctx, NEEDLE, names, values, 3);
                free(k);
                free(v);
            }
        }
    }
    /* query and answers */
    if (ruler_sample_indices(&rng, n_k, c->n_q, qidx)) { rc = -1; goto done; }
    kvb_sb q = {0};
    for (int i = 0; i < c->n_q; i++) {
        if (i) kvb_sb_adds(&q, i == c->n_q - 1 ? ", and " : ", "); /* ', '.join(q[:-1]) + ', and ' + q[-1] */
        kvb_sb_adds(&q, keys[qidx[i]]);
        for (int v = 0; v < c->n_v && !rc; v++) rc = ruler_built_add_answer(out, vals[qidx[i] * c->n_v + v]);
    }
    char *query = kvb_sb_take(&q);
    if (query && niah_question(c, c->n_q * c->n_v == 1, query, out)) rc = -1;
    if (!(out->queries = calloc((size_t)c->n_q, sizeof *out->queries))) rc = -1;
    for (int i = 0; i < c->n_q && out->queries; i++, out->n_queries++)
        if (!(out->queries[i] = kvb_strdup(keys[qidx[i]]))) rc = -1;
    out->context = kvb_sb_take(&ctx);
    if (!query || !out->context) rc = -1;
    free(query);
done:
    kvb_sb_free(&ctx);
    for (int k = 0; keys && k < n_k; k++) free(keys[k]);
    for (int i = 0; needles && i < n_needles; i++) free(needles[i]), free(vals[i]);
    free(keys), free(needles), free(vals), free(order), free(qidx), free(pos);
    return rc;
}

/* ---- vt ---- */

static void random_upper(uint64_t *rng, int k, char *out) {
    for (int i = 0; i < k; i++) out[i] = (char)('A' + kvb_rng_below(rng, 26));
    out[k] = 0;
}

/* variable_tracking.py with one chain of 4 hops over the noise haystack; icl = 3-letter names, value drawn
 * (the official example's 12345 renamed), tokens_to_generate 0. */
static int vt_core(ruler_gen *g, int n, uint64_t *rng, int icl, ruler_built *out) {
    enum { HOPS = 4, NV = HOPS + 1 };
    char vars[NV][8], value[16], chain[NV][64];
    int k = icl ? 3 : 5;
    for (int i = 0; i < NV; i++) { /* distinct names */
        int dup;
        do {
            random_upper(rng, k, vars[i]);
            dup = 0;
            for (int j = 0; j < i; j++) dup |= !strcmp(vars[i], vars[j]);
        } while (dup);
    }
    snprintf(value, sizeof value, "%d", 10000 + (int)kvb_rng_below(rng, 89999)); /* np.random.randint(10000, 99999) */
    snprintf(chain[0], sizeof chain[0], "VAR %s = %s", vars[0], value);
    for (int j = 0; j < HOPS; j++) snprintf(chain[j + 1], sizeof chain[j + 1], "VAR %s = VAR %s ", vars[j + 1], vars[j]);
    int pos[NV];
    if (ruler_sample_indices(rng, n, NV, pos)) return -1;
    qsort(pos, NV, sizeof *pos, cmp_int);
    if (!icl) out->depth = 100.0 * pos[0] / n;
    kvb_sb ctx = {0};
    int next = 0;
    for (int i = 0; i < n; i++) {
        while (next < NV && pos[next] == i) {
            if (ctx.n) kvb_sb_add(&ctx, "\n", 1);
            kvb_sb_adds(&ctx, chain[next++]);
        }
        if (ctx.n) kvb_sb_add(&ctx, "\n", 1);
        kvb_sb_adds(&ctx, NOISE);
    }
    char *raw = kvb_sb_take(&ctx);
    out->context = raw ? kvb_replace_all(raw, ". \n", ".\n") : NULL;
    free(raw);
    char nv[8];
    snprintf(nv, sizeof nv, "%d", NV);
    const char *names[2] = {"query", "num_v"}, *values[2] = {value, nv};
    ruler_fmt_split(VT_T, names, values, 2, &out->pre, &out->post);
    kvb_sb pb = {0};
    ruler_fmt(&pb, VT_P, names, values, 2);
    out->prefix = kvb_sb_take(&pb);
    int rc = out->context && out->pre && out->post && out->prefix ? 0 : -1;
    for (int i = 0; i < NV && !rc; i++) rc = ruler_built_add_answer(out, vars[i]);
    return rc;
}

static int vt_icl_build(ruler_gen *g, int n, uint64_t rng, ruler_built *out) { return vt_core(g, n, &rng, 1, out); }

static int vt_build(ruler_gen *g, int n, uint64_t rng, ruler_built *out) {
    /* the in-context example: its own stream, its size fitted once (g->vt_icl_n) */
    uint64_t icl_rng = rng ^ 0x5eed1c1ULL;
    ruler_built ex = {0};
    if (vt_core(g, g->vt_icl_n, &icl_rng, 1, &ex)) { ruler_built_free(&ex); return -1; }
    int rc = vt_core(g, n, &rng, 0, out);
    kvb_sb pre = {0};
    kvb_sb_adds(&pre, ex.pre);
    kvb_sb_adds(&pre, ex.context);
    kvb_sb_adds(&pre, ex.post);
    kvb_sb_adds(&pre, ex.prefix);
    kvb_sb_add(&pre, " ", 1);
    for (int i = 0; i < ex.n_answers; i++) kvb_sb_addf(&pre, "%s%s", i ? " " : "", ex.answers[i]);
    kvb_sb_adds(&pre, "\n\n");
    kvb_sb_adds(&pre, out->pre ? out->pre : "");
    ruler_built_free(&ex);
    free(out->pre);
    out->pre = kvb_sb_take(&pre);
    return rc || !out->pre ? -1 : 0;
}

/* ---- cwe ---- */

/* get_example: a numbered list of num_words distinct words, the first common_nums repeated cr times, the
 * rest ur times, shuffled. */
static char *cwe_example(ruler_gen *g, uint64_t *rng, int num_words, int cr, int ur, int common_nums, ruler_built *ans) {
    int *idx = malloc((size_t)num_words * sizeof *idx);
    int total = common_nums * cr + (num_words - common_nums) * ur;
    int *list = malloc((size_t)(total > 0 ? total : 1) * sizeof *list);
    if (!idx || !list || ruler_sample_indices(rng, g->all.n, num_words, idx)) { free(idx), free(list); return NULL; }
    int m = 0;
    for (int i = 0; i < num_words; i++)
        for (int r = 0; r < (i < common_nums ? cr : ur); r++) list[m++] = idx[i];
    for (int i = m - 1; i > 0; i--) {
        int j = (int)kvb_rng_below(rng, (uint64_t)i + 1), t = list[i];
        list[i] = list[j];
        list[j] = t;
    }
    kvb_sb b = {0};
    for (int i = 0; i < m; i++) kvb_sb_addf(&b, "%s%d. %s", i ? " " : "", i + 1, g->all.v[list[i]]);
    int rc = 0;
    for (int i = 0; ans && i < common_nums && !rc; i++) rc = ruler_built_add_answer(ans, g->all.v[idx[i]]);
    free(idx), free(list);
    if (rc) { kvb_sb_free(&b); return NULL; }
    return kvb_sb_take(&b);
}

static int cwe_build(ruler_gen *g, int n, uint64_t rng, ruler_built *out) {
    int big = g->o->length >= 4096;
    if (n > g->all.n) return -1;
    ruler_built shot = {0};
    char *ex = cwe_example(g, &rng, big ? 40 : 20, big ? 10 : 3, big ? 3 : 1, 10, &shot);
    out->context = ex ? cwe_example(g, &rng, n, big ? 30 : 6, big ? 3 : 1, 10, out) : NULL;
    const char *names[1] = {"query"}, *values[1] = {""};
    char *pre = NULL, *post = NULL;
    ruler_fmt_split(CWE_T, names, values, 1, &pre, &post);
    kvb_sb b = {0};
    kvb_sb_adds(&b, pre ? pre : "");
    kvb_sb_adds(&b, ex ? ex : "");
    kvb_sb_adds(&b, post ? post : "");
    kvb_sb_adds(&b, CWE_P);
    kvb_sb_add(&b, " ", 1);
    for (int i = 0; i < shot.n_answers; i++) kvb_sb_addf(&b, "%s%d. %s", i ? " " : "", i + 1, shot.answers[i]);
    kvb_sb_adds(&b, "\n");
    kvb_sb_adds(&b, pre ? pre : "");
    out->pre = kvb_sb_take(&b);
    out->post = post;
    out->prefix = kvb_strdup(CWE_P);
    free(pre), free(ex);
    ruler_built_free(&shot);
    return out->context && out->pre && out->post && out->prefix ? 0 : -1;
}

/* ---- fwe ---- */

static double zeta(double a) { /* Riemann zeta for a > 1: partial sum + Euler-Maclaurin tail */
    double s = 0;
    int N = 1000;
    for (int k = 1; k < N; k++) s += pow(k, -a);
    s += pow(N, 1 - a) / (a - 1) + 0.5 * pow(N, -a) + a / 12.0 * pow(N, -a - 1);
    return s;
}

static int fwe_build(ruler_gen *g, int n, uint64_t rng, ruler_built *out) {
    enum { WL = 6 };
    int V = g->fwe_vocab;
    char *vocab = malloc((size_t)V * (WL + 1));
    int *order = malloc((size_t)V * sizeof *order);
    if (!vocab || !order) { free(vocab), free(order); return -1; }
    /* V distinct random 6-letter words (sorted, then shuffled: one random order) */
    for (int i = 0; i < V; i++) {
        int dup;
        do {
            for (int c = 0; c < WL; c++) vocab[i * (WL + 1) + c] = (char)('a' + kvb_rng_below(&rng, 26));
            vocab[i * (WL + 1) + WL] = 0;
            dup = 0;
            for (int j = 0; j < i && !dup; j++) dup = !memcmp(vocab + j * (WL + 1), vocab + i * (WL + 1), WL);
        } while (dup);
        order[i] = i;
    }
    double z = zeta(g->fwe_alpha);
    int64_t total = 0;
    for (int k = 1; k <= V; k++) total += (int64_t)((double)n * pow(k, -g->fwe_alpha) / z);
    int *list = malloc((size_t)(total > 0 ? total : 1) * sizeof *list);
    if (!list) { free(vocab), free(order); return -1; }
    int64_t m = 0;
    for (int k = 1; k <= V; k++)
        for (int64_t r = (int64_t)((double)n * pow(k, -g->fwe_alpha) / z); r > 0; r--) list[m++] = k - 1;
    for (int64_t i = m - 1; i > 0; i--) {
        int64_t j = (int64_t)kvb_rng_below(&rng, (uint64_t)i + 1);
        int t = list[i];
        list[i] = list[j];
        list[j] = t;
    }
    kvb_sb b = {0};
    for (int64_t i = 0; i < m; i++) {
        if (i) kvb_sb_add(&b, " ", 1);
        kvb_sb_adds(&b, list[i] == 0 ? "..." : vocab + list[i] * (WL + 1)); /* rank 1 is noise: '...' */
    }
    out->context = kvb_sb_take(&b);
    int rc = 0;
    for (int k = 1; k < 4 && k < V && !rc; k++) rc = ruler_built_add_answer(out, vocab + k * (WL + 1));
    const char *names[1] = {"query"}, *values[1] = {""};
    ruler_fmt_split(FWE_T, names, values, 1, &out->pre, &out->post);
    out->prefix = kvb_strdup(FWE_P);
    free(vocab), free(order), free(list);
    return rc || !out->context || !out->pre || !out->post || !out->prefix ? -1 : 0;
}

/* The queries of niah sample i posed one at a time over its haystack (ruler_opts.per_query): each with the
 * singular template and its n_v values as answers. 0 / -1 (OOM). */
static int emit_per_query(ruler_gen *g, int i, ruler_built *b, int gen_tokens, kvb_samples *out) {
    const niah_cfg *c = niah_of(g);
    char **answers = b->answers;
    int rc = 0;
    for (int q = 0; q < b->n_queries && !rc; q++) {
        b->answers = answers + q * c->n_v;
        b->n_answers = c->n_v;
        rc = niah_question(c, c->n_v == 1, b->queries[q], b) || ruler_emit(g, i, q, b, gen_tokens, out);
    }
    b->answers = answers; /* back to the whole list, which ruler_built_free releases */
    b->n_answers = b->n_queries * c->n_v;
    return rc;
}

static int synth_samples(ruler_gen *g, ruler_build_fn build, int inc, int gen_tokens, int max_n, kvb_samples *out,
                         char *err, size_t err_len) {
    int hint = 0;
    for (int i = 0; i < g->o->n_samples; i++) {
        uint64_t rng = ruler_stream(g->o, i);
        int n;
        if (ruler_fit(g, build, inc, rng, gen_tokens, hint, max_n, &n, err, err_len)) return -1;
        if (max_n > 0 && n >= max_n) /* the whole list fits: the length would be missed, not filled */
            return kvb_seterr(err, err_len, "ruler %s: length %d needs more distinct words than the %d of the word list",
                              g->o->task, g->o->length, max_n), -1;
        hint = n;
        ruler_built b = {0};
        int rc = build(g, n, rng, &b) || (g->o->per_query ? emit_per_query(g, i, &b, gen_tokens, out)
                                                           : ruler_emit(g, i, -1, &b, gen_tokens, out));
        ruler_built_free(&b);
        if (rc) return kvb_seterr(err, err_len, "ruler %s: out of memory", g->o->task), -1;
    }
    return 0;
}

int ruler_generate(const ruler_opts *o, kvb_samples *out, char *err, size_t err_len) {
    int ti = task_index(o->task);
    if (ti < 0) return kvb_seterr(err, err_len, "ruler: unknown task '%s'", o->task ? o->task : "(null)"), -1;
    if (o->length < 64 || o->n_samples < 1)
        return kvb_seterr(err, err_len, "ruler %s: need a length >= 64 tokens and at least one sample", o->task), -1;
    if (o->per_query && strcmp(o->task, "niah_multiquery"))
        return kvb_seterr(err, err_len, "ruler %s: queries posed one at a time are niah_multiquery's", o->task), -1;
    ruler_gen g;
    memset(&g, 0, sizeof g);
    g.o = o;
    int needs = ruler_task_needs(o->task), n0 = out->n, rc = 0;
    if ((needs & RULER_NEEDS_WORDS) && ruler_load_words(&g, err, err_len)) rc = -1;
    if (!rc && (needs & RULER_NEEDS_ESSAY) && ruler_load_essays(&g, err, err_len)) rc = -1;
    if (!rc) {
        if (ti < 8) {
            int hay = NIAH_CFG[ti].hay;
            int inc = hay == HAY_ESSAY ? 500 : (o->length < 4096 ? 5 : 25);
            rc = synth_samples(&g, niah_build, inc, 128, 0, out, err, err_len);
        } else if (!strcmp(o->task, "vt")) {
            /* the example: fitted to 500 tokens with nothing to generate (increment 5) */
            ruler_opts eo = *o;
            eo.length = 500;
            ruler_gen ge = g;
            ge.o = &eo;
            uint64_t rng = o->seed ^ 0x5eed1c1ULL;
            rc = ruler_fit(&ge, vt_icl_build, 5, rng, 0, 0, 0, &g.vt_icl_n, err, err_len);
            if (!rc) rc = synth_samples(&g, vt_build, o->length < 4096 ? 5 : 10, 30, 0, out, err, err_len);
        } else if (!strcmp(o->task, "cwe")) {
            rc = synth_samples(&g, cwe_build, 10, 120, g.all.n, out, err, err_len);
            if (rc && out->n == n0 && strstr(err, "too short") == NULL && g.all.n > 0)
                kvb_seterr(err, err_len, "ruler cwe: length %d needs more distinct words than the %d of the word list",
                           o->length, g.all.n);
        } else if (!strcmp(o->task, "fwe")) {
            g.fwe_alpha = 2.0;
            g.fwe_vocab = (o->length - 50) / 50;
            if (g.fwe_vocab < 4) {
                kvb_seterr(err, err_len, "ruler fwe: length %d is too short", o->length);
                rc = -1;
            }
            else rc = synth_samples(&g, fwe_build, 10, 50, 0, out, err, err_len);
        } else
            rc = ruler_qa_generate(&g, out, err, err_len);
    }
    ruler_words_free(&g.nouns);
    ruler_words_free(&g.adjs);
    ruler_words_free(&g.all);
    free(g.essay);
    free(g.essay_buf);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}

/* ---- scoring ---- */

void ruler_postprocess(char *pred) {
    for (char *p = pred; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '\n';
    /* Python's str.strip(): ASCII whitespace (and \x1c-\x1f, which are now '\n') */
    size_t n = strlen(pred), a = 0;
    while (a < n && isspace((unsigned char)pred[a])) a++;
    while (n > a && isspace((unsigned char)pred[n - 1])) n--;
    memmove(pred, pred + a, n - a);
    pred[n - a] = 0;
}

/* r.lower() in pred.lower(), ASCII case folding (the answers RULER generates are ASCII). */
static int contains_lower(const char *pred, const char *ref) {
    size_t n = strlen(ref);
    if (!n) return 1;
    for (const char *p = pred; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)ref[i])) i++;
        if (i == n) return 1;
    }
    return 0;
}

double ruler_match_all(const char *pred, const char *const *refs, int n_refs) {
    if (n_refs <= 0) return 0;
    int hit = 0;
    for (int i = 0; i < n_refs; i++) hit += contains_lower(pred, refs[i]);
    return (double)hit / n_refs;
}

double ruler_match_part(const char *pred, const char *const *refs, int n_refs) {
    for (int i = 0; i < n_refs; i++)
        if (contains_lower(pred, refs[i])) return 1.0;
    return 0.0;
}

const char *ruler_metric_name(const char *task) {
    int i = task_index(task);
    if (i < 0) return NULL;
    return !strncmp(task, "qa_", 3) ? "string_match_part" : "string_match_all";
}

int ruler_score(const char *task, const char *pred, const char *const *refs, int n_refs, double *score) {
    const char *m = ruler_metric_name(task);
    if (!m) return -1;
    char *p = kvb_strdup(pred ? pred : "");
    if (!p) return -1;
    ruler_postprocess(p);
    *score = !strcmp(m, "string_match_part") ? ruler_match_part(p, refs, n_refs) : ruler_match_all(p, refs, n_refs);
    free(p);
    return 0;
}
