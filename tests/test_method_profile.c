/* test_method_profile.c — calibration profiles (methods/profile.h) on tiny models: the key is the model file's sha256
 * (checked against coreutils' sha256sum), each section is written and read back while the others stay, a copy
 * of the model under another name finds the same profile and another model none, and a corrupt profile or a
 * malformed section is a one-line error that never overwrites the file. Also which section a method reads (its
 * options decide: what `kvbench run` calibrates), and the profile lock. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "methods/method.h"
#include "methods/profile.h"

enum { L = 8, HK = 2 };

static char dir[64] = "/tmp/kvb_profile_XXXXXX";
static char prof_dir[128];
static kvb_model *model_a, *model_a_copy, *model_b;
static char err[512];

static kvb_model *write_and_load(const char *name, uint64_t seed) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    gw_random r = {seed, 0.5f, NULL};
    gw_tiny t = {"llama", L, 16, 2, HK, 24, 32, 64, 0, NULL, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, path);
    free(r.buf);
    return rc ? NULL : kvb_model_load(path, err, sizeof err);
}

static void profile_path_of(const kvb_model *m, char *path, size_t cap) {
    CU_ASSERT_FATAL(kvb_profile_path(m, path, cap, err, sizeof err) == 0);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(text, f);
    fclose(f);
}

static cJSON *parse(const char *text) {
    cJSON *v = cJSON_Parse(text);
    CU_ASSERT_FATAL(v != NULL);
    return v;
}

/* The key is the sha256 of the model file's bytes, as sha256sum computes it, and the profile file is
 * $KVB_PROFILE_DIR/<sha256>.json. */
static void test_key_is_the_sha256_of_the_model_file(void) {
    char hex[65], cmd[1100], want[65] = "", path[1024], expect[1200];
    CU_ASSERT_FATAL(kvb_model_sha256(model_a, hex, err, sizeof err) == 0);
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", model_a->path);
    FILE *p = popen(cmd, "r");
    CU_ASSERT_FATAL(p != NULL);
    CU_ASSERT(fscanf(p, "%64s", want) == 1);
    pclose(p);
    CU_ASSERT_STRING_EQUAL(hex, want);
    profile_path_of(model_a, path, sizeof path);
    snprintf(expect, sizeof expect, "%s/%s.json", prof_dir, want);
    CU_ASSERT_STRING_EQUAL(path, expect);
    /* a model read from elsewhere is a one-line error naming its file */
    kvb_model gone = *model_a;
    snprintf(gone.path, sizeof gone.path, "%s/deleted.gguf", dir);
    CU_ASSERT(kvb_model_sha256(&gone, hex, err, sizeof err) == -1 && strstr(err, gone.path) && !strchr(err, '\n'));
}

/* Before any calibration every lookup says "no profile" without an error; each stored section reads back,
 * later stores keep the other sections, and the file records the model's sha256. */
