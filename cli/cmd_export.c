/* cmd_export.c — `kvbench export --kvpress RUN_DIR OUT`: a run directory in NVIDIA kvpress's evaluation
 * layout (reports/export_kvpress.h), so kvbench rows can stand next to the leaderboard's. */
#include <stdio.h>

#include "cli/cli.h"
#include "reports/export_kvpress.h"

static const char *HELP =
    "usage: kvbench export --kvpress RUN_DIR OUT [--model NAME] [--force]\n"
    "\n"
    "Writes RUN_DIR's records (run.json + results.jsonl) as kvpress's evaluation/evaluate.py writes its results:\n"
    "one directory per dataset, model, press and compression ratio, named as kvpress names it\n"
    "(OUT/ruler__4096__MODEL__snapkv__0.50, \"__query_aware\" when the question was visible), holding\n"
    "predictions.csv (task, answer, predicted_answer, compression_ratio, and kvbench's sample_id and score),\n"
    "metrics.json (kvpress's scorer shape: RULER {task: {\"string_match\": x100}}, others one number) and\n"
    "config.yaml (kvpress's EvaluationConfig).\n"
    "\n"
    "Mapping: the method is kvpress's press (snapkv, knorm, keydiff, observed_attention, streaming_llm, tova,\n"
    "pyramidkv, random, adakv_snapkv, chunkkv, expected_attention (expected ada=1), decoding_knorm,\n"
    "decoding_keydiff; full is no_press); a budget of B% is compression ratio 1 - B/100; RULER, LongBench and\n"
    "InfiniteBench's official tasks are kvpress's ruler (data_dir = the length), longbench and infinitebench\n"
    "(data_dir = the task). Records kvpress cannot represent (another method, benchmark, or a token budget)\n"
    "and failed samples are skipped and counted in one line.\n"
    "\n"
    "Refused (one line, exit 1): RUN_DIR missing or its records unreadable, OUT not writable, OUT existing and\n"
    "not empty without --force, nothing kvpress can represent.\n"
    "\n"
    "options:\n"
    "  --kvpress              the layout to write (the only one)\n"
    "  --model NAME           the model's name in the layout, e.g. Qwen/Qwen2.5-Coder-0.5B-Instruct\n"
    "                         (default: the run's model file name without .gguf)\n"
    "  --force                write into an OUT that is not empty (files of the same name are replaced)\n";

int cmd_export(int argc, char **argv) {
    int kvpress = 0;
    kvb_kvpress_opts o = {0};
    cli_opt opts[] = {CLI_FLAG("--kvpress", &kvpress), CLI_STR("--model", &o.model), CLI_FLAG("--force", &o.force),
                      CLI_END};
    int n, stop = cli_parse("export", HELP, opts, 2, argc, argv, &n);
    if (stop >= 0) return stop;
    if (!kvpress) return cli_fail("export: name the layout: --kvpress (see --help)");
    if (n != 2) return cli_fail("export: give RUN_DIR and OUT (see --help)");
    if (o.model && !*o.model)
        return cli_fail("export: --model is empty (give the model's name, e.g. Qwen/Qwen2.5-Coder-0.5B-Instruct)");
    char err[2048];
    kvb_kvpress_stats st;
    if (kvb_export_kvpress(argv[1], argv[2], &o, &st, err, sizeof err)) return cli_fail("export: %s", err);
    printf("exported %zu record%s into %zu kvpress director%s under %s", st.n_exported, st.n_exported == 1 ? "" : "s",
           st.n_dirs, st.n_dirs == 1 ? "y" : "ies", argv[2]);
    if (st.skipped[0]) printf("; skipped %s", st.skipped);
    printf("\n");
    return 0;
}
