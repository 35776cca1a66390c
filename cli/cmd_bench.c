/* cmd_bench.c — `kvbench bench`: prefill and decode speed at several contexts, with llama.cpp's figures
 * from the same run beside ours when llama-cpp-python is installed (scripts/llamacpp_bench.py), and with
 * --torch PyTorch's prefill (scripts/torch_bench.py, transformers on the same GGUF). All engines see the same
 * token ids (id_i = 1000 + (i*7919) mod 40000), so the work is identical. A model without a tokenizer
 * (synthetic:<shape>) gets seeded random ids and no llama.cpp run.
 *
 * On a GPU backend, and with --torch on a synthetic model, the peer is PyTorch on the model's shapes instead
 * (scripts/torch_synth_bench.py: transformers' Llama, Mistral, Qwen2, Qwen3 or Gemma-3 built from the config with
 * random weights, SDPA, f16 on the GPU): TTFT and decode ms/token at the same contexts, in the same run. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli/cli.h"
#include "engine/sampler.h"
#include "engine/synthetic.h"

static const char *HELP =
    "usage: kvbench bench [--model PATH|default|synthetic:SHAPE] [--contexts 512,2048,8000] [-n 64] [--reps R]\n"
    "                     [--no-peer] [--torch] [--python PY] [--torch-python PY]\n"
    "\n"
    "For each context length: prefill a prompt of that many tokens, then decode N greedy tokens; prints\n"
    "prefill and decode tokens/s (best of R repetitions, default 1). Then runs llama.cpp on the same token\n"
    "ids with the same thread count and KV type (via scripts/llamacpp_bench.py, when llama-cpp-python is\n"
    "importable) and prints the ratios (llama.cpp runs once, at its own prefill batch of 512, whatever --reps\n"
    "and --batch say). --no-peer skips llama.cpp. --torch also times PyTorch's prefill\n"
    "on the same ids (transformers loading the same GGUF, float32, SDPA, the same thread count;\n"
    "scripts/torch_bench.py).\n"
    "On a GPU backend the peer is PyTorch instead (unless --no-peer): transformers' model of the same shapes\n"
    "with random f16 weights on the same GPU, attn_implementation=sdpa (scripts/torch_synth_bench.py), timing\n"
    "TTFT and decode ms/token at the same contexts; --torch on a synthetic model runs it on the CPU (f32).\n"
    "--json FILE also writes the figures as JSON.\n"
    "\n"
    "options:\n"
    "  --contexts LIST        comma-separated prompt lengths (default 512,2048,8000)\n"
    "  --ctx-len N            one prompt length (the same as --contexts N)\n"
    "  -n N                   decode steps per context (default 64)\n"
    "  --reps R               repetitions, best kept (default 1)\n"
    "  --no-peer              do not run llama.cpp\n"
    "  --torch                also run PyTorch's prefill (needs torch, transformers and gguf for PY)\n"
    "  --python PY            the Python that runs the peers (default $KVB_PEER_PYTHON or python3), e.g. a\n"
    "                         throwaway venv holding llama-cpp-python / torch\n"
    "  --torch-python PY      the Python for PyTorch alone (default: --python's)\n"
    "  --json FILE            write results as JSON\n"
    "  --profile              print the phase breakdown of the last context\n"
    "  --bound                show the decode byte bound on the CPU too (always shown on a GPU): bytes a step\n"
    "                         must read (every matmul weight as held + the K/V rows of the context) over the\n"
    "                         backend's device copy rate measured in this run. On the CPU that rate is one\n"
    "                         thread's memmove, so a decode on more threads can pass 100%\n"
    "\n"
    "With --method M[,M...] it benchmarks KV-cache methods instead (see `kvbench bench --method all --help`).\n"
    "--model synthetic:SHAPE[?layers=N&seed=S&ctx=N] measures a model of that shape with seeded random F16\n"
    "weights and random token ids, without a weights file (shapes: llama3-8b, llama3.1-8b, mistral-7b,\n"
    "qwen2.5-7b, qwen3-8b, gemma3-4b, smollm2-135m, tiny).\n"
    CLI_ENGINE_HELP;

enum { MAX_CTX = 16 };

typedef struct {
    long ctx;
    double prefill_tok_s, decode_tok_s;
    double peer_prefill_tok_s, peer_decode_tok_s;
    double torch_prefill_tok_s;
    double torch_ttft_s, torch_decode_ms; /* the shape peer (torch_synth_bench.py) */
    char torch_err[48];                   /* its one-word reason when a context did not run ("out of memory") */
    double step_bytes, bound_ms;          /* the decode step's byte bound (cli/bound.c); 0 = not shown */
} bench_row;

