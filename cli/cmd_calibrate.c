/* cmd_calibrate.c — placeholder until the calibrate command lands (being written now). */
#include "cli/cli.h"

int cmd_calibrate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_fail("calibrate: not built yet");
}
