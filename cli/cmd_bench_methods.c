/* cmd_bench_methods.c — `kvbench bench --method M[,M2...] --budget B`: decode latency and measured KV of
 * each method on the same prompt in one run, with full attention as the reference peer. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "benchmarks/shared_prefill.h"
#include "benchmarks/suitecheck.h"
#include "cli/cli.h"
#include "engine/sampler.h"
#include "engine/synthetic.h"

static const char *HELP =
    "usage: kvbench bench --method M[,M...] [--budget B] [--ctx-len 8000] [-n 32] [--method-opt [M:]K=V]\n"
    "\n"
    "Prefills one prompt of --ctx-len tokens once; each method (full attention first, as the reference) takes\n"
    "that prefill over in its own copy of the context, as `kvbench run`'s cells share a sample's prefill, and\n"
    "decodes N greedy tokens (the same timing path as run's). Prints per method: prefill seconds, decode ms/token, speedup over full, measured KV on\n"
    "the device and host tiers after decode, bytes moved between tiers, the backend's host->device and\n"
    "device->host copies per decode step (count / bytes: positions up and logits down are the engine's own)\n"
    "and mean tokens attended per layer. On a GPU (and on the CPU with --bound) also each method's decode byte\n"
    "bound: the bytes a step must read (every matmul weight as held, and the K and V rows it attends) over the\n"
    "backend's device copy rate measured in this run, and how close its ms/token comes to that (% of bound).\n"
    "`--method all` runs every method. A --method-opt prefixed `M:` applies to that method only, an unprefixed\n"
    "one to every method but full. A method that reads the model's calibration profile (round without lw=, pod\n"
    "without block=, omnikv with layers=profile, qfilter, duo) on a model whose profile lacks its section is\n"
    "calibrated first, once, as `kvbench run` does (the profile keeps it for later commands).\n"
    "\n"
    "options:\n"
    "  --ctx-len N            prompt tokens (default 8000)\n"
    "  -n N                   decode steps (default 32)\n"
    "  --json FILE            also write the table as JSON\n"
    "  --bound                the byte-bound columns on the CPU too (its copy rate is one thread's memmove)\n"
    "  --no-calibrate         a missing calibration is an error naming the command to run, not calibrated here\n"
    "  --profile              time the phases (on a GPU each waits for the device: decode ms/token then counts\n"
    "                         those waits); report each method's decode step by phase, with the share outside\n"
    "                         attention and the matmul phases, and its packed host->device loads (Round\n"
    "                         Attention's per question, OmniKV's with offload=1): loads, MiB, GB/s and % of the\n"
    "                         pinned copy rate measured in the same run\n"
    CLI_METHOD_HELP CLI_ENGINE_HELP;

typedef struct {
    char name[32];
    double prefill_s, decode_ms;
    kvb_kv_usage kv;
    double attended, formula;
    double copies[KVB_COPY_DIRS], bytes[KVB_COPY_DIRS]; /* per decode step, by direction */
    int64_t load_ns, load_bytes, loads;                  /* packed loads (PROF_H2D), with --profile */
    double phase_ms[PROF_PHASE_COUNT];                   /* decode phases per step, with --profile */
    long long graph[3];                                  /* CUDA graphs: decode steps recorded, graphs, nodes */
    char desc[200];
} bm_row;

/* One method on the shared prefill, as `kvbench run` times a cell (benchmarks/runner.c run_cell): its context forked
 * from sp (with the observation window nd says it reads), the method adopting the prefill (its prefill time is the shared forward's plus the fork and the end of
 * prefill), then n_dec greedy decode steps through the session. */
