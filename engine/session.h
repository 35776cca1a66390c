/* session.h — the one place a sample lives (DESIGN.md "Engine: Session").
 *
 * A prompt, cut into rounds (a dialogue's real rounds, or chunk-token rounds of a single prompt), is
 * prefilled round by round (kvb_ctx_begin_round, then the engine's chunks), the method ends the prefill
 * (compression) and its budget is verified; decode samples until the stop rule (end of generation, max new
 * tokens, a stop string such as samsum's newline), and the session measures what it cost: prefill and decode
 * time, phase breakdown, KV bytes per tier, bytes moved, tokens attended per layer. The runner, `generate`,
 * `serve`, `fidelity` and `bench` (both forms) drive samples through it; `calibrate` does not (it prefills
 * through its own context with capture hooks: methods/calibrate.c).
 *
 * A session owns its sample from the prefill on: the method's own prefill, the rounds, or the adoption of a
 * shared prefill (kvb_session_adopt), the end of prefill and the budget check (kvb_end_prefill, the one place
 * either happens), decode, the measurements and the final check. The caller makes the context (or forks a
 * shared one) and the method, and frees both after kvb_session_free.
 *
 * The engine does not know the method layer: a method plugs into a session through kvb_session_method
 * (methods/method.h kvb_method_seam fills it from the method's def), as it plugs into the forward pass
 * through kvb_hooks. */
#ifndef KVB_SESSION_H
#define KVB_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "engine/batch.h"
#include "engine/model.h"
#include "engine/profile.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

/* A prompt's ids and its rounds: round r covers [round_end[r-1], round_end[r]); the last round is the
 * question (whose answer is generated). */
typedef struct {
    int32_t *ids;
    int64_t n;
    int64_t *round_end;
    int n_rounds;
    int real_rounds; /* 1 = a dialogue's rounds, 0 = chunk-token rounds of a single prompt */
    int truncated;   /* tokens or rounds were dropped to fit (benchmarks/prompt.h) */
} kvb_rounds;

/* Cut r->ids[0, r->n) into chunk-token rounds from the start; the last, possibly shorter, chunk is the question
 * (a prompt of a whole number of chunks ends with a whole chunk). Replaces r->round_end. */
int kvb_rounds_chunk(kvb_rounds *r, int64_t chunk, char *err, size_t err_len);
/* Free ids and round_end. */
void kvb_rounds_free(kvb_rounds *r);

/* Measured KV of a context: device / host bytes of occupied slots (store + what the method holds). */
typedef struct {
    int64_t device_bytes, host_bytes, full_bytes; /* full = what full attention would hold now (a local layer: its window) */
    int64_t moved_h2d, moved_d2h;
    double device_frac;                            /* device / full */
} kvb_kv_usage;

/* What the session asks of a context's method; every pointer may be NULL (no method: full attention). */
typedef struct {
    void *self;
    /* prefill a single prompt itself (Round Attention's chunk rounds); NULL = the session's rounds */
    int (*prefill)(void *self, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len);
    /* take over what a shared prefill recorded (opaque to the engine: methods/method.h kvb_share), refusing one
     * that kept less than it needs; NULL = nothing to take over */
    int (*adopt)(void *self, kvb_ctx *c, const void *shared, char *err, size_t err_len);
    /* check the measured device KV against the method's claim (and, at the end of prefill, its budget) */
    int (*verify)(void *self, kvb_ctx *c, int end_of_prefill, char *err, size_t err_len);
    /* KV usage including what the method holds outside the store */
    void (*usage)(const void *self, const kvb_ctx *c, kvb_kv_usage *u);
} kvb_session_method;

/* The end of prefill, written once: the method compresses (kvb_ctx_end_prefill runs its after_prefill hook), then
 * its device KV is checked against its claim and budget (m->verify; m may be NULL). Every path that ends a prefill
 * comes here: kvb_session_prefill, kvb_session_adopt, and methods/method.h's kvb_method_prefill and
 * kvb_method_adopt (tests and tools outside a session). */
int kvb_end_prefill(kvb_ctx *c, const kvb_session_method *m, char *err, size_t err_len);

/* KV usage of the context's store alone. */
void kvb_ctx_kv_usage(const kvb_ctx *c, kvb_kv_usage *u);

typedef enum { KVB_FINISH_NONE = 0, KVB_FINISH_EOS, KVB_FINISH_LENGTH, KVB_FINISH_STOP } kvb_finish;

typedef struct {
    int max_new;                   /* tokens to generate */
    char *const *stop;             /* stop strings: generation ends at the first one, which is cut from the text */
    int n_stop;
    int ignore_eos;                /* end of generation does not stop (bench, --ignore-eos) */
    float temp, top_p;             /* temp 0 = greedy */
    uint64_t seed;
    /* choose the next token instead of the sampler (teacher forcing: fidelity feeds full attention's token) */
    int32_t (*pick)(void *user, const float *logits);
    int64_t chunk;                 /* prefill: at most this many tokens per forward call (0 = all at once) */
    int (*cancel)(void *user);     /* prefill: nonzero between chunks stops it ("cancelled") */
    /* phase "prefill" or "decode", done of total tokens (called per chunk / per token) */
    void (*progress)(void *user, const char *phase, int64_t done, int64_t total);
    void *user;
} kvb_gen_params;

