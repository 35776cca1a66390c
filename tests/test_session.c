/* test_session.c — the engine session (engine/session.h) on a tiny byte-vocabulary model, with a recording method
 * seam in place of a method: chunk rounds cut as documented; the rounds prefilled in p->chunk pieces with
 * progress and cancel; the end of prefill written once (kvb_end_prefill: after it the context is out of prefill,
 * then the method verifies, and a failed check is the session's error); the method's own prefill taken only for
 * a single prompt from round 0; a shared prefill adopted (the shared pointer passed through), ended, its tail
 * forwarded and its time added; decode ending at max tokens, at a stop string (cut from the text), at the end of
 * generation (first_eog) or not (ignore_eos); the final check and ms per token. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "engine/model.h"
#include "engine/session.h"

enum { L = 2, NH = 2, NKV = 1, HD = 8, E = NH * HD, FF = 32, CTX = 256 };

static kvb_model *model;
static char model_path[256];

static kvb_ctx *new_ctx(void) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = CTX;
    p.n_threads = 1;
    p.n_batch = 16;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

/* ---- a method seam that records what the session asks of it ---- */

typedef struct {
    int prefills, adopts, verifies_prefill, verifies_end, usages;
    int in_prefill_at_verify; /* c->in_prefill when verify(end_of_prefill = 1) ran */
    int64_t n_past_at_verify;
    const void *shared_seen;
    int fail_verify, fail_adopt;
} rec;

static int rec_prefill(void *self, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    rec *r = self;
    r->prefills++;
    return kvb_forward(c, ids, n, err, err_len);
}

static int rec_adopt(void *self, kvb_ctx *c, const void *shared, char *err, size_t err_len) {
    (void)c;
    rec *r = self;
    r->adopts++;
    r->shared_seen = shared;
    return r->fail_adopt ? (snprintf(err, err_len, "adopt refused"), -1) : 0;
}

static int rec_verify(void *self, kvb_ctx *c, int end_of_prefill, char *err, size_t err_len) {
    rec *r = self;
    if (end_of_prefill) {
        r->verifies_prefill++;
        r->in_prefill_at_verify = c->in_prefill;
        r->n_past_at_verify = c->n_past;
    } else {
        r->verifies_end++;
    }
    return r->fail_verify ? (snprintf(err, err_len, "method x: layer 0 holds 1 device KV tokens"), -1) : 0;
}

static void rec_usage(const void *self, const kvb_ctx *c, kvb_kv_usage *u) {
    ((rec *)self)->usages++;
    kvb_ctx_kv_usage(c, u);
}

static kvb_session_method seam_of(rec *r, int own_prefill) {
    kvb_session_method m = {r, own_prefill ? rec_prefill : NULL, rec_adopt, rec_verify, rec_usage};
    return m;
}

/* A prompt of n ids (bytes 'a'.. as tokens), cut into chunk-token rounds. */
static kvb_rounds prompt(int64_t n, int64_t chunk) {
    char err[256];
    kvb_rounds r = {0};
    r.ids = malloc((size_t)n * sizeof *r.ids);
    for (int64_t i = 0; i < n; i++) r.ids[i] = 3 + 'a' + (int32_t)(i % 26);
    r.n = n;
    CU_ASSERT_FATAL(kvb_rounds_chunk(&r, chunk, err, sizeof err) == 0);
    return r;
}

/* ---- rounds ---- */

static void test_rounds_chunk_cuts_whole_chunks_from_the_start(void) {
    kvb_rounds r = prompt(10, 4); /* 4 + 4 + a 2-token question */
    CU_ASSERT(r.n_rounds == 3 && r.round_end[0] == 4 && r.round_end[1] == 8 && r.round_end[2] == 10 && !r.real_rounds);
    kvb_rounds_free(&r);
    r = prompt(8, 4); /* a whole number of chunks ends with a whole chunk */
    CU_ASSERT(r.n_rounds == 2 && r.round_end[0] == 4 && r.round_end[1] == 8);
    kvb_rounds_free(&r);
    r = prompt(3, 4); /* shorter than a chunk: one round */
    CU_ASSERT(r.n_rounds == 1 && r.round_end[0] == 3);
    kvb_rounds_free(&r);
    r = prompt(7, 0); /* 0: the whole prompt */
    CU_ASSERT(r.n_rounds == 1 && r.round_end[0] == 7);
    kvb_rounds_free(&r);
    CU_ASSERT(r.ids == NULL && r.round_end == NULL && r.n == 0);
}

typedef struct {
    int calls, cancel_after;
    int64_t last_done, last_total;
} watch;

static void on_progress(void *user, const char *phase, int64_t done, int64_t total) {
    watch *w = user;
    if (strcmp(phase, "prefill")) return;
    w->calls++;
    w->last_done = done;
    w->last_total = total;
}

