/* test_gguf.c — the GGUF reader: every metadata type, getters, alignment, tensors, the real model, and a
 * corruption sweep (every truncation length, byte flips, hand-made bad headers) that must fail cleanly. */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "util_common.h"
#include "util_gguf_writer.h"

static char err[512];

/* A small file with one key of every type, nested arrays and two tensors. */
static void build_sample(uint8_t **buf, size_t *len, uint32_t alignment) {
    gw_writer *w = gw_new();
    if (alignment != 32) gw_set_alignment(w, alignment);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    uint64_t u64 = 1ull << 40;
    int64_t i64 = -(1ll << 40);
    double f64 = 2.5e-300;
    gw_kv_scalar(w, "t.u8", GGUF_VT_UINT8, &u8);
    gw_kv_scalar(w, "t.i8", GGUF_VT_INT8, &i8);
    gw_kv_scalar(w, "t.u16", GGUF_VT_UINT16, &u16);
    gw_kv_scalar(w, "t.i16", GGUF_VT_INT16, &i16);
    gw_kv_u32(w, "t.u32", 4000000000u);
    gw_kv_i32(w, "t.i32", -7);
    gw_kv_f32(w, "t.f32", 0.25f);
    gw_kv_bool(w, "t.bool", 1);
    gw_kv_str(w, "t.str", "h\xc3\xa9llo");
    gw_kv_scalar(w, "t.u64", GGUF_VT_UINT64, &u64);
    gw_kv_scalar(w, "t.i64", GGUF_VT_INT64, &i64);
    gw_kv_scalar(w, "t.f64", GGUF_VT_FLOAT64, &f64);
    const char *strs[] = {"a", "", "long string"};
    gw_kv_arr_str(w, "t.arr_str", strs, 3);
    int32_t ints[] = {1, -2, 3};
    gw_kv_arr_i32(w, "t.arr_i32", ints, 3);
    gw_kv_arr_i32(w, "t.arr_empty", ints, 0);
    int32_t a0[] = {5}, a1[] = {6, 7};
    const int32_t *vals[] = {a0, a1};
    int lens[] = {1, 2};
    gw_kv_arr_arr_i32(w, "t.nested", vals, lens, 2);
    float t1[64];
    for (int i = 0; i < 64; i++) t1[i] = (float)i;
    uint64_t ne1[2] = {32, 2};
    gw_tensor(w, "w.f32", GGML_T_F32, 2, ne1, t1, sizeof t1);
    uint8_t q[2 * 20] = {0};
    uint64_t ne2[2] = {32, 2};
    gw_tensor(w, "w.q4_1", GGML_T_Q4_1, 2, ne2, q, sizeof q);
    gw_finish(w, buf, len);
    gw_free(w);
}

