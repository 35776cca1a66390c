/* main.c — the kvbench command: subcommand dispatch and the helpers the subcommands share. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "benchmarks/provenance.h"
#ifdef KVB_HAVE_CUDA
#include "kernels/cuda/attention.h"
#endif

int cmd_bench_serve(int argc, char **argv); /* cli/cmd_bench_serve.c */
int cmd_export(int argc, char **argv);      /* cli/cmd_export.c */

#ifndef KVB_SOURCE_DIR
#define KVB_SOURCE_DIR "."
#endif

static const char *USAGE =
    "kvbench — KV-cache methods for long-context LLM inference, measured in one native engine\n"
    "\n"
    "usage: kvbench <command> [options]\n"
    "\n"
    "commands:\n"
    "  inspect MODEL        print a GGUF file's metadata and tensor table\n"
    "  generate             run a prompt through the model and print the continuation and tokens/s\n"
    "  bench                prefill and decode tokens/s at several contexts, beside llama.cpp when installed\n"
    "  run SUITE            run or resume a suite (configs/quick.json): methods x budgets x tasks x samples\n"
    "  report RUN_DIR       write summary.csv, report.md and charts of a run\n"
    "  compare BASE NEW     Markdown diff of two runs; exit 1 on a regression beyond the tolerances\n"
    "  merge OUT DIR...     join shard run directories (run --shard i/N) into one run and report it\n"
    "  export --kvpress RUN_DIR OUT  a run in kvpress's evaluation layout (predictions, metrics, config per press/ratio)\n"
    "  history RUN_DIR...   history.md and an SVG trend per method@budget over runs' dates and commits\n"
    "  serve                OpenAI-compatible chat-completions server on the engine (any method per request)\n"
    "  bench-attention      decode attention GB/s vs a copy: the GPU (beside PyTorch SDPA) or --backend cpu\n"
    "  bench-judge          judgments/s of the judge client against a local kvbench serve, by concurrency\n"
    "  bench-serve          requests/s and tokens/s per method on a fixed KV pool, continuous batching, N clients\n"
    "  calibrate KIND       model profiles for round (watershed layer), omnikv (filter layers), pod (layer blocks),\n"
    "                       qfilter (query directions per head), duo (retrieval-head scores on passkey prompts)\n"
    "  fidelity             methods teacher-forced against full attention: top-1 agreement, KL, attention recall\n"
    "  help                 this text; `kvbench <command> --help` explains a command\n"
    "  --version            the commit this binary was built from and its build flags\n"
    "\n"
    "MODEL is a GGUF path, `default` (SmolLM2-135M-Instruct Q4_1), `qwen2.5-coder-0.5b` (Qwen2.5-Coder-0.5B-Instruct,\n"
    "32K context) or `gemma-3-270m` (Gemma-3-270M Q4_K_M, 32K context, sliding window), each fetched by\n"
    "scripts/fetch-model.sh [NAME].\n";

int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kvbench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

void cli_engine_defaults(cli_engine_opts *o) {
    o->model = "default";
    o->ctx = kvb_ctx_default_params();
}

int cli_fn_backend(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    if (strcmp(v, "cpu") && strcmp(v, "cuda"))
        return snprintf(err, err_len, "%s must be cpu or cuda, got '%s'", opt, v), -1;
    *(const char **)dst = v;
    return 0;
}

int cli_fn_kv_type(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    if (strcmp(v, "f16") && strcmp(v, "f32"))
        return snprintf(err, err_len, "%s must be f16 or f32, got '%s'", opt, v), -1;
    *(kvb_dtype *)dst = strcmp(v, "f16") ? KVB_F32 : KVB_F16;
    return 0;
}

int cli_fn_prefill_gemm(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    static const char *const names[] = {"auto", "int8", "f32"}; /* kvb_prefill_gemm order */
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) return *(kvb_prefill_gemm *)dst = (kvb_prefill_gemm)i, 0;
    return snprintf(err, err_len, "%s must be auto, int8 or f32, got '%s'", opt, v), -1;
}

