/* cmd_calibrate.c — `kvbench calibrate round|omnikv|pod|qfilter|duo`: its options into benchmarks/calibration.h's
 * kvb_calibrate, which runs the analysis (the rules are in benchmarks/calibration.c). */
#include <stdio.h>
#include <string.h>

#include "benchmarks/calibration.h"
#include "cli/cli.h"
#include "engine/synthetic.h"

static const char *HELP =
    "usage: kvbench calibrate round|omnikv|pod|qfilter|duo [--prompt-file F ...] [--samples 4] [--out-dir .] [--dry-run]\n"
    "\n"
    "Runs a paper's analysis on calibration inputs, prints the result, saves the curve as DIR/calibrate-KIND.csv\n"
    "and its per-layer table as DIR/calibrate-KIND.md, and\n"
    "stores the result in the model's profile (keyed by the model's sha256, under $KVB_PROFILE_DIR or\n"
    "~/.cache/kvbench/profiles), which the methods read unless a flag overrides it (omnikv reads it only\n"
    "with --method-opt layers=profile; its default is the paper's layers scaled to the model):\n"
    "  round   watershed layer lw (Round Attention: KL of round attention between layers)\n"
    "  omnikv  filter layers (OmniKV: attention mass later layers put on a layer's top-k tokens)\n"
    "  pod     layer blocks per KV head (PoD: head-wise JS similarity, greedy grouping)\n"
    "  qfilter a filter direction per layer and KV head (Q-Filters: first right singular vector of the head's\n"
    "          post-RoPE queries on the inputs, signed so the mean query projects positively)\n"
    "  duo     a retrieval score per layer and KV head (DuoAttention, training-free: the attention mass the\n"
    "          question of --samples synthetic passkey prompts of --max-tokens tokens puts on the pass key;\n"
    "          the highest-scoring heads keep the full cache, as many as the budget allows)\n"
    "\n"
    "inputs:\n"
    "  --prompt-file F        a calibration text (repeatable); rounds are --chunk-token chunks\n"
    "  --samples N            synthetic multi-round dialogues when no --prompt-file (default 4); duo: passkey\n"
    "                         prompts (it reads no --prompt-file)\n"
    "  --rounds N             rounds per synthetic dialogue (default 12)\n"
    "  --chunk N              round size of prompt files in tokens (default 256)\n"
    "  --max-tokens N         cap per input; longer inputs drop middle rounds (default 2500); duo: the\n"
    "                         length of each passkey prompt\n"
    "analysis:\n"
    "  --frac F               round: watershed where the curve stays below F x its maximum (default 0.5)\n"
    "  --eps E                round: smoothing of the distributions in KL (default 1e-6)\n"
    "  --topk F               omnikv: share of tokens a layer selects (default 0.1)\n"
    "  --n-filter N           omnikv: filter layers to choose (default 3)\n"
    "  --span N               omnikv: later layers averaged in the ability (default L/4, the paper's 8 of 32;\n"
    "                         0 = all later layers)\n"
    "  --q N                  pod: last queries compared (default 16)\n"
    "  --delta D              pod: similarity threshold of a block (default 0.5)\n"
    "output:\n"
    "  --out-dir DIR          where calibrate-KIND.csv goes (default .)\n"
    "  --dry-run              print and save the CSV, do not touch the profile\n" CLI_ENGINE_HELP;

/* The analysis options and the one kind each applies to. */
static const char *const ONLY[][2] = {{"--frac", "round"},     {"--eps", "round"},  {"--topk", "omnikv"},
                                      {"--n-filter", "omnikv"}, {"--span", "omnikv"}, {"--q", "pod"},
                                      {"--delta", "pod"}};
enum { N_ONLY = sizeof ONLY / sizeof ONLY[0] };

