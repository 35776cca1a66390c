/* cmd_generate.c — `kvbench generate`: one prompt through the engine, text out, then speed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "base/fsutil.h"
#include "engine/chat.h"
#include "benchmarks/runopts.h"
#include "engine/kept.h"
#include "engine/sampler.h"
#include "engine/synthetic.h"

static const char *HELP =
    "usage: kvbench generate [--model PATH|default] (--prompt TEXT | --prompt-file F) [options]\n"
    "\n"
    "Runs the prompt through the model (prefill in chunks), then generates up to N tokens, printing\n"
    "them as they come; then prints prefill and decode tokens/s on stderr.\n"
    "\n"
    "options:\n"
    "  --prompt TEXT          the prompt\n"
    "  --prompt-file F        read the prompt from a file\n"
    "  --chat                 wrap the prompt as a user turn in the model's chat template\n"
    "  --system TEXT          system message for --chat (default: the template's own, if any)\n"
    "  --template NAME        chat template: chatml, llama3, mistral (default: from the model)\n"
    "  -n N                   tokens to generate (default 128; stops early at end of generation)\n"
    "  --temp T               sampling temperature (default 0 = greedy)\n"
    "  --top-p P              nucleus sampling mass (default 1 = off)\n"
    "  --seed S               RNG seed (default 42)\n"
    "  --ignore-eos           keep generating past end-of-generation tokens\n"
    "  --profile              print the per-phase time breakdown (prefill vs decode)\n"
    "  --trace FILE           write a Chrome/Perfetto trace of the phases per layer\n"
    "  --ids                  also print the prompt and generated token ids on stderr\n"
    "  --special              read special-token text in the prompt (<|im_start|> ...) as those tokens\n"
    "                         (always on with --chat)\n"
    "  --kv-report            print measured KV bytes after prefill and at the end (always with a method)\n"
    "  --dump-activations DIR write every intermediate activation (llama.cpp's graph names) of every forward\n"
    "                         pass to DIR/activations.f32 with an index DIR/activations.tsv\n"
    "                         (scripts/llamacpp_diff.py compares them with llama.cpp's, op by op)\n"
    "  --dump-kept FILE       write, per layer and KV head, the positions the method kept (and, at the end,\n"
    "                         attended) after prefill and at the end, as JSON lines (docs/methods.md \"Kept tokens\")\n"
    CLI_METHOD_HELP CLI_ENGINE_HELP;

/* --dump-activations: raw floats appended to one file, a line per call in the index */
typedef struct {
    FILE *data, *index;
    long long offset;
    int call, failed;
} act_dump;

static void dump_tap(void *user, const char *name, int layer, const float *x, int64_t n_rows, int64_t row_len) {
    act_dump *d = user;
    if (d->failed) return;
    size_t n = (size_t)(n_rows * row_len);
    if (fwrite(x, sizeof *x, n, d->data) != n ||
        fprintf(d->index, "%d\t%s\t%d\t%lld\t%lld\t%lld\n", d->call, name, layer, d->offset, (long long)n_rows,
                (long long)row_len) < 0)
        d->failed = 1;
    d->offset += (long long)n;
    if (!strcmp(name, "result_output")) d->call++;
}

static int dump_open(act_dump *d, const char *dir) {
    char path[4096];
    if (kvb_mkdirs(dir)) return cli_fail("generate: cannot create %s: %s", dir, strerror(errno)), -1;
    snprintf(path, sizeof path, "%s/activations.f32", dir);
    d->data = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/activations.tsv", dir);
    d->index = fopen(path, "w");
    if (!d->data || !d->index) return cli_fail("generate: cannot write activations in %s", dir), -1;
    fputs("call\tname\tlayer\toffset\trows\tcols\n", d->index);
    return 0;
}

static int dump_close(act_dump *d, const char *dir) {
    int bad = d->failed;
    if (d->data && fclose(d->data)) bad = 1;
    if (d->index && fclose(d->index)) bad = 1;
    if (bad && dir) cli_fail("generate: writing activations in %s failed (disk full?)", dir);
    return bad ? -1 : 0;
}

/* --dump-kept: a header line (method, resolved parameters, budget, prompt ids), then the kept positions after
 * prefill and at the end (engine/kept.h) */
typedef struct {
    FILE *f;
    kvb_kept *k;
    const char *path;
} kept_dump;

static int kept_open(kept_dump *d, const char *path, kvb_ctx *c) {
    d->path = path;
    if (!path) return 0;
    if (!(d->f = fopen(path, "w"))) return cli_fail("generate: cannot write %s: %s", path, strerror(errno)), -1;
    if (!(d->k = kvb_kept_attach(c))) return cli_fail("generate: out of memory"), -1;
    return 0;
}

static int kept_note(kept_dump *d, kvb_ctx *c, const kvb_method *m, const kvb_budget *b, const int32_t *ids,
                     const char *when) {
    if (!d->f) return 0;
    char err[256], bud[32];
    kvb_budget_format(b, bud, sizeof bud);
    if (kvb_run_kept_note(d->f, d->k, c, m, bud, NULL, NULL, ids, when, err, sizeof err))
        return cli_fail("generate: %s: %s", d->path, err), -1;
    return 0;
}