static void test_every_metadata_type_parses_with_its_value(void) {
    uint8_t *buf;
    size_t len;
    build_sample(&buf, &len, 32);
    gguf_file *f = gguf_open_mem(buf, len, err, sizeof err);
    if (!f) printf("%s\n", err);
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->version, 3);
    CU_ASSERT_EQUAL(f->n_kv, 16);
    CU_ASSERT_EQUAL(gguf_find(f, "t.u8")->val.v.u, 200);
    CU_ASSERT_EQUAL(gguf_find(f, "t.i8")->val.v.i, -100);
    CU_ASSERT_EQUAL(gguf_find(f, "t.u16")->val.v.u, 60000);
    CU_ASSERT_EQUAL(gguf_find(f, "t.i16")->val.v.i, -30000);
    CU_ASSERT_EQUAL(gguf_find(f, "t.i32")->val.v.i, -7);
    CU_ASSERT_EQUAL(gguf_find(f, "t.u64")->val.v.u, 1ull << 40);
    CU_ASSERT_EQUAL(gguf_find(f, "t.i64")->val.v.i, -(1ll << 40));
    CU_ASSERT_DOUBLE_EQUAL(gguf_find(f, "t.f64")->val.v.f, 2.5e-300, 1e-310);
    uint32_t u;
    float fl;
    int b;
    gguf_str s;
    CU_ASSERT(gguf_get_u32(f, "t.u32", &u, err, sizeof err) == 0 && u == 4000000000u);
    CU_ASSERT(gguf_get_u32(f, "t.u8", &u, err, sizeof err) == 0 && u == 200);
    CU_ASSERT(gguf_get_f32(f, "t.f32", &fl, err, sizeof err) == 0 && fl == 0.25f);
    CU_ASSERT(gguf_get_bool(f, "t.bool", &b, err, sizeof err) == 0 && b == 1);
    CU_ASSERT(gguf_get_str(f, "t.str", &s, err, sizeof err) == 0 && gguf_str_eq(s, "h\xc3\xa9llo"));
    const gguf_value *a;
    CU_ASSERT_FATAL(gguf_get_arr(f, "t.arr_str", GGUF_VT_STRING, &a, err, sizeof err) == 0);
    CU_ASSERT(a->v.arr.count == 3 && gguf_str_eq(a->v.arr.strs[1], "") && gguf_str_eq(a->v.arr.strs[2], "long string"));
    CU_ASSERT_FATAL(gguf_get_arr(f, "t.arr_i32", GGUF_VT_INT32, &a, err, sizeof err) == 0);
    CU_ASSERT(gguf_arr_i64(a, 1) == -2 && gguf_arr_f64(a, 2) == 3.0);
    CU_ASSERT(gguf_get_arr(f, "t.arr_empty", GGUF_VT_INT32, &a, err, sizeof err) == 0 && a->v.arr.count == 0);
    CU_ASSERT_FATAL(gguf_get_arr(f, "t.nested", GGUF_VT_ARRAY, &a, err, sizeof err) == 0);
    CU_ASSERT(a->v.arr.count == 2 && a->v.arr.items[1].v.arr.count == 2 && gguf_arr_i64(&a->v.arr.items[1], 1) == 7);
    gguf_close(f);
    free(buf);
}

static void test_getters_report_missing_keys_and_type_mismatch(void) {
    uint8_t *buf;
    size_t len;
    build_sample(&buf, &len, 32);
    gguf_file *f = gguf_open_mem(buf, len, err, sizeof err);
    CU_ASSERT_FATAL(f != NULL);
    uint32_t u;
    gguf_str s;
    CU_ASSERT(gguf_get_u32(f, "llama.block_count", &u, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "missing metadata key 'llama.block_count'") != NULL);
    CU_ASSERT(gguf_get_u32(f, "t.str", &u, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "type string") != NULL);
    CU_ASSERT(gguf_get_u32(f, "t.i32", &u, err, sizeof err) != 0); /* -7 does not fit */
    CU_ASSERT(gguf_get_str(f, "t.u32", &s, err, sizeof err) != 0);
    const gguf_value *a;
    CU_ASSERT(gguf_get_arr(f, "t.arr_i32", GGUF_VT_STRING, &a, err, sizeof err) != 0);
    gguf_close(f);
    free(buf);
}

static void test_tensors_are_found_aligned_with_their_data(void) {
    uint32_t aligns[] = {32, 64};
    for (int k = 0; k < 2; k++) {
        uint8_t *buf;
        size_t len;
        build_sample(&buf, &len, aligns[k]);
        gguf_file *f = gguf_open_mem(buf, len, err, sizeof err);
        CU_ASSERT_FATAL(f != NULL);
        CU_ASSERT_EQUAL(f->alignment, aligns[k]);
        CU_ASSERT_EQUAL(f->data_offset % aligns[k], 0);
        const gguf_tensor *t = gguf_find_tensor(f, "w.f32");
        CU_ASSERT_FATAL(t != NULL);
        CU_ASSERT(t->type == GGML_T_F32 && t->ne[0] == 32 && t->ne[1] == 2 && t->n_bytes == 256);
        CU_ASSERT(((const float *)t->data)[63] == 63.0f);
        const gguf_tensor *q = gguf_find_tensor(f, "w.q4_1");
        CU_ASSERT_FATAL(q != NULL);
        CU_ASSERT(q->n_bytes == 40 && q->offset % aligns[k] == 0);
        CU_ASSERT(gguf_find_tensor(f, "nope") == NULL);
        gguf_close(f);
        free(buf);
    }
}