int cmd_calibrate(int argc, char **argv) {
    kvb_cal_opts o;
    kvb_cal_defaults(&o);
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    cli_list files = {o.files, 0, 64};
    cli_opt opts[] = {CLI_FLAG("--dry-run", &o.dry_run), CLI_LIST("--prompt-file", &files),
                      CLI_STR("--out-dir", &o.out_dir), CLI_LONG("--samples", &o.samples, 1, 1000),
                      CLI_LONG("--rounds", &o.rounds, 3, 10000), CLI_LONG("--chunk", &o.chunk, 1, 1 << 20),
                      CLI_LONG("--max-tokens", &o.max_tokens, 16, 1 << 24), CLI_LONG("--n-filter", &o.n_filter, 1, 8),
                      CLI_LONG("--span", &o.span, 0, 10000), CLI_LONG("--q", &o.q, 1, 4096),
                      CLI_FLOAT("--frac", &o.frac, 0, 1), CLI_FLOAT("--eps", &o.eps, 0, 1),
                      CLI_FLOAT("--topk", &o.topk, 1e-6, 1), CLI_FLOAT("--delta", &o.delta, 0, 1), CLI_ENGINE_OPTS(&eo),
                      CLI_END};
    /* which analysis options were given, read before cli_parse moves the kind over the arguments it has read */
    int given[N_ONLY] = {0};
    for (int k = 0; k < N_ONLY; k++) given[k] = cli_given(argc, argv, ONLY[k][0]);
    const int given_samples = cli_given(argc, argv, "--samples"), given_rounds = cli_given(argc, argv, "--rounds"),
              given_chunk = cli_given(argc, argv, "--chunk");
    int n_pos, stop = cli_parse("calibrate", HELP, opts, 1, argc, argv, &n_pos);
    if (stop >= 0) return stop;
    if (!n_pos) return cli_fail("calibrate: give a kind: round, omnikv, pod, qfilter or duo (see --help)");
    o.kind = argv[1];
    o.n_files = files.n;
    if (strcmp(o.kind, "round") && strcmp(o.kind, "omnikv") && strcmp(o.kind, "pod") && strcmp(o.kind, "qfilter") &&
        strcmp(o.kind, "duo"))
        return cli_fail("calibrate: unknown kind '%s' (round, omnikv, pod, qfilter or duo)", o.kind);
    if (!strcmp(o.kind, "duo") && files.n) return cli_fail("calibrate: duo makes its own passkey prompts: drop --prompt-file");
    /* an analysis option of another kind would be ignored without a word */
    for (int k = 0; k < N_ONLY; k++)
        if (given[k] && strcmp(o.kind, ONLY[k][1]))
            return cli_fail("calibrate: %s is an option of %s, not of %s", ONLY[k][0], ONLY[k][1], o.kind);
    /* the inputs' options: synthetic dialogues (--samples, --rounds) or prompt files (--chunk), not both; duo's
     * passkey prompts take --samples alone */
    if (!strcmp(o.kind, "duo") && (given_rounds || given_chunk))
        return cli_fail("calibrate: duo's passkey prompts have no rounds: drop %s", given_rounds ? "--rounds" : "--chunk");
    if (files.n && (given_samples || given_rounds))
        return cli_fail("calibrate: %s makes synthetic dialogues, which --prompt-file replaces: drop one",
                        given_samples ? "--samples" : "--rounds");
    if (!files.n && given_chunk && strcmp(o.kind, "duo"))
        return cli_fail("calibrate: --chunk is the round size of --prompt-file texts; synthetic dialogues take --rounds");
    if (syn_is_name(eo.model)) return cli_fail("synthetic models have no tokenizer: %s needs text; use a GGUF model", "calibrate");
    kvb_model *m = cli_load_model(&eo);
    if (!m) return 1;
    char err[1024];
    int rc = kvb_calibrate(m, &eo.ctx, &o, err, sizeof err) ? cli_fail("%s", err) : 0;
    kvb_model_free(m);
    return rc;
}