static int bench_method(const kvb_shared_prefill *sp, const char *name, const kvb_budget *b, kvb_opts *o,
                        const kvb_method_needs *nd, long n_dec, bm_row *row) {
    char err[512];
    double t0 = kvb_now_s();
    kvb_ctx *c = kvb_ctx_fork(sp->base, nd->obs_window, err, sizeof err); /* the window it reads, as run's cells */
    if (!c) return cli_fail("bench: %s", err);
    kvb_session ses = {0};
    kvb_budget full = {KVB_BUDGET_NONE, 0, 0};
    kvb_method *meth = kvb_method_create(name, c, kvb_method_find(name)->traits & KVB_NO_BUDGET ? &full : b, o, err, sizeof err);
    int rc = 1;
    if (!meth) { cli_fail("bench: %s", err); goto done; }
    kvb_session_method seam = kvb_method_seam(meth);
    kvb_gen_params gp = {.max_new = (int)n_dec + 1, .ignore_eos = 1}; /* n_dec decode steps */
    long long g0[3] = {0, 0, 0};
#ifdef KVB_HAVE_CUDA
    kvb_cuda_graph_counts(&g0[0], &g0[1], &g0[2]);
#endif
    if (kvb_session_init(&ses, c, &seam, &gp, err, sizeof err) ||
        kvb_shared_prefill_adopt(&ses, sp, kvb_shared_prefill_cell_ms(sp, nd) + (kvb_now_s() - t0) * 1e3, err, sizeof err) ||
        kvb_session_decode(&ses, err, sizeof err)) {
        cli_fail("bench: %s: %s", name, err);
        goto done;
    }
    row->prefill_s = ses.prefill_ms / 1e3;
    row->decode_ms = kvb_session_ms_per_token(&ses);
#ifdef KVB_HAVE_CUDA
    kvb_cuda_graph_counts(&row->graph[0], &row->graph[1], &row->graph[2]);
#endif
    for (int i = 0; i < 3; i++) row->graph[i] -= g0[i]; /* this method's decode steps */
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) row->phase_ms[ph] = ses.steps ? ses.dec_phase_ms[ph] / ses.steps : 0;
    row->kv = ses.kv_end;
    row->formula = meth->def->formula_frac ? meth->def->formula_frac(meth, c) : -1;
    row->attended = ses.attended;
    for (int d = 0; d < KVB_COPY_DIRS; d++) {
        int64_t cn = 0, cb = 0;
        prof_copies(c->prof, PROF_DECODE, d, &cn, &cb);
        row->copies[d] = n_dec > 0 ? (double)cn / (double)n_dec : 0;
        row->bytes[d] = n_dec > 0 ? (double)cb / (double)n_dec : 0;
    }
    for (int st = 0; st < PROF_STAGE_COUNT; st++) {
        row->load_ns += prof_total_ns(c->prof, (prof_stage)st, PROF_H2D);
        row->load_bytes += prof_total_bytes(c->prof, (prof_stage)st, PROF_H2D);
        row->loads += prof_calls(c->prof, (prof_stage)st, PROF_H2D);
    }
    snprintf(row->name, sizeof row->name, "%s", name);
    if (meth->def->describe) meth->def->describe(meth, row->desc, sizeof row->desc);
    rc = 0;
done:
    kvb_session_free(&ses);
    kvb_method_free(meth, c);
    kvb_ctx_free(c);
    return rc;
}

/* "3 / 12.0 KiB": copies and bytes per decode step in one direction */
static void copies_cell(char *buf, size_t cap, double n, double bytes) {
    if (bytes >= 1024.0 * 1024.0) snprintf(buf, cap, "%.0f / %.2f MiB", n, bytes / (1024.0 * 1024.0));
    else snprintf(buf, cap, "%.0f / %.1f KiB", n, bytes / 1024.0);
}

