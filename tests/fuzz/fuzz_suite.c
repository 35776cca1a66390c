/* fuzz_suite.c — the suite parser: a suite JSON file through the runner's own reading of it (load_suite: the
 * strict parse and checks of benchmarks/suitecheck.h, then its model-bound checks at an 8192-token context), its
 * method x budget cells (names, budgets, method options, with command-line options
 * merged in) and its judge object, everything the runner checks before it needs a model. runner.c is included for
 * its static functions. */
#include "benchmarks/runner.c"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[256], err[512] = "";
    fuzz_write("suite.json", data, size, path, sizeof path);
    kvb_run_opts o = {0};
    o.suite_path = path;
    run_state st;
    memset(&st, 0, sizeof st);
    st.o = &o;
    st.fd = st.lock_fd = -1;
    if (load_suite(&st, err, sizeof err) == 0 && kvb_suite_check(st.suite, path, 8192, err, sizeof err) == 0) {
        st.judge = kvb_runner_judge_create(cJSON_GetObjectItemCaseSensitive(st.suite, "judge"), NULL, expand_path, err, sizeof err);
        /* the cells as kvb_run_suite expands them, with command-line options merged in (cells.h) */
        static const char *const cli[] = {"snapkv:window=8", "pool=avg", "h2o:heavy=0.25"};
        kvb_cells_args ca = {path, NULL, NULL, cli, 3};
        if (kvb_cells_expand(st.suite, &ca, &st.cs, err, sizeof err) == 0) st.cells = st.cs.v, st.n_cells = st.cs.n;
        for (int i = 0; i < st.n_cells; i++) { /* each cell's options as the runner builds them */
            kvb_opts op;
            cell_opts(&st.cells[i], &op, err, sizeof err);
        }
    }
    free_state(&st);
    return 0;
}