static int one_line(const char *s) { return s[0] != 0 && strchr(s, '\n') == NULL; }

static int parses_or_fails_cleanly(const uint8_t *buf, size_t len) {
    err[0] = 0;
    gguf_file *f = gguf_open_mem(buf, len, err, sizeof err);
    if (f) {
        gguf_close(f);
        return 1;
    }
    return one_line(err);
}

static void test_every_truncation_fails_with_a_one_line_error(void) {
    uint8_t *buf;
    size_t len;
    build_sample(&buf, &len, 32);
    int bad = 0;
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact-size copy so ASan sees any overread */
        memcpy(copy, buf, n);
        err[0] = 0;
        gguf_file *f = gguf_open_mem(copy, n, err, sizeof err);
        if (f || !one_line(err)) bad++;
        gguf_close(f);
        free(copy);
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(buf);
}

static void test_byte_flips_never_crash(void) {
    uint8_t *buf;
    size_t len;
    build_sample(&buf, &len, 32);
    uint8_t vals[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x40};
    int bad = 0;
    uint8_t *copy = malloc(len);
    for (size_t i = 0; i < len; i++)
        for (size_t v = 0; v < sizeof vals; v++) {
            memcpy(copy, buf, len);
            copy[i] = vals[v];
            if (!parses_or_fails_cleanly(copy, len)) bad++;
        }
    CU_ASSERT_EQUAL(bad, 0);
    free(copy);
    free(buf);
}

static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void test_hand_made_bad_headers_name_the_problem(void) {
    uint8_t *buf;
    size_t len;
    build_sample(&buf, &len, 32);
    uint8_t *c = malloc(len);
    memcpy(c, buf, len);
    memcpy(c, "GGML", 4);
    CU_ASSERT(gguf_open_mem(c, len, err, sizeof err) == NULL && strstr(err, "magic"));
    memcpy(c, buf, len);
    c[4] = 4;
    CU_ASSERT(gguf_open_mem(c, len, err, sizeof err) == NULL && strstr(err, "unsupported version 4"));
    memcpy(c, buf, len);
    put_u64(c + 8, 1ull << 60);
    CU_ASSERT(gguf_open_mem(c, len, err, sizeof err) == NULL && strstr(err, "tensor count"));
    memcpy(c, buf, len);
    put_u64(c + 16, 1ull << 60);
    CU_ASSERT(gguf_open_mem(c, len, err, sizeof err) == NULL && strstr(err, "metadata count"));
    free(c);
    free(buf);

    /* unknown tensor type, tensor past the end, n_dims 0 and 5, misaligned offset: written via the writer */
    float d[32] = {0};
    uint64_t ne[1] = {32};
    gw_writer *w = gw_new();
    gw_tensor(w, "t.bad", (ggml_type)99, 1, ne, d, sizeof d);
    gw_finish(w, &buf, &len);
    CU_ASSERT(gguf_open_mem(buf, len, err, sizeof err) == NULL && strstr(err, "unknown tensor type 99"));
    free(buf);
    gw_free(w);
    /* a real ggml type kvbench does not read (IQ3_XXS = 18) is refused by its name, in one line */
    w = gw_new();
    gw_tensor(w, "t.iq3", (ggml_type)18, 1, ne, d, sizeof d);
    gw_finish(w, &buf, &len);
    CU_ASSERT(gguf_open_mem(buf, len, err, sizeof err) == NULL && strstr(err, "t.iq3") && strstr(err, "IQ3_XXS") &&
              !strchr(err, '\n'));
    free(buf);
    gw_free(w);
    w = gw_new();
    gw_tensor(w, "t.ok", GGML_T_F32, 1, ne, d, sizeof d);
    gw_finish(w, &buf, &len);
    CU_ASSERT(gguf_open_mem(buf, len - 4, err, sizeof err) == NULL && strstr(err, "t.ok") && strstr(err, "past the end"));
    /* the tensor info sits right before the padded data: n_dims is after the name */
    size_t name_at = 24 + 8; /* header, then the name's length */
    CU_ASSERT(memcmp(buf + name_at, "t.ok", 4) == 0);
    uint8_t *c2 = malloc(len);
    memcpy(c2, buf, len);
    c2[name_at + 4] = 0;
    CU_ASSERT(gguf_open_mem(c2, len, err, sizeof err) == NULL && strstr(err, "dimensions"));
    c2[name_at + 4] = 5;
    CU_ASSERT(gguf_open_mem(c2, len, err, sizeof err) == NULL && strstr(err, "dimensions"));
    memcpy(c2, buf, len);
    put_u64(c2 + name_at + 4 + 4 + 8 + 4, 3); /* offset 3 */
    CU_ASSERT(gguf_open_mem(c2, len, err, sizeof err) == NULL && strstr(err, "aligned"));
    free(c2);
    free(buf);
    gw_free(w);
}

