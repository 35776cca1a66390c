/* opts.c — the table-driven option parser every kvbench command uses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "methods/method.h"

/* Help text with CLI_METHODS_HERE replaced by the registry's methods, wrapped under the option column (so the help
 * names every method without a list written twice). */
static void print_help(const char *help) {
    const char *at = strstr(help, CLI_METHODS_HERE);
    if (!at) {
        fputs(help, stdout);
        return;
    }
    fwrite(help, 1, (size_t)(at - help), stdout);
    const char *line = at;
    while (line > help && line[-1] != '\n') line--;
    int col = (int)(at - line);
    char names[1024];
    kvb_method_names(names, sizeof names);
    for (const char *p = names; *p;) {
        const char *end = strstr(p, ", ");
        size_t n = end ? (size_t)(end - p) + 1 : strlen(p); /* the name and its comma */
        if (p != names && col + 1 + (int)n > 110) printf("\n%25s", ""), col = 25;
        else if (p != names) putchar(' '), col++;
        fwrite(p, 1, n, stdout);
        col += (int)n;
        p += end ? n + 1 : n;
    }
    fputs(at + strlen(CLI_METHODS_HERE), stdout);
}

int cli_number(const char *opt, const char *s, double lo, double hi, int integer, double *out, char *err,
               size_t err_len) {
    char *end;
    errno = 0;
    double v = integer ? (double)strtol(s, &end, 10) : strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        if (integer)
            snprintf(err, err_len, "%s expects an integer in [%ld, %ld], got '%s'", opt, (long)lo, (long)hi, s);
        else
            snprintf(err, err_len, "%s expects a number in [%g, %g], got '%s'", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Store v in the option's destination; prints the error. */
static int set_value(const cli_opt *o, const char *v) {
    char err[512];
    double x = 0;
    if ((o->kind == CLI_K_STR || o->kind == CLI_K_LIST) && !*v && o->lo != 1)
        return cli_fail("%s is empty (give it a value, or leave the option out)", o->name);
    switch (o->kind) {
    case CLI_K_STR: *o->dst.s = v; return 0;
    case CLI_K_LIST:
        if (o->dst.list->n == o->dst.list->cap) return cli_fail("at most %d %s", o->dst.list->cap, o->name);
        o->dst.list->v[o->dst.list->n++] = v;
        return 0;
    case CLI_K_FN: return o->fn(o->dst.any, o->name, v, err, sizeof err) ? cli_fail("%s", err) : 0;
    default: break;
    }
    if (cli_number(o->name, v, o->lo, o->hi, o->kind != CLI_K_FLOAT, &x, err, sizeof err)) return cli_fail("%s", err);
    if (o->kind == CLI_K_INT) *o->dst.i = (int)x;
    else if (o->kind == CLI_K_LONG) *o->dst.l = (long)x;
    else *o->dst.d = x;
    return 0;
}

int cli_given(int argc, char **argv, const char *opt) {
    const size_t n = strlen(opt);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], opt, n) && (argv[i][n] == 0 || argv[i][n] == '=')) return 1;
    return 0;
}

int cli_parse(const char *cmd, const char *help, const cli_opt *opts, int max_pos, int argc, char **argv, int *n_pos) {
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return print_help(help), 0;
        if (a[0] != '-') {
            if (n == max_pos) return cli_fail("%s: unexpected argument '%s' (see --help)", cmd, a);
            argv[1 + n++] = argv[i]; /* a slot already read */
            continue;
        }
        const cli_opt *o = opts;
        while (o && o->name && strcmp(o->name, a)) o++;
        if (!o || !o->name) return cli_fail("%s: unknown option '%s' (see --help)", cmd, a);
        if (o->kind == CLI_K_FLAG) *o->dst.i = 1;
        else if (i + 1 >= argc) return cli_fail("%s: %s needs a value", cmd, a);
        else if (set_value(o, argv[++i])) return 1;
    }
    if (n_pos) *n_pos = n;
    return -1;
}
