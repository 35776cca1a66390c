/* cmd_fidelity.c — `kvbench fidelity`: each method teacher-forced with full attention's greedy continuation
 * on one or more prompts (methods/fidelity.h); a Markdown table per method and per layer, and JSON. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/synthetic.h"
#include "engine/tokenizer.h"
#include "methods/fidelity.h"

static const char *HELP =
    "usage: kvbench fidelity --prompt-file F [--prompt-file F2 ...] --methods a,b|all --budget B [-n N]\n"
    "                        [--max-tokens T] [--method-opt [M:]K=V] [--json FILE] [engine options]\n"
    "\n"
    "Full attention prefills each prompt and generates N greedy tokens; each method prefills the same prompt\n"
    "with its own hooks and is teacher-forced with full's tokens, step for step. Per method it reports:\n"
    "  top-1     share of positions where the method's most likely next token is full's;\n"
    "  KL        mean (and max) KL(full || method) of the next-token distributions, in nats;\n"
    "  recall    per layer, the share of full attention's probability mass (per KV head, mean over its query\n"
    "            heads) on the positions the method let that layer read, averaged over decode steps.\n"
    "Results are summed over the prompts. `--methods all` = every compressing method; add full for a\n"
    "sanity row (top-1 100%, KL 0, recall 1). A --method-opt prefixed `M:` applies to that method only.\n"
    "A method that reads the model's calibration profile (round, pod, qfilter, duo; omnikv with layers=profile)\n"
    "on a model whose profile lacks its section is calibrated first, once, as `kvbench run` does.\n"
    "The table's `max KV/head` is the most slots any layer's KV head held, measured in the store after the\n"
    "prefill and after every decode step, and the step it was reached at (a method compressing while decoding\n"
    "must keep it bounded: `decoding` holds at most target + interval).\n"
    "\n"
    "options:\n"
    "  --prompt-file F        a text prompt (repeatable, up to 16), tokenized with BOS, no chat template\n"
    "  --methods LIST         comma list of methods, or all\n"
    "  --budget B             30% (share of the full KV bytes) or N tokens per layer and head (default 30%)\n"
    "  --compression-ratio R  kvpress's: remove R of the prompt's KV, = --budget (1-R)x100%\n"
    "  -n N                   positions compared per prompt (default 32; fewer when full ends its answer)\n"
    "  --ignore-eos           full attention keeps generating past its end of generation: exactly N positions\n"
    "  --max-tokens T         keep the first T tokens of each prompt (default: all)\n"
    "  --method-opt [M:]K=V   a method parameter (repeatable)\n"
    "  --no-calibrate         a missing calibration is an error naming the command to run, not calibrated here\n"
    "  --json FILE            also write every figure (per prompt, per layer) as JSON\n" CLI_ENGINE_HELP;

#define MAX_PROMPTS 16
#define MAX_METHODS 64 /* the registry holds about 30 */

typedef struct {
    const char *name;
    kvb_fid_result sum;                  /* over the prompts */
    double device_frac_sum, host_mib_sum; /* measured KV per prompt, summed */
} method_total;

static void add_result(method_total *t, const kvb_fid_result *r) {
    kvb_fid_result_add(&t->sum, r);
    t->device_frac_sum += r->kv.device_frac;
    t->host_mib_sum += r->kv.host_bytes / (1024.0 * 1024.0);
}

static cJSON *result_json(const char *prompt, int64_t n_tokens, const char *method, const kvb_fid_result *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", prompt);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)n_tokens);
    cJSON_AddStringToObject(o, "method", method);
    cJSON_AddStringToObject(o, "parameters", r->params);
    cJSON_AddNumberToObject(o, "positions", r->positions);
    cJSON_AddNumberToObject(o, "top1_agreement", r->positions ? (double)r->agree / r->positions : 0);
    cJSON_AddNumberToObject(o, "kl_mean", r->positions ? r->kl_sum / r->positions : 0);
    cJSON_AddNumberToObject(o, "kl_max", r->kl_max);
    cJSON_AddNumberToObject(o, "decode_steps", r->recall_steps);
    cJSON *rl = cJSON_AddArrayToObject(o, "recall_by_layer");
    for (int l = 0; l < r->n_layer; l++)
        cJSON_AddItemToArray(rl, cJSON_CreateNumber(r->recall_steps ? kvb_fid_layer_recall(r, l) : 0));
    double mr = kvb_fid_mean_recall(r);
    if (isnan(mr)) cJSON_AddNullToObject(o, "recall_mean");
    else cJSON_AddNumberToObject(o, "recall_mean", mr);
    cJSON_AddNumberToObject(o, "kv_device_frac", r->kv.device_frac);
    cJSON_AddNumberToObject(o, "kv_device_bytes", (double)r->kv.device_bytes);
    cJSON_AddNumberToObject(o, "kv_host_bytes", (double)r->kv.host_bytes);
    cJSON_AddNumberToObject(o, "max_head_tokens", (double)r->max_head_tokens);
    cJSON_AddNumberToObject(o, "max_head_step", r->max_head_step);
    return o;
}

