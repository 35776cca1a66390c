/* shared_prefill.h — the runner's one exact prefill per sample, shared by every method x budget cell that
 * compresses after prefill (each cell forks it and adopts its statistics), and, with the question hidden, by
 * every question of a context group (kvb_sample.group: RULER niah_multiquery posed one query at a time,
 * InfiniteBench kv_retrieval with several queries per haystack), as kvpress's pipeline and SCBench do: the
 * context is prefilled once and each question starts from the same cache, so the adoption, which sees only the
 * context, gives every question the same kept set. The turns of a carried conversation (SCBench's multi-turn KV
 * cache reuse) share the first turn's prefill the same way: each turn's cell adopts it (the method compresses the
 * first turn's prompt, its question seen), then the later turns' pieces are appended uncompressed, as SCBench's
 * cache appends follow-up turns, and the turn decodes on that cache.
 *
 * Why the exact prefill and not a compressed snapshot: kvb_ctx_fork copies the KV store but not a method's hooks
 * or state, so a snapshot after compression would lose what stateful methods keep after prefill (H2O's scores,
 * Quest's pages, OmniKV's selection); re-adopting the exact prefill per question costs a fork, not a prefill. */
#ifndef KVB_SHARED_PREFILL_H
#define KVB_SHARED_PREFILL_H

#include "benchmarks/prompt.h"
#include "benchmarks/sample.h"
#include "engine/profile.h"
#include "engine/session.h"
#include "methods/method.h"

typedef struct {
    kvb_prompt p;         /* the current sample's prompt */
    kvb_ctx *base, *hist; /* after the whole prompt (hidden: the context); after the history rounds (for round) */
    kvb_share *share;
    int hidden;           /* the question is hidden: prompt ids [0, split) are the context, prefilled and shared */
    int64_t split;
    int obs_window, prefill_scores; /* what the share records (the union of the cells' needs) */
    double prefill_ms, hist_ms;     /* the shared forward's time (of its first sample) */
    double scorer_ms;               /* of prefill_ms: KVzap's scorer run for the cells reading it (the share's) */
    double pre_phase_ms[PROF_PHASE_COUNT];
    int64_t own;          /* a carried turn (kvb_sample.carried) after the first: where its own piece starts; the
                           * pieces [split, own) of the earlier turns rebuild the cache they left (0 otherwise) */
    char *group;          /* hidden or carried: the group the prefill belongs to (kvb_sample.group), else NULL */
    int reused;           /* out: this sample reuses the prefill of an earlier question of its group */
} kvb_shared_prefill;

/* How the runner prefills: the model, its contexts' parameters, the longest context it may make (n_ctx), the
 * single prompts' round size, progress reporting (gp.progress, gp.user), and the prompt builder of the sample's
 * benchmark (its registry row's; NULL: kvb_prompt_build, by the sample's shape). */
typedef struct {
    kvb_model *model;
    kvb_ctx_params cp;
    int n_ctx, round_chunk;
    kvb_gen_params gp;
    kvb_prompt_fn prompt;
} kvb_prefill_env;

/* The prefill of sample s for cells needing u (their union), leaving sp->p the sample's prompt. A carried turn
 * (kvb_sample.carried) is built as its conversation's pieces (hidden.h kvb_carried_build) and split after the first
 * turn's piece, so every turn of a group reuses the first turn's prefill, as hidden questions do. With hidden set,
 * a prefill kept in sp from an earlier sample is reused (sp->reused = 1) when both samples are of the same group
 * with identical context ids, it records what u needs, and its context holds the new question and answer;
 * otherwise sp is freed and the prompt (its context only when hidden) prefilled. 0, or -1 + err (sp is then
 * still freed by kvb_shared_prefill_free). */
int kvb_shared_prefill_run(const kvb_prefill_env *e, const kvb_sample *s, int hidden, const kvb_method_needs *u,
                           int max_new, kvb_shared_prefill *sp, char *err, size_t err_len);
/* The same for a bare prompt of n ids as one round (`kvbench bench`: a synthetic prompt), so bench's cells take the
 * run's path: one prefill, each method's context forked from it (kvb_shared_prefill_adopt). */
int kvb_shared_prefill_ids(const kvb_prefill_env *e, const int32_t *ids, int64_t n, const kvb_method_needs *u,
                           int max_new, kvb_shared_prefill *sp, char *err, size_t err_len);
/* The forward tokens the sample's records count as prefilled: the whole prompt, or only the question (a carried
 * turn: its own piece) when the context's prefill was reused. */
int64_t kvb_shared_prefill_tokens(const kvb_shared_prefill *sp);
/* A cell's session (its context forked from sp->base, its method installed) takes the shared prefill over: the
 * method adopts it and the prefill ends (compression, budget check), then the rest of the prompt after sp->split
 * is forwarded on the compressed cache, which the method never saw (a hidden question; a carried turn's pieces).
 * shared_ms: the shared forward's share of this sample (kvb_session_adopt). A carried turn whose group's prefill
 * was reused counts only its own piece's forward as its prefill: the compression and the earlier turns' pieces
 * rebuild the cache those turns' records already paid for (SCBench keeps that cache between turns; kvbench
 * rebuilds it, as a fork cannot copy a method's state). 0, or -1 + err. */
int kvb_shared_prefill_adopt(kvb_session *ses, const kvb_shared_prefill *sp, double shared_ms, char *err, size_t err_len);
/* The shared forward's time a cell of needs nd is charged: prefill_ms, less the scorer's time for a cell that does
 * not read its scores (full attention does not pay for KVzap's scorer). */
double kvb_shared_prefill_cell_ms(const kvb_shared_prefill *sp, const kvb_method_needs *nd);
/* Frees everything sp holds and zeroes it. */
void kvb_shared_prefill_free(kvb_shared_prefill *sp);

#endif
