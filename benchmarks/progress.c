/* progress.c — the runner's status line (see progress.h). The clock is the caller's, so tests can drive
 * the rate limit with made-up times. */
#include "benchmarks/progress.h"

void kvb_progress_init(kvb_progress *p, FILE *out, int tty, int quiet, double now_s) {
    *p = (kvb_progress){out, tty, quiet, 0.25, now_s, -1e300, 0, 0, 0};
}

void kvb_progress_note(kvb_progress *p, kvb_prog_kind kind, const char *what, double now_s) {
    if (p->quiet || !p->out) return;
    if (!p->tty && (kind == KVB_PROG_BEGIN || kind == KVB_PROG_STEP)) return;
    if (p->tty && kind == KVB_PROG_STEP && now_s - p->last_s < p->interval_s) return;
    p->last_s = now_s;
    double el = now_s - p->t_start;
    /* the ETA extrapolates this process's own pace: resumed records cost it nothing */
    double eta = p->ran > 0 ? el / (double)p->ran * (double)(p->total - p->finished) : 0;
    if (el < 0) el = 0;
    if (eta < 0) eta = 0;
    if (p->tty)
        fprintf(p->out, "\r[%ld/%ld] %3.0f%% elapsed %02ld:%02ld ETA %02ld:%02ld  %-72.72s", p->finished, p->total,
                p->total ? 100.0 * (double)p->finished / (double)p->total : 100.0, (long)el / 60, (long)el % 60,
                (long)eta / 60, (long)eta % 60, what ? what : "");
    else
        fprintf(p->out, "[%ld/%ld] %3.0f%% elapsed %02ld:%02ld ETA %02ld:%02ld  %s\n", p->finished, p->total,
                p->total ? 100.0 * (double)p->finished / (double)p->total : 100.0, (long)el / 60, (long)el % 60,
                (long)eta / 60, (long)eta % 60, what ? what : "");
    if (p->tty && kind == KVB_PROG_DONE) fputc('\n', p->out);
    fflush(p->out);
}
