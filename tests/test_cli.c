/* test_cli.c — the kvbench binary under good and bad input: each failure is one line on stderr naming the
 * problem and a non-zero exit, never a crash. Runs build/kvbench (path from KVB_BIN, set by CTest). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "methods/method.h"
#include "util_gguf_writer.h"

static const char *bin;
static char model[1024];
/* this run's scratch folder (mkdtemp in main), $KVB_T in the commands run() hands to the shell, so two suites
 * (release and ASan) can run at once without sharing files */
static char tmp_dir[64] = "/tmp/kvb_cli_XXXXXX";

/* tmp_dir/name, in one of 8 rotating buffers */
static const char *tp(const char *name) {
    static char buf[8][192];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", tmp_dir, name);
    return b;
}

typedef struct {
    int exit_code; /* -1 when killed by a signal */
    char out[1 << 15];
    char err[1 << 14];
} run_result;

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
}

/* Runs `kvbench ARGS`, capturing stdout, stderr and the exit status. */
static void run(run_result *r, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s >$KVB_T/kvb_cli_out.txt 2>$KVB_T/kvb_cli_err.txt", bin, args);
    int st = system(cmd);
    r->exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp(tp("kvb_cli_out.txt"), r->out, sizeof r->out);
    slurp(tp("kvb_cli_err.txt"), r->err, sizeof r->err);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* A failure: non-zero exit (not a signal: 126+ means the shell saw a crash), exactly one line on stderr
 * that starts with "kvbench:" and mentions `needle`. */
static void expect_clean_failure(const char *args, const char *needle) {
    run_result *r = malloc(sizeof *r);
    run(r, args);
    int ok = r->exit_code > 0 && r->exit_code < 126 && count_lines(r->err) == 1 &&
             strncmp(r->err, "kvbench:", 8) == 0 && strstr(r->err, needle) != NULL;
    if (!ok) fprintf(stderr, "\n  args: %s\n  exit %d, stderr: %s\n", args, r->exit_code, r->err);
    CU_ASSERT(ok);
    free(r);
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    fwrite(data, 1, n, f);
    fclose(f);
}

/* The first n bytes of the real model. */
static void write_model_prefix(const char *path, size_t n) {
    FILE *in = fopen(model, "rb");
    CU_ASSERT_FATAL(in != NULL);
    char *buf = malloc(n);
    size_t got = fread(buf, 1, n, in);
    fclose(in);
    write_bytes(path, buf, got);
    free(buf);
}

static void test_missing_model_file_is_one_line_error(void) {
    expect_clean_failure("generate --model /nonexistent/m.gguf --prompt hi", "/nonexistent/m.gguf");
}

static void test_wrong_magic_is_reported(void) {
    write_bytes(tp("kvb_bad_magic.gguf"), "NOPE\3\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 24);
    expect_clean_failure("inspect $KVB_T/kvb_bad_magic.gguf", "magic");
}

static void test_truncated_model_is_reported(void) {
    UTIL_REQUIRE_FILE(model);
    write_model_prefix(tp("kvb_trunc_head.gguf"), 1000);
    expect_clean_failure("generate --model $KVB_T/kvb_trunc_head.gguf --prompt hi", "kvb_trunc_head.gguf");
    write_model_prefix(tp("kvb_trunc_data.gguf"), 50u << 20);
    expect_clean_failure("generate --model $KVB_T/kvb_trunc_data.gguf --prompt hi", "kvb_trunc_data.gguf");
}

/* A GGUF with valid structure but a model kvbench cannot run: unknown arch, then a missing key. */
static void test_unknown_arch_and_missing_key_are_reported(void) {
    float w[32] = {0};
    uint64_t ne[1] = {32};
    gw_writer *g = gw_new();
    gw_kv_str(g, "general.architecture", "mamba");
    gw_tensor(g, "x", GGML_T_F32, 1, ne, w, sizeof w);
    CU_ASSERT_FATAL(gw_write_file(g, tp("kvb_arch.gguf")) == 0);
    gw_free(g);
    expect_clean_failure("generate --model $KVB_T/kvb_arch.gguf --prompt hi", "unsupported architecture 'mamba'");
    g = gw_new();
    gw_kv_str(g, "general.architecture", "llama");
    gw_kv_u32(g, "llama.embedding_length", 64);
    gw_tensor(g, "x", GGML_T_F32, 1, ne, w, sizeof w);
    CU_ASSERT_FATAL(gw_write_file(g, tp("kvb_nokey.gguf")) == 0);
    gw_free(g);
    expect_clean_failure("generate --model $KVB_T/kvb_nokey.gguf --prompt hi", "missing metadata key 'llama.block_count'");
    /* a tensor type kvbench does not know, and a tensor running past the end of the file */
    g = gw_new();
    gw_kv_str(g, "general.architecture", "llama");
    gw_tensor(g, "x", (ggml_type)77, 1, ne, w, sizeof w);
    CU_ASSERT_FATAL(gw_write_file(g, tp("kvb_type.gguf")) == 0);
    gw_free(g);
    expect_clean_failure("inspect $KVB_T/kvb_type.gguf", "unknown tensor type 77");
}

static void test_prompt_longer_than_context_is_reported(void) {
    UTIL_REQUIRE_FILE(model);
    expect_clean_failure("generate --model default --ctx 16 -n 4 --prompt 'one two three four five six seven eight "
                         "nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen'",
                         "context");
}

/* bench --method refuses a context beyond the model's 8192 tokens, as plain bench does, before any work. */
static void test_bench_method_refuses_contexts_beyond_the_model(void) {
    UTIL_REQUIRE_FILE(model);
    expect_clean_failure("bench --model default --method snapkv --budget 30% --ctx-len 9000", "exceeds the model's context of 8192");
    expect_clean_failure("bench --model default --contexts 9000", "exceeds the model's context of 8192");
    /* --ctx N lets a context pass the model's, up to N: one beyond N is refused, not measured at its own size */
    expect_clean_failure("bench --model default --contexts 100 --ctx 64", "exceeds --ctx of 64");
    expect_clean_failure("bench --model default --method snapkv --ctx-len 100 --ctx 64", "exceeds --ctx of 64");
}

/* a method that cannot be made (no Round profile for a synthetic model; a bad option) is refused before the prefill:
 * one line on stderr, not the prefill's and the methods' before it */
static void test_bench_method_refuses_a_method_it_cannot_make_before_the_prefill(void) {
    expect_clean_failure("bench --model synthetic:tiny --method snapkv,round --ctx-len 64 -n 2", "no watershed layer");
    expect_clean_failure("bench --model synthetic:tiny --method snapkv --method-opt snapkv:window=0 --ctx-len 64 -n 2",
                         "window must be in");
}

static void test_invalid_utf8_prompt_is_reported(void) {
    UTIL_REQUIRE_FILE(model);
    write_bytes(tp("kvb_bad_utf8.txt"), "hello \xff\xfe world", 14);
    expect_clean_failure("generate --model default --prompt-file $KVB_T/kvb_bad_utf8.txt -n 2", "UTF-8");
}

/* fidelity's --ctx caps a prompt and its generation (it was accepted and ignored) */
static void test_fidelity_ctx_caps_the_prompt(void) {
    UTIL_REQUIRE_FILE(model);
    write_bytes(tp("kvb_fid_prompt.txt"), "The quick brown fox jumps over the lazy dog, again and again.", 61);
    expect_clean_failure("fidelity --model default --prompt-file $KVB_T/kvb_fid_prompt.txt --methods snapkv --budget 50% "
                         "-n 4 --ctx 8",
                         "exceed the context given by --ctx of 8");
}

static void test_bad_flags_are_reported(void) {
    expect_clean_failure("generate --prompt hi -n minus", "-n");
    expect_clean_failure("generate --prompt hi --kv-type f8", "--kv-type");
    expect_clean_failure("generate --prompt hi --bogus 1", "--bogus");
    expect_clean_failure("generate", "--prompt");
    expect_clean_failure("bench --contexts 12,x", "--contexts");
    /* an empty list, a flag that needs another, an option for a method or a kind that is not there: refused */
    expect_clean_failure("bench --contexts ''", "--contexts is empty");
    expect_clean_failure("bench --method ''", "--method is empty");
    expect_clean_failure("bench --method snapkv --method-opt snapk:window=4", "no method is named 'snapk'");
    expect_clean_failure("fidelity --prompt-file x.txt --methods ,,", "--methods is empty");
    expect_clean_failure("generate --prompt hi --system 'be brief'", "--system and --template need --chat");
    expect_clean_failure("calibrate pod --frac 0.3", "--frac is an option of round, not of pod");
    expect_clean_failure("calibrate duo --rounds 4", "duo's passkey prompts have no rounds: drop --rounds");
    expect_clean_failure("calibrate round --prompt-file x.txt --samples 2", "--samples makes synthetic dialogues");
    expect_clean_failure("calibrate round --chunk 64", "--chunk is the round size of --prompt-file texts");
    expect_clean_failure("bench-judge --concurrency 4x", "--concurrency expects");
    /* an empty path or name: refused by the parser, naming the option (text options may be empty) */
    expect_clean_failure("bench --json ''", "--json is empty");
    expect_clean_failure("history x --out ''", "--out is empty");
    expect_clean_failure("run configs/quick.json --out ''", "--out is empty");
}

/* Every command parses its options with one table-driven parser (cli/opts.c): an unknown option, an option
 * missing its value and a stray argument are told apart, and positionals may come anywhere. */
static void test_option_errors_tell_unknown_missing_and_stray_apart(void) {
    expect_clean_failure("generate --prompt", "generate: --prompt needs a value");
    expect_clean_failure("generate --prompt hi --bogus", "generate: unknown option '--bogus'");
    expect_clean_failure("serve stray", "serve: unexpected argument 'stray'");
    expect_clean_failure("history --out", "history: --out needs a value");
    expect_clean_failure("inspect --items", "inspect: --items needs a value");
    expect_clean_failure("compare a b --max-slowdown 10x", "--max-slowdown expects a number in [0, 1e+06], got '10x'");
    expect_clean_failure("calibrate --dry-run round --model /nonexistent/m.gguf", "/nonexistent/m.gguf");
}

static void test_unknown_command_fails(void) {
    run_result *r = malloc(sizeof *r);
    run(r, "frobnicate");
    CU_ASSERT(r->exit_code == 2);
    CU_ASSERT(strstr(r->err, "unknown command") != NULL);
    free(r);
}

/* --version names the commit the binary was built from: the test runs in the source folder, built from it, so
 * where that folder is a git checkout the two agree */
static void test_version_names_the_built_commit(void) {
    run_result *r = malloc(sizeof *r);
    run(r, "--version");
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strstr(r->out, "kvbench, commit ") == r->out);
    CU_ASSERT(strstr(r->out, ", built ") != NULL);
    char head[64] = "";
    FILE *g = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
    if (g && fgets(head, sizeof head, g)) head[strcspn(head, "\n")] = 0;
    if (g) pclose(g);
    if (head[0]) CU_ASSERT(strncmp(r->out + strlen("kvbench, commit "), head, strlen(head)) == 0);
    free(r);
}

/* --cuda-kernels: a bad spec is a one-line error naming what it takes; a good one is accepted in a CUDA build
 * (it sets process-wide switches; no GPU needed) and refused by name in a build without CUDA */
static void test_cuda_kernels_option_is_checked(void) {
    run_result *r = malloc(sizeof *r);
    run(r, "bench --cuda-kernels attn=9 --contexts 16");
    CU_ASSERT(r->exit_code != 0 && count_lines(r->err) == 1);
#ifdef KVB_HAVE_CUDA
    CU_ASSERT(strstr(r->err, "--cuda-kernels") && strstr(r->err, "attn=1|2|3|4"));
#else
    CU_ASSERT(strstr(r->err, "--cuda-kernels") && strstr(r->err, "no CUDA backend"));
#endif
    run(r, "bench --cuda-kernels prefetch=3 --contexts 16"); /* v4's prefetch takes 1 or 2 tiles */
    CU_ASSERT(r->exit_code != 0 && count_lines(r->err) == 1);
#ifdef KVB_HAVE_CUDA
    CU_ASSERT(strstr(r->err, "prefetch=3") && strstr(r->err, "prefetch=1|2"));
#endif
    run(r, "bench --cuda-kernels graph=2 --contexts 16"); /* the decode-step graph is on (1) or off (0) */
    CU_ASSERT(r->exit_code != 0 && count_lines(r->err) == 1);
#ifdef KVB_HAVE_CUDA
    CU_ASSERT(strstr(r->err, "graph=2") && strstr(r->err, "graph=0|1"));
#endif
    run(r, "generate --cuda-kernels attn=1,prefill=cuda,gemv=3,probs=2,prefetch=2,graph=1 --prompt hi -n 1");
#ifdef KVB_HAVE_CUDA
    CU_ASSERT(r->exit_code == 0);
#else
    CU_ASSERT(r->exit_code != 0 && strstr(r->err, "no CUDA backend"));
#endif
    free(r);
}

/* bench-attention on the CPU backend: every point's row for both cases, the float64 checks, the CSV; bad flags */
static void test_bench_attention_cpu_measures_full_and_index_lists_and_checks_them(void) {
    run_result *r = malloc(sizeof *r);
    char args[512];
    snprintf(args, sizeof args, "bench-attention --backend cpu --ctx 256,300 --batch 1,2 --heads 4 --kv-heads 2 --head-dim 64 "
                                "--iters 2 --threads 2 --rotate-mib 1 --csv %s", tp("ba.csv"));
    run(r, args);
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strstr(r->out, "check: full at 256 tokens") && strstr(r->out, "check: index list at 256 tokens"));
    CU_ASSERT(!strstr(r->out, "FAIL"));
    int rows = 0;
    for (const char *p = r->out; (p = strstr(p, "\n| ")); p++) rows += p[3] >= '0' && p[3] <= '9';
    CU_ASSERT(rows == 8); /* 2 contexts x 2 batches x (full, index list) */
    char csv[4096];
    slurp(tp("ba.csv"), csv, sizeof csv);
    CU_ASSERT(strstr(csv, "ctx,batch,case,us,gbps") == csv && count_lines(csv) == 9);
    CU_ASSERT(strstr(csv, "\n300,2,sparse,") != NULL);
    const char *bad[] = {"bench-attention --backend tpu", "bench-attention --backend cpu --ctx 0",
                         "bench-attention --backend cpu --heads 5 --kv-heads 2", "bench-attention --backend cpu --sparse 2",
                         "bench-attention --backend cpu --batch 1,x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        run(r, bad[i]);
        CU_ASSERT(r->exit_code != 0 && count_lines(r->err) == 1);
    }
    free(r);
}

