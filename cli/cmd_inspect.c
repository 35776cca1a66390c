/* cmd_inspect.c — `kvbench inspect MODEL`: metadata, tensor table, and the config the engine derives. */
#include <inttypes.h>
#include <stdio.h>

#include "cli/cli.h"
#include "engine/gguf_print.h"
#include "engine/synthetic.h"

static void print_config(const kvb_config *cfg) {
    printf("config: arch %s, %d layers, embd %d, heads %d (kv %d), head_dim %d, ffn %d, ctx %d, rope base %g (%s), "
           "rms eps %g\n",
           cfg->arch, cfg->n_layer, cfg->n_embd, cfg->n_head, cfg->n_head_kv, cfg->head_dim, cfg->n_ff, cfg->n_ctx_train,
           cfg->rope_freq_base, cfg->rope_neox ? "neox" : "normal", cfg->rms_eps);
}

static const char *HELP =
    "usage: kvbench inspect MODEL [--items N]\n"
    "Prints the GGUF header, every metadata key (arrays: first N items, default 8), the tensor\n"
    "table with types, shapes, offsets and sizes, and the model config kvbench derives from it.\n"
    "MODEL may be synthetic:SHAPE[?layers=N&seed=S&ctx=N]: its config and tensor table, from the\n"
    "shape alone.\n";

/* A synthetic model's tensor table and config, from its shape alone: nothing is allocated or generated. */
static int inspect_synthetic(const char *name) {
    syn_spec s;
    char err[512], canon[256];
    if (syn_parse(name, &s, err, sizeof err)) return cli_fail("%s", err);
    syn_canonical_name(&s, canon, sizeof canon);
    printf("synthetic model: %s (seeded random weights, no tokenizer)\n\n", canon);
    printf("tensors:\n  %-36s %-5s %-22s %12s\n", "name", "type", "shape", "bytes");
    int64_t n = syn_tensor_count(&s);
    for (int64_t i = 0; i < n; i++) {
        syn_tensor t;
        char shape[48];
        syn_tensor_get(&s, i, &t);
        if (t.n_dims == 2) snprintf(shape, sizeof shape, "[%" PRId64 ", %" PRId64 "]", t.ne[0], t.ne[1]);
        else snprintf(shape, sizeof shape, "[%" PRId64 "]", t.ne[0]);
        printf("  %-36s %-5s %-22s %12" PRIu64 "\n", t.name, ggml_type_name(t.type), shape, t.n_bytes);
    }
    uint64_t bytes = syn_weight_bytes(&s);
    printf("%" PRId64 " tensors, %" PRIu64 " bytes (%.2f GiB)\n\n", n, bytes, bytes / 1073741824.0);
    print_config(&s.cfg);
    printf("vocab %d, output %s, qkv bias %s\n", s.cfg.n_vocab, s.cfg.tied_output ? "tied to token_embd" : "separate",
           s.cfg.has_qkv_bias ? "yes" : "no");
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    long max_items = 8;
    cli_opt opts[] = {CLI_LONG("--items", &max_items, 0, 1 << 20), CLI_END};
    int n_pos, stop = cli_parse("inspect", HELP, opts, argc, argc, argv, &n_pos);
    if (stop >= 0) return stop;
    if (n_pos > 1) return cli_fail("inspect: one model at a time ('%s' is extra)", argv[2]);
    const char *model = n_pos ? argv[1] : NULL;
    if (!model) return cli_fail("inspect: which model? usage: kvbench inspect MODEL");
    if (syn_is_name(model)) return inspect_synthetic(model);
    char path[1024], err[512];
    if (kvb_model_resolve(model, path, sizeof path, err, sizeof err)) return cli_fail("%s", err);
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) return cli_fail("%s: %s", path, err);
    printf("file: %s\n", path);
    gguf_print(f, stdout, (int)max_items);
    kvb_config cfg;
    if (kvb_config_read(f, &cfg, err, sizeof err) == 0) {
        printf("\n");
        print_config(&cfg);
    } else
        printf("\nconfig: not a model kvbench can run: %s\n", err);
    gguf_close(f);
    return 0;
}
