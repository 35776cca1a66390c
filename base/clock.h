/* clock.h — the monotonic clock the runner's timings read. */
#ifndef KVB_CLOCK_H
#define KVB_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin: differences only). */
double kvb_now_s(void);

#endif
