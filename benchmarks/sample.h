/* sample.h — one benchmark sample as every loader and generator yields it, and the small helpers the
 * loaders share: a growable string, one-line error messages, a seeded PRNG (splitmix64), and the
 * (user, assistant) round builder.
 *
 * A sample is either a single prompt (`prompt`, LongBench, 2StageRetr, NIAH), or a dialogue (`turns` +
 * `question`, ShareGPT, multi-round recall), or both (LongMemEval: the official single-message prompt AND
 * the sessions' real rounds, so round-level methods see the rounds). `turns`, when present, always
 * alternate user, assistant, user, assistant, ... (an optional leading "system" turn aside), so
 * turns[2r], turns[2r+1] is round r; a message missing on one side is an empty string (see
 * kvb_sample_add_message). Every pointer is owned by the sample; kvb_sample_free releases them. */
#ifndef KVB_SAMPLE_H
#define KVB_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *role;    /* "system" | "user" | "assistant" */
    char *content;
    char *date;    /* LongMemEval: the session's date string; NULL otherwise */
    int session;   /* LongMemEval: 0-based index of the session in date order; -1 otherwise */
    int has_answer; /* LongMemEval: the turn carries has_answer: true (evidence); 0 otherwise */
} kvb_turn;

typedef struct {
    char *id;               /* stable id within the task (e.g. LongBench _id or line number, LongMemEval question_id) */
    char *task;             /* e.g. "hotpotqa", "longmemeval_oracle", "2stage", "niah", "recall", "sharegpt" */
    char *prompt;           /* single-prompt benchmarks: the rendered user prompt (official template filled),
                               else NULL */
    kvb_turn *turns; int n_turns;  /* multi-round benchmarks: history turns; each (user, assistant) pair is one round */
    char *question;         /* multi-round: the final user question; NIAH: the second user message; else NULL */
    char **answers; int n_answers;
    char **all_classes; int n_classes;
    int max_new_tokens;
    int ignore_eos;         /* 1 = generate max_new_tokens whatever the model says (a suite's "ignore_eos": timing) */
    int use_chat;           /* 1 = wrap in the model's chat template (LongBench: 0 for trec, triviaqa, samsum, lsht,
                               lcc, repobench-p) */
    int first_line;         /* 1 = cut the prediction to its first line before scoring (trec, triviaqa, samsum, lsht) */
    char *stop;             /* stop string or NULL (samsum: "\n") */
    int64_t length;         /* dataset's length field (LongBench-E bins), -1 if none; NIAH: context tokens */
    char *qtype;            /* LongMemEval question_type, NIAH "len=<L>,depth=<d>", recall "round=<r>" ... */
    int abstention;         /* LongMemEval _abs question */
    int ctx_tokens;         /* NIAH: target context length in tokens; 0 otherwise */
    double depth;           /* NIAH: needle depth percent */
    /* added fields */
    char *system;           /* system message of the official chat layout (NIAH, 2StageRetr), else NULL */
    char *prefill;          /* text the assistant turn starts with (OmniKV 2StageRetr), else NULL */
    char *context;          /* the long part of the prompt when the official code handles it apart: LongMemEval
                               history string (truncated from the end by the reader), NIAH haystack with the
                               needle (the first user message); else NULL */
    char *date;             /* LongMemEval question_date; else NULL */
    char *group;            /* context group: samples of one group share their context (the prompt up to the end
                               of `context`) and differ in the question (RULER niah_multiquery posed one query at a
                               time, InfiniteBench kv_retrieval with several queries per haystack); with the
                               question hidden the runner prefills the context once per group. NULL = its own */
    int carried;            /* 1: a turn of a conversation whose KV cache is kept from turn to turn (SCBench's
                               multi-turn KV cache reuse): the samples of its group are its turns in order, and the
                               runner prefills each turn on the cache the earlier ones left (shared_prefill.h) */
    char *difficulty;       /* LongBench v2: "easy" | "hard"; else NULL */
    char *domain;           /* LongBench v2: the question's domain ("Single-Document QA", ...); else NULL */
    /* a second question asked in the same cell after the first reply (LongBench v2 with CoT: 0shot_cot_ans.txt,
       as pred.py asks it): the runner replaces every followup_slot in followup by the first reply (str.strip()
       of it), generates again from that prompt (one user message, middle-cut like the first, same method and
       budget, followup_max_new tokens) and scores the second reply; NULL = one generation */
    char *followup;
    char *followup_slot;    /* the placeholder the first reply fills ("$COT$") */
    int followup_max_new;
} kvb_sample;