static void print_tables(const method_total *t, int n_methods, int n_layer, int n_prompts, const char *budget) {
    printf("\nfidelity to full attention, budget %s, %d prompt(s)\n\n", budget, n_prompts);
    printf("| method | positions | top-1 agreement %% | mean KL (nats) | max KL | mean recall | min layer recall | device KV %% of full | host KV MiB | max KV/head (step) | parameters |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int k = 0; k < n_methods; k++) {
        const kvb_fid_result *r = &t[k].sum;
        double minr = INFINITY;
        int minl = -1;
        for (int l = 0; l < n_layer && r->recall_steps; l++)
            if (kvb_fid_layer_recall(r, l) < minr) minr = kvb_fid_layer_recall(r, l), minl = l;
        printf("| %s | %d | %.1f | %.4f | %.3f | %.3f | %.3f (layer %d) | %.1f | %.2f | %lld (%d) | %s |\n", t[k].name,
               r->positions,
               r->positions ? 100.0 * r->agree / r->positions : 0, r->positions ? r->kl_sum / r->positions : 0, r->kl_max,
               kvb_fid_mean_recall(r), minl >= 0 ? minr : NAN, minl, 100 * t[k].device_frac_sum / n_prompts,
               t[k].host_mib_sum / n_prompts, (long long)r->max_head_tokens, r->max_head_step, r->params);
    }
    printf("\nattention-mass recall by layer\n\n| layer |");
    for (int k = 0; k < n_methods; k++) printf(" %s |", t[k].name);
    printf("\n|---:|");
    for (int k = 0; k < n_methods; k++) printf("---:|");
    printf("\n");
    for (int l = 0; l < n_layer; l++) {
        printf("| %d |", l);
        for (int k = 0; k < n_methods; k++) printf(" %.3f |", kvb_fid_layer_recall(&t[k].sum, l));
        printf("\n");
    }
}

/* Tokenize a prompt file (BOS, no special-token parsing), keeping at most max_tokens. */
static int32_t *prompt_ids(kvb_model *m, const char *path, long max_tokens, int *n) {
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) return NULL;
    int32_t *ids = NULL;
    char err[256];
    int rc = tok_encode(m->tok, text, len, 1, 0, &ids, n, err, sizeof err);
    free(text);
    if (rc) { cli_fail("fidelity: %s: %s", path, err); return NULL; }
    if (*n < 2) { free(ids); cli_fail("fidelity: %s: the prompt is empty", path); return NULL; }
    if (max_tokens > 0 && *n > max_tokens) *n = (int)max_tokens;
    return ids;
}

