/* runopts.h — what the runner's engine options and --dump-kept mean for a cell's context (runner.h). */
#ifndef KVB_RUNOPTS_H
#define KVB_RUNOPTS_H

#include <stdio.h>

#include "benchmarks/runner.h"
#include "engine/kept.h"
#include "methods/method.h"

/* The contexts' parameters: the defaults with the run's engine settings (threads, KV type, backend, chunk). */
kvb_ctx_params kvb_run_ctx_params(const kvb_run_opts *o);
/* What of the engine settings changes results, for the fingerprints ("kv=f32 backend=cuda gemm=int8 ctx=4096";
 * "" = the defaults). */
void kvb_run_engine_fingerprint(const kvb_run_opts *o, char *out, size_t cap);
/* --dump-kept (run's cells, generate): at "prefill" a header line ({"method", "budget", "params", "sample" and "cell"
 * when given, "n_prompt", "prompt_ids" when ids are given: c->n_past of them}), then the kept positions
 * (engine/kept.h). k NULL: nothing. 0, or -1 + err. */
int kvb_run_kept_note(FILE *out, kvb_kept *k, kvb_ctx *c, const kvb_method *m, const char *budget, const char *sample,
                      const char *cell, const int32_t *ids, const char *when, char *err, size_t err_len);

#endif
