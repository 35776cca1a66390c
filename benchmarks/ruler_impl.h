/* ruler_impl.h — what ruler.c and ruler_qa.c share (not a public interface: only those two files include it). */
#ifndef KVB_RULER_IMPL_H
#define KVB_RULER_IMPL_H

#include "benchmarks/ruler.h"

typedef struct { char **v; int n, cap; } ruler_words;

typedef struct {
    const ruler_opts *o;
    ruler_words nouns, adjs, all; /* wonderwords lists (deduplicated, sorted); all = nouns + adjs + verbs */
    char *essay_buf;              /* essays, whitespace-collapsed, NUL between words */
    char **essay;
    int n_essay;
    int vt_icl_n;                 /* noise sentences of vt's in-context example */
    int fwe_vocab;
    double fwe_alpha;
    void *qa;                     /* ruler_qa.c's documents and questions */
    int qa_index;                 /* the question being built */
} ruler_gen;

/* One generated input: pre + context + post is RULER's "input", prefix its answer prefix. */
typedef struct {
    char *pre, *context, *post, *prefix;
    char **answers;
    int n_answers;
    double depth;
    char **queries;   /* niah: the keys asked, in the question's order (answers follow them, n_v each) */
    int n_queries;
} ruler_built;

/* Builds the sample for haystack size n from a copy of the stream rng; 0 / -1. */
typedef int (*ruler_build_fn)(ruler_gen *g, int n, uint64_t rng, ruler_built *out);

/* The wonderwords lists (nouns, adjectives, all = nouns + adjectives + verbs) and the essays; 0 / -1 + err. */
int ruler_load_words(ruler_gen *g, char *err, size_t err_len);
int ruler_load_essays(ruler_gen *g, char *err, size_t err_len);
void ruler_words_free(ruler_words *w);
/* Formats a str.format template with the named values (literal substitution, no re-parsing). */
void ruler_fmt(kvb_sb *b, const char *tmpl, const char *const *names, const char *const *values, int n);
/* Splits a template at "{context}" and formats both halves (malloc'd; NULL on OOM). */
void ruler_fmt_split(const char *t, const char *const *names, const char *const *values, int n, char **pre, char **post);
/* k distinct indices of [0, n) in draw order; 0 / -1. */
int ruler_sample_indices(uint64_t *rng, int n, int k, int *out);
int ruler_built_add_answer(ruler_built *b, const char *a);
void ruler_built_free(ruler_built *b);
/* Largest haystack size in [inc, max_n] (max_n <= 0: unbounded) that fits the length; 0 / -1. */
int ruler_fit(ruler_gen *g, ruler_build_fn build, int inc, uint64_t rng, int64_t gen_tokens, int hint, int max_n,
              int *out, char *err, size_t err_len);
/* Appends the sample built for index; query >= 0: its query-th question posed alone over the haystack (id
 * "<task>_<length>_<index>_q<query>", group "<task>_<length>_<index>"); 0 / -1 (OOM). */
int ruler_emit(ruler_gen *g, int index, int query, const ruler_built *b, int gen_tokens, kvb_samples *out);
/* The PRNG stream of sample index of a task (seed, task name, index). */
uint64_t ruler_stream(const ruler_opts *o, int index);
/* qa_1 / qa_2 (ruler_qa.c). */
int ruler_qa_generate(ruler_gen *g, kvb_samples *out, char *err, size_t err_len);

#endif