static void test_real_model_tables_match_python_gguf_reader(void) {
    char path[1024];
    util_default_model(path, sizeof path);
    UTIL_REQUIRE_FILE(path);
    gguf_file *f = gguf_open(path, err, sizeof err);
    CU_ASSERT_FATAL(f != NULL);
    /* figures read with the python `gguf` package (GGUFReader) */
    CU_ASSERT_EQUAL(f->n_tensors, 272);
    CU_ASSERT_EQUAL(f->n_kv, 33);
    uint32_t u;
    CU_ASSERT(gguf_get_u32(f, "llama.block_count", &u, err, sizeof err) == 0 && u == 30);
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CU_ASSERT(t && t->type == GGML_T_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
    const gguf_value *a;
    CU_ASSERT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &a, err, sizeof err) == 0 &&
              a->v.arr.count == 49152 && gguf_str_eq(a->v.arr.strs[1], "<|im_start|>"));
    CU_ASSERT(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &a, err, sizeof err) == 0 &&
              a->v.arr.count == 48900);
    gguf_close(f);
}

/* A file that declares one more metadata key (or tensor) than the reader's limit is refused by the limit's name,
 * before anything is read for them; the bytes after the header are zeros, so the file is big enough for the
 * count. (The limits make the worst case bounded; the duplicate checks are linear in the count.) */
static void test_key_and_tensor_counts_beyond_the_limits_are_refused_by_name(void) {
    size_t len = ((size_t)GGUF_MAX_TENSOR_COUNT + 1) * 33 + 64;
    uint8_t *buf = calloc(1, len);
    CU_ASSERT_FATAL(buf != NULL);
    memcpy(buf, "GGUF\3\0\0\0", 8);
    put_u64(buf + 16, (uint64_t)GGUF_MAX_KV_COUNT + 1);
    CU_ASSERT(gguf_open_mem(buf, len, err, sizeof err) == NULL && strstr(err, "metadata count 65537") &&
              strstr(err, "GGUF_MAX_KV_COUNT") && one_line(err));
    put_u64(buf + 16, 0);
    put_u64(buf + 8, (uint64_t)GGUF_MAX_TENSOR_COUNT + 1);
    CU_ASSERT(gguf_open_mem(buf, len, err, sizeof err) == NULL && strstr(err, "GGUF_MAX_TENSOR_COUNT") && one_line(err));
    free(buf);
}

