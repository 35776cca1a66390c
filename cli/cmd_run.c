/* cmd_run.c — `kvbench run SUITE`: run or resume a suite, then write and print its report. */
#include <stdio.h>
#include <string.h>

#include "benchmarks/runner.h"
#include "benchmarks/runopts.h"
#include "cli/cli.h"

static const char *HELP =
    "usage: kvbench run SUITE.json [--out DIR] [--limit N] [--methods a,b] [--budgets 30%,50%] [--model M]\n"
    "                         [--shard i/N]\n"
    "\n"
    "Runs every (method x budget x task x sample) cell of a suite (configs/*.json): one exact prefill per\n"
    "sample is shared by the methods that compress after prefill, then each method decodes greedily and is\n"
    "scored; one JSONL record per cell is appended (fsynced) to DIR/results.jsonl with the prediction, score,\n"
    "TTFT, decode ms/token, phase breakdown, measured KV bytes per tier and bytes moved. Re-running the same\n"
    "command skips recorded cells, so a killed run (even kill -9) resumes where it stopped. A record is reused\n"
    "only when its fingerprint (model, method and options, budget, benchmark parameters, sample content,\n"
    "generation settings, kvbench version) matches; a changed cell is an error naming it and the field, or\n"
    "with --rerun-changed it runs again. At the end it\n"
    "writes DIR/summary.csv, DIR/report.md and SVG charts and prints the main table.\n"
    "\n"
    "Calibration: a method that reads the model's calibration profile (round without lw=, pod without block=,\n"
    "omnikv with layers=profile, qfilter without filters=window, duo without split=window; docs/methods.md \"Calibration\")\n"
    "on a model whose profile lacks its section is calibrated\n"
    "first, once, as `kvbench calibrate KIND` does (4 synthetic 12-round dialogues, or the suite's\n"
    "\"calibration\": {\"samples\": N, \"rounds\": N}): one line says so, one gives the result; the curves and tables\n"
    "go to DIR/calibration/ and the profile is stored, so later runs reuse it. Shards sharing a profile directory\n"
    "wait for the one calibrating (a lock file beside the profile) and then reuse its result.\n"
    "\n"
    "options:\n"
    "  --out DIR              results directory (default: the suite's \"output\")\n"
    "  --limit N              at most N samples per task\n"
    "  --methods LIST         only these methods of the suite\n"
    "  --budgets LIST         replace the suite's budgets\n"
    "  --compression-ratios L kvpress's ratios instead (remove R of the prompt's KV): 0.25,0.5 = --budgets\n"
    "                         75%,50% (--compression-ratio R likewise); a suite may say \"compression_ratios\"\n"
    "  --model M              replace the suite's model (GGUF path or default)\n"
    "  --threads N            CPU threads (default: $KVB_THREADS, else the usable cores)\n"
    "  --quiet                no progress line\n"
    "  --profile              time the phases per record (\"breakdown\"); on a GPU each phase waits for the\n"
    "                         device, so decode ms/token then counts those waits (without it, decode is timed\n"
    "                         as `kvbench bench` times it)\n"
    "  --rerun-changed        run again the cells whose stored record was made with other inputs\n"
    "  --no-calibrate         a missing calibration is an error naming the command to run, not calibrated here\n"
    "  --method-opt K=V       a method option for every method of the suite but full, or M:K=V for method M\n"
    "                         only (repeatable; replaces the suite's value; recorded in the fingerprints)\n"
    "  --method NAME          = --methods NAME;  --budget B = --budgets B\n"
    "  --kv-type f16|f32      KV cache element type (default f16)\n"
    "  --backend cpu|cuda     where the forward pass runs (default cpu, or $KVB_BACKEND)\n"
    "  --batch N              prefill chunk size in tokens (default 512)\n" CLI_PREFILL_GEMM_HELP
    "  --ctx N                cap the context: prompts are truncated (by each benchmark's rule) to fit N\n"
    "  --dump-kept FILE       append, per cell, the positions its method kept per layer and KV head after\n"
    "                         prefill and at the end (JSON lines, docs/methods.md \"Kept tokens\")\n"
    "  --shard i/N            only the cells of shard i (0 <= i < N): a stable hash of (model sha256,\n"
    "                         method@budget and options, benchmark, task, sample id) splits the suite into N\n"
    "                         disjoint shards; join their directories with `kvbench merge`\n"
    "\n"
    "judge (LongMemEval, ShareGPT dialogue quality, NIAH with \"judge\": true; overrides the suite's \"judge\"):\n"
    "  --judge-url URL        OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1 of `kvbench serve`\n"
    "                         (also KVB_JUDGE_URL)\n"
    "  --judge-model NAME     model name sent to the judge (default: the suite's, else \"default\")\n"
    "  --judge-key-env VAR    environment variable holding the API key (the key is never written anywhere)\n"
    "  --judge-refresh        ask again instead of reading cached judge replies (~/.cache/kvbench/judge)\n"
    "Every verdict is stored in its record (judge model, raw replies, parsed value); a failed or unparseable\n"
    "judgement leaves the score empty with a judge error that the report counts, and the run goes on.\n";

