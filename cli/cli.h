/* cli.h — shared pieces of the kvbench subcommands. Only cli/ decides to exit. */
#ifndef KVB_CLI_H
#define KVB_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "benchmarks/runner.h"
#include "cli/opts.h"
#include "engine/model.h"
#include "methods/method.h"

/* Subcommands: each returns the process exit code. */
int cmd_inspect(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_methods(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench_judge(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_bench_attn(int argc, char **argv);
int cmd_fidelity(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_history(int argc, char **argv);

/* Print "kvbench: <msg>" on stderr; returns 1 (the exit code for errors). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The engine options every running command takes (table entries CLI_ENGINE_OPTS(&o), help CLI_ENGINE_HELP):
 * --model, --threads, --ctx, --kv-type, --backend, --batch. */
typedef struct {
    const char *model;
    kvb_ctx_params ctx;
} cli_engine_opts;
void cli_engine_defaults(cli_engine_opts *o);
/* CLI_K_FN parsers: --backend cpu|cuda into a const char *, --kv-type f16|f32 into a kvb_dtype. */
int cli_fn_backend(void *dst, const char *opt, const char *v, char *err, size_t err_len);
int cli_fn_kv_type(void *dst, const char *opt, const char *v, char *err, size_t err_len);
/* CLI_K_FN parser: --prefill-gemm auto|int8|f32 into a kvb_prefill_gemm. */
int cli_fn_prefill_gemm(void *dst, const char *opt, const char *v, char *err, size_t err_len);
/* CLI_K_FN parser: --cuda-kernels attn=1|2|3|4|5,prefill=tc|tc2|cuda,gemv=1|2|3|4|5|6,probs=1|2,prefetch=1|2,graph=0|1
 * (any subset): sets the CUDA kernel switches for the process (the same as KVB_ATTN_KERNEL, KVB_PREFILL_TC,
 * KVB_GEMV_KERNEL, KVB_PROBS_KERNEL, KVB_ATTN_PREFETCH and KVB_CUDA_GRAPH, which stay the defaults); an error in a
 * build without CUDA. dst is unused. */
int cli_fn_cuda_kernels(void *dst, const char *opt, const char *v, char *err, size_t err_len);
#define CLI_ENGINE_OPTS(o)                                                                                         \
    CLI_STR("--model", &(o)->model), CLI_INT("--threads", &(o)->ctx.n_threads, 1, 256),                            \
        CLI_INT("--ctx", &(o)->ctx.n_ctx, 1, 1 << 24), CLI_FN("--kv-type", &(o)->ctx.kv_dtype, cli_fn_kv_type),    \
        CLI_FN("--backend", &(o)->ctx.backend, cli_fn_backend), CLI_INT("--batch", &(o)->ctx.n_batch, 1, 65536), \
        CLI_FN("--prefill-gemm", &(o)->ctx.prefill_gemm, cli_fn_prefill_gemm),                                   \
        CLI_FN("--cuda-kernels", NULL, cli_fn_cuda_kernels)
#define CLI_ENGINE_HELP                                                                                  \
    "  --model PATH|default   GGUF model (default: SmolLM2-135M-Instruct Q4_1 from scripts/fetch-model.sh)\n" \
    "  --threads N            CPU threads (default: $KVB_THREADS, else the usable cores)\n"                 \
    "  --ctx N                context size in tokens: the most a prompt and its generation may take\n"          \
    "                         (default: the model's training context)\n"           \
    "  --kv-type f16|f32      KV cache element type (default f16)\n"                                      \
    "  --backend cpu|cuda     where the forward pass runs (default cpu, or $KVB_BACKEND)\n"                                      \
    "  --batch N              prefill chunk size in tokens (default 512)\n" CLI_PREFILL_GEMM_HELP CLI_CUDA_KERNELS_HELP
#define CLI_CUDA_KERNELS_HELP                                                                            \
    "  --cuda-kernels SPEC    CUDA kernels, any of attn=1|2|3|4|5,prefill=tc|tc2|cuda,gemv=1|2|3|4|5|6,probs=1|2,\n"       \
    "                         prefetch=1|2 (decode v4's L2 prefetch, tiles ahead; a candidate, off by default),\n" \
    "                         graph=0|1 (each decode step launched as one CUDA graph; a candidate, off by default)\n" \
    "                         (defaults: attn=4,prefill=tc2,gemv=5 [v4 from 8192 rows, else v1],probs=2, or\n"    \
    "                         $KVB_ATTN_KERNEL, $KVB_PREFILL_TC, ...);\n"                                          \
    "                         bench prints them, run.json and the record fingerprint name them\n"
#define CLI_PREFILL_GEMM_HELP                                                                            \
    "  --prefill-gemm MODE    CPU prefill matmuls over 32+ tokens: f32 = the weights dequantized a panel at a\n"  \
    "                         time into an OpenBLAS sgemm; int8 = llama.cpp's integer order; auto (default) =\n"  \
    "                         f32 with an f16 KV cache, int8 with an f32 one (the llama.cpp-exact mode)\n"

/* Load the model named by o->model ("default" or a path); prints the error and returns NULL on failure. */
kvb_model *cli_load_model(const cli_engine_opts *o);

/* The method options (table entries CLI_METHOD_OPTS(&o), help CLI_METHOD_HELP): --method NAME, --budget B,
 * --method-opt K=V (repeatable). */
typedef struct {
    const char *method;
    kvb_budget budget;
    kvb_opts opts;
} cli_method_opts;
void cli_method_defaults(cli_method_opts *o);
/* CLI_K_FN parsers: --method NAME (a registered method) into a const char *, --budget into a kvb_budget,
 * --method-opt K=V added to a kvb_opts. */
int cli_fn_method(void *dst, const char *opt, const char *v, char *err, size_t err_len);
int cli_fn_budget(void *dst, const char *opt, const char *v, char *err, size_t err_len);
int cli_fn_method_opt(void *dst, const char *opt, const char *v, char *err, size_t err_len);
/* --compression-ratio R (kvpress's: remove R of the prompt's KV) into a kvb_budget: --budget (1 - R) x 100%. Given
 * with --budget, the later one wins, as any option given twice. */
int cli_fn_compression_ratio(void *dst, const char *opt, const char *v, char *err, size_t err_len);
/* A --method-opt M:K=V whose M is no registered method (it would apply to nothing): -1 with the reason in err,
 * else 0 */
int cli_method_opt_prefix_check(const char *v, char *err, size_t err_len);
#define CLI_METHOD_OPTS(o)                                                                                         \
    CLI_FN("--method", &(o)->method, cli_fn_method), CLI_FN("--budget", &(o)->budget, cli_fn_budget),              \
        CLI_FN("--compression-ratio", &(o)->budget, cli_fn_compression_ratio),                                     \
        CLI_FN("--method-opt", &(o)->opts, cli_fn_method_opt)
/* In a help text, where cli_parse prints the registered methods (kvb_method_names) */
#define CLI_METHODS_HERE "@METHODS@"
#define CLI_METHOD_HELP                                                                                  \
    "  --method NAME          KV-cache method: " CLI_METHODS_HERE "\n"                                      \
    "  --budget B             KV budget: 30% (share of the full cache's bytes) or N tokens per layer and head\n" \
    "  --compression-ratio R  kvpress's: remove R of the prompt's KV, = --budget (1-R)x100% (0.75 = 25%)\n"       \
    "  --method-opt K=V       a method parameter (repeatable; see README \"Methods\")\n"

/* Before a command runs methods names[0..n) (options from raw --method-opt values): each calibration profile section
 * they read that the model lacks is made, once, as `kvbench run` does (benchmarks/runcal.h: progress and result on
 * stderr, tables in a /tmp folder the result line names); with refuse (--no-calibrate) a missing one is an error
 * naming `kvbench calibrate KIND`. A model without a tokenizer (synthetic:) is left alone: its methods then name the
 * option that stands in for the profile. 0, or 1 after one line on stderr. */
int cli_calibrate_methods(const char *who, kvb_model *m, const kvb_ctx_params *cp, char *const *names, int n,
                          const char *const *raw, int n_raw, int refuse);

/* One line of measured KV: device / host bytes, share of full, bytes moved. */
void cli_print_kv_usage(const kvb_method *m, const kvb_ctx *c, const char *when, FILE *out);

/* The byte bound of a decode step (cli/bound.c): the bytes of every matmul weight as the backend reads them
 * (discrete: f16 copies; else the file's blocks), the K+V bytes of one token over all layers and KV heads, and
 * the backend's device-to-device copy rate in GB/s (bytes read + written per second; 0 = not measured).
 * cli_copy_gbs_for creates the named backend for the measurement and says whether it is discrete. */
double cli_step_weight_bytes(const kvb_model *m, int discrete);
double cli_kv_token_bytes(const kvb_config *c, kvb_dtype kv);
double cli_copy_gbs(kvb_backend *be, size_t bytes);
/* The rate of the backend's `copy` in direction dir (D2D: read + written bytes; H2D: from the pinned host tier,
 * the bytes that crossed), best of 5 after a warm-up, in GB/s; 0 = not measured. Not counted in be->traffic. */
double cli_copy_rate(kvb_backend *be, kvb_copy_dir dir, size_t bytes);
/* D2D rate when the backend is discrete or force; with want_h2d also the H2D rate into *h2d_gbs. */
double cli_copy_gbs_for(const char *backend, int n_threads, int force, int want_h2d, int *discrete, double *h2d_gbs);

/* Monotonic clock in seconds. */
double cli_now(void);
/* The most a prompt file may hold: --prompt-file /dev/zero or a pipe that never ends is refused at this size
 * instead of growing memory without bound (64 MiB is ~16M tokens, past any model's context). */
#define CLI_MAX_PROMPT_FILE_BYTES ((size_t)64 << 20)
/* Read a whole file (a prompt: at most CLI_MAX_PROMPT_FILE_BYTES); NULL + message on failure. */
char *cli_read_file(const char *path, size_t *len);
/* The directory holding scripts/ (KVB_SOURCE_DIR env, else the source tree this binary was built from). */
const char *cli_source_dir(void);

#endif