typedef struct {
    kvb_ctx *c;                    /* borrowed */
    kvb_session_method m;
    kvb_gen_params p;
    kvb_sampler smp;
    tok_stream ts;
    int32_t *gen;                  /* generated ids [n_gen] */
    int n_gen, steps;              /* tokens generated; decode forward passes */
    int32_t first_eog;             /* the end-of-generation token when it came first, else -1 */
    kvb_finish finish;
    char *text;                    /* generated text so far (complete characters; stop string cut) */
    size_t text_n, text_cap;
    /* measured cost */
    double prefill_ms, decode_ms;  /* wall time of the prefill (shared part included) and of the decode loop */
    double t_decode0;
    kvb_kv_usage kv_prefill, kv_end;
    double attended;               /* mean tokens attended per KV head and layer over decode steps */
    double pre_phase_ms[PROF_PHASE_COUNT], dec_phase_ms[PROF_PHASE_COUNT];
} kvb_session;

/* A session on context c (its method, if any, through m; NULL = none). */
int kvb_session_init(kvb_session *s, kvb_ctx *c, const kvb_session_method *m, const kvb_gen_params *p, char *err,
                     size_t err_len);
void kvb_session_free(kvb_session *s);

/* Prefill rounds [r0, r->n_rounds) of r on c, stopping at token `end` (< r->n: the rest is prefilled later, e.g. a
 * hidden question): each round tagged (kvb_ctx_begin_round, the last is the question), forwarded in p->chunk
 * pieces with progress and cancel. Does not end the prefill. */
int kvb_prefill_rounds(kvb_ctx *c, const kvb_rounds *r, int r0, int64_t end, const kvb_gen_params *p, char *err,
                       size_t err_len);
/* The prompt from round r0 (r0 > 0: the context already holds the rounds before, e.g. a fork after a shared
 * history): the method's own prefill of a single prompt, or the rounds; then the end of prefill (the method
 * compresses) and its budget check. Adds the prefill's time to s->prefill_ms and measures what it left. */
int kvb_session_prefill(kvb_session *s, const kvb_rounds *r, int r0, char *err, size_t err_len);
/* The prefill of a single-round prompt in pieces (a server's prefill between decode steps): each call forwards at
 * most chunk more tokens from *done (which it advances); 1 while tokens remain, 0 once the prefill has ended (the
 * method compressed, its budget checked, as kvb_session_prefill), -1 on error. With chunk a multiple of the
 * context's n_batch the engine's own chunks, so the results, are kvb_session_prefill's. A prompt of real or several
 * rounds, or a method with its own prefill, is prefilled whole on the first call. */
int kvb_session_prefill_part(kvb_session *s, const kvb_rounds *r, int64_t chunk, int64_t *done, char *err,
                             size_t err_len);
/* The prompt was prefilled once for many methods (a shared prefill, forked into c): the method adopts what it
 * recorded (shared; m.adopt), the prefill ends (kvb_end_prefill), then the n_tail tokens `tail` are forwarded (a
 * hidden question, reaching the compressed cache only now, so the method never saw it). The prefill time is
 * shared_ms (the shared forward's share of this sample; 0 when it was reused) plus this call's. */
int kvb_session_adopt(kvb_session *s, const void *shared, double shared_ms, const int32_t *tail, int64_t n_tail,
                      char *err, size_t err_len);
/* n more prompt tokens after the end of prefill (a later turn of a conversation whose cache is kept): forwarded on
 * the method's cache as decode-time tokens are (the method compresses nothing more); their forward time and phases
 * are added to the prefill's, and the KV left is measured again. 0, or -1 + err. */
int kvb_session_append(kvb_session *s, const int32_t *ids, int64_t n, char *err, size_t err_len);
/* One step: sample, apply the stop rule, run the token through the model unless generation ends. 1 = a token
 * was generated (*piece: its new text, n bytes, may be 0), 0 = finished (s->finish says why), -1 = error. */
int kvb_session_step(kvb_session *s, const char **piece, size_t *n, char *err, size_t err_len);
/* One step of n sessions at once: each samples and applies its stop rule as kvb_session_step does, then the tokens
 * of those that go on run through the model as one batched step (kvb_batch_decode: their contexts share b's model
 * and backend). ret[i], piece[i], len[i]: what kvb_session_step would return and give for session i. 0, or -1 (the
 * error names the sequence; the step's sessions are then unusable). */
int kvb_session_step_batch(kvb_session *const *ss, int n, kvb_batch *b, int *ret, const char **piece, size_t *len,
                           char *err, size_t err_len);
/* Step until finished, then verify the method and measure the decode. */
int kvb_session_decode(kvb_session *s, char *err, size_t err_len);
/* After the last step: flush the text, verify the method's claim, measure KV, attention and decode phases. */
int kvb_session_finish(kvb_session *s, char *err, size_t err_len);
/* Decode ms per forward pass (0 when none ran). */
double kvb_session_ms_per_token(const kvb_session *s);

#endif