static int on_cancel(void *user) {
    watch *w = user;
    return w->cancel_after > 0 && w->calls >= w->cancel_after;
}

static void test_prefill_rounds_in_chunk_pieces_with_progress_and_cancel(void) {
    char err[256];
    kvb_rounds r = prompt(40, 16); /* rounds 16, 16, 8; pieces of 5: 4 + 4 + 2 = 10 forward calls */
    kvb_ctx *c = new_ctx();
    watch w = {0};
    kvb_gen_params p = {.chunk = 5, .progress = on_progress, .cancel = on_cancel, .user = &w};
    CU_ASSERT_FATAL(kvb_prefill_rounds(c, &r, 0, r.n, &p, err, sizeof err) == 0);
    CU_ASSERT(w.calls == 10 && w.last_done == 40 && w.last_total == 40);
    CU_ASSERT(c->n_past == 40 && c->in_prefill); /* the prefill is not ended here */
    CU_ASSERT(c->cur_round == 2);                /* the last round was tagged */
    kvb_ctx_free(c);
    /* stopping at a token inside a round (a hidden question): the rest is not prefilled */
    c = new_ctx();
    w = (watch){0};
    CU_ASSERT_FATAL(kvb_prefill_rounds(c, &r, 0, 20, &p, err, sizeof err) == 0);
    CU_ASSERT(c->n_past == 20);
    kvb_ctx_free(c);
    /* cancel between pieces */
    c = new_ctx();
    w = (watch){.cancel_after = 3};
    CU_ASSERT(kvb_prefill_rounds(c, &r, 0, r.n, &p, err, sizeof err) == -1 && !strcmp(err, "cancelled"));
    CU_ASSERT(c->n_past == 15);
    kvb_ctx_free(c);
    kvb_rounds_free(&r);
}

/* ---- the end of prefill ---- */