/* A peer engine run by a script of scripts/ that prints {"version", "kv", "results": [{ctx, prefill_tok_s,
 * decode_tok_s}]}; exit 3 = not installed. */
typedef enum { PEER_LLAMA, PEER_TORCH_GGUF, PEER_TORCH_SHAPE } peer_kind;
typedef struct {
    const char *label, *script, *install;
    peer_kind kind; /* which columns of bench_row it fills */
} bench_peer;

static int bench_one(kvb_model *m, const kvb_ctx_params *base, long n_prompt, long n_dec, int profile, bench_row *row) {
    char err[512];
    kvb_ctx_params p = *base;
    p.n_ctx = (int)(n_prompt + n_dec + 1);
    p.kv_reserve = p.n_ctx; /* no growth copy inside the timed decode */
    p.profile = profile;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    if (!c) return cli_fail("bench: %s", err);
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    if (!ids) {
        kvb_ctx_free(c);
        return cli_fail("bench: out of memory");
    }
    if (m->tok)
        for (long i = 0; i < n_prompt; i++) ids[i] = (int32_t)(1000 + (i * 7919) % 40000);
    else
        syn_random_ids(0, m->cfg.n_vocab, ids, n_prompt);
    kvb_session ses;
    kvb_rounds prompt = {.ids = ids, .n = n_prompt};
    kvb_gen_params gp = {.max_new = (int)n_dec + 1, .ignore_eos = 1}; /* n_dec decode steps */
    int rc = kvb_session_init(&ses, c, NULL, &gp, err, sizeof err) || kvb_rounds_chunk(&prompt, 0, err, sizeof err) ||
             kvb_session_prefill(&ses, &prompt, 0, err, sizeof err) || kvb_session_decode(&ses, err, sizeof err);
    double t_pre = ses.prefill_ms / 1e3, t_dec = ses.decode_ms / 1e3;
    kvb_session_free(&ses);
    free(prompt.round_end);
    if (rc) {
        free(ids);
        kvb_ctx_free(c);
        return cli_fail("bench: %s", err);
    }
    double pre = n_prompt / t_pre, dec = n_dec > 0 ? n_dec / t_dec : 0;
    if (pre > row->prefill_tok_s) row->prefill_tok_s = pre;
    if (dec > row->decode_tok_s) row->decode_tok_s = dec;
    if (profile) prof_print_table(c->prof, stderr);
    free(ids);
    kvb_ctx_free(c);
    return 0;
}

/* The shape peer's arguments: the model's config, where it runs and in what type. */
static void shape_args(char *out, size_t cap, const kvb_config *c, int on_gpu) {
    const char *dev = getenv("KVB_CUDA_DEVICE");
    char where[64];
    if (on_gpu)
        snprintf(where, sizeof where, "--device cuda:%d --dtype f16", dev && *dev ? atoi(dev) : 0);
    else
        snprintf(where, sizeof where, "--device cpu --dtype f32");
    const char *arch = !strcmp(c->arch, "qwen2") || !strcmp(c->arch, "qwen3") || !strcmp(c->arch, "gemma3") ? c->arch
                                                                                                             : "llama";
    char extra[128] = "";
    if (c->n_swa > 0)
        snprintf(extra, sizeof extra, " --window %d --swa-base %.9g", c->n_swa,
                 c->rope_freq_base_swa > 0 ? c->rope_freq_base_swa : c->rope_freq_base);
    if (c->rope.freq_scale > 0.0f && c->rope.freq_scale != 1.0f) {
        size_t l = strlen(extra);
        snprintf(extra + l, sizeof extra - l, " --rope-linear %.9g", 1.0 / c->rope.freq_scale);
    }
    snprintf(out, cap,
             "--arch %s --layers %d --embd %d --heads %d --kv-heads %d --head-dim %d --ff %d --vocab %d "
             "--rope-base %.9g --rms-eps %.9g%s%s %s",
             arch, c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->head_dim, c->n_ff, c->n_vocab,
             c->rope_freq_base, c->rms_eps, c->tied_output ? " --tied" : "", extra, where);
}

