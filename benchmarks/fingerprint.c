/* fingerprint.c — record fingerprints and the resume index (fingerprint.h). */
#include "benchmarks/fingerprint.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const unsigned char *md, int n, char *out) {
    for (int i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* Fields are hashed with their lengths so that ("ab", "c") and ("a", "bc") differ. */
static void upd(EVP_MD_CTX *c, const char *s) {
    unsigned long long n = s ? strlen(s) + 1 : 0; /* NULL and "" differ too */
    EVP_DigestUpdate(c, &n, sizeof n);
    if (s) EVP_DigestUpdate(c, s, n - 1);
}

static void updi(EVP_MD_CTX *c, long long v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", v);
    upd(c, b);
}

void kvb_fp_sample(const kvb_sample *s, char out[65]) {
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    upd(c, s->id), upd(c, s->task), upd(c, s->prompt), upd(c, s->question), upd(c, s->stop), upd(c, s->qtype);
    upd(c, s->system), upd(c, s->prefill), upd(c, s->context), upd(c, s->date);
    updi(c, s->n_turns);
    for (int i = 0; i < s->n_turns; i++) upd(c, s->turns[i].role), upd(c, s->turns[i].content), upd(c, s->turns[i].date);
    updi(c, s->n_answers);
    for (int i = 0; i < s->n_answers; i++) upd(c, s->answers[i]);
    updi(c, s->n_classes);
    for (int i = 0; i < s->n_classes; i++) upd(c, s->all_classes[i]);
    updi(c, s->use_chat), updi(c, s->first_line), updi(c, s->length), updi(c, s->abstention), updi(c, s->ctx_tokens);
    updi(c, (long long)(s->depth * 1e6));
    if (s->followup) /* a second question (LongBench v2's CoT): hashed only when there is one, so the fingerprints of
                      * samples without one stay as they were and their records stay reusable */
        upd(c, "followup"), upd(c, s->followup), upd(c, s->followup_slot), updi(c, s->followup_max_new);
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    hex(md, 32, out);
}

/* A copy with every object's keys sorted (recursively), without the top-level keys in drop. */
static cJSON *canonical(const cJSON *j, const char *const *drop) {
    cJSON *d = cJSON_Duplicate(j, 1);
    if (!d) return NULL;
    for (int i = 0; drop && drop[i]; i++) cJSON_DeleteItemFromObjectCaseSensitive(d, drop[i]);
    /* insertion sort of each object's children by key */
    cJSON *stack[64];
    int sp = 0;
    stack[sp++] = d;
    while (sp) {
        cJSON *o = stack[--sp];
        if (cJSON_IsObject(o)) {
            cJSON *sorted = NULL, *it = o->child;
            while (it) {
                cJSON *next = it->next;
                it->prev = it->next = NULL;
                cJSON **at = &sorted;
                while (*at && strcmp((*at)->string, it->string) <= 0) at = &(*at)->next;
                it->next = *at;
                *at = it;
                it = next;
            }
            cJSON *prev = NULL;
            for (it = sorted; it; it = it->next) it->prev = prev, prev = it;
            if (sorted) sorted->prev = prev; /* cJSON keeps the tail in the head's prev */
            o->child = sorted;
        }
        for (cJSON *c = o->child; c && sp < 64; c = c->next)
            if (cJSON_IsObject(c) || cJSON_IsArray(c)) stack[sp++] = c;
    }
    return d;
}

static char *canonical_text(const cJSON *j, const char *const *drop) {
    if (!j || cJSON_IsNull(j)) return strdup("null");
    cJSON *c = canonical(j, drop);
    char *t = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    return t;
}

static const char *const FIELDS[] = {"kvbench", "model_sha256", "method", "method_opts", "budget", "benchmark",
                                     "sample", "generation"};
enum { N_FIELDS = sizeof FIELDS / sizeof *FIELDS };

cJSON *kvb_fp_make(const kvb_fp_in *in) {
    static const char *const count_keys[] = {"limit", "samples", "dialogues", "optional", NULL};
    char *opts = canonical_text(in->method_opts, NULL), *bench = canonical_text(in->benchmark, count_keys);
    char gen[256];
    snprintf(gen, sizeof gen, "greedy max_new_tokens=%d seed=%.17g round_chunk=%d%s%s", in->max_new_tokens, in->seed,
             in->round_chunk, in->engine && in->engine[0] ? " " : "", in->engine ? in->engine : "");
    cJSON *fp = cJSON_CreateObject();
    if (!opts || !bench || !fp) {
        free(opts), free(bench), cJSON_Delete(fp);
        return NULL;
    }
    const char *vals[N_FIELDS] = {KVB_RECORD_VERSION, in->model_sha256, in->method, opts, in->budget, bench,
                                  in->sample_sha256, gen};
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    for (int i = 0; i < N_FIELDS; i++) upd(c, FIELDS[i]), upd(c, vals[i] ? vals[i] : "");
    unsigned char md[32];
    unsigned int len = 0;
    char sha[65];
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    hex(md, 32, sha);
    cJSON_AddStringToObject(fp, "sha256", sha);
    for (int i = 0; i < N_FIELDS; i++) cJSON_AddStringToObject(fp, FIELDS[i], vals[i] ? vals[i] : "");
    free(opts), free(bench);
    return fp;
}

int kvb_fp_compare(const cJSON *stored, const cJSON *now, char *why, size_t why_len) {
    if (!cJSON_IsObject(stored)) {
        snprintf(why, why_len, "fingerprint: the stored record has none (written by an older kvbench)");
        return 1;
    }
    const char *a = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(stored, "sha256")),
               *b = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(now, "sha256"));
    if (a && b && !strcmp(a, b)) return 0;
    for (int i = 0; i < N_FIELDS; i++) {
        const char *x = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(stored, FIELDS[i])),
                   *y = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(now, FIELDS[i]));
        if (x && y && !strcmp(x, y)) continue;
        snprintf(why, why_len, "%s: stored %.120s, now %.120s", FIELDS[i], x ? x : "(none)", y ? y : "(none)");
        return 1;
    }
    snprintf(why, why_len, "fingerprint: stored sha256 %.12s, now %.12s", a ? a : "(none)", b ? b : "(none)");
    return 1;
}