static void test_session_prefill_ends_once_then_verifies(void) {
    char err[256];
    rec r = {0};
    kvb_session_method m = seam_of(&r, 0);
    kvb_ctx *c = new_ctx();
    kvb_rounds pr = prompt(30, 8);
    kvb_gen_params gp = {.max_new = 4};
    kvb_session s;
    CU_ASSERT_FATAL(kvb_session_init(&s, c, &m, &gp, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_session_prefill(&s, &pr, 0, err, sizeof err) == 0);
    CU_ASSERT(r.prefills == 0 && r.adopts == 0 && r.verifies_prefill == 1 && r.verifies_end == 0);
    CU_ASSERT(r.in_prefill_at_verify == 0 && r.n_past_at_verify == 30); /* verified after the end of prefill */
    CU_ASSERT(s.kv_prefill.full_bytes > 0 && s.kv_prefill.device_bytes == s.kv_prefill.full_bytes && r.usages == 1);
    CU_ASSERT(s.prefill_ms >= 0);
    kvb_session_free(&s);
    kvb_ctx_free(c);
    kvb_rounds_free(&pr);
}

static void test_own_prefill_only_for_a_single_prompt_from_round_0(void) {
    char err[256];
    kvb_gen_params gp = {.max_new = 2};
    for (int k = 0; k < 3; k++) {
        rec r = {0};
        kvb_session_method m = seam_of(&r, 1);
        kvb_ctx *c = new_ctx();
        kvb_rounds pr = prompt(24, k == 0 ? 0 : 8); /* k 0: one round; k 1: three chunk rounds; k 2: real rounds */
        if (k == 2) pr.real_rounds = 1;
        kvb_session s;
        CU_ASSERT_FATAL(kvb_session_init(&s, c, &m, &gp, err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_session_prefill(&s, &pr, 0, err, sizeof err) == 0);
        CU_ASSERT_EQUAL(r.prefills, k == 0 ? 1 : 0);
        CU_ASSERT(r.verifies_prefill == 1 && c->n_past == 24 && !c->in_prefill);
        kvb_session_free(&s);
        kvb_ctx_free(c);
        kvb_rounds_free(&pr);
    }
}

static void test_failed_check_at_the_end_of_prefill_is_the_sessions_error(void) {
    char err[256] = "";
    rec r = {.fail_verify = 1};
    kvb_session_method m = seam_of(&r, 0);
    kvb_ctx *c = new_ctx();
    kvb_rounds pr = prompt(12, 0);
    kvb_gen_params gp = {.max_new = 2};
    kvb_session s;
    CU_ASSERT_FATAL(kvb_session_init(&s, c, &m, &gp, err, sizeof err) == 0);
    CU_ASSERT(kvb_session_prefill(&s, &pr, 0, err, sizeof err) == -1 && strstr(err, "holds 1 device KV tokens"));
    kvb_session_free(&s);
    kvb_ctx_free(c);
    /* the same end, outside a session */
    c = new_ctx();
    CU_ASSERT_FATAL(kvb_forward(c, pr.ids, pr.n, err, sizeof err) == 0);
    CU_ASSERT(kvb_end_prefill(c, &m, err, sizeof err) == -1 && !c->in_prefill && r.verifies_prefill == 2);
    kvb_ctx_free(c);
    c = new_ctx(); /* no method: full attention, nothing to check */
    CU_ASSERT_FATAL(kvb_forward(c, pr.ids, pr.n, err, sizeof err) == 0);
    CU_ASSERT(kvb_end_prefill(c, NULL, err, sizeof err) == 0 && !c->in_prefill);
    kvb_ctx_free(c);
    kvb_rounds_free(&pr);
}

static void test_adopt_a_shared_prefill_then_end_then_tail(void) {
    char err[256];
    kvb_rounds pr = prompt(30, 0);
    kvb_ctx *base = new_ctx();
    CU_ASSERT_FATAL(kvb_forward(base, pr.ids, 24, err, sizeof err) == 0); /* the shared context; 6 tokens hidden */
    int shared_token = 0;
    rec r = {0};
    kvb_session_method m = seam_of(&r, 0);
    kvb_ctx *c = kvb_ctx_fork(base, 0, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_gen_params gp = {.max_new = 2};
    kvb_session s;
    CU_ASSERT_FATAL(kvb_session_init(&s, c, &m, &gp, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_session_adopt(&s, &shared_token, 1000.0, pr.ids + 24, 6, err, sizeof err) == 0);
    CU_ASSERT(r.adopts == 1 && r.shared_seen == &shared_token && r.verifies_prefill == 1);
    CU_ASSERT(r.n_past_at_verify == 24 && c->n_past == 30); /* ended before the tail, which came after */
    CU_ASSERT(s.prefill_ms >= 1000.0 && s.prefill_ms < 1000.0 + 60e3);
    kvb_session_free(&s);
    kvb_ctx_free(c);
    /* a refused adoption stops before the end of prefill */
    rec r2 = {.fail_adopt = 1};
    m = seam_of(&r2, 0);
    c = kvb_ctx_fork(base, 0, err, sizeof err);
    CU_ASSERT_FATAL(kvb_session_init(&s, c, &m, &gp, err, sizeof err) == 0);
    CU_ASSERT(kvb_session_adopt(&s, NULL, 0, NULL, 0, err, sizeof err) == -1 && !strcmp(err, "adopt refused"));
    CU_ASSERT(r2.verifies_prefill == 0 && c->in_prefill);
    kvb_session_free(&s);
    kvb_ctx_free(c);
    kvb_ctx_free(base);
    kvb_rounds_free(&pr);
}

/* ---- decode ---- */

typedef struct {
    const char *text; /* bytes to force, one token each; then end of generation (token 0) */
    int at;
} forced;

static int32_t force(void *user, const float *logits) {
    (void)logits;
    forced *f = user;
    return f->text[f->at] ? 3 + (unsigned char)f->text[f->at++] : 0;
}

/* a session after a 12-token prefill with gp; decode to the end */
static void decode(kvb_gen_params *gp, rec *r, kvb_session *s, kvb_ctx **c) {
    char err[256];
    kvb_session_method m = seam_of(r, 0);
    *c = new_ctx();
    kvb_rounds pr = prompt(12, 0);
    CU_ASSERT_FATAL(kvb_session_init(s, *c, &m, gp, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_session_prefill(s, &pr, 0, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_session_decode(s, err, sizeof err) == 0);
    kvb_rounds_free(&pr);
}

static void test_decode_ends_at_max_tokens(void) {
    rec r = {0};
    forced f = {"abcdefghij", 0};
    kvb_gen_params gp = {.max_new = 5, .pick = force, .user = &f};
    kvb_session s;
    kvb_ctx *c;
    decode(&gp, &r, &s, &c);
    CU_ASSERT(s.finish == KVB_FINISH_LENGTH && s.n_gen == 5 && !strcmp(s.text, "abcde"));
    CU_ASSERT(s.steps == 4 && c->n_past == 12 + 4); /* the last token is not run through the model */
    CU_ASSERT(r.verifies_end == 1 && r.usages == 2 && s.kv_end.full_bytes > s.kv_prefill.full_bytes);
    CU_ASSERT(kvb_session_ms_per_token(&s) == s.decode_ms / 4);
    kvb_session_free(&s);
    kvb_ctx_free(c);
}

static void test_decode_ends_at_a_stop_string_cut_from_the_text(void) {
    rec r = {0};
    forced f = {"yes\nmore", 0};
    char *stop[] = {"\n"};
    kvb_gen_params gp = {.max_new = 20, .stop = stop, .n_stop = 1, .pick = force, .user = &f};
    kvb_session s;
    kvb_ctx *c;
    decode(&gp, &r, &s, &c);
    CU_ASSERT(s.finish == KVB_FINISH_STOP && !strcmp(s.text, "yes") && s.n_gen == 4);
    kvb_session_free(&s);
    kvb_ctx_free(c);
}

static void test_decode_ends_at_end_of_generation_unless_ignored(void) {
    rec r = {0};
    forced f = {"", 0}; /* end of generation first */
    kvb_gen_params gp = {.max_new = 6, .pick = force, .user = &f};
    kvb_session s;
    kvb_ctx *c;
    CU_ASSERT_FATAL(tok_is_eog(model->tok, 0));
    decode(&gp, &r, &s, &c);
    CU_ASSERT(s.finish == KVB_FINISH_EOS && s.n_gen == 0 && s.first_eog == 0 && s.steps == 0 && !strcmp(s.text, ""));
    CU_ASSERT(kvb_session_ms_per_token(&s) == 0 && r.verifies_end == 1);
    kvb_session_free(&s);
    kvb_ctx_free(c);
    f = (forced){"ab", 0};
    gp.ignore_eos = 1; /* bench: end of generation does not stop */
    decode(&gp, &r, &s, &c);
    CU_ASSERT(s.finish == KVB_FINISH_LENGTH && s.n_gen == 6 && s.first_eog == -1);
    kvb_session_free(&s);
    kvb_ctx_free(c);
}

static void test_failed_final_check_is_the_decodes_error(void) {
    char err[256] = "";
    rec r = {0};
    kvb_session_method m = seam_of(&r, 0);
    kvb_ctx *c = new_ctx();
    kvb_rounds pr = prompt(12, 0);
    forced f = {"abc", 0};
    kvb_gen_params gp = {.max_new = 3, .pick = force, .user = &f};
    kvb_session s;
    CU_ASSERT_FATAL(kvb_session_init(&s, c, &m, &gp, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_session_prefill(&s, &pr, 0, err, sizeof err) == 0);
    r.fail_verify = 1;
    CU_ASSERT(kvb_session_decode(&s, err, sizeof err) == -1 && strstr(err, "device KV tokens") && r.verifies_end == 1);
    kvb_session_free(&s);
    kvb_ctx_free(c);
    kvb_rounds_free(&pr);
}

static char dir[] = "/tmp/kvb_session_XXXXXX";

static int setup(void) {
    if (!mkdtemp(dir)) return -1;
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    gw_random rnd = {5, 0.5f, NULL};
    gw_tiny t = {"llama", L, E, NH, NKV, FF, GW_BYTE_VOCAB, CTX, 1, NULL, gw_random_tensor, &rnd};
    int rc = gw_write_tiny(&t, model_path);
    free(rnd.buf);
    char err[256];
    model = rc ? NULL : kvb_model_load(model_path, err, sizeof err);
    return model ? 0 : -1;
}

static int teardown(void) {
    kvb_model_free(model);
    unlink(model_path);
    rmdir(dir);
    return 0;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("session", setup, teardown);
    CU_add_test(s, "chunk rounds: whole chunks from the start, the question last", test_rounds_chunk_cuts_whole_chunks_from_the_start);
    CU_add_test(s, "rounds prefilled in chunk pieces, with progress, a stop token and cancel",
                test_prefill_rounds_in_chunk_pieces_with_progress_and_cancel);
    CU_add_test(s, "session prefill: ended once, then verified, then measured", test_session_prefill_ends_once_then_verifies);
    CU_add_test(s, "own prefill only for a single prompt from round 0", test_own_prefill_only_for_a_single_prompt_from_round_0);
    CU_add_test(s, "a failed check at the end of prefill is the error (in a session and out)",
                test_failed_check_at_the_end_of_prefill_is_the_sessions_error);
    CU_add_test(s, "adopt: the shared prefill passed through, ended, then the tail", test_adopt_a_shared_prefill_then_end_then_tail);
    CU_add_test(s, "decode ends at max tokens", test_decode_ends_at_max_tokens);
    CU_add_test(s, "decode ends at a stop string, cut from the text", test_decode_ends_at_a_stop_string_cut_from_the_text);
    CU_add_test(s, "decode ends at end of generation unless ignored", test_decode_ends_at_end_of_generation_unless_ignored);
    CU_add_test(s, "a failed final check is decode's error", test_failed_final_check_is_the_decodes_error);
    return util_run_suites();
}
