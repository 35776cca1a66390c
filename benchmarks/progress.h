/* progress.h — the suite runner's progress on stderr. On a terminal one status line is rewritten in place:
 * at each sample's start and end, and within a sample (prefill chunks, decode tokens) at most every
 * interval_s, so a long sample never looks stuck and a fast one never floods. In a log (not a terminal) it
 * writes one line per finished sample, with what the sample cost, so a log stays short and greppable. */
#ifndef KVB_PROGRESS_H
#define KVB_PROGRESS_H

#include <stdio.h>

typedef enum {
    KVB_PROG_BEGIN, /* a sample starts */
    KVB_PROG_STEP,  /* work within the sample: rate-limited, terminal only */
    KVB_PROG_END,   /* a sample is done (what = its summary) */
    KVB_PROG_DONE   /* the run is done */
} kvb_prog_kind;

typedef struct {
    FILE *out;
    int tty, quiet;
    double interval_s;            /* least time between two STEP updates on a terminal */
    double t_start, last_s;       /* seconds on the caller's clock */
    long total, finished, ran;    /* records: in the run, recorded (resumed ones included), made by this process */
} kvb_progress;

/* Set up progress on out; tty selects in-place updates; quiet writes nothing. */
void kvb_progress_init(kvb_progress *p, FILE *out, int tty, int quiet, double now_s);
/* Report one event at time now_s (see kvb_prog_kind); what names the sample or the step. */
void kvb_progress_note(kvb_progress *p, kvb_prog_kind kind, const char *what, double now_s);

#endif
