/* cmd_inspect.c — `kvbench inspect MODEL`: metadata, tensor table, and the config the engine derives. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/gguf_print.h"

int cmd_inspect(int argc, char **argv) {
    const char *model = NULL;
    long max_items = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: kvbench inspect MODEL [--items N]\n"
                 "Prints the GGUF header, every metadata key (arrays: first N items, default 8), the tensor\n"
                 "table with types, shapes, offsets and sizes, and the model config kvbench derives from it.");
            return 0;
        }
        if (!strcmp(argv[i], "--items") && i + 1 < argc) {
            if (cli_int("--items", argv[++i], 0, 1 << 20, &max_items)) return 1;
        } else if (argv[i][0] == '-') {
            return cli_fail("inspect: unknown option '%s'", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return cli_fail("inspect: one model at a time ('%s' is extra)", argv[i]);
        }
    }
    if (!model) return cli_fail("inspect: which model? usage: kvbench inspect MODEL");
    char path[1024], err[512];
    if (kvb_model_resolve(model, path, sizeof path, err, sizeof err)) return cli_fail("%s", err);
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) return cli_fail("%s: %s", path, err);
    printf("file: %s\n", path);
    gguf_print(f, stdout, (int)max_items);
    kvb_config cfg;
    if (kvb_config_read(f, &cfg, err, sizeof err) == 0)
        printf("\nconfig: arch %s, %d layers, embd %d, heads %d (kv %d), head_dim %d, ffn %d, ctx %d, rope base %g "
               "(%s), rms eps %g\n",
               cfg.arch, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.n_ctx_train,
               cfg.rope_freq_base, cfg.rope_neox ? "neox" : "normal", cfg.rms_eps);
    else
        printf("\nconfig: not a model kvbench can run: %s\n", err);
    gguf_close(f);
    return 0;
}