/* Run a peer on the same ids (or, the shape peer, the same shapes) and thread count; fills its figures.
 * 0 = ran, 1 = unavailable (message printed). */
static int run_peer(const bench_peer *pe, const char *python, const char *model_path, const kvb_config *cfg,
                    int on_gpu, bench_row *rows, int n_rows, long n_dec, int n_threads, const char *kv, long reps) {
    char cmd[4096], list[512] = "", shape[512];
    for (int i = 0; i < n_rows; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%ld", i ? "," : "", rows[i].ctx);
    }
    if (pe->kind == PEER_TORCH_GGUF) {
        snprintf(cmd, sizeof cmd, "'%s' '%s/scripts/%s' --model '%s' --ctx %s --threads %d --reps %ld --json", python,
                 cli_source_dir(), pe->script, model_path, list, n_threads, reps);
    } else if (pe->kind == PEER_TORCH_SHAPE) {
        shape_args(shape, sizeof shape, cfg, on_gpu);
        snprintf(cmd, sizeof cmd, "'%s' '%s/scripts/%s' %s --ctx %s -n %ld --threads %d --reps %ld --json", python,
                 cli_source_dir(), pe->script, shape, list, n_dec > 0 ? n_dec : 1, n_threads, reps);
    } else {
        snprintf(cmd, sizeof cmd, "'%s' '%s/scripts/%s' --model '%s' --ctx %s --n-decode %ld --threads %d --kv %s --json",
                 python, cli_source_dir(), pe->script, model_path, list, n_dec, n_threads, kv);
    }
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "%s: could not start %s\n", pe->label, python);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while (out && (got = fread(out + n, 1, cap - 1 - n, p)) > 0) n += got;
    int status = pclose(p);
    if (!out) return 1;
    out[n] = 0;
    if (status != 0) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (code == 3)
            fprintf(stderr, "%s: not installed for %s (`pip install %s` to compare in the same run)\n", pe->label,
                    python, pe->install);
        else
            fprintf(stderr, "%s: scripts/%s failed (exit %d)\n", pe->label, pe->script, code);
        free(out);
        return 1;
    }
    cJSON *j = cJSON_Parse(out);
    free(out);
    cJSON *res = j ? cJSON_GetObjectItem(j, "results") : NULL;
    if (!cJSON_IsArray(res)) {
        fprintf(stderr, "%s: unreadable output from scripts/%s\n", pe->label, pe->script);
        cJSON_Delete(j);
        return 1;
    }
    cJSON *r;
    cJSON_ArrayForEach(r, res) {
        cJSON *ctx = cJSON_GetObjectItem(r, "ctx"), *pre = cJSON_GetObjectItem(r, "prefill_tok_s"),
              *dec = cJSON_GetObjectItem(r, "decode_tok_s"), *ttft = cJSON_GetObjectItem(r, "ttft_s"),
              *ms = cJSON_GetObjectItem(r, "decode_ms"), *why = cJSON_GetObjectItem(r, "error");
        if (!cJSON_IsNumber(ctx)) continue;
        bench_row *b = NULL;
        for (int i = 0; i < n_rows; i++)
            if (rows[i].ctx == (long)ctx->valuedouble) b = &rows[i];
        if (!b) continue;
        if (pe->kind == PEER_TORCH_SHAPE && cJSON_IsString(why)) {
            fprintf(stderr, "%s: ctx %ld: %s\n", pe->label, b->ctx, why->valuestring);
            snprintf(b->torch_err, sizeof b->torch_err, "%s",
                     strstr(why->valuestring, "out of memory") == why->valuestring ? "out of memory" : "failed");
        }
        if (!cJSON_IsNumber(pre) || !cJSON_IsNumber(dec)) continue;
        if (pe->kind == PEER_TORCH_GGUF) {
            b->torch_prefill_tok_s = pre->valuedouble;
        } else if (pe->kind == PEER_TORCH_SHAPE && cJSON_IsNumber(ttft) && cJSON_IsNumber(ms)) {
            b->torch_ttft_s = ttft->valuedouble;
            b->torch_decode_ms = ms->valuedouble;
        } else if (pe->kind == PEER_LLAMA) {
            b->peer_prefill_tok_s = pre->valuedouble;
            b->peer_decode_tok_s = dec->valuedouble;
        }
    }
    cJSON *ver = cJSON_GetObjectItem(j, "version"), *kv_j = cJSON_GetObjectItem(j, "kv");
    if (cJSON_IsString(ver))
        printf("%s peer: %s, KV %s\n", pe->label, ver->valuestring, cJSON_IsString(kv_j) ? kv_j->valuestring : kv);
    cJSON_Delete(j);
    return 0;
}