int cmd_fidelity(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    kvb_budget budget = {KVB_BUDGET_FRACTION, 0.3, 0};
    const char *methods = NULL, *json = NULL, *prompts[MAX_PROMPTS], *raw_opts[32];
    cli_list prompt_list = {prompts, 0, MAX_PROMPTS}, raw = {raw_opts, 0, 32};
    char err[512];
    long n_gen = 32, max_tokens = 0;
    int ignore_eos = 0, no_calibrate = 0;
    cli_opt opts[] = {CLI_STR("--methods", &methods), CLI_STR("--method", &methods),
                      CLI_LIST("--prompt-file", &prompt_list), CLI_FN("--budget", &budget, cli_fn_budget),
                      CLI_FN("--compression-ratio", &budget, cli_fn_compression_ratio),
                      CLI_LIST("--method-opt", &raw), CLI_LONG("-n", &n_gen, 1, 1 << 16),
                      CLI_LONG("--max-tokens", &max_tokens, 2, 1 << 24), CLI_STR("--json", &json), CLI_FLAG("--ignore-eos", &ignore_eos),
                      CLI_FLAG("--no-calibrate", &no_calibrate), CLI_ENGINE_OPTS(&eo),
                      CLI_END};
    int stop = cli_parse("fidelity", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    int n_prompts = prompt_list.n;
    if (!methods) return cli_fail("fidelity: --methods is required (e.g. --methods all)");
    for (int i = 0; i < raw.n; i++)
        if (cli_method_opt_prefix_check(raw.v[i], err, sizeof err)) return cli_fail("fidelity: %s", err);
    if (!n_prompts) return cli_fail("fidelity: give at least one --prompt-file");
    if (syn_is_name(eo.model)) return cli_fail("synthetic models have no tokenizer: %s needs text; use a GGUF model", "fidelity");
    char list[2048];
    if (!strcmp(methods, "all")) kvb_method_names_all(list, sizeof list);
    else snprintf(list, sizeof list, "%s", methods);
    method_total tot[MAX_METHODS];
    memset(tot, 0, sizeof tot);
    int n_methods = 0;
    for (char *save, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!kvb_method_find(t)) return cli_fail("fidelity: unknown method '%s'", t);
        if (n_methods == MAX_METHODS) return cli_fail("fidelity: more than %d methods", MAX_METHODS);
        tot[n_methods++].name = t;
    }
    if (!n_methods) return cli_fail("fidelity: --methods is empty (give method names, or all)");
    kvb_model *m = cli_load_model(&eo);
    if (!m) return 1;
    const int L = m->cfg.n_layer;
    int rc = 1;
    int32_t *pids[MAX_PROMPTS] = {0};
    int pn[MAX_PROMPTS] = {0};
    cJSON *runs = cJSON_CreateArray();
    for (int k = 0; k < n_methods; k++)
        if (kvb_fid_result_init(&tot[k].sum, L)) { cli_fail("fidelity: out of memory"); goto done; }
    char bud[32];
    kvb_budget_format(&budget, bud, sizeof bud);
    /* every prompt is read and checked before any work, so a bad one does not cost the others' results */
    for (int p = 0; p < n_prompts; p++) {
        if (!(pids[p] = prompt_ids(m, prompts[p], max_tokens, &pn[p]))) goto done;
        const int limit = eo.ctx.n_ctx > 0 ? eo.ctx.n_ctx : m->cfg.n_ctx_train; /* --ctx, else the model's */
        if (pn[p] + n_gen + 1 > limit) {
            cli_fail("fidelity: %s: %d prompt tokens + %ld exceed the %s of %d (use --max-tokens)", prompts[p], pn[p],
                     n_gen, eo.ctx.n_ctx > 0 ? "context given by --ctx" : "model's context", limit);
            goto done;
        }
    }
    {
        char *names[MAX_METHODS];
        for (int k = 0; k < n_methods; k++) names[k] = (char *)tot[k].name;
        if (cli_calibrate_methods("fidelity", m, &eo.ctx, names, n_methods, raw.v, raw.n, no_calibrate)) goto done;
    }
    double t0 = cli_now();
    for (int p = 0; p < n_prompts; p++) {
        int n = pn[p];
        const int32_t *ids = pids[p];
        fprintf(stderr, "[prompt %d/%d] %s: %d tokens, full attention prefill ...\n", p + 1, n_prompts, prompts[p], n);
        kvb_fid_ref *ref = kvb_fid_ref_create(m, &eo.ctx, ids, n, (int)n_gen, err, sizeof err);
        if (!ref) { cli_fail("fidelity: %s: %s", prompts[p], err); goto done; }
        kvb_fid_ref_ignore_eos(ref, ignore_eos);
        for (int k = 0; k < n_methods; k++) {
            kvb_opts o;
            kvb_fid_result r;
            if (kvb_opts_for_method(tot[k].name, raw.v, raw.n, &o, err, sizeof err) ||
                kvb_fidelity_run(ref, tot[k].name, &budget, &o, &r, err, sizeof err)) {
                kvb_fid_ref_free(ref);
                cli_fail("fidelity: %s on %s: %s", tot[k].name, prompts[p], err);
                goto done;
            }
            fprintf(stderr, "  %-12s top-1 %5.1f%%  KL %.4f  recall %.3f   (%.0f s elapsed)\n", tot[k].name,
                    r.positions ? 100.0 * r.agree / r.positions : 0, r.positions ? r.kl_sum / r.positions : 0,
                    kvb_fid_mean_recall(&r), cli_now() - t0);
            add_result(&tot[k], &r);
            cJSON_AddItemToArray(runs, result_json(prompts[p], n, tot[k].name, &r));
            kvb_fid_result_free(&r);
        }
        kvb_fid_ref_free(ref);
    }
    print_tables(tot, n_methods, L, n_prompts, bud);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", m->path);
        cJSON_AddStringToObject(j, "budget", bud);
        cJSON_AddNumberToObject(j, "n", (double)n_gen);
        cJSON_AddItemToObject(j, "runs", runs);
        runs = NULL;
        char *text = cJSON_Print(j);
        cJSON_Delete(j);
        FILE *f = fopen(json, "w");
        int bad = !text || !f || fputs(text, f) < 0;
        if (f && fclose(f)) bad = 1;
        free(text);
        if (bad) { cli_fail("fidelity: cannot write %s", json); goto done; }
    }
    rc = 0;
done:
    for (int p = 0; p < n_prompts; p++) free(pids[p]);
    cJSON_Delete(runs);
    for (int k = 0; k < n_methods; k++) kvb_fid_result_free(&tot[k].sum);
    kvb_model_free(m);
    return rc;
}
