/* cmd_generate.c — `kvbench generate`: one prompt through the engine, text out, then speed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "base/fsutil.h"
#include "engine/chat.h"
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

int cmd_generate(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    cli_method_opts mo;
    cli_method_defaults(&mo);
    int kv_report = 0;
    const char *prompt = NULL, *prompt_file = NULL, *system = NULL, *tmpl_name = NULL, *trace = NULL;
    const char *dump_dir = NULL;
    act_dump dump = {0};
    long n_gen = 128, seed = 42;
    double temp = 0.0, top_p = 1.0;
    int chat = 0, ignore_eos = 0, show_ids = 0, special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_opt(&eo, argc, argv, &i);
        if (r == 0) r = cli_method_opt(&mo, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--profile")) eo.ctx.profile = 1;
        else if (!strcmp(a, "--ids")) show_ids = 1;
        else if (!strcmp(a, "--special")) special = 1;
        else if (!strcmp(a, "--kv-report")) kv_report = 1;
        else if (!has_val) return cli_fail("generate: %s needs a value (or is unknown; see --help)", a);
        else if (!strcmp(a, "--prompt")) prompt = argv[++i];
        else if (!strcmp(a, "--prompt-file")) prompt_file = argv[++i];
        else if (!strcmp(a, "--system")) system = argv[++i];
        else if (!strcmp(a, "--template")) tmpl_name = argv[++i];
        else if (!strcmp(a, "--dump-activations")) dump_dir = argv[++i];
        else if (!strcmp(a, "--trace")) trace = argv[++i], eo.ctx.trace = 1;
        else if (!strcmp(a, "-n")) { if (cli_int("-n", argv[++i], 0, 1 << 24, &n_gen)) return 1; }
        else if (!strcmp(a, "--seed")) { if (cli_int("--seed", argv[++i], 0, 0x7fffffffL, &seed)) return 1; }
        else if (!strcmp(a, "--temp")) { if (cli_float("--temp", argv[++i], 0, 100, &temp)) return 1; }
        else if (!strcmp(a, "--top-p")) { if (cli_float("--top-p", argv[++i], 0.0, 1.0, &top_p)) return 1; }
        else return cli_fail("generate: unknown option '%s' (see --help)", a);
    }
    if (!!prompt == !!prompt_file) return cli_fail("generate: give exactly one of --prompt or --prompt-file");
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
    kvb_sampler smp = {0};
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
        } else {
            gguf_str t = {0};
            const gguf_kv *kv = gguf_find(m->gguf, "tokenizer.chat_template");
            if (kv && kv->val.type == GGUF_VT_STRING) t = kv->val.v.s;
            char *tcopy = strndup(t.ptr ? t.ptr : "", t.len);
            kind = chat_detect(tcopy, m->cfg.arch);
            free(tcopy);
        }
        chat_msg msgs[2];
        int n_msgs = 0;
        if (system) msgs[n_msgs++] = (chat_msg){"system", system};
        msgs[n_msgs++] = (chat_msg){"user", prompt};
        char *def_sys = NULL;
        if (!system) def_sys = chat_default_system_from_model(m->gguf);
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
    if (strcmp(mo.method, "full")) kv_report = 1;
    if (dump_dir) {
        if (dump_open(&dump, dump_dir)) goto done;
        ctx->tap = dump_tap;
        ctx->tap_user = &dump;
    }
    if (sampler_init(&smp, m->cfg.n_vocab, (float)temp, (float)top_p, (uint64_t)seed)) {
        cli_fail("generate: out of memory");
        goto done;
    }
    if (show_ids) {
        fprintf(stderr, "prompt ids (%d):", n_ids);
        for (int i = 0; i < n_ids; i++) fprintf(stderr, " %d", ids[i]);
        fputc('\n', stderr);
    }
    double t0 = cli_now();
    if (kvb_method_prefill(method, ctx, ids, n_ids, err, sizeof err)) {
        cli_fail("generate: %s", err);
        goto done;
    }
    double t_prefill = cli_now() - t0;
    kvb_kv_usage after_prefill;
    kvb_method_usage(method, ctx, &after_prefill);
    tok_stream ts;
    tok_stream_init(&ts);
    int n_out = 0, n_steps = 0; /* tokens generated; decode forward passes (each generated token but the last) */
    int32_t first_eog = -1;     /* the end-of-generation token, when it came first */
    double t1 = cli_now();
    if (show_ids) fprintf(stderr, "generated ids:");
    while (n_out < n_gen) {
        prof_begin(ctx->prof, PROF_SAMPLE, -1);
        int32_t next = sampler_sample(&smp, ctx->logits);
        prof_end(ctx->prof, PROF_SAMPLE, -1, 1, 0);
        if (show_ids) fprintf(stderr, " %d", next);
        if (!ignore_eos && tok_is_eog(m->tok, next)) {
            if (n_out == 0) first_eog = next;
            break;
        }
        n_out++;
        char piece[256];
        int np = tok_stream_push(&ts, m->tok, next, piece, sizeof piece);
        if (np > 0) {
            fwrite(piece, 1, (size_t)np, stdout);
            fflush(stdout);
        }
        if (n_out == n_gen) break;
        if (kvb_forward(ctx, &next, 1, err, sizeof err)) {
            cli_fail("generate: %s", err);
            goto done;
        }
        n_steps++;
    }
    {
        char piece[64];
        int np = tok_stream_flush(&ts, piece, sizeof piece);
        if (np > 0) fwrite(piece, 1, (size_t)np, stdout);
    }
    double t_decode = cli_now() - t1;
    if (show_ids) fputc('\n', stderr);
    /* an instruct model given a bare prompt often ends at once: say so instead of printing nothing */
    if (first_eog >= 0)
        fprintf(stderr, "generate: the model's first token is end of generation (token %d)%s\n", first_eog,
                chat ? "" : "; an instruct model may need --chat (its chat template), or --ignore-eos");
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr, "\nprefill: %d tokens in %.1f ms (%.1f tok/s)\n", n_ids, t_prefill * 1e3, n_ids / t_prefill);
    if (n_steps > 0)
        fprintf(stderr, "decode:  %d tokens generated, %d decode steps in %.1f ms (%.1f tok/s, %.2f ms/token)\n", n_out,
                n_steps, t_decode * 1e3, n_steps / t_decode, t_decode * 1e3 / n_steps);
    else
        fprintf(stderr, "decode:  %d tokens generated, no decode step\n", n_out);
    if (kvb_method_verify(method, ctx, 0, err, sizeof err)) {
        cli_fail("generate: %s", err);
        goto done;
    }
    if (kv_report) {
        char desc[256] = "", bud[32];
        if (method->describe) method->describe(method, desc, sizeof desc);
        kvb_budget_format(&mo.budget, bud, sizeof bud);
        fprintf(stderr, "method:  %s budget %s (%s)%s%s\n", method->name, bud, desc, method->note[0] ? "; " : "",
                method->note);
        const double MiB = 1024.0 * 1024.0;
        fprintf(stderr, "kv after prefill device %8.2f MiB (%5.1f%% of full)  host %8.2f MiB\n",
                after_prefill.device_bytes / MiB, 100.0 * after_prefill.device_frac, after_prefill.host_bytes / MiB);
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
    sampler_free(&smp);
    kvb_method_free(method, ctx);
    kvb_ctx_free(ctx);
    free(ids);
    free(rendered);
    free(file_text);
    kvb_model_free(m);
    return rc;
}