static void test_help_explains_every_command(void) {
    run_result *r = malloc(sizeof *r);
    run(r, "--help");
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strstr(r->out, "inspect") && strstr(r->out, "generate") && strstr(r->out, "bench"));
    run(r, "generate --help");
    CU_ASSERT(r->exit_code == 0 && strstr(r->out, "--prompt-file") && strstr(r->out, "--kv-type"));
    for (int i = 0; i < kvb_method_count(); i++) { /* the help names every registered method */
        char word[48];
        snprintf(word, sizeof word, " %s%s", kvb_method_at(i)->name, i == 0 ? " (" : i + 1 < kvb_method_count() ? "," : "\n");
        CU_ASSERT(strstr(r->out, word) != NULL);
        if (!strstr(r->out, word)) fprintf(stderr, "\n  generate --help does not name method %s\n", kvb_method_at(i)->name);
    }
    run(r, "run --help");
    CU_ASSERT(r->exit_code == 0 && strstr(r->out, "--method-opt") && strstr(r->out, "--dump-kept") && strstr(r->out, "--kv-type"));
    free(r);
}

/* Every command `kvbench --help` lists (read from that list, so a new command is covered) answers --help with its
 * usage line and exit 0, and prints its text as written: no printf escape such as "%%" left in it (bench's help
 * once showed "100%%"). bench --method has a help of its own. */