static void test_sections_are_written_and_read_back(void) {
    int lw = -1, layers[8], bases[HK * L];
    err[0] = 'x';
    CU_ASSERT(kvb_profile_round_lw(model_a, &lw, err, sizeof err) == 0 && err[0] == 0 && lw == -1);
    CU_ASSERT(kvb_profile_omnikv_layers(model_a, layers, 8, err, sizeof err) == 0);
    CU_ASSERT(kvb_profile_pod_bases(model_a, bases, err, sizeof err) == 0);
    cJSON *v = parse("{\"lw\": 3, \"curve\": [0.5, 0.25]}");
    CU_ASSERT_FATAL(kvb_profile_store(model_a, "round", v, err, sizeof err) == 0); /* makes $KVB_PROFILE_DIR */
    cJSON_Delete(v);
    v = parse("{\"layers\": [1, 4, 6]}");
    CU_ASSERT_FATAL(kvb_profile_store(model_a, "omnikv", v, err, sizeof err) == 0);
    cJSON_Delete(v);
    /* per KV head, each layer starts a block (its own index) or continues the previous layer's */
    v = parse("{\"bases\": [[0, 0, 0, 3, 3, 5, 6, 6], [0, 1, 2, 3, 4, 5, 6, 7]]}");
    CU_ASSERT_FATAL(kvb_profile_store(model_a, "pod", v, err, sizeof err) == 0);
    cJSON_Delete(v);
    v = parse("{\"lw\": 5}");
    CU_ASSERT_FATAL(kvb_profile_store(model_a, "round", v, err, sizeof err) == 0); /* replaces round only */
    cJSON_Delete(v);
    CU_ASSERT(kvb_profile_round_lw(model_a, &lw, err, sizeof err) == 1 && lw == 5);
    CU_ASSERT(kvb_profile_omnikv_layers(model_a, layers, 8, err, sizeof err) == 3);
    CU_ASSERT(layers[0] == 1 && layers[1] == 4 && layers[2] == 6);
    CU_ASSERT(kvb_profile_pod_bases(model_a, bases, err, sizeof err) == 1);
    static const int want[HK * L] = {0, 0, 0, 3, 3, 5, 6, 6, 0, 1, 2, 3, 4, 5, 6, 7};
    CU_ASSERT(!memcmp(bases, want, sizeof want));
    char path[1024], hex[65];
    profile_path_of(model_a, path, sizeof path);
    CU_ASSERT_FATAL(kvb_model_sha256(model_a, hex, err, sizeof err) == 0);
    char *text = util_read_file(path, NULL);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CU_ASSERT_FATAL(root != NULL);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(root, "model_sha256")), hex);
    CU_ASSERT(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "round"), "curve") == NULL); /* the old round is gone */
    cJSON_Delete(root);
    free(text);
}

/* The profile belongs to the model's content: the same bytes under another file name find it, another model's
 * bytes do not. */
static void test_profile_follows_the_model_bytes_not_its_name(void) {
    int lw = -1;
    CU_ASSERT(kvb_profile_round_lw(model_a_copy, &lw, err, sizeof err) == 1 && lw == 5);
    lw = -1;
    CU_ASSERT(kvb_profile_round_lw(model_b, &lw, err, sizeof err) == 0 && lw == -1 && err[0] == 0);
    CU_ASSERT(kvb_profile_round_lw(model_a, &lw, err, sizeof err) == 1 && lw == 5); /* and back */
}

/* A corrupt profile (cut short, or JSON that is no object) is one line naming the file and saying what to do;
 * a store refuses to build on it and leaves it as it was. */
static void test_corrupt_profile_is_a_one_line_error_and_is_not_overwritten(void) {
    static const char *const corrupt[2] = {"{\"round\": {\"lw\": 3", "[1, 2]"};
    char path[1024];
    profile_path_of(model_b, path, sizeof path);
    for (int k = 0; k < 2; k++) {
        write_text(path, corrupt[k]);
        cJSON *p = kvb_profile_load(model_b, err, sizeof err);
        CU_ASSERT(p == NULL && strstr(err, path) && strstr(err, "not a JSON object") && strstr(err, "kvbench calibrate"));
        CU_ASSERT(!strchr(err, '\n'));
        int lw;
        CU_ASSERT(kvb_profile_round_lw(model_b, &lw, err, sizeof err) == -1 && strstr(err, path));
        cJSON *v = parse("{\"lw\": 2}");
        CU_ASSERT(kvb_profile_store(model_b, "round", v, err, sizeof err) == -1);
        cJSON_Delete(v);
        char *text = util_read_file(path, NULL);
        CU_ASSERT(text && !strcmp(text, corrupt[k]));
        free(text);
    }
    unlink(path);
}

/* Another model's profile under this model's name (copied or renamed: its model_sha256 says whose it is) is one line
 * naming the file, not that model's layers and heads fed to this one; a store leaves it as it was. */