static void print_table(const bench_row *rows, int n_rows, int llama, int torch, int shape, int bound) {
    printf("\n| ctx | prefill tok/s | decode tok/s |");
    if (bound) printf(" GB/step | bound ms | %% of bound |");
    if (shape) printf(" TTFT s | ms/token | PyTorch TTFT s | PyTorch ms/token | TTFT: PyTorch/ours | decode: PyTorch/ours |");
    if (llama) printf(" llama.cpp prefill | llama.cpp decode | prefill ratio | decode ratio |");
    if (torch) printf(" PyTorch prefill | prefill vs PyTorch |");
    printf("\n|---:|---:|---:|%s%s%s%s\n", bound ? "---:|---:|---:|" : "", shape ? "---:|---:|---:|---:|---:|---:|" : "",
           llama ? "---:|---:|---:|---:|" : "", torch ? "---:|---:|" : "");
    for (int i = 0; i < n_rows; i++) {
        const bench_row *b = &rows[i];
        printf("| %ld | %.1f | %.1f |", b->ctx, b->prefill_tok_s, b->decode_tok_s);
        if (bound && b->bound_ms > 0 && b->decode_tok_s > 0)
            printf(" %.3f | %.3f | %.0f%% |", b->step_bytes / 1e9, b->bound_ms, 100 * b->bound_ms * b->decode_tok_s / 1e3);
        else if (bound)
            printf(" %.3f | - | - |", b->step_bytes / 1e9);
        if (shape) {
            printf(" %.3f | %.2f |", b->ctx / b->prefill_tok_s, b->decode_tok_s > 0 ? 1e3 / b->decode_tok_s : 0);
            if (b->torch_ttft_s > 0)
                printf(" %.3f | %.2f | %.2fx | %.2fx |", b->torch_ttft_s, b->torch_decode_ms,
                       b->torch_ttft_s * b->prefill_tok_s / b->ctx, b->torch_decode_ms * b->decode_tok_s / 1e3);
            else
                printf(" %s | - | - | - |", b->torch_err[0] ? b->torch_err : "-");
        }
        if (llama && b->peer_prefill_tok_s > 0)
            printf(" %.1f | %.1f | %.2fx | %.2fx |", b->peer_prefill_tok_s, b->peer_decode_tok_s,
                   b->prefill_tok_s / b->peer_prefill_tok_s, b->decode_tok_s / b->peer_decode_tok_s);
        else if (llama)
            printf(" - | - | - | - |");
        if (torch && b->torch_prefill_tok_s > 0)
            printf(" %.1f | %.2fx |", b->torch_prefill_tok_s, b->prefill_tok_s / b->torch_prefill_tok_s);
        else if (torch)
            printf(" - | - |");
        printf("\n");
    }
}

static int write_json(const char *path, const bench_row *rows, int n_rows, int n_threads, long n_dec, double weight_bytes,
                      double kv_token_bytes, double copy_gbs) {
    FILE *f = fopen(path, "w");
    if (!f) return cli_fail("bench: cannot write %s", path);
    fprintf(f, "{\"engine\":\"kvbench\",\"threads\":%d,\"n_decode\":%ld,\"weight_bytes\":%.0f,\"kv_token_bytes\":%.0f,"
               "\"copy_gbs\":%.3f,\"results\":[",
            n_threads, n_dec, weight_bytes, kv_token_bytes, copy_gbs);
    for (int i = 0; i < n_rows; i++)
        fprintf(f, "%s{\"ctx\":%ld,\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"peer_prefill_tok_s\":%.3f,"
                   "\"peer_decode_tok_s\":%.3f,\"torch_prefill_tok_s\":%.3f,\"torch_ttft_s\":%.6f,"
                   "\"torch_decode_ms\":%.6f,\"step_bytes\":%.0f,\"bound_ms\":%.6f}",
                i ? "," : "", rows[i].ctx, rows[i].prefill_tok_s, rows[i].decode_tok_s, rows[i].peer_prefill_tok_s,
                rows[i].peer_decode_tok_s, rows[i].torch_prefill_tok_s, rows[i].torch_ttft_s, rows[i].torch_decode_ms,
                rows[i].step_bytes, rows[i].bound_ms);
    fprintf(f, "]}\n");
    return fclose(f) ? cli_fail("bench: cannot write %s", path) : 0;
}