static void test_every_commands_help_prints_clean(void) {
    run_result *top = malloc(sizeof *top), *r = malloc(sizeof *r);
    run(top, "--help");
    CU_ASSERT_FATAL(top->exit_code == 0);
    const char *p = strstr(top->out, "\ncommands:\n");
    CU_ASSERT_FATAL(p != NULL);
    int n = 0;
    for (p = strchr(p + 1, '\n') + 1; p[0] == ' ' && p[1] == ' '; p = strchr(p, '\n') + 1) {
        char cmd[32] = "";
        if (p[2] != ' ' && sscanf(p, " %31[a-z-]", cmd) == 1 && cmd[0] != '-' && strcmp(cmd, "help") != 0) {
            char line[96], usage[64];
            snprintf(line, sizeof line, "%s --help", cmd);
            run(r, line);
            snprintf(usage, sizeof usage, "usage: kvbench %s", cmd);
            CU_ASSERT(r->exit_code == 0 && strstr(r->out, usage) != NULL);
            CU_ASSERT(strstr(r->out, "%%") == NULL && strstr(r->err, "%%") == NULL);
            if (r->exit_code != 0 || !strstr(r->out, usage) || strstr(r->out, "%%"))
                fprintf(stderr, "\n  `kvbench %s` prints no clean usage (exit %d)\n", line, r->exit_code);
            n++;
        }
        if (!strchr(p, '\n')) break;
    }
    CU_ASSERT(n >= 15); /* inspect ... fidelity */
    run(r, "bench --method all --help");
    CU_ASSERT(r->exit_code == 0 && strstr(r->out, "usage: kvbench bench --method") && !strstr(r->out, "%%"));
    free(top), free(r);
}