static int shard_fn(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    return kvb_shard_parse(v, dst, err, err_len);
}

static int method_opt_fn(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    kvb_run_opts *o = dst;
    static const char *raw[KVB_MAX_OPTS];
    if (o->n_method_opts == KVB_MAX_OPTS) return snprintf(err, err_len, "more than %d --method-opt values", KVB_MAX_OPTS), -1;
    if (!strchr(v, '=')) return snprintf(err, err_len, "--method-opt %s: expected KEY=VALUE or METHOD:KEY=VALUE", v), -1;
    if (cli_method_opt_prefix_check(v, err, err_len)) return -1;
    raw[o->n_method_opts++] = v;
    o->method_opts = raw;
    return 0;
}

/* --compression-ratios 0.25,0.5 (kvpress's ratios) as the --budgets they mean: "75%,50%" */
static int ratios_fn(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    static char budgets[512];
    char copy[512], pct[32];
    size_t at = 0;
    if (snprintf(copy, sizeof copy, "%s", v) >= (int)sizeof copy) return snprintf(err, err_len, "%s: list too long", opt), -1;
    for (char *save, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (kvb_budget_ratio_str(t, pct, sizeof pct, err, err_len)) return -1;
        at += (size_t)snprintf(budgets + at, at < sizeof budgets ? sizeof budgets - at : 0, "%s%s", at ? "," : "", pct);
    }
    if (!at || at >= sizeof budgets) return snprintf(err, err_len, "%s: expected a list like 0.25,0.5", opt), -1;
    *(const char **)dst = budgets;
    return 0;
}

int cmd_run(int argc, char **argv) {
    kvb_run_opts o = {0};
    kvb_dtype kv = KVB_F16;
    char line[2048] = "kvbench";
    for (int i = 0; i < argc; i++) {
        size_t l = strlen(line);
        snprintf(line + l, sizeof line - l, " %s", argv[i]);
    }
    o.argv_line = line;
    cli_opt opts[] = {CLI_FLAG("--quiet", &o.quiet), CLI_FLAG("--profile", &o.profile),
                      CLI_FLAG("--judge-refresh", &o.judge_refresh),
                      CLI_FLAG("--no-calibrate", &o.no_calibrate),
                      CLI_FLAG("--rerun-changed", &o.rerun_changed), CLI_STR("--out", &o.out_dir),
                      CLI_STR("--methods", &o.methods), CLI_STR("--budgets", &o.budgets), CLI_STR("--model", &o.model),
                      CLI_STR("--judge-url", &o.judge_url), CLI_STR("--judge-model", &o.judge_model),
                      CLI_STR("--judge-key-env", &o.judge_key_env), CLI_FN("--shard", &o.shard, shard_fn),
                      CLI_INT("--limit", &o.limit, 1, 1 << 30), CLI_INT("--threads", &o.n_threads, 0, 1024),
                      CLI_FN("--method-opt", &o, method_opt_fn), CLI_STR("--method", &o.methods),
                      CLI_STR("--budget", &o.budgets), CLI_FN("--compression-ratios", &o.budgets, ratios_fn),
                      CLI_FN("--compression-ratio", &o.budgets, ratios_fn), CLI_FN("--kv-type", &kv, cli_fn_kv_type),
                      CLI_FN("--backend", &o.backend, cli_fn_backend), CLI_INT("--batch", &o.n_batch, 1, 65536),
                      CLI_FN("--prefill-gemm", &o.prefill_gemm, cli_fn_prefill_gemm),
                      CLI_INT("--ctx", &o.n_ctx, 64, 1 << 24), CLI_STR("--dump-kept", &o.dump_kept), CLI_END};
    int n_pos, stop = cli_parse("run", HELP, opts, argc, argc, argv, &n_pos);
    if (stop >= 0) return stop;
    if (n_pos > 1) return cli_fail("run: more than one suite given ('%s' and '%s')", argv[1], argv[2]);
    if (!n_pos) return cli_fail("run: give a suite file (e.g. configs/quick.json)");
    o.suite_path = argv[1];
    o.kv_f32 = kv == KVB_F32;
    char err[1024];
    if (kvb_run_suite(&o, stdout, err, sizeof err)) return cli_fail("run: %s", err);
    return 0;
}
