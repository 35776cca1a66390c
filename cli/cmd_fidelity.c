/* cmd_fidelity.c — placeholder until the fidelity command lands (being written now). */
#include "cli/cli.h"

int cmd_fidelity(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_fail("fidelity: not built yet");
}