/* The duplicate checks (a hash set now, pairwise before) still find a repeated key or tensor name among many. */
static void test_duplicates_among_many_keys_and_tensors_are_found(void) {
    enum { N_KEYS = 20000 };
    gw_writer *w = gw_new();
    char key[32];
    for (int i = 0; i < N_KEYS; i++) {
        snprintf(key, sizeof key, "k.%05d", i);
        gw_kv_u32(w, key, (uint32_t)i);
    }
    uint8_t *buf;
    gguf_file *f = gw_open(w, &buf, err, sizeof err);
    CU_ASSERT_FATAL(f != NULL);
    uint32_t u;
    CU_ASSERT(f->n_kv == N_KEYS && gguf_get_u32(f, "k.19999", &u, err, sizeof err) == 0 && u == 19999);
    gguf_close(f);
    free(buf);
    w = gw_new();
    for (int i = 0; i < N_KEYS; i++) {
        snprintf(key, sizeof key, "k.%05d", i);
        gw_kv_u32(w, key, (uint32_t)i);
    }
    gw_kv_u32(w, "k.12345", 0);
    CU_ASSERT(gw_open(w, &buf, err, sizeof err) == NULL && strstr(err, "duplicate metadata key 'k.12345'"));
    free(buf);
    float d[32] = {0};
    uint64_t ne[1] = {32};
    w = gw_new();
    gw_tensor(w, "t.a", GGML_T_F32, 1, ne, d, sizeof d);
    gw_tensor(w, "t.b", GGML_T_F32, 1, ne, d, sizeof d);
    gw_tensor(w, "t.a", GGML_T_F32, 1, ne, d, sizeof d);
    CU_ASSERT(gw_open(w, &buf, err, sizeof err) == NULL && strstr(err, "duplicate tensor name 't.a'"));
    free(buf);
}

/* An F32 tensor of 2^31 x 2^31 = 2^62 elements is 2^64 bytes: the count wrapped to 0, and the tensor was
 * accepted with no data. Now the byte count is computed with an overflow check and the tensor refused by name. */
static void test_tensor_whose_byte_count_overflows_is_refused_by_name(void) {
    float d[32] = {0};
    uint64_t ne[2] = {1ull << 31, 1ull << 31};
    gw_writer *w = gw_new();
    gw_tensor(w, "t.huge", GGML_T_F32, 2, ne, d, sizeof d);
    uint8_t *buf;
    gguf_file *f = gw_open(w, &buf, err, sizeof err);
    CU_ASSERT(f == NULL && strstr(err, "t.huge") && one_line(err));
    if (f) printf("\n  accepted: n_bytes %llu\n", (unsigned long long)f->tensors[0].n_bytes);
    gguf_close(f);
    free(buf);
    /* a shape whose bytes fit 64 bits but not the file is still "past the end" */
    uint64_t ne2[2] = {1ull << 20, 1ull << 20};
    w = gw_new();
    gw_tensor(w, "t.big", GGML_T_F32, 2, ne2, d, sizeof d);
    CU_ASSERT(gw_open(w, &buf, err, sizeof err) == NULL && strstr(err, "t.big") && strstr(err, "past the end"));
    free(buf);
}

/* Offset of tensor `name`'s data offset field in a writer image (after its name, n_dims, dims and type). */
static size_t tensor_offset_field(const uint8_t *buf, size_t len, const char *name, int n_dims) {
    size_t n = strlen(name);
    for (size_t i = 8; i + n + 8 < len; i++)
        if (!memcmp(buf + i, name, n) && buf[i - 8] == n) return i + n + 4 + 8 * (size_t)n_dims + 4;
    return 0;
}