static int parse_contexts(const char *contexts, bench_row *rows, int *n_rows) {
    for (const char *s = contexts; *s;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 24 || (*end && *end != ',') || *n_rows == MAX_CTX)
            return cli_fail("bench: --contexts expects up to %d comma-separated positive integers, got '%s'", MAX_CTX,
                            contexts);
        rows[(*n_rows)++].ctx = v;
        s = *end ? end + 1 : end;
    }
    return *n_rows ? 0 : cli_fail("bench: --contexts is empty (give prompt lengths, e.g. 512,2048)");
}

static const bench_peer LLAMA_PEER = {"llama.cpp", "llamacpp_bench.py", "llama-cpp-python", PEER_LLAMA};
static const bench_peer TORCH_PEER = {"PyTorch", "torch_bench.py", "torch transformers gguf", PEER_TORCH_GGUF};
static const bench_peer SHAPE_PEER = {"PyTorch", "torch_synth_bench.py", "torch transformers", PEER_TORCH_SHAPE};

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--method") || !strcmp(argv[i], "--methods")) return cmd_bench_methods(argc, argv);
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    const char *contexts = "512,2048,8000", *json_path = NULL, *python = getenv("KVB_PEER_PYTHON"), *torch_python = NULL;
    long n_dec = 64, reps = 1;
    int no_peer = 0, profile = 0, torch = 0, bound = 0;
    cli_opt opts[] = {CLI_FLAG("--no-peer", &no_peer), CLI_FLAG("--profile", &profile), CLI_FLAG("--torch", &torch),
                      CLI_FLAG("--bound", &bound),
                      CLI_STR("--contexts", &contexts), CLI_STR("--ctx-len", &contexts), CLI_STR("--json", &json_path),
                      CLI_STR("--python", &python), CLI_STR("--torch-python", &torch_python),
                      CLI_LONG("-n", &n_dec, 0, 100000), CLI_LONG("--reps", &reps, 1, 100),
                      CLI_ENGINE_OPTS(&eo), CLI_END};
    int stop = cli_parse("bench", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    if (!python || !*python) python = "python3";
    if (!torch_python || !*torch_python) torch_python = python;
    int peer = !no_peer;
    bench_row rows[MAX_CTX] = {0};
    int n_rows = 0;
    if (parse_contexts(contexts, rows, &n_rows)) return 1;
    kvb_model *m = cli_load_model(&eo);
    if (!m) return 1;
    /* --ctx N lets a context pass the model's training context, up to N */
    const int ctx_limit = eo.ctx.n_ctx > 0 ? eo.ctx.n_ctx : m->cfg.n_ctx_train; /* read before the model is freed */
    for (int i = 0; i < n_rows; i++)
        if (rows[i].ctx + n_dec + 1 > ctx_limit) {
            kvb_model_free(m);
            return cli_fail("bench: context %ld + %ld decode steps exceeds %s of %d", rows[i].ctx, n_dec,
                            eo.ctx.n_ctx > 0 ? "--ctx" : "the model's context", ctx_limit);
        }
    char err[512];
    kvb_backend *probe = kvb_backend_create(eo.ctx.backend, eo.ctx.n_threads, err, sizeof err);
    if (!probe) {
        kvb_model_free(m);
        return cli_fail("bench: %s", err);
    }
    int n_threads = probe->n_threads;
    const int on_gpu = strcmp(probe->name, "cpu") != 0, discrete = probe->discrete;
    if (on_gpu) bound = 1;
    /* measured before the runs, on an idle device: 1 GiB on a GPU (past its L2), 256 MiB on the CPU */
    double copy_gbs = bound ? cli_copy_gbs(probe, discrete ? (size_t)1 << 30 : (size_t)256 << 20) : 0;
    kvb_backend_free(probe);
    /* On the GPU the like-for-like peer is PyTorch on the same GPU and shapes (llama.cpp and torch_bench.py run
     * on the CPU here); on the CPU a synthetic model has no GGUF for them, so --torch means the shape peer. */
    int shape = on_gpu ? peer || torch : torch && m->syn_weights != NULL;
    if (on_gpu || m->syn_weights) torch = 0;
    if (on_gpu) peer = 0;
    const char *kv = eo.ctx.kv_dtype == KVB_F16 ? "f16" : "f32";
    const char *gemm = on_gpu ? "cuBLAS f16" : kvb_backend_cpu_gemm_name(kvb_ctx_gemm(&eo.ctx));
    printf("kvbench bench: %s, backend %s, %d threads, KV %s, prefill GEMM: %s, decode %ld tokens, best of %ld\n",
           m->path, eo.ctx.backend, n_threads, kv, gemm, n_dec, reps);
#ifdef KVB_HAVE_CUDA
    if (on_gpu) printf("CUDA kernels: %s\n", kvb_cuda_kernels());
#endif
    for (int i = 0; i < n_rows; i++) {
        for (long r = 0; r < reps; r++)
            if (bench_one(m, &eo.ctx, rows[i].ctx, n_dec, profile && i == n_rows - 1 && r == reps - 1, &rows[i])) {
                kvb_model_free(m);
                return 1;
            }
        printf("  ctx %6ld: prefill %8.1f tok/s, decode %7.1f tok/s\n", rows[i].ctx, rows[i].prefill_tok_s,
               rows[i].decode_tok_s);
        fflush(stdout);
    }
#ifdef KVB_HAVE_CUDA
    if (on_gpu && *kvb_cuda_graph_stats()) printf("CUDA graphs: %s\n", kvb_cuda_graph_stats());
#endif
    if (peer && m->syn_weights) {
        fprintf(stderr, "llama.cpp: skipped (a synthetic model has no GGUF file to load; --torch compares with "
                        "PyTorch on its shapes)\n");
        peer = 0;
    }
    const double w_bytes = cli_step_weight_bytes(m, discrete), kv_tok = cli_kv_token_bytes(&m->cfg, eo.ctx.kv_dtype);
    if (bound) {
        /* decode step t (0-based) attends ctx + t + 1 tokens: their mean over the n_dec steps */
        for (int i = 0; i < n_rows; i++) {
            rows[i].step_bytes = w_bytes + kv_tok * ((double)rows[i].ctx + (double)(n_dec + 1) / 2);
            rows[i].bound_ms = copy_gbs > 0 ? rows[i].step_bytes / (copy_gbs * 1e9) * 1e3 : 0;
        }
        printf("byte bound: %.3f GB of matmul weights (%s) + %.1f KiB of K+V per context token, read at %.1f GB/s "
               "(the backend's device copy rate, bytes read + written, measured now%s)\n",
               w_bytes / 1e9, discrete ? "f16 copies" : "as in the file", kv_tok / 1024, copy_gbs,
               on_gpu ? "" : "; one thread on the CPU");
    }
    /* the peers need the model's path and shapes, not its weights (a synthetic 8B holds 16 GB of them) */
    kvb_config cfg = m->cfg;
    char path[sizeof m->path];
    memcpy(path, m->path, sizeof path);
    kvb_model_free(m);
    int have_shape =
        shape && run_peer(&SHAPE_PEER, torch_python, path, &cfg, on_gpu, rows, n_rows, n_dec, n_threads, kv, reps) == 0;
    int have_peer = peer && run_peer(&LLAMA_PEER, python, path, &cfg, on_gpu, rows, n_rows, n_dec, n_threads, kv, reps) == 0;
    int have_torch =
        torch && run_peer(&TORCH_PEER, torch_python, path, &cfg, on_gpu, rows, n_rows, n_dec, n_threads, kv, reps) == 0;
    print_table(rows, n_rows, have_peer, have_torch, have_shape, bound);
    return json_path ? write_json(json_path, rows, n_rows, n_threads, n_dec, w_bytes, kv_tok, copy_gbs) : 0;
}