/* ---- the resume index ---- */

size_t kvb_fp_key(char *buf, size_t cap, const char *method, const char *budget, const char *task, const char *id) {
    const char *fields[4] = {method, budget, task, id};
    size_t n = 0;
    for (int f = 0; f < 4; f++) {
        if (f) {
            if (n + 1 < cap) buf[n] = '|';
            n++;
        }
        for (const char *p = fields[f] ? fields[f] : ""; *p; p++) {
            if (*p == '|' || *p == '\\') {
                if (n + 1 < cap) buf[n] = '\\';
                n++;
            }
            if (n + 1 < cap) buf[n] = *p;
            n++;
        }
    }
    if (cap) buf[n < cap ? n : cap - 1] = 0;
    return n;
}

char *kvb_fp_key_new(const char *method, const char *budget, const char *task, const char *id) {
    size_t n = kvb_fp_key(NULL, 0, method, budget, task, id);
    char *k = malloc(n + 1);
    if (k) kvb_fp_key(k, n + 1, method, budget, task, id);
    return k;
}

int kvb_fp_index_add(kvb_fp_index *ix, const cJSON *rec, long line) {
    const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "method")),
               *b = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "budget")),
               *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "task")),
               *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "sample_id"));
    if (!m || !b || !t || !id) return -1;
    if (ix->n == ix->cap) {
        int cap = ix->cap ? 2 * ix->cap : 256;
        kvb_fp_entry *v = realloc(ix->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        ix->v = v, ix->cap = cap;
    }
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(rec, "fingerprint");
    const cJSON *judge = cJSON_GetObjectItemCaseSensitive(rec, "judge");
    int pending = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(judge, "pending"));
    kvb_fp_entry *e = &ix->v[ix->n];
    e->key = kvb_fp_key_new(m, b, t, id);
    e->fingerprint = cJSON_IsObject(fp) ? cJSON_Duplicate(fp, 1) : NULL;
    e->pending = pending ? cJSON_Duplicate(rec, 1) : NULL;
    e->line = line;
    if (!e->key) return -1;
    ix->n++;
    return 0;
}

static int cmp_entry(const void *pa, const void *pb) {
    const kvb_fp_entry *a = pa, *b = pb;
    int c = strcmp(a->key, b->key);
    return c ? c : (a->line > b->line) - (a->line < b->line);
}

static void entry_free(kvb_fp_entry *e) {
    free(e->key);
    cJSON_Delete(e->fingerprint);
    cJSON_Delete(e->pending);
}

void kvb_fp_index_finish(kvb_fp_index *ix) {
    if (!ix->n) return;
    qsort(ix->v, (size_t)ix->n, sizeof *ix->v, cmp_entry);
    int out = 0;
    for (int i = 0; i < ix->n; i++) {
        if (i + 1 < ix->n && !strcmp(ix->v[i].key, ix->v[i + 1].key)) { /* a later record of the key wins */
            entry_free(&ix->v[i]);
            continue;
        }
        ix->v[out++] = ix->v[i];
    }
    ix->n = out;
}

const kvb_fp_entry *kvb_fp_index_find(const kvb_fp_index *ix, const char *key) {
    int lo = 0, hi = ix->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(ix->v[mid].key, key);
        if (!c) return &ix->v[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

void kvb_fp_index_free(kvb_fp_index *ix) {
    for (int i = 0; i < ix->n; i++) entry_free(&ix->v[i]);
    free(ix->v);
    memset(ix, 0, sizeof *ix);
}