int cmd_bench_methods(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    kvb_budget budget = {KVB_BUDGET_FRACTION, 0.3, 0};
    const char *methods = NULL, *json = NULL;
    const char *raw_opts[32];
    cli_list raw = {raw_opts, 0, 32};
    long ctx_len = 8000, n_dec = 32;
    int bound = 0, profile = 0, no_calibrate = 0;
    char err[512];
    cli_opt opts[] = {CLI_STR("--method", &methods), CLI_STR("--methods", &methods),
                      CLI_FN("--budget", &budget, cli_fn_budget),
                      CLI_FN("--compression-ratio", &budget, cli_fn_compression_ratio), CLI_LIST("--method-opt", &raw),
                      CLI_LONG("--ctx-len", &ctx_len, 16, 1 << 20), CLI_LONG("-n", &n_dec, 0, 1 << 16),
                      CLI_STR("--json", &json), CLI_FLAG("--bound", &bound), CLI_FLAG("--profile", &profile),
                      CLI_FLAG("--no-calibrate", &no_calibrate),
                      CLI_ENGINE_OPTS(&eo), CLI_END};
    int stop = cli_parse("bench", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    if (!methods) return cli_fail("bench: --method is required for the method benchmark");
    for (int i = 0; i < raw.n; i++)
        if (cli_method_opt_prefix_check(raw.v[i], err, sizeof err)) return cli_fail("bench: %s", err);
    char list[2048];
    if (!strcmp(methods, "all")) kvb_method_names_all(list, sizeof list);
    else snprintf(list, sizeof list, "%s", methods);
    enum { MAX_NAMES = 64 };
    char *names[MAX_NAMES];
    int n_names = 0;
    names[n_names++] = "full";
    char *t = strtok(list, ",");
    if (!t) return cli_fail("bench: --method is empty (give method names, or all)");
    for (; t; t = strtok(NULL, ",")) {
        const kvb_method_def *info = kvb_method_find(t);
        if (!info) return cli_fail("bench: unknown method '%s'", t);
        if (n_names == MAX_NAMES) return cli_fail("bench: more than %d methods", MAX_NAMES - 1);
        if (!(info->traits & KVB_NO_BUDGET)) names[n_names++] = t; /* the baseline runs first anyway */
    }
    kvb_model *m = cli_load_model(&eo);
    if (!m) return 1;
    /* as plain bench: --ctx N goes beyond the model's context on purpose, up to N */
    int ctx_limit = eo.ctx.n_ctx > 0 ? eo.ctx.n_ctx : m->cfg.n_ctx_train;
    if (ctx_len + n_dec + 1 > ctx_limit) {
        kvb_model_free(m);
        return cli_fail("bench: context %ld + %ld decode steps exceeds %s of %d", ctx_len, n_dec,
                        eo.ctx.n_ctx > 0 ? "--ctx" : "the model's context", ctx_limit);
    }
    if (cli_calibrate_methods("bench", m, &eo.ctx, names, n_names, raw.v, raw.n, no_calibrate)) {
        kvb_model_free(m);
        return 1;
    }
    /* every method made once on a small context before the prefill (as `run` checks a suite's): a bad option or a
     * missing profile (Round's watershed layer on a synthetic model) fails now, not after the prefill and the
     * methods before it */
    kvb_ctx *chk = kvb_method_check_ctx(m, &eo.ctx, err, sizeof err);
    int bad = !chk;
    for (int k = 1; k < n_names && !bad; k++) {
        kvb_opts o;
        bad = kvb_opts_for_method(names[k], raw.v, raw.n, &o, err, sizeof err) ||
              kvb_method_check(chk, names[k], &o, err, sizeof err); /* the method names itself */
    }
    kvb_ctx_free(chk);
    if (bad) {
        kvb_model_free(m);
        return cli_fail("bench: %s", err);
    }
    int32_t *ids = malloc((size_t)ctx_len * sizeof *ids);
    bm_row *rows = calloc((size_t)n_names, sizeof *rows);
    kvb_method_needs needs[MAX_NAMES];
    kvb_shared_prefill sp = {0};
    int rc = 1;
    if (!ids || !rows) { cli_fail("bench: out of memory"); goto done; }
    if (m->tok)
        for (long i = 0; i < ctx_len; i++) ids[i] = (int32_t)(1000 + (i * 7919) % 40000);
    else
        syn_random_ids(0, m->cfg.n_vocab, ids, ctx_len); /* synthetic:<shape>: no tokenizer, ids only */
    char bud[32];
    kvb_budget_format(&budget, bud, sizeof bud);
    int discrete = 0; /* the copy rate on an idle device, before the methods run */
    double h2d_gbs = 0, copy_gbs = cli_copy_gbs_for(eo.ctx.backend, eo.ctx.n_threads, bound, profile, &discrete, &h2d_gbs);
    if (discrete) bound = 1;
    const double w_bytes = cli_step_weight_bytes(m, discrete), kv_tok = cli_kv_token_bytes(&m->cfg, eo.ctx.kv_dtype);
    kvb_method_needs u = {0}; /* what the shared prefill records: the union of the methods' needs */
    for (int k = 0; k < n_names; k++) {
        kvb_opts o;
        if (kvb_opts_for_method(names[k], raw.v, raw.n, &o, err, sizeof err) ||
            kvb_method_needs_of(names[k], &o, &needs[k], err, sizeof err)) { cli_fail("bench: %s", err); goto done; }
        kvb_method_needs_merge(&u, &needs[k]);
    }
    kvb_prefill_env env = {.model = m, .cp = eo.ctx, .n_ctx = (int)(ctx_len + n_dec + 1)};
    env.cp.profile = profile;
    fprintf(stderr, "prefill %ld tokens (shared by every method, as `kvbench run` shares a sample's) ...\n", ctx_len);
    if (kvb_shared_prefill_ids(&env, ids, ctx_len, &u, (int)n_dec + 1, &sp, err, sizeof err)) {
        cli_fail("bench: prefill: %s", err);
        goto done;
    }
    for (int k = 0; k < n_names; k++) {
        kvb_opts o;
        if (kvb_opts_for_method(names[k], raw.v, raw.n, &o, err, sizeof err)) { cli_fail("bench: %s", err); goto done; }
        fprintf(stderr, "[%d/%d] %s: decode %ld ...\n", k + 1, n_names, names[k], n_dec);
        if (bench_method(&sp, names[k], &budget, &o, &needs[k], n_dec, &rows[k])) goto done;
    }
    const double MiB = 1024.0 * 1024.0;
    printf("\nmethods at %ld tokens, budget %s, %ld decode steps (%s, backend %s)\n\n", ctx_len, bud, n_dec, m->path,
           eo.ctx.backend);
#ifdef KVB_HAVE_CUDA
    if (strcmp(eo.ctx.backend, "cpu")) printf("CUDA kernels: %s\n\n", kvb_cuda_kernels());
    if (strcmp(eo.ctx.backend, "cpu") && *kvb_cuda_graph_stats()) { /* every method's steps together, then each */
        printf("CUDA graphs (all methods): %s\n", kvb_cuda_graph_stats());
        printf("CUDA graphs a decode step (nodes a graph):");
        for (int k = 0; k < n_names; k++)
            if (rows[k].graph[0] > 0)
                printf("%s %s %.2f (%.0f)", k ? "," : "", rows[k].name, (double)rows[k].graph[1] / (double)rows[k].graph[0],
                       rows[k].graph[1] ? (double)rows[k].graph[2] / (double)rows[k].graph[1] : 0.0);
        printf("\n\n");
    }
#endif
    if (bound)
        printf("byte bound: %.3f GB of matmul weights (%s) + %.1f KiB of K+V per attended token, at %.1f GB/s (the "
               "backend's device copy rate, bytes read + written, measured now%s)\n\n",
               w_bytes / 1e9, discrete ? "f16 copies" : "as in the file", kv_tok / 1024, copy_gbs,
               discrete ? "" : "; one thread on the CPU");
    printf("| method | prefill s | decode ms/token | speedup vs full |%s device KV MiB | %% of full | formula %% | host KV MiB | moved MiB | h2d/step | d2h/step | attended/layer | parameters |\n",
           bound ? " GB/step | bound ms | % of bound | bound speedup | % of bound speedup |" : "");
    printf("|---|---|---|---|%s---|---|---|---|---|---|---|---|---|\n", bound ? "---|---|---|---|---|" : "");
    /* the byte-bound speedup: full's bound over the method's, what fewer bytes read allow; the measured speedup
     * against it says how much of that the method delivers (OmniKV's filter layers read every row: its bound
     * speedup at 128K with layers 2;8;18 is about 1.55x, not the budget's ratio) */
    const double full_bound_ms = copy_gbs > 0 ? (w_bytes + kv_tok * rows[0].attended) / (copy_gbs * 1e9) * 1e3 : 0;
    for (int k = 0; k < n_names; k++) {
        bm_row *r = &rows[k];
        char formula[32] = "-";
        if (r->formula >= 0) snprintf(formula, sizeof formula, "%.1f", 100 * r->formula);
        char up[48], down[48];
        copies_cell(up, sizeof up, r->copies[KVB_COPY_H2D], r->bytes[KVB_COPY_H2D]);
        copies_cell(down, sizeof down, r->copies[KVB_COPY_D2H], r->bytes[KVB_COPY_D2H]);
        char bcell[128] = "";
        double step = w_bytes + kv_tok * r->attended, bound_ms = copy_gbs > 0 ? step / (copy_gbs * 1e9) * 1e3 : 0;
        if (bound && bound_ms > 0 && r->decode_ms > 0) {
            const double bound_up = full_bound_ms / bound_ms, up = rows[0].decode_ms / r->decode_ms;
            snprintf(bcell, sizeof bcell, " %.3f | %.3f | %.0f%% | %.2fx | %.0f%% |", step / 1e9, bound_ms,
                     100 * bound_ms / r->decode_ms, bound_up, 100 * up / bound_up);
        } else if (bound) {
            snprintf(bcell, sizeof bcell, " %.3f | - | - | - | - |", step / 1e9);
        }
        printf("| %s | %.1f | %.2f | %.2fx |%s %.2f | %.1f | %s | %.2f | %.2f | %s | %s | %.0f | %s |\n", r->name,
               r->prefill_s, r->decode_ms, r->decode_ms > 0 ? rows[0].decode_ms / r->decode_ms : 0, bcell,
               r->kv.device_bytes / MiB, 100 * r->kv.device_frac, formula, r->kv.host_bytes / MiB,
               (r->kv.moved_h2d + r->kv.moved_d2h) / MiB, up, down, r->attended, r->desc);
    }
    if (profile) {
        /* attention and the phases whose work is the matmuls (with their small ops: norms, rope, adds) */
        static const prof_phase mm[] = {PROF_CALC_QKV_AND_ROPE, PROF_ATTN_OUTPUT, PROF_MLP, PROF_LM_HEAD};
        printf("\ndecode step by phase (ms/token; a load made inside attention counts as attention; outside = the step "
               "less attention and the matmul phases):\n\n");
        printf("| method | ms/token | attention | matmul phases | select | update_cache | h2d | d2h | sample | outside %% |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int k = 0; k < n_names; k++) {
            const bm_row *r = &rows[k];
            double mmt = 0;
            for (size_t i = 0; i < sizeof mm / sizeof *mm; i++) mmt += r->phase_ms[mm[i]];
            const double out = r->decode_ms - r->phase_ms[PROF_ATTN_FORWARD] - mmt;
            printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f%% |\n", r->name, r->decode_ms,
                   r->phase_ms[PROF_ATTN_FORWARD], mmt, r->phase_ms[PROF_SELECT], r->phase_ms[PROF_UPDATE_CACHE],
                   r->phase_ms[PROF_H2D], r->phase_ms[PROF_D2H], r->phase_ms[PROF_SAMPLE],
                   r->decode_ms > 0 ? 100 * out / r->decode_ms : 0);
        }
        printf("\npacked host->device loads (the methods' h2d phase, from its start to the device having finished it)"
               " against the backend's pinned host->device copy of 256 MiB, %.2f GB/s, measured now:\n\n", h2d_gbs);
        printf("| method | loads | MiB | ms | GB/s | %% of pinned copy |\n|---|---:|---:|---:|---:|---:|\n");
        for (int k = 0; k < n_names; k++) {
            const bm_row *r = &rows[k];
            if (!r->loads) continue;
            double gbs = r->load_ns > 0 ? (double)r->load_bytes / (double)r->load_ns : 0; /* bytes/ns = GB/s */
            printf("| %s | %lld | %.2f | %.3f | %.2f | %.0f%% |\n", r->name, (long long)r->loads, r->load_bytes / MiB,
                   r->load_ns / 1e6, gbs, h2d_gbs > 0 ? 100 * gbs / h2d_gbs : 0);
        }
    }
    if (json) {
        cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "methods");
        cJSON_AddNumberToObject(j, "ctx_len", (double)ctx_len);
        cJSON_AddStringToObject(j, "budget", bud);
        cJSON_AddNumberToObject(j, "weight_bytes", w_bytes);
        cJSON_AddNumberToObject(j, "kv_token_bytes", kv_tok);
        if (copy_gbs > 0) cJSON_AddNumberToObject(j, "copy_gbs", copy_gbs);
        if (h2d_gbs > 0) cJSON_AddNumberToObject(j, "pinned_h2d_gbs", h2d_gbs);
        for (int k = 0; k < n_names; k++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "method", rows[k].name);
            cJSON_AddNumberToObject(o, "prefill_s", rows[k].prefill_s);
            cJSON_AddNumberToObject(o, "decode_ms_per_token", rows[k].decode_ms);
            cJSON_AddNumberToObject(o, "kv_device_bytes", (double)rows[k].kv.device_bytes);
            cJSON_AddNumberToObject(o, "kv_host_bytes", (double)rows[k].kv.host_bytes);
            cJSON_AddNumberToObject(o, "kv_full_bytes", (double)rows[k].kv.full_bytes);
            cJSON_AddNumberToObject(o, "moved_bytes", (double)(rows[k].kv.moved_h2d + rows[k].kv.moved_d2h));
            cJSON_AddNumberToObject(o, "attended_per_layer", rows[k].attended);
            cJSON_AddNumberToObject(o, "step_bytes", w_bytes + kv_tok * rows[k].attended);
            if (profile) {
                cJSON *ph = cJSON_AddObjectToObject(o, "decode_phase_ms");
                for (int p = 0; ph && p < PROF_PHASE_COUNT; p++)
                    cJSON_AddNumberToObject(ph, prof_phase_name((prof_phase)p), rows[k].phase_ms[p]);
                cJSON_AddNumberToObject(o, "loads", (double)rows[k].loads);
                cJSON_AddNumberToObject(o, "load_bytes", (double)rows[k].load_bytes);
                cJSON_AddNumberToObject(o, "load_ns", (double)rows[k].load_ns);
            }
            cJSON_AddNumberToObject(o, "h2d_copies_per_step", rows[k].copies[KVB_COPY_H2D]);
            cJSON_AddNumberToObject(o, "h2d_bytes_per_step", rows[k].bytes[KVB_COPY_H2D]);
            cJSON_AddNumberToObject(o, "d2h_copies_per_step", rows[k].copies[KVB_COPY_D2H]);
            cJSON_AddNumberToObject(o, "d2h_bytes_per_step", rows[k].bytes[KVB_COPY_D2H]);
            if (rows[k].formula >= 0) cJSON_AddNumberToObject(o, "formula_frac", rows[k].formula);
            cJSON_AddStringToObject(o, "parameters", rows[k].desc);
            cJSON_AddItemToArray(arr, o);
        }
        char *text = cJSON_Print(j);
        cJSON_Delete(j);
        FILE *f = fopen(json, "w");
        if (!f || fputs(text, f) < 0 || fclose(f)) { free(text); cli_fail("bench: cannot write %s", json); goto done; }
        free(text);
    }
    rc = 0;
done:
    kvb_shared_prefill_free(&sp); /* the forks went with their rows */
    free(ids);
    free(rows);
    kvb_model_free(m);
    return rc;
}
