/* ruler_qa.c — RULER's qa_1 (SQuAD v2 dev) and qa_2 (HotpotQA dev), following NVIDIA/RULER
 * scripts/data/synthetic/qa.py (read, not copied): the documents are the distinct paragraphs (SQuAD) or
 * "<title>\n<sentences joined>" passages (HotpotQA), sorted; SQuAD keeps the answerable questions with
 * every answer text, its gold paragraph and the other paragraphs of the same article as first distractors;
 * HotpotQA's gold set is all ten passages of the question; more documents are drawn at random until the
 * length is filled, the list is shuffled and rendered "Document {i}:\n{document}" joined by blank lines, in
 * the template of scripts/data/synthetic/constants.py. Sample i asks question i of the file (as qa.py with
 * pre_samples 0). depth = percent position of the first gold document. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"
#include "benchmarks/ruler_impl.h"

static const char QA_T[] = "Answer the question based on the given documents. Only give me the answer and do not output any "
                           "other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on "
                           "the given documents. Only give me the answer and do not output any other words.\n\nQuestion: "
                           "{query}";
static const char QA_P[] = " Answer:";

typedef struct {
    char *query;
    char **outputs;
    int n_outputs;
    int *gold, n_gold;
    int *more, n_more;
} qa_item;

typedef struct {
    char **docs;
    int n_docs;
    qa_item *qas;
    int n_qas;
} qa_set;

static void qa_free(qa_set *q) {
    if (!q) return;
    for (int i = 0; i < q->n_docs; i++) free(q->docs[i]);
    free(q->docs);
    for (int i = 0; i < q->n_qas; i++) {
        free(q->qas[i].query);
        for (int k = 0; k < q->qas[i].n_outputs; k++) free(q->qas[i].outputs[k]);
        free(q->qas[i].outputs);
        free(q->qas[i].gold);
        free(q->qas[i].more);
    }
    free(q->qas);
    free(q);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Index of doc in the sorted list; -1 if absent. */
static int doc_index(const qa_set *q, const char *doc) {
    char *const *hit = bsearch(&doc, q->docs, (size_t)q->n_docs, sizeof *q->docs, cmp_str);
    return hit ? (int)(hit - q->docs) : -1;
}

static int push_str(char ***v, int *n, const char *s) {
    char **nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
    if (!nv) return -1;
    *v = nv;
    return (nv[*n] = kvb_strdup(s)) ? ((*n)++, 0) : -1;
}

static int push_int(int **v, int *n, int x) {
    int *nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
    if (!nv) return -1;
    *v = nv;
    nv[(*n)++] = x;
    return 0;
}

static char *hotpot_doc(const cJSON *pair) {
    const cJSON *t = cJSON_GetArrayItem(pair, 0), *sents = cJSON_GetArrayItem(pair, 1), *s;
    if (!cJSON_IsString(t) || !cJSON_IsArray(sents)) return NULL;
    kvb_sb b = {0};
    kvb_sb_addf(&b, "%s\n", t->valuestring);
    cJSON_ArrayForEach(s, sents) {
        if (!cJSON_IsString(s)) { kvb_sb_free(&b); return NULL; }
        kvb_sb_adds(&b, s->valuestring);
    }
    return kvb_sb_take(&b);
}