static void test_inspect_prints_metadata_and_tensors(void) {
    UTIL_REQUIRE_FILE(model);
    run_result *r = malloc(sizeof *r);
    run(r, "inspect default");
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strstr(r->out, "llama.block_count") != NULL);
    CU_ASSERT(strstr(r->out, "blk.29.ffn_down.weight") != NULL);
    CU_ASSERT(strstr(r->out, "Q4_1") != NULL);
    free(r);
}

static void test_generate_chat_produces_text_and_speed(void) {
    UTIL_REQUIRE_FILE(model);
    run_result *r = malloc(sizeof *r);
    run(r, "generate --model default --prompt 'The capital of France is' -n 3");
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strstr(r->out, "Paris") != NULL); /* llama.cpp's greedy continuation too */
    CU_ASSERT(strstr(r->err, "prefill:") && strstr(r->err, "decode:"));
    run(r, "generate --model default --chat --prompt 'Name a colour.' -n 8");
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strlen(r->out) > 2);
    free(r);
}

/* A bare prompt the instruct model answers with end of generation at once: generate says so (and how to get
 * text) instead of printing nothing; an ordinary prompt gets no such line. */
static void test_generate_says_when_the_first_token_ends_generation(void) {
    UTIL_REQUIRE_FILE(model);
    run_result *r = malloc(sizeof *r);
    run(r, "generate --model default --special -n 4 --prompt \"$(printf '<|im_start|>user\\nSay OK.<|im_end|>\\n"
           "<|im_start|>assistant\\nOK.')\"");
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strstr(r->err, "first token is end of generation") && strstr(r->err, "--chat"));
    CU_ASSERT(strstr(r->err, "0 tokens generated") != NULL);
    run(r, "generate --model default --prompt 'The capital of France is' -n 2");
    CU_ASSERT(r->exit_code == 0 && !strstr(r->err, "end of generation"));
    free(r);
}

/* --backend cuda where there is no GPU (a CPU-only build, or no device) is one line saying "no GPU". */
static void test_backend_cuda_without_a_gpu_says_no_gpu(void) {
    UTIL_REQUIRE_FILE(model);
    run_result *r = malloc(sizeof *r);
    run(r, "generate --model default --prompt hi -n 1 --backend cuda");
    int gpu = r->exit_code == 0;
    free(r);
    if (gpu) return; /* a CUDA build on a GPU machine: nothing to refuse */
    expect_clean_failure("generate --model default --prompt hi -n 1 --backend cuda", "no GPU");
}

/* The number after "key": in a JSON text (the first occurrence), or -1. */
static double json_num(const char *text, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(text, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* The byte bound of a decode step: every matmul weight once (synthetic weights are f16 in the "file": 2 bytes
 * each, the output matrix the token embedding when tied) and the K+V rows of the mean context of the decode
 * steps, counted here from the shapes of engine/synthetic.c's table. */
static void test_bench_byte_bound_counts_weights_and_kv(void) {
    static const struct {
        const char *model;
        double L, E, H, KV, D, F, V;
    } cases[] = {{"synthetic:tiny", 2, 64, 4, 2, 16, 128, 256}, {"'synthetic:smollm2-135m?layers=2'", 2, 576, 9, 3, 64, 1536, 49152}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512], json[1 << 12];
        snprintf(args, sizeof args, "bench --model %s --contexts 100 -n 4 --no-peer --bound --json $KVB_T/kvb_bound.json",
                 cases[i].model);
        run_result *r = malloc(sizeof *r);
        unlink(tp("kvb_bound.json"));
        run(r, args);
        CU_ASSERT(r->exit_code == 0 && strstr(r->out, "% of bound"));
        slurp(tp("kvb_bound.json"), json, sizeof json);
        double L = cases[i].L, E = cases[i].E, H = cases[i].H, KV = cases[i].KV, D = cases[i].D, F = cases[i].F;
        double w = 2 * (L * (E * H * D + 2 * E * KV * D + H * D * E + 3 * E * F) + cases[i].V * E);
        double kv = 2 * L * KV * D * 2; /* K and V, f16 */
        CU_ASSERT_DOUBLE_EQUAL(json_num(json, "weight_bytes"), w, 0.5);
        CU_ASSERT_DOUBLE_EQUAL(json_num(json, "kv_token_bytes"), kv, 0.5);
        CU_ASSERT_DOUBLE_EQUAL(json_num(json, "step_bytes"), w + kv * (100 + 2.5), 0.5); /* steps attend 101..104 */
        double gbs = json_num(json, "copy_gbs"), bound = json_num(json, "bound_ms");
        CU_ASSERT(gbs > 0.1 && bound > 0);
        CU_ASSERT_DOUBLE_EQUAL(bound, (w + kv * 102.5) / (gbs * 1e9) * 1e3, 1e-3 * bound + 1e-6);
        free(r);
    }
}

/* bench --method all: one prefill shared by every method, as run shares a sample's (each method forks it and takes it
 * over), so every registered method that takes a budget gets a row, full attention first, each timed, each measured
 * against the same full-attention reference; full attention attends the prompt and the steps' own rows (steps
 * attend 301..304 tokens). Methods from the registry, so a new one is covered. */
static void test_bench_methods_share_one_prefill(void) {
    run_result *r = malloc(sizeof *r);
    static char json[1 << 16];
    unlink(tp("kvb_methods.json"));
    run(r, "bench --model default --method all --ctx-len 300 -n 4 --json $KVB_T/kvb_methods.json " UTIL_NO_CALIBRATION_OPTS);
    CU_ASSERT_EQUAL(r->exit_code, 0);
    CU_ASSERT(strstr(r->err, "prefill 300 tokens (shared by every method") != NULL);
    slurp(tp("kvb_methods.json"), json, sizeof json);
    cJSON *root = cJSON_Parse(json), *rows = cJSON_GetObjectItem(root, "methods");
    CU_ASSERT_FATAL(cJSON_IsArray(rows));
    int k = 0;
    double full_bytes = -1;
    for (int i = 0; i < kvb_method_count(); i++) {
        const kvb_method_def *d = kvb_method_at(i);
        if ((i > 0 && (d->traits & KVB_NO_BUDGET)) || d->scorer) continue; /* "all" has no kvzap (scorer=) */
        cJSON *row = cJSON_GetArrayItem(rows, k++);
        const cJSON *name = cJSON_GetObjectItem(row, "method");
        CU_ASSERT(cJSON_IsString(name) && !strcmp(name->valuestring, d->name));
        if (!cJSON_IsString(name) || strcmp(name->valuestring, d->name)) {
            fprintf(stderr, "\n  bench --method all: row %d is not method %s\n", k - 1, d->name);
            continue;
        }
        const double ms = cJSON_GetObjectItem(row, "decode_ms_per_token")->valuedouble,
                     dev = cJSON_GetObjectItem(row, "kv_device_bytes")->valuedouble,
                     ref = cJSON_GetObjectItem(row, "kv_full_bytes")->valuedouble;
        CU_ASSERT(ms > 0);
        if (full_bytes < 0) { /* full attention: the reference, held whole, every token attended */
            full_bytes = ref;
            CU_ASSERT_DOUBLE_EQUAL(dev, ref, 0.5);
            CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(row, "attended_per_layer")->valuedouble, 302.5, 1e-9);
        }
        CU_ASSERT_DOUBLE_EQUAL(ref, full_bytes, 0.5);
    }
    CU_ASSERT_EQUAL(cJSON_GetArraySize(rows), k);
    cJSON_Delete(root);
    free(r);
}