typedef struct { kvb_sample *v; int n, cap; } kvb_samples;

void kvb_sample_free(kvb_sample *s);   /* frees what s owns and zeroes it */
void kvb_samples_free(kvb_samples *s); /* frees every sample and the array, leaves {0} */

/* Zeroes s and sets the "absent" defaults (length -1). */
void kvb_sample_init(kvb_sample *s);
/* Appends s to v, taking ownership of its contents even on failure (then they are freed); 0 / -1 (OOM). */
int kvb_samples_push(kvb_samples *v, kvb_sample *s);
/* Frees v->v[from..n) and sets n = from (releasing the array when n becomes 0): how a loader undoes
 * its partial output on error, so a failed load into an empty set owns nothing. */
void kvb_samples_truncate(kvb_samples *v, int from);

/* Two samples of v[from..n) with the same id (a record's key is its id within the task: two would be one cell,
 * one result silently standing for both): 1 with *first < *second their indices (the pair whose second comes
 * earliest), 0 when the ids are distinct (NULL ids count as ""), -1 out of memory. */
int kvb_samples_find_dup_id(const kvb_samples *v, int from, int *first, int *second);

/* Appends a copy of a to the answers; 0 / -1. */
int kvb_sample_add_answer(kvb_sample *s, const char *a);
/* Appends one turn as given (copies role/content; date may be NULL); 0 / -1. */
int kvb_sample_add_turn(kvb_sample *s, const char *role, const char *content, const char *date);
/* Appends a message keeping the user/assistant alternation: a user message after a user message, or an
 * assistant message where a user one is due, gets an empty-content partner inserted first. "system" is
 * accepted only as the very first turn: returns 1 (and stores nothing) for a later one; 0 ok; -1 OOM. */
int kvb_sample_add_message(kvb_sample *s, const char *role, const char *content, const char *date);
/* Ends the rounds: a trailing user turn gets an empty assistant reply; 0 / -1. */
int kvb_sample_close_rounds(kvb_sample *s);
/* Number of complete (user, assistant) rounds in turns. */
int kvb_sample_n_rounds(const kvb_sample *s);

/* The follow-up's prompt after the first reply: s->followup with every s->followup_slot replaced by
 * kvb_py_strip(reply), left to right, the inserted text not searched again (str.replace); malloc'd, NULL on OOM
 * or when s has no follow-up. */
char *kvb_sample_followup_prompt(const kvb_sample *s, const char *reply);
/* Python's str.strip() on UTF-8 text (every str.isspace character at both ends); malloc'd, NULL on OOM. */
char *kvb_py_strip(const char *text);
/* Python's s.replace(from, to): every occurrence, left to right, the inserted text not searched again; from
 * non-empty; malloc'd, NULL on OOM. */
char *kvb_replace_all(const char *s, const char *from, const char *to);

/* strdup that returns NULL for NULL. */
char *kvb_strdup(const char *s);

/* Writes a one-line message (control characters become spaces) into err; safe with err NULL. */
void kvb_seterr(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Growable NUL-terminated string. Appends never fail loudly: an allocation failure sets oom and later
 * appends do nothing; kvb_sb_take returns NULL then. */
typedef struct { char *p; size_t n, cap; int oom; } kvb_sb;
void kvb_sb_add(kvb_sb *b, const char *s, size_t len);
void kvb_sb_adds(kvb_sb *b, const char *s);
void kvb_sb_addf(kvb_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *kvb_sb_take(kvb_sb *b); /* the string (caller frees; "" when nothing was added), NULL on OOM; resets b */
void kvb_sb_free(kvb_sb *b);

/* splitmix64: the generators' own PRNG, so a seed gives the same samples on every libc. */
uint64_t kvb_rng_next(uint64_t *state);
/* Uniform integer in [0, n) (n >= 1), without modulo bias. */
uint64_t kvb_rng_below(uint64_t *state, uint64_t n);

#endif