static void test_another_models_profile_is_refused(void) {
    char path_a[1024], path_b[1024];
    int lw = -1;
    cJSON *v = parse("{\"lw\": 4}");
    CU_ASSERT_FATAL(kvb_profile_store(model_a, "round", v, err, sizeof err) == 0);
    cJSON_Delete(v);
    profile_path_of(model_a, path_a, sizeof path_a);
    profile_path_of(model_b, path_b, sizeof path_b);
    char *text = util_read_file(path_a, NULL);
    CU_ASSERT_FATAL(text != NULL);
    write_text(path_b, text);
    CU_ASSERT(kvb_profile_round_lw(model_b, &lw, err, sizeof err) == -1 && lw == -1);
    CU_ASSERT(strstr(err, path_b) && strstr(err, "another model") && !strchr(err, '\n'));
    v = parse("{\"lw\": 2}");
    CU_ASSERT(kvb_profile_store(model_b, "round", v, err, sizeof err) == -1);
    cJSON_Delete(v);
    char *after = util_read_file(path_b, NULL);
    CU_ASSERT(after && !strcmp(after, text));
    free(after);
    free(text);
    unlink(path_b);
    CU_ASSERT(kvb_profile_round_lw(model_a, &lw, err, sizeof err) == 1 && lw == 4); /* its own still reads */
}

/* A section of the wrong shape is an error naming the field, not a method run with a wrong setting. */
static void test_malformed_sections_are_errors_naming_the_field(void) {
    static const struct { const char *text; int which; const char *what; } cases[] = {
        {"{\"round\": {\"lw\": \"three\"}}", 0, "round.lw is not a whole number"},
        {"{\"round\": {\"lw\": 2.5}}", 0, "round.lw is not a whole number"},
        {"{\"omnikv\": {\"layers\": [4, 2]}}", 1, "omnikv.layers[1]"},
        {"{\"omnikv\": {\"layers\": [0, 8]}}", 1, "omnikv.layers[1]"},   /* beyond the model's 8 layers */
        {"{\"omnikv\": {\"layers\": []}}", 1, "omnikv.layers must be"},
        {"{\"omnikv\": {\"layers\": 3}}", 1, "omnikv.layers must be"},
        {"{\"pod\": {\"bases\": [[0, 0, 0, 0, 0, 0, 0, 0]]}}", 2, "needs 2 KV heads"},
        {"{\"pod\": {\"bases\": [[0, 0, 0], [0, 1, 2]]}}", 2, "pod.bases[0] needs 8 layers"},
        {"{\"pod\": {\"bases\": [[0, 0, 2, 1, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5, 6, 7]]}}", 2, "pod.bases[0][3]"},
        {"{\"pod\": {\"bases\": [[0, 1, 2, 3, 4, 5, 6, 7], [1, 1, 2, 3, 4, 5, 6, 7]]}}", 2, "pod.bases[1][0]"},
    };
    char path[1024];
    profile_path_of(model_b, path, sizeof path);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_text(path, cases[i].text);
        int lw, layers[8], bases[HK * L], rc;
        err[0] = 0;
        if (cases[i].which == 0) rc = kvb_profile_round_lw(model_b, &lw, err, sizeof err);
        else if (cases[i].which == 1) rc = kvb_profile_omnikv_layers(model_b, layers, 8, err, sizeof err);
        else rc = kvb_profile_pod_bases(model_b, bases, err, sizeof err);
        int ok = rc == -1 && strstr(err, cases[i].what) && !strchr(err, '\n');
        CU_ASSERT(ok);
        if (!ok) fprintf(stderr, "\n  case %zu: rc %d, err \"%s\"\n", i, rc, err);
    }
    unlink(path);
}