/* Two tensors whose data ranges overlap would alias each other's weights: refused, naming both. */
static void test_overlapping_tensor_data_is_refused_naming_both(void) {
    float d[64] = {0};
    uint64_t ne[1] = {64};
    gw_writer *w = gw_new();
    gw_tensor(w, "t.first", GGML_T_F32, 1, ne, d, sizeof d);
    gw_tensor(w, "t.second", GGML_T_F32, 1, ne, d, sizeof d);
    gw_tensor(w, "t.third", GGML_T_F32, 1, ne, d, sizeof d);
    uint8_t *buf;
    size_t len;
    gw_finish(w, &buf, &len);
    gw_free(w);
    gguf_file *f = gguf_open_mem(buf, len, err, sizeof err);
    CU_ASSERT_FATAL(f != NULL); /* as written: three ranges one after another */
    gguf_close(f);
    size_t at = tensor_offset_field(buf, len, "t.third", 1);
    CU_ASSERT_FATAL(at > 0);
    put_u64(buf + at, 128); /* inside t.first's 256 bytes */
    f = gguf_open_mem(buf, len, err, sizeof err);
    CU_ASSERT(f == NULL && strstr(err, "overlaps") && strstr(err, "'t.third'") && strstr(err, "'t.first'") &&
              one_line(err));
    gguf_close(f);
    put_u64(buf + at, 0); /* the same range as t.first */
    CU_ASSERT(gguf_open_mem(buf, len, err, sizeof err) == NULL && strstr(err, "overlaps"));
    free(buf);
}

static void on_alarm(int sig) { (void)sig; }

/* A FIFO given as a model used to block in open() until something wrote to it, forever; now it is refused at once
 * by its kind. (An alarm interrupts a blocking open, so the old behaviour fails the test instead of hanging it.) */
static void test_fifo_is_refused_without_blocking(void) {
    char dir[] = "/tmp/kvb_gguf_fifo_XXXXXX", path[64]; /* a folder of this run's own */
    CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    CU_ASSERT_FATAL(mkfifo(path, 0600) == 0);
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_alarm; /* no SA_RESTART: the blocked open returns EINTR */
    sigaction(SIGALRM, &sa, &old);
    alarm(3);
    gguf_file *f = gguf_open(path, err, sizeof err);
    alarm(0);
    sigaction(SIGALRM, &old, NULL);
    CU_ASSERT(f == NULL && strstr(err, "FIFO") && strstr(err, "not a regular file"));
    gguf_close(f);
    unlink(path);
    rmdir(dir);
    CU_ASSERT(gguf_open("/tmp", err, sizeof err) == NULL && strstr(err, "directory"));
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("gguf", NULL, NULL);
    CU_add_test(s, "every metadata type parses with its value", test_every_metadata_type_parses_with_its_value);
    CU_add_test(s, "getters report missing keys and type mismatch", test_getters_report_missing_keys_and_type_mismatch);
    CU_add_test(s, "tensors are found, aligned, with their data", test_tensors_are_found_aligned_with_their_data);
    CU_add_test(s, "every truncation fails with a one-line error", test_every_truncation_fails_with_a_one_line_error);
    CU_add_test(s, "byte flips never crash", test_byte_flips_never_crash);
    CU_add_test(s, "hand-made bad headers name the problem", test_hand_made_bad_headers_name_the_problem);
    CU_add_test(s, "real model tables match the python gguf reader", test_real_model_tables_match_python_gguf_reader);
    CU_add_test(s, "key and tensor counts beyond the limits are refused by name", test_key_and_tensor_counts_beyond_the_limits_are_refused_by_name);
    CU_add_test(s, "duplicates among many keys and tensors are found", test_duplicates_among_many_keys_and_tensors_are_found);
    CU_add_test(s, "a tensor whose byte count overflows is refused by name", test_tensor_whose_byte_count_overflows_is_refused_by_name);
    CU_add_test(s, "overlapping tensor data is refused, naming both", test_overlapping_tensor_data_is_refused_naming_both);
    CU_add_test(s, "a FIFO is refused without blocking", test_fifo_is_refused_without_blocking);
    return util_run_suites();
}