static int kept_close(kept_dump *d, kvb_ctx *c) {
    kvb_kept_free(d->k, c);
    int bad = d->f && fclose(d->f);
    return bad ? cli_fail("generate: writing %s failed (disk full?)", d->path), -1 : 0;
}

int cmd_generate(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    cli_method_opts mo;
    cli_method_defaults(&mo);
    int kv_report = 0;
    const char *prompt = NULL, *prompt_file = NULL, *system = NULL, *tmpl_name = NULL, *trace = NULL;
    const char *dump_dir = NULL, *dump_kept = NULL;
    act_dump dump = {0};
    kept_dump kept = {0};
    long n_gen = 128, seed = 42;
    double temp = 0.0, top_p = 1.0;
    int chat = 0, ignore_eos = 0, show_ids = 0, special = 0;
    cli_opt opts[] = {CLI_FLAG("--chat", &chat), CLI_FLAG("--ignore-eos", &ignore_eos),
                      CLI_FLAG("--profile", &eo.ctx.profile), CLI_FLAG("--ids", &show_ids),
                      CLI_FLAG("--special", &special), CLI_FLAG("--kv-report", &kv_report),
                      CLI_TEXT("--prompt", &prompt), CLI_STR("--prompt-file", &prompt_file),
                      CLI_TEXT("--system", &system), CLI_STR("--template", &tmpl_name),
                      CLI_STR("--dump-activations", &dump_dir), CLI_STR("--trace", &trace),
                      CLI_STR("--dump-kept", &dump_kept),
                      CLI_LONG("-n", &n_gen, 0, 1 << 24), CLI_LONG("--seed", &seed, 0, 0x7fffffffL),
                      CLI_FLOAT("--temp", &temp, 0, 100), CLI_FLOAT("--top-p", &top_p, 0, 1), CLI_METHOD_OPTS(&mo),
                      CLI_ENGINE_OPTS(&eo), CLI_END};
    int stop = cli_parse("generate", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    if (trace) eo.ctx.trace = 1;
    if (!!prompt == !!prompt_file) return cli_fail("generate: give exactly one of --prompt or --prompt-file");
    if (!chat && (system || tmpl_name)) return cli_fail("generate: --system and --template need --chat");
    if (syn_is_name(eo.model)) return cli_fail("synthetic models have no tokenizer: %s needs text; use a GGUF model", "generate");
    char *file_text = NULL;
    size_t prompt_len = 0;
    if (prompt_file) {
        file_text = cli_read_file(prompt_file, &prompt_len);
        if (!file_text) return 1;
        prompt = file_text;
    } else {
        prompt_len = strlen(prompt);
    }

    int rc = 1;
    char err[512];
    char *rendered = NULL;
    int32_t *ids = NULL;
    kvb_ctx *ctx = NULL;
    kvb_session ses = {0};
    kvb_method *method = NULL;
    kvb_model *m = cli_load_model(&eo);
    if (!m) goto done;

    const char *text = prompt;
    size_t text_len = prompt_len;
    if (chat) {
        chat_kind kind;
        if (tmpl_name) {
            if (chat_kind_from_name(tmpl_name, &kind)) {
                cli_fail("generate: unknown chat template '%s' (chatml, llama3, mistral)", tmpl_name);
                goto done;
            }
        }
        chat_msg msgs[2];
        int n_msgs = 0;
        if (system) msgs[n_msgs++] = (chat_msg){"system", system};
        msgs[n_msgs++] = (chat_msg){"user", prompt};
        char *def_sys = NULL;
        chat_kind detected = chat_model_kind(m->gguf, m->cfg.arch, system ? NULL : &def_sys);
        if (!tmpl_name) kind = detected;
        int e = chat_render(kind, msgs, n_msgs, 1, def_sys, &rendered, err, sizeof err);
        free(def_sys);
        if (e) {
            cli_fail("generate: %s", err);
            goto done;
        }
        text = rendered;
        text_len = strlen(rendered);
    }
    int n_ids = 0;
    if (tok_encode(m->tok, text, text_len, 1, chat || special, &ids, &n_ids, err, sizeof err)) {
        cli_fail("generate: prompt: %s", err);
        goto done;
    }
    if (n_ids == 0) {
        cli_fail("generate: the prompt is empty after tokenization");
        goto done;
    }
    kvb_ctx_params cp = eo.ctx;
    int n_ctx = cp.n_ctx > 0 ? cp.n_ctx : m->cfg.n_ctx_train;
    if (n_ids + n_gen > n_ctx) {
        cli_fail("generate: prompt of %d tokens + %ld to generate exceeds the context of %d tokens (use --ctx, or "
                 "a shorter prompt or -n)",
                 n_ids, n_gen, n_ctx);
        goto done;
    }
    cp.n_ctx = n_ctx;
    ctx = kvb_ctx_create(m, &cp, err, sizeof err);
    if (!ctx) {
        cli_fail("generate: %s", err);
        goto done;
    }
    method = kvb_method_create(mo.method, ctx, &mo.budget, &mo.opts, err, sizeof err);
    if (!method) {
        cli_fail("generate: %s", err);
        goto done;
    }
    if (!(kvb_method_find(mo.method)->traits & KVB_NO_BUDGET)) kv_report = 1; /* a method beside the baseline */
    if (kept_open(&kept, dump_kept, ctx)) goto done;
    if (dump_dir) {
        if (dump_open(&dump, dump_dir)) goto done;
        ctx->tap = dump_tap;
        ctx->tap_user = &dump;
    }
    kvb_gen_params gp = {.max_new = (int)n_gen, .ignore_eos = ignore_eos, .temp = (float)temp, .top_p = (float)top_p,
                         .seed = (uint64_t)seed};
    kvb_session_method seam = kvb_method_seam(method);
    if (kvb_session_init(&ses, ctx, &seam, &gp, err, sizeof err)) {
        cli_fail("generate: %s", err);
        goto done;
    }
    if (show_ids) {
        fprintf(stderr, "prompt ids (%d):", n_ids);
        for (int i = 0; i < n_ids; i++) fprintf(stderr, " %d", ids[i]);
        fputc('\n', stderr);
    }
    kvb_rounds prompt_rounds = {.ids = ids, .n = n_ids};
    if (kvb_rounds_chunk(&prompt_rounds, 0, err, sizeof err) || kvb_session_prefill(&ses, &prompt_rounds, 0, err, sizeof err)) {
        free(prompt_rounds.round_end);
        cli_fail("generate: %s", err);
        goto done;
    }
    free(prompt_rounds.round_end);
    if (kept_note(&kept, ctx, method, &mo.budget, ids, "prefill")) goto done;
    int r;
    const char *piece;
    size_t np;
    while ((r = kvb_session_step(&ses, &piece, &np, err, sizeof err)) > 0) {
        if (show_ids) fprintf(stderr, " %d", ses.gen[ses.n_gen - 1]);
        fwrite(piece, 1, np, stdout);
        fflush(stdout);
    }
    size_t shown = ses.text_n;
    if (r < 0 || kvb_session_finish(&ses, err, sizeof err)) {
        cli_fail("generate: %s", err);
        goto done;
    }
    if (kept_note(&kept, ctx, method, &mo.budget, ids, "end")) goto done;
    fwrite(ses.text + shown, 1, ses.text_n - shown, stdout);
    if (show_ids) fputc('\n', stderr);
    /* an instruct model given a bare prompt often ends at once: say so instead of printing nothing */
    if (ses.first_eog >= 0)
        fprintf(stderr, "generate: the model's first token is end of generation (token %d)%s\n", ses.first_eog,
                chat ? "" : "; an instruct model may need --chat (its chat template), or --ignore-eos");
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr, "\nprefill: %d tokens in %.1f ms (%.1f tok/s)\n", n_ids, ses.prefill_ms, n_ids / ses.prefill_ms * 1e3);
    if (ses.steps > 0)
        fprintf(stderr, "decode:  %d tokens generated, %d decode steps in %.1f ms (%.1f tok/s, %.2f ms/token)\n", ses.n_gen,
                ses.steps, ses.decode_ms, ses.steps / ses.decode_ms * 1e3, kvb_session_ms_per_token(&ses));
    else
        fprintf(stderr, "decode:  %d tokens generated, no decode step\n", ses.n_gen);
    if (kv_report) {
        char desc[256] = "", bud[32];
        if (method->def->describe) method->def->describe(method, desc, sizeof desc);
        kvb_budget_format(&mo.budget, bud, sizeof bud);
        fprintf(stderr, "method:  %s budget %s (%s)%s%s\n", method->name, bud, desc, method->note[0] ? "; " : "",
                method->note);
        const double MiB = 1024.0 * 1024.0;
        fprintf(stderr, "kv after prefill device %8.2f MiB (%5.1f%% of full)  host %8.2f MiB\n",
                ses.kv_prefill.device_bytes / MiB, 100.0 * ses.kv_prefill.device_frac, ses.kv_prefill.host_bytes / MiB);
        cli_print_kv_usage(method, ctx, "at end", stderr);
    }
    if (eo.ctx.profile) prof_print_table(ctx->prof, stderr);
    if (trace && prof_write_trace(ctx->prof, trace, err, sizeof err)) {
        cli_fail("generate: %s", err);
        goto done;
    }
    rc = 0;
done:
    if (dump_dir && dump_close(&dump, dump_dir)) rc = 1;
    if (kept_close(&kept, ctx)) rc = 1;
    kvb_session_free(&ses);
    kvb_method_free(method, ctx);
    kvb_ctx_free(ctx);
    free(ids);
    free(rendered);
    free(file_text);
    kvb_model_free(m);
    return rc;
}