/* Collects every document (pass 0) or builds the questions (pass 1). */
static int walk(const cJSON *root, int squad, int pass, qa_set *q) {
    const cJSON *arts = squad ? kvb_json_get(root, "data") : root, *a;
    if (!cJSON_IsArray(arts)) return -2;
    cJSON_ArrayForEach(a, arts) {
        if (squad) {
            const cJSON *paras = kvb_json_get(a, "paragraphs"), *p;
            if (!cJSON_IsArray(paras)) return -2;
            cJSON_ArrayForEach(p, paras) {
                const cJSON *ctx = kvb_json_get(p, "context");
                if (!cJSON_IsString(ctx)) return -2;
                if (pass == 0) { if (push_str(&q->docs, &q->n_docs, ctx->valuestring)) return -1; continue; }
                const cJSON *qs = kvb_json_get(p, "qas"), *x;
                if (!cJSON_IsArray(qs)) return -2;
                cJSON_ArrayForEach(x, qs) {
                    const cJSON *imp = kvb_json_get(x, "is_impossible"), *qq = kvb_json_get(x, "question");
                    const cJSON *ans = kvb_json_get(x, "answers"), *an;
                    if (!cJSON_IsString(qq) || !cJSON_IsArray(ans)) return -2;
                    if (cJSON_IsTrue(imp)) continue;
                    qa_item *it = realloc(q->qas, (size_t)(q->n_qas + 1) * sizeof *it);
                    if (!it) return -1;
                    q->qas = it;
                    it = &q->qas[q->n_qas++];
                    memset(it, 0, sizeof *it);
                    if (!(it->query = kvb_strdup(qq->valuestring))) return -1;
                    cJSON_ArrayForEach(an, ans) {
                        const cJSON *t = kvb_json_get(an, "text");
                        if (!cJSON_IsString(t)) return -2;
                        if (push_str(&it->outputs, &it->n_outputs, t->valuestring)) return -1;
                    }
                    int g = doc_index(q, ctx->valuestring);
                    if (push_int(&it->gold, &it->n_gold, g)) return -1;
                    const cJSON *p2;
                    cJSON_ArrayForEach(p2, paras) {
                        const cJSON *c2 = kvb_json_get(p2, "context");
                        int d = cJSON_IsString(c2) ? doc_index(q, c2->valuestring) : -1;
                        if (d >= 0 && d != g && push_int(&it->more, &it->n_more, d)) return -1;
                    }
                }
            }
        } else {
            const cJSON *ctx = kvb_json_get(a, "context"), *qq = kvb_json_get(a, "question"), *ans = kvb_json_get(a, "answer"), *pair;
            if (!cJSON_IsArray(ctx) || !cJSON_IsString(qq) || !cJSON_IsString(ans)) return -2;
            qa_item *it = NULL;
            if (pass == 1) {
                it = realloc(q->qas, (size_t)(q->n_qas + 1) * sizeof *it);
                if (!it) return -1;
                q->qas = it;
                it = &q->qas[q->n_qas++];
                memset(it, 0, sizeof *it);
                if (!(it->query = kvb_strdup(qq->valuestring)) || push_str(&it->outputs, &it->n_outputs, ans->valuestring)) return -1;
            }
            cJSON_ArrayForEach(pair, ctx) {
                char *d = hotpot_doc(pair);
                if (!d) return -2;
                int rc = pass == 0 ? push_str(&q->docs, &q->n_docs, d) : push_int(&it->gold, &it->n_gold, doc_index(q, d));
                free(d);
                if (rc) return -1;
            }
        }
    }
    return 0;
}

static qa_set *qa_load(const char *path, int squad, char *err, size_t err_len) {
    size_t len;
    char *buf = kvb_read_file(path, &len, err, err_len);
    if (!buf) return NULL;
    cJSON *root = kvb_json_parse(path, 1, buf, len, err, err_len);
    free(buf);
    if (!root) return NULL;
    qa_set *q = calloc(1, sizeof *q);
    int rc = q ? walk(root, squad, 0, q) : -1;
    if (!rc) { /* sorted(set(docs)) */
        qsort(q->docs, (size_t)q->n_docs, sizeof *q->docs, cmp_str);
        int m = 0;
        for (int i = 0; i < q->n_docs; i++) {
            if (m && !strcmp(q->docs[m - 1], q->docs[i])) { free(q->docs[i]); continue; }
            q->docs[m++] = q->docs[i];
        }
        q->n_docs = m;
        rc = walk(root, squad, 1, q);
    }
    cJSON_Delete(root);
    if (!rc && q->n_qas == 0) rc = -3;
    if (rc) {
        if (rc == -1) kvb_seterr(err, err_len, "%s: out of memory", path);
        else if (rc == -3) kvb_seterr(err, err_len, "%s: no answerable question", path);
        else kvb_seterr(err, err_len, "%s: not a %s dev file (fields missing or of the wrong type)", path,
                        squad ? "SQuAD v2" : "HotpotQA");
        qa_free(q);
        return NULL;
    }
    return q;
}