/* The PyTorch shape peer gets the model's shapes and its figures land beside ours: a stand-in "python" checks
 * the arguments and answers for one context (the real script needs torch; scripts/torch_synth_bench.py). */
static void test_bench_shape_peer_gets_the_shapes(void) {
    const char *fake = tp("kvb_fake_python.sh");
    FILE *f = fopen(fake, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("#!/bin/sh\n"
          "case \"$*\" in *torch_synth_bench.py*'--arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --head-dim 16 "
          "--ff 128 --vocab 256 --rope-base 10000 --rms-eps 9.99999975e-06 --device cpu --dtype f32 --ctx 100,200 -n 4'*) ;;\n"
          "*) echo \"unexpected: $*\" >&2; exit 1 ;; esac\n"
          "echo '{\"version\":\"fake\",\"kv\":\"f32\",\"results\":[{\"ctx\":100,\"ttft_s\":2.5,\"decode_ms\":40,"
          "\"prefill_tok_s\":40,\"decode_tok_s\":25},{\"ctx\":200,\"error\":\"out of memory: x\"}]}'\n",
          f);
    fclose(f);
    chmod(fake, 0755);
    run_result *r = malloc(sizeof *r);
    run(r, "bench --model synthetic:tiny --contexts 100,200 -n 4 --torch --torch-python $KVB_T/kvb_fake_python.sh");
    CU_ASSERT(r->exit_code == 0);
    /* our TTFT and ms/token, then the peer's, then the peer's over ours */
    double pre = -1, dec = -1, ttft = -1, ms = -1, pt = -1, pm = -1, rt = -1, rm = -1;
    const char *row = strstr(r->out, "\n| 100 |");
    CU_ASSERT_FATAL(row != NULL);
    CU_ASSERT(sscanf(row, "\n| 100 | %lf | %lf | %lf | %lf | %lf | %lf | %lfx | %lfx |", &pre, &dec, &ttft, &ms, &pt, &pm,
                     &rt, &rm) == 8);
    CU_ASSERT_DOUBLE_EQUAL(ttft, 100 / pre, 0.0011);
    CU_ASSERT_DOUBLE_EQUAL(pt, 2.5, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(pm, 40, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(rt, 2.5 * pre / 100, 0.006 * rt + 0.006);
    CU_ASSERT_DOUBLE_EQUAL(rm, 40 * dec / 1e3, 0.006 * rm + 0.006);
    const char *row200 = strstr(r->out, "\n| 200 |");
    CU_ASSERT(row200 && strstr(row200, "out of memory"));
    CU_ASSERT(strstr(r->err, "ctx 200: out of memory") != NULL);
    free(r);
    unlink(fake);
}

static void test_profile_and_trace_are_written(void) {
    UTIL_REQUIRE_FILE(model);
    run_result *r = malloc(sizeof *r);
    unlink(tp("kvb_trace.json"));
    run(r, "generate --model default --prompt 'The quick brown fox' -n 4 --profile --trace $KVB_T/kvb_trace.json");
    CU_ASSERT(r->exit_code == 0);
    CU_ASSERT(strstr(r->err, "calc_qkv_and_rope") && strstr(r->err, "attn_forward") && strstr(r->err, "mlp"));
    struct stat st;
    CU_ASSERT(stat(tp("kvb_trace.json"), &st) == 0 && st.st_size > 100);
    char *buf = calloc(1, (size_t)st.st_size + 1);
    slurp(tp("kvb_trace.json"), buf, (size_t)st.st_size + 1);
    CU_ASSERT(strstr(buf, "traceEvents") && strstr(buf, "update_cache"));
    free(buf);
    free(r);
}

/* --dump-activations: an index line per tensor and call, data that adds up (ffn_inp = previous l_out +
 * attn_out, as the residual stream must), and a one-line error for a directory it cannot create */
static void test_dump_activations_index_and_residual_stream(void) {
    UTIL_REQUIRE_FILE(model);
    run_result *r = malloc(sizeof *r);
    run(r, "generate --model default --prompt 'Hello there' -n 2 --kv-type f32 --dump-activations $KVB_T/kvb_act");
    CU_ASSERT_FATAL(r->exit_code == 0);
    FILE *f = fopen(tp("kvb_act/activations.tsv"), "r");
    CU_ASSERT_FATAL(f != NULL);
    struct stat st;
    CU_ASSERT_FATAL(stat(tp("kvb_act/activations.f32"), &st) == 0);
    float *data = malloc((size_t)st.st_size);
    FILE *d = fopen(tp("kvb_act/activations.f32"), "rb");
    CU_ASSERT_FATAL(d && fread(data, 1, (size_t)st.st_size, d) == (size_t)st.st_size);
    fclose(d);
    char line[256], name[64];
    int call, layer, lines = 0, calls = 0, checked = 0, bad = 0;
    long long off, rows, cols, end = 0, prev_lout = -1, attn_out = -1;
    CU_ASSERT(fgets(line, sizeof line, f) && strncmp(line, "call\tname", 9) == 0);
    while (fgets(line, sizeof line, f)) {
        CU_ASSERT_FATAL(sscanf(line, "%d\t%63s\t%d\t%lld\t%lld\t%lld", &call, name, &layer, &off, &rows, &cols) == 6);
        CU_ASSERT(off == end);
        end = off + rows * cols;
        lines++;
        if (!strcmp(name, "result_output")) {
            calls++;
            CU_ASSERT(cols == 49152);
        }
        if (!strcmp(name, "attn_out")) attn_out = off;
        if (!strcmp(name, "ffn_inp") && layer > 0 && prev_lout >= 0 && attn_out >= 0) {
            for (long long i = 0; i < rows * cols; i++)
                bad += data[off + i] != data[prev_lout + i] + data[attn_out + i];
            checked++;
        }
        if (!strcmp(name, "l_out")) prev_lout = off;
    }
    fclose(f);
    CU_ASSERT(end * (long long)sizeof(float) == (long long)st.st_size);
    CU_ASSERT_EQUAL(calls, 2);                /* the prompt, then one decode step */
    CU_ASSERT_EQUAL(lines, 2 * (30 * 13 + 2)); /* 13 tensors per layer + result_norm, result_output */
    CU_ASSERT_EQUAL(checked, 2 * 29);
    CU_ASSERT_EQUAL(bad, 0);
    free(data);
    free(r);
    expect_clean_failure("generate --model default --prompt hi -n 1 --dump-activations /proc/kvb_no/dir",
                         "/proc/kvb_no/dir");
}

/* Runs `kvbench ARGS` as run() does, under `timeout SECS` so a command that blocks fails the test instead of
 * hanging it (exit 124). */
static void run_timeout(run_result *r, int secs, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout %d '%s' %s >$KVB_T/kvb_cli_out.txt 2>$KVB_T/kvb_cli_err.txt", secs, bin, args);
    int st = system(cmd);
    r->exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp(tp("kvb_cli_out.txt"), r->out, sizeof r->out);
    slurp(tp("kvb_cli_err.txt"), r->err, sizeof r->err);
}

/* expect_clean_failure under a timeout. */
static void expect_clean_failure_within(int secs, const char *args, const char *needle) {
    run_result *r = malloc(sizeof *r);
    run_timeout(r, secs, args);
    int ok = r->exit_code > 0 && r->exit_code < 124 && count_lines(r->err) == 1 &&
             strncmp(r->err, "kvbench:", 8) == 0 && strstr(r->err, needle) != NULL;
    if (!ok) fprintf(stderr, "\n  args: %s\n  exit %d, stderr: %s\n", args, r->exit_code, r->err);
    CU_ASSERT(ok);
    free(r);
}

/* A FIFO as --model blocked in open() forever (nothing ever writes to it): now refused at once, by its kind. */
static void test_fifo_as_model_is_refused_without_blocking(void) {
    unlink(tp("kvb_cli_fifo.gguf"));
    CU_ASSERT_FATAL(mkfifo(tp("kvb_cli_fifo.gguf"), 0600) == 0);
    expect_clean_failure_within(20, "generate --model $KVB_T/kvb_cli_fifo.gguf --prompt hi", "FIFO");
    expect_clean_failure_within(20, "inspect $KVB_T/kvb_cli_fifo.gguf", "not a regular file");
    unlink(tp("kvb_cli_fifo.gguf"));
}

/* A prompt file over the limit (a sparse 64 MiB + 1 byte file here; /dev/zero or an endless pipe in the issue) is
 * refused by the limit's name before any work; it used to be read whole, without bound, then tokenized. */
static void test_prompt_file_over_the_limit_is_refused(void) {
    FILE *f = fopen(tp("kvb_cli_big_prompt.txt"), "wb");
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_FATAL(ftruncate(fileno(f), (off_t)(64 << 20) + 1) == 0);
    fclose(f);
    expect_clean_failure_within(60, "generate --model default --prompt-file $KVB_T/kvb_cli_big_prompt.txt -n 1",
                                "CLI_MAX_PROMPT_FILE_BYTES");
    unlink(tp("kvb_cli_big_prompt.txt"));
}

/* A one-layer llama (embedding 8, 2 heads, FFN 16, context 64) with a 29-token vocabulary: <|endoftext|>,
 * <|im_start|>, <|im_end|> (control), then the letters a..z. emb_rows rows of token embedding (the tied output
 * matrix), the given RMS epsilon and RoPE base, weights from a fixed LCG, and NaN in tensor nan_tensor (NULL:
 * none). */
enum { SMALL_VOCAB = 29 };
static void write_small_llama(const char *path, int emb_rows, float rms_eps, float freq_base, const char *nan_tensor) {
    const int E = 8, F = 16;
    gw_writer *g = gw_new();
    gw_kv_str(g, "general.architecture", "llama");
    gw_kv_u32(g, "llama.block_count", 1);
    gw_kv_u32(g, "llama.context_length", 64);
    gw_kv_u32(g, "llama.embedding_length", (uint32_t)E);
    gw_kv_u32(g, "llama.feed_forward_length", (uint32_t)F);
    gw_kv_u32(g, "llama.attention.head_count", 2);
    gw_kv_f32(g, "llama.attention.layer_norm_rms_epsilon", rms_eps);
    gw_kv_f32(g, "llama.rope.freq_base", freq_base);
    gw_kv_str(g, "tokenizer.ggml.model", "gpt2");
    gw_kv_str(g, "tokenizer.ggml.pre", "gpt2");
    const char *toks[SMALL_VOCAB] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    static char letters[26][2];
    int32_t types[SMALL_VOCAB];
    for (int i = 0; i < SMALL_VOCAB; i++) {
        types[i] = i < 3 ? 3 : 1;
        if (i >= 3) letters[i - 3][0] = (char)('a' + i - 3), toks[i] = letters[i - 3];
    }
    gw_kv_arr_str(g, "tokenizer.ggml.tokens", toks, SMALL_VOCAB);
    gw_kv_arr_i32(g, "tokenizer.ggml.token_type", types, SMALL_VOCAB);
    gw_kv_arr_str(g, "tokenizer.ggml.merges", toks, 0);
    gw_kv_u32(g, "tokenizer.ggml.eos_token_id", 0);
    static const struct {
        const char *name;
        int cols, rows; /* rows 0: emb_rows */
    } shapes[] = {{"token_embd.weight", 8, 0},        {"output_norm.weight", 8, 1},     {"blk.0.attn_norm.weight", 8, 1},
                  {"blk.0.ffn_norm.weight", 8, 1},    {"blk.0.attn_q.weight", 8, 8},    {"blk.0.attn_k.weight", 8, 8},
                  {"blk.0.attn_v.weight", 8, 8},      {"blk.0.attn_output.weight", 8, 8}, {"blk.0.ffn_gate.weight", 8, 16},
                  {"blk.0.ffn_up.weight", 8, 16},     {"blk.0.ffn_down.weight", 16, 8}};
    uint64_t state = 7;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int rows = shapes[i].rows ? shapes[i].rows : emb_rows, n = shapes[i].cols * rows;
        float *w = malloc((size_t)n * sizeof *w);
        for (int k = 0; k < n; k++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            float u = (float)((state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
            w[k] = rows == 1 ? 1.0f + 0.1f * u : u;
        }
        if (nan_tensor && !strcmp(nan_tensor, shapes[i].name)) w[n / 2] = NAN;
        uint64_t ne[2] = {(uint64_t)shapes[i].cols, (uint64_t)rows};
        gw_tensor(g, shapes[i].name, GGML_T_F32, rows > 1 ? 2 : 1, ne, w, (size_t)n * sizeof *w);
        free(w);
    }
    CU_ASSERT_FATAL(gw_write_file(g, path) == 0);
    gw_free(g);
}

/* The small model as written generates (exit 0): the cases below differ from it in one thing each. */
static void test_small_llama_generates(void) {
    write_small_llama(tp("kvb_small.gguf"), SMALL_VOCAB, 1e-5f, 10000.0f, NULL);
    run_result *r = malloc(sizeof *r);
    run(r, "generate --model $KVB_T/kvb_small.gguf --prompt hello -n 4 --ignore-eos");
    CU_ASSERT(r->exit_code == 0);
    if (r->exit_code) fprintf(stderr, "\n  %s\n", r->err);
    free(r);
}

/* More embedding rows than tokenizer tokens loaded, generated ids the tokenizer cannot print, printed nothing and
 * exited 0; llama.cpp refuses token_embd.weight of any shape but [n_embd, tokens]: so does kvbench, naming both. */
static void test_embedding_rows_other_than_the_tokenizer_are_refused(void) {
    write_small_llama(tp("kvb_small_rows.gguf"), SMALL_VOCAB + 11, 1e-5f, 10000.0f, NULL);
    expect_clean_failure("generate --model $KVB_T/kvb_small_rows.gguf --prompt hello -n 4", "has 40 rows but the tokenizer has 29 tokens");
    write_small_llama(tp("kvb_small_rows.gguf"), SMALL_VOCAB - 1, 1e-5f, 10000.0f, NULL);
    expect_clean_failure("generate --model $KVB_T/kvb_small_rows.gguf --prompt hello -n 4", "has 28 rows but the tokenizer has 29 tokens");
}

/* A NaN or negative RMS epsilon and a RoPE base of 0 made every logit NaN, reported as "the first token is end
 * of generation ... --chat": now refused at load, naming the key. */
static void test_nan_or_nonpositive_hyperparameters_are_refused_by_key(void) {
    write_small_llama(tp("kvb_small_hp.gguf"), SMALL_VOCAB, NAN, 10000.0f, NULL);
    expect_clean_failure("generate --model $KVB_T/kvb_small_hp.gguf --prompt hello -n 4", "llama.attention.layer_norm_rms_epsilon is nan");
    write_small_llama(tp("kvb_small_hp.gguf"), SMALL_VOCAB, -1e-5f, 10000.0f, NULL);
    expect_clean_failure("generate --model $KVB_T/kvb_small_hp.gguf --prompt hello -n 4", "llama.attention.layer_norm_rms_epsilon is -1e-05");
    write_small_llama(tp("kvb_small_hp.gguf"), SMALL_VOCAB, 1e-5f, 0.0f, NULL);
    expect_clean_failure("generate --model $KVB_T/kvb_small_hp.gguf --prompt hello -n 4", "llama.rope.freq_base is 0");
}

/* A NaN weight made every logit NaN, read as end of generation: the forward pass checks the logits and the error
 * names the first activation (llama.cpp's graph name) that went non-finite. */
static void test_nan_weights_stop_generation_naming_the_layer(void) {
    write_small_llama(tp("kvb_small_nan.gguf"), SMALL_VOCAB, 1e-5f, 10000.0f, "blk.0.ffn_down.weight");
    expect_clean_failure("generate --model $KVB_T/kvb_small_nan.gguf --prompt hello -n 4",
                         "not finite (29 of 29 are NaN or Inf); the first is in layer 0 (ffn_out)");
    write_small_llama(tp("kvb_small_nan.gguf"), SMALL_VOCAB, 1e-5f, 10000.0f, "output_norm.weight");
    expect_clean_failure("generate --model $KVB_T/kvb_small_nan.gguf --prompt hello -n 4", "in the output layer (result_norm)");
}

/* Control characters in a key went to the terminal raw (ESC [ 2 J clears the screen): inspect shows them
 * escaped, as it does in string values. */
static void test_inspect_escapes_control_characters_in_keys(void) {
    float w[32] = {0};
    uint64_t ne[1] = {32};
    gw_writer *g = gw_new();
    gw_kv_str(g, "general.architecture", "llama");
    gw_kv_u32(g, "evil\x1b[2J\x07.key", 1);
    gw_kv_str(g, "value.with.esc", "red\x1b[31m");
    gw_tensor(g, "tensor\x1b]0;title\x07", GGML_T_F32, 1, ne, w, sizeof w);
    CU_ASSERT_FATAL(gw_write_file(g, tp("kvb_ctrl.gguf")) == 0);
    gw_free(g);
    run_result *r = malloc(sizeof *r);
    run(r, "inspect $KVB_T/kvb_ctrl.gguf");
    CU_ASSERT(strchr(r->out, '\x1b') == NULL && strchr(r->out, '\x07') == NULL);
    CU_ASSERT(strstr(r->out, "evil\\x1b[2J\\x07.key (uint32) = 1") != NULL);
    CU_ASSERT(strstr(r->out, "\"red\\x1b[31m\"") != NULL);
    CU_ASSERT(strstr(r->out, "tensor\\x1b]0;title\\x07") != NULL);
    free(r);
}

int main(void) {
    bin = getenv("KVB_BIN");
    if (!bin) bin = "build/kvbench";
    util_default_model(model, sizeof model);
    if (!mkdtemp(tmp_dir) || setenv("KVB_T", tmp_dir, 1)) {
        perror("test_cli: scratch folder");
        return 1;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("cli", NULL, NULL);
    CU_add_test(s, "missing model file is a one-line error", test_missing_model_file_is_one_line_error);
    CU_add_test(s, "generate says when the first token ends generation", test_generate_says_when_the_first_token_ends_generation);
    CU_add_test(s, "--backend cuda without a GPU says no GPU", test_backend_cuda_without_a_gpu_says_no_gpu);
    CU_add_test(s, "bench's byte bound counts the weights and the K/V rows", test_bench_byte_bound_counts_weights_and_kv);
    CU_add_test(s, "bench --method all: every method on one shared prefill", test_bench_methods_share_one_prefill);
    CU_add_test(s, "bench's PyTorch shape peer gets the model's shapes", test_bench_shape_peer_gets_the_shapes);
    CU_add_test(s, "bench --method refuses contexts beyond the model", test_bench_method_refuses_contexts_beyond_the_model);
    CU_add_test(s, "bench --method refuses a method it cannot make before the prefill",
                test_bench_method_refuses_a_method_it_cannot_make_before_the_prefill);
    CU_add_test(s, "wrong magic is reported", test_wrong_magic_is_reported);
    CU_add_test(s, "truncated model is reported", test_truncated_model_is_reported);
    CU_add_test(s, "unknown arch, missing key and unknown tensor type are reported", test_unknown_arch_and_missing_key_are_reported);
    CU_add_test(s, "prompt longer than the context is reported", test_prompt_longer_than_context_is_reported);
    CU_add_test(s, "invalid UTF-8 prompt is reported", test_invalid_utf8_prompt_is_reported);
    CU_add_test(s, "bad flags are reported", test_bad_flags_are_reported);
    CU_add_test(s, "option errors tell unknown, missing and stray apart", test_option_errors_tell_unknown_missing_and_stray_apart);
    CU_add_test(s, "unknown command fails", test_unknown_command_fails);
    CU_add_test(s, "--version names the commit it was built from", test_version_names_the_built_commit);
    CU_add_test(s, "--cuda-kernels is checked", test_cuda_kernels_option_is_checked);
    CU_add_test(s, "fidelity's --ctx caps the prompt", test_fidelity_ctx_caps_the_prompt);
    CU_add_test(s, "bench-attention --backend cpu measures and checks", test_bench_attention_cpu_measures_full_and_index_lists_and_checks_them);
    CU_add_test(s, "help explains every command", test_help_explains_every_command);
    CU_add_test(s, "every command's help prints clean", test_every_commands_help_prints_clean);
    CU_add_test(s, "inspect prints metadata and tensors", test_inspect_prints_metadata_and_tensors);
    CU_add_test(s, "dump-activations: index, data, residual stream", test_dump_activations_index_and_residual_stream);
    CU_add_test(s, "generate --chat produces text and speed", test_generate_chat_produces_text_and_speed);
    CU_add_test(s, "profile table and trace file are written", test_profile_and_trace_are_written);
    CU_add_test(s, "a FIFO as --model is refused without blocking", test_fifo_as_model_is_refused_without_blocking);
    CU_add_test(s, "a prompt file over the limit is refused", test_prompt_file_over_the_limit_is_refused);
    CU_add_test(s, "the small llama generates", test_small_llama_generates);
    CU_add_test(s, "embedding rows other than the tokenizer's tokens are refused", test_embedding_rows_other_than_the_tokenizer_are_refused);
    CU_add_test(s, "NaN or non-positive hyperparameters are refused by key", test_nan_or_nonpositive_hyperparameters_are_refused_by_key);
    CU_add_test(s, "NaN weights stop generation, naming the layer", test_nan_weights_stop_generation_naming_the_layer);
    CU_add_test(s, "inspect escapes control characters in keys", test_inspect_escapes_control_characters_in_keys);
    int rc = util_run_suites();
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp_dir);
    if (system(rm) != 0) fprintf(stderr, "test_cli: could not remove %s\n", tmp_dir);
    return rc;
}