static int setup(void) {
    if (!mkdtemp(dir)) return -1;
    snprintf(prof_dir, sizeof prof_dir, "%s/profiles/nested", dir);
    setenv("KVB_PROFILE_DIR", prof_dir, 1);
    model_a = write_and_load("a.gguf", 11);
    model_a_copy = write_and_load("a-copy.gguf", 11);
    model_b = write_and_load("b.gguf", 12);
    return model_a && model_a_copy && model_b ? 0 : -1;
}

static int teardown(void) {
    kvb_model_free(model_a);
    kvb_model_free(model_a_copy);
    kvb_model_free(model_b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) ? -1 : 0;
}

/* The section a method reads follows its options (what `kvbench run` calibrates, benchmarks/runcal.h): round
 * without lw=, pod without block=, omnikv only with layers=profile, other methods none. */
static void test_the_section_a_method_reads_follows_its_options(void) {
    static const struct { const char *method, *opts, *section; } cases[] = {
        {"round", NULL, "round"},     {"round", "lw=3", NULL},   {"pod", NULL, "pod"},
        {"pod", "block=2", NULL},     {"omnikv", NULL, NULL},    {"omnikv", "layers=profile", "omnikv"},
        {"omnikv", "layers=2;5", NULL}, {"snapkv", NULL, NULL}, {"full", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvb_opts o = {0};
        if (cases[i].opts) CU_ASSERT_FATAL(kvb_opts_add(&o, cases[i].opts, err, sizeof err) == 0);
        kvb_method_needs nd;
        CU_ASSERT_FATAL(kvb_method_needs_of(cases[i].method, &o, &nd, err, sizeof err) == 0);
        int ok = cases[i].section ? nd.profile && !strcmp(nd.profile, cases[i].section) : nd.profile == NULL;
        CU_ASSERT(ok);
        if (!ok) fprintf(stderr, "\n  %s %s: %s\n", cases[i].method, cases[i].opts ? cases[i].opts : "", nd.profile ? nd.profile : "NULL");
        CU_ASSERT(!cases[i].opts || kvb_opts_unused(&o) != NULL); /* asking reads a copy: the options stay unread */
    }
}

/* has: absent before a store, present after; the lock nests within a process (a store inside it takes it again)
 * and holds one model's profile at a time. */
static void test_has_and_the_lock_nest(void) {
    CU_ASSERT(kvb_profile_has(model_b, "round", err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_profile_lock(model_b, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_profile_lock(model_b, err, sizeof err) == 0);
    cJSON *v = parse("{\"lw\": 2}");
    CU_ASSERT(kvb_profile_store(model_b, "round", v, err, sizeof err) == 0);
    cJSON_Delete(v);
    CU_ASSERT(kvb_profile_lock(model_a, err, sizeof err) == -1 && strstr(err, "already holding"));
    kvb_profile_unlock();
    kvb_profile_unlock();
    CU_ASSERT(kvb_profile_has(model_b, "round", err, sizeof err) == 1 && kvb_profile_has(model_b, "pod", err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_profile_lock(model_a, err, sizeof err) == 0); /* released: another model's may be taken */
    kvb_profile_unlock();
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("profile", setup, teardown);
    CU_add_test(s, "the key is the sha256 of the model file", test_key_is_the_sha256_of_the_model_file);
    CU_add_test(s, "sections are written and read back", test_sections_are_written_and_read_back);
    CU_add_test(s, "a profile follows the model's bytes, not its name", test_profile_follows_the_model_bytes_not_its_name);
    CU_add_test(s, "a corrupt profile is a one-line error and is not overwritten",
                test_corrupt_profile_is_a_one_line_error_and_is_not_overwritten);
    CU_add_test(s, "another model's profile is refused", test_another_models_profile_is_refused);
    CU_add_test(s, "malformed sections are errors naming the field", test_malformed_sections_are_errors_naming_the_field);
    CU_add_test(s, "the section a method reads follows its options", test_the_section_a_method_reads_follows_its_options);
    CU_add_test(s, "has, and the lock nests", test_has_and_the_lock_nest);
    return util_run_suites();
}