int cli_fn_cuda_kernels(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    (void)dst; /* process-wide switches: set now, before any context exists; run.json and the fingerprint name them */
#ifdef KVB_HAVE_CUDA
    int attn = 0, tc = -1, gemv = 0, probs = 0, prefetch = 0, graph = -1;
    char spec[128];
    if (strlen(v) >= sizeof spec) return snprintf(err, err_len, "%s: '%.40s...' is too long", opt, v), -1;
    snprintf(spec, sizeof spec, "%s", v);
    for (char *save = NULL, *kv = strtok_r(spec, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        const char *val = eq ? eq + 1 : "";
        if (eq) *eq = 0;
        const int digit = val[0] >= '1' && val[0] <= '9' && !val[1] ? val[0] - '0' : 0;
        if (!strcmp(kv, "attn") && digit >= 1 && digit <= 5) attn = digit; /* 5: FlashInfer (flashinfer.h) */
        else if (!strcmp(kv, "prefill") && (!strcmp(val, "tc") || !strcmp(val, "tc2") || !strcmp(val, "cuda")))
            tc = !strcmp(val, "tc") ? 1 : !strcmp(val, "tc2") ? 2 : 0;
        else if (!strcmp(kv, "gemv") && digit >= 1 && digit <= 6) gemv = digit; /* 6: a candidate */
        else if (!strcmp(kv, "probs") && digit >= 1 && digit <= 2) probs = digit;
        else if (!strcmp(kv, "prefetch") && digit >= 1 && digit <= 2) prefetch = digit; /* v4's L2 prefetch, a candidate */
        else if (!strcmp(kv, "graph") && (!strcmp(val, "0") || !strcmp(val, "1"))) graph = val[0] - '0'; /* a candidate */
        else
            return snprintf(err, err_len,
                            "%s: '%s%s%s' is not one of attn=1|2|3|4|5, prefill=tc|tc2|cuda, gemv=1|2|3|4|5|6, probs=1|2, "
                            "prefetch=1|2, graph=0|1",
                            opt, kv, eq ? "=" : "", val), -1;
    }
    if (attn) kvb_cuda_attention_set_kernel(attn);
    if (tc >= 0) kvb_cuda_attention_set_prefill_tc(tc);
    if (gemv) kvb_cuda_set_gemv_kernel(gemv);
    if (probs) kvb_cuda_attention_set_probs_kernel(probs);
    if (prefetch) kvb_cuda_set_attn_prefetch(prefetch);
    if (graph >= 0) kvb_cuda_set_graph(graph);
    return 0;
#else
    (void)v;
    return snprintf(err, err_len, "%s: this build has no CUDA backend", opt), -1;
#endif
}

kvb_model *cli_load_model(const cli_engine_opts *o) {
    char path[1024], err[512];
    if (kvb_model_resolve(o->model, path, sizeof path, err, sizeof err)) {
        cli_fail("%s", err);
        return NULL;
    }
    kvb_model *m = kvb_model_load(path, err, sizeof err);
    if (!m) cli_fail("%s", err);
    return m;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_fail("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        if (n > CLI_MAX_PROMPT_FILE_BYTES) { /* the buffer grows to one byte past the limit at most */
            free(buf);
            fclose(f);
            cli_fail("%s is larger than %zu MiB, the limit for a prompt file (CLI_MAX_PROMPT_FILE_BYTES)", path,
                     CLI_MAX_PROMPT_FILE_BYTES >> 20);
            return NULL;
        }
        size_t new_cap = cap * 2 < CLI_MAX_PROMPT_FILE_BYTES + 1 ? cap * 2 : CLI_MAX_PROMPT_FILE_BYTES + 1;
        char *nb = realloc(buf, new_cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap = new_cap;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        cli_fail("cannot read %s", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

const char *cli_source_dir(void) {
    const char *d = getenv("KVB_SOURCE_DIR");
    return d && *d ? d : KVB_SOURCE_DIR;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        puts(kvb_provenance_version());
        return 0;
    }
    static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
    } COMMANDS[] = {{"inspect", cmd_inspect}, {"generate", cmd_generate}, {"bench", cmd_bench}, {"run", cmd_run},
                    {"report", cmd_report}, {"compare", cmd_compare}, {"merge", cmd_merge}, {"history", cmd_history},
                    {"serve", cmd_serve}, {"bench-judge", cmd_bench_judge}, {"calibrate", cmd_calibrate},
                    {"fidelity", cmd_fidelity}, {"bench-attention", cmd_bench_attn},
                    {"bench-serve", cmd_bench_serve}, {"export", cmd_export}};
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof COMMANDS / sizeof *COMMANDS; i++)
        if (!strcmp(cmd, COMMANDS[i].name)) return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvbench: unknown command '%s' (see `kvbench help`)\n", cmd);
    return 2;
}