static int in_list(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

static int qa_build(ruler_gen *g, int n, uint64_t rng, ruler_built *out) {
    const qa_set *q = g->qa;
    const qa_item *it = &q->qas[g->qa_index];
    int *all = malloc((size_t)(n > 0 ? n : 1) * sizeof *all), m = 0, rc = 0;
    if (!all) return -1;
    if (n < q->n_docs) {
        int ng = it->n_gold < n ? it->n_gold : n;
        for (int i = 0; i < ng; i++) all[m++] = it->gold[i];
        if (n - it->n_gold > it->n_more) {
            for (int i = 0; i < it->n_more; i++) all[m++] = it->more[i];
            int na = 0, *add = malloc((size_t)q->n_docs * sizeof *add), *pick = malloc((size_t)(n - m > 0 ? n - m : 1) * sizeof *pick);
            for (int d = 0; add && d < q->n_docs; d++)
                if (!in_list(it->gold, it->n_gold, d) && !in_list(it->more, it->n_more, d)) add[na++] = d;
            int k = n - m < na ? n - m : na;
            if (!add || !pick || ruler_sample_indices(&rng, na, k, pick)) rc = -1;
            for (int i = 0; !rc && i < k; i++) all[m++] = add[pick[i]];
            free(add), free(pick);
        } else if (n > ng) {
            int k = n - ng, *pick = malloc((size_t)k * sizeof *pick);
            if (!pick || ruler_sample_indices(&rng, it->n_more, k, pick)) rc = -1;
            for (int i = 0; !rc && i < k; i++) all[m++] = it->more[pick[i]];
            free(pick);
        }
    } else
        for (int i = 0; i < n; i++) all[m++] = i % q->n_docs;
    for (int i = m - 1; !rc && i > 0; i--) {
        int j = (int)kvb_rng_below(&rng, (uint64_t)i + 1), t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    out->depth = -1;
    for (int i = 0; !rc && i < m && out->depth < 0; i++)
        if (in_list(it->gold, it->n_gold, all[i])) out->depth = 100.0 * i / m;
    kvb_sb b = {0};
    for (int i = 0; !rc && i < m; i++) kvb_sb_addf(&b, "%sDocument %d:\n%s", i ? "\n\n" : "", i + 1, q->docs[all[i]]);
    free(all);
    if (rc) { kvb_sb_free(&b); return -1; }
    out->context = kvb_sb_take(&b);
    const char *names[1] = {"query"}, *values[1] = {it->query};
    ruler_fmt_split(QA_T, names, values, 1, &out->pre, &out->post);
    out->prefix = kvb_strdup(QA_P);
    for (int i = 0; !rc && i < it->n_outputs; i++) rc = ruler_built_add_answer(out, it->outputs[i]);
    return rc || !out->context || !out->pre || !out->post || !out->prefix ? -1 : 0;
}

int ruler_qa_generate(ruler_gen *g, kvb_samples *out, char *err, size_t err_len) {
    int squad = !strcmp(g->o->task, "qa_1");
    if (!g->o->qa_path) {
        kvb_seterr(err, err_len, "ruler %s: needs the %s dev file (\"qa_path\"; scripts/fetch-datasets.sh ruler)", g->o->task,
                   squad ? "SQuAD v2" : "HotpotQA");
        return -1;
    }
    qa_set *q = qa_load(g->o->qa_path, squad, err, err_len);
    if (!q) return -1;
    g->qa = q;
    int rc = 0, hint = 0;
    for (int i = 0; i < g->o->n_samples && !rc; i++) {
        g->qa_index = i % q->n_qas;
        uint64_t rng = ruler_stream(g->o, i);
        int n;
        rc = ruler_fit(g, qa_build, 10, rng, 32, hint, 0, &n, err, err_len);
        if (rc) break;
        hint = n;
        ruler_built b = {0};
        if (qa_build(g, n, rng, &b) || ruler_emit(g, i, -1, &b, 32, out)) {
            kvb_seterr(err, err_len, "ruler %s: out of memory", g->o->task);
            rc = -1;
        }
        ruler_built_free(&b);
    }
    qa_free(q);
    g->qa = NULL;
    return rc;
}
