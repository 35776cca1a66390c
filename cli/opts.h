/* opts.h — the one option parser of the kvbench commands. A command declares a table of its options (each a
 * name, a kind, where the value goes and, for numbers, the accepted range), adds the shared engine and method
 * entries (CLI_ENGINE_OPTS, CLI_METHOD_OPTS in cli.h) and calls cli_parse. Errors are one line on stderr, exit code 1:
 * a problem with the command line names the command ("generate: unknown option '--x' (see --help)",
 * "generate: --prompt needs a value"), a bad value names the option ("-n expects an integer in [0, 16], got 'x'"). */
#ifndef KVB_CLI_OPTS_H
#define KVB_CLI_OPTS_H

#include <stddef.h>

typedef enum { CLI_K_FLAG, CLI_K_INT, CLI_K_LONG, CLI_K_FLOAT, CLI_K_STR, CLI_K_LIST, CLI_K_FN } cli_kind;

/* A repeatable string option: values in v[0..n), at most cap of them. */
typedef struct {
    const char **v;
    int n, cap;
} cli_list;

/* Parses v for an option of kind CLI_K_FN into dst: 0, or -1 with a message naming opt in err. */
typedef int (*cli_opt_fn)(void *dst, const char *opt, const char *v, char *err, size_t err_len);

typedef struct {
    const char *name; /* "--prompt", "-n"; NULL ends a table */
    cli_kind kind;
    union { /* typed, so that a table entry pointing at the wrong type does not compile quietly */
        int *i;
        long *l;
        double *d;
        const char **s;
        cli_list *list;
        void *any;
    } dst;
    double lo, hi; /* CLI_K_INT, CLI_K_LONG, CLI_K_FLOAT: the accepted range; CLI_K_STR, CLI_K_LIST: lo 1 = may be empty */
    cli_opt_fn fn; /* CLI_K_FN */
} cli_opt;

/* Table entries. A flag sets its int to 1; every other kind takes the next argument as its value. */
#define CLI_FLAG(name, p) {name, CLI_K_FLAG, {.i = p}, 0, 0, NULL}
#define CLI_INT(name, p, lo, hi) {name, CLI_K_INT, {.i = p}, lo, hi, NULL}
#define CLI_LONG(name, p, lo, hi) {name, CLI_K_LONG, {.l = p}, lo, hi, NULL}
#define CLI_FLOAT(name, p, lo, hi) {name, CLI_K_FLOAT, {.d = p}, lo, hi, NULL}
/* a string (a path, a name, a list) that an empty value would leave meaning nothing: "" is refused */
#define CLI_STR(name, p) {name, CLI_K_STR, {.s = p}, 0, 0, NULL}
/* text that may be empty (a prompt, a system message) */
#define CLI_TEXT(name, p) {name, CLI_K_STR, {.s = p}, 1, 0, NULL}
#define CLI_LIST(name, p) {name, CLI_K_LIST, {.list = p}, 0, 0, NULL}
#define CLI_FN(name, p, fn) {name, CLI_K_FN, {.any = p}, 0, 0, fn}
#define CLI_END {NULL, CLI_K_FLAG, {NULL}, 0, 0, NULL}

/* Parses argv[1..argc) against opts (NULL: none). --help / -h prints help on stdout. Arguments that do not
 * start with '-' are positional: at most max_pos of them, moved in order to argv[1..*n_pos] (n_pos may be NULL
 * when max_pos is 0). Returns -1 when the command goes on, else the exit code to return at once: 0 after the
 * help, 1 after an error (printed). */
int cli_parse(const char *cmd, const char *help, const cli_opt *opts, int max_pos, int argc, char **argv, int *n_pos);
/* 1 when argv[1..argc) gives option opt ("--opt V" or "--opt=V"): for an option whose default a user may also
 * write, to refuse it where it would change nothing */
int cli_given(int argc, char **argv, const char *opt);

/* Parse s as an integer (integer != 0) or a number in [lo, hi]: 0, or -1 with "OPT expects ..." in err. */
int cli_number(const char *opt, const char *s, double lo, double hi, int integer, double *out, char *err,
               size_t err_len);

#endif
