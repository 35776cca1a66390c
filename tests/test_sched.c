/* test_sched.c — continuous batching on a fixed KV pool (judge/sched.h), on a seeded random-weight model (16 layers,
 * so that OmniKV's full layers fit 25%): every request completes with the tokens it gets decoded alone; a pool sized
 * for two full-attention sequences never runs more than two of them (the rest wait, counted), and never promises
 * more pages than it has; a method that keeps 25% runs more sequences at once in the same pool, more still when it
 * ends its prefill layer by layer (promised what each layer keeps plus one layer's whole prompt, and measured within
 * it: SnapKV and StreamingLLM exactly at it, OmniKV below, its packed loads coming after its last layer's
 * attention); a request larger than the pool is refused with an error while the others complete; the pages all come
 * back; malformed requests are refused at submit. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/kvpool.h"
#include "engine/session.h"
#include "judge/sched.h"

enum { L = 16, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 64, V = 200, CTX = 512, NREQ = 8, PROMPT = 96, NEW = 12 };

static uint64_t rng = 0x5c4edull;
static int32_t prompts[NREQ][PROMPT];

typedef struct {
    int n_done, n_ok;
    int32_t gen[NREQ][NEW];
    int n_gen[NREQ];
    char err[NREQ][384];
    int ok[NREQ];
} outcome;

static void on_done(void *user, const kvb_sched_result *r) {
    outcome *o = user;
    o->n_done++;
    o->n_ok += r->ok;
    o->ok[r->id] = r->ok;
    snprintf(o->err[r->id], sizeof o->err[r->id], "%s", r->err);
    o->n_gen[r->id] = r->n_gen;
    if (r->ok) {
        memcpy(o->gen[r->id], r->gen, (size_t)r->n_gen * sizeof(int32_t));
        CU_ASSERT(r->t_arrive <= r->t_admit && r->t_admit <= r->t_first && r->t_first <= r->t_last &&
                  r->t_last <= r->t_done);
    }
}

/* Request i decoded alone (the reference), under method name at budget (NULL: full attention). */
static void decode_alone(int i, const char *name, const char *budget, int32_t *gen) {
    char err[384];
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = name ? util_make_method(name, c, budget, NULL) : NULL;
    kvb_session_method seam = kvb_method_seam(m);
    kvb_gen_params gp = {0};
    gp.max_new = NEW;
    gp.ignore_eos = 1;
    kvb_session s;
    CU_ASSERT_FATAL(kvb_session_init(&s, c, &seam, &gp, err, sizeof err) == 0);
    int64_t end = PROMPT;
    kvb_rounds r = {prompts[i], PROMPT, &end, 1, 0, 0};
    CU_ASSERT_FATAL(kvb_session_prefill(&s, &r, 0, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_session_decode(&s, err, sizeof err) == 0);
    CU_ASSERT_FATAL(s.n_gen == NEW);
    memcpy(gen, s.gen, NEW * sizeof(int32_t));
    kvb_session_free(&s);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* The pool's bytes for n full-attention sequences of PROMPT + NEW tokens. */
static int64_t pool_for(int n, kvb_ctx *probe) {
    kvp_pool p;
    char err[128];
    CU_ASSERT_FATAL(kvp_init(&p, 1 << 30, kvc_slot_bytes(probe->kv), 16, err, sizeof err) == 0);
    return n * kvp_full_pages(&p, &util_tiny->cfg, PROMPT + NEW) * p.page_bytes;
}

static int64_t prefill_chunk; /* the scheduler's, for the next new_sched */

static kvb_sched *new_sched(const char *method, const char *budget, int64_t pool_bytes) {
    char err[384];
    kvb_sched_opts o;
    memset(&o, 0, sizeof o);
    o.model = util_tiny;
    o.ctx = kvb_ctx_default_params();
    o.ctx.n_ctx = CTX;
    o.ctx.n_threads = 2;
    o.ctx.n_batch = 64;
    o.max_batch = 16;
    o.pool_bytes = pool_bytes;
    o.prefill_chunk = prefill_chunk;
    o.method = method;
    if (budget) CU_ASSERT_FATAL(kvb_budget_parse(budget, &o.budget, err, sizeof err) == 0);
    kvb_sched *s = kvb_sched_create(&o, err, sizeof err);
    if (!s) fprintf(stderr, "\n  sched: %s\n", err);
    CU_ASSERT_FATAL(s != NULL);
    return s;
}

/* Submit every request at once (as NREQ closed-loop clients' first requests) and step until all have ended. */
static void run_all(kvb_sched *s, outcome *o, int n_req) {
    char err[384];
    for (int i = 0; i < n_req; i++) {
        kvb_sched_req r = {0};
        r.id = i;
        r.ids = prompts[i];
        r.n = PROMPT;
        r.max_new = NEW;
        r.ignore_eos = 1;
        CU_ASSERT_FATAL(kvb_sched_submit(s, &r, err, sizeof err) == 0);
    }
    for (int it = 0; o->n_done < n_req; it++) {
        CU_ASSERT_FATAL(kvb_sched_step(s, on_done, o, err, sizeof err) == 0);
        CU_ASSERT_FATAL(it < 10000);
    }
    CU_ASSERT(kvb_sched_waiting(s) == 0 && kvb_sched_running(s) == 0);
}

static kvb_sched_stats last; /* the stats of check_case's last run */

static void check_case(const char *method, const char *budget, int pool_seqs, int *max_running) {
    kvb_ctx *probe = util_tiny_ctx(KVB_F16, CTX);
    kvb_sched *s = new_sched(method, budget, pool_for(pool_seqs, probe));
    kvb_ctx_free(probe);
    outcome *o = calloc(1, sizeof *o);
    run_all(s, o, NREQ);
    CU_ASSERT(o->n_ok == NREQ);
    for (int i = 0; i < NREQ; i++) {
        if (!o->ok[i]) fprintf(stderr, "\n  request %d: %s\n", i, o->err[i]);
        int32_t ref[NEW];
        decode_alone(i, method, budget, ref);
        CU_ASSERT(o->n_gen[i] == NEW && memcmp(ref, o->gen[i], sizeof ref) == 0);
    }
    kvb_sched_stats st;
    kvb_sched_get_stats(s, &st);
    CU_ASSERT(st.finished == NREQ && st.failed == 0 && st.refused == 0 && st.overdrafts == 0);
    CU_ASSERT(st.peak_reserved <= st.pool_pages && st.peak_held <= st.pool_pages);
    CU_ASSERT(st.prefills == NREQ && st.steps > 0);
    CU_ASSERT(st.prefill_parts == (prefill_chunk ? (PROMPT + prefill_chunk - 1) / prefill_chunk : 1) * NREQ);
    *max_running = st.max_running;
    last = st;
    if (pool_seqs < NREQ) CU_ASSERT(st.waits > 0);
    kvb_sched_free(s);
    free(o);
}

static void test_full_attention_pool_of_two_runs_two_and_decodes_as_alone(void) {
    int mr = 0;
    check_case(NULL, NULL, 2, &mr);
    CU_ASSERT(mr == 2);
}

static void test_snapkv_25_runs_more_in_the_same_pool(void) {
    int mr_full = 0, mr_snap = 0;
    check_case("full", NULL, 2, &mr_full);
    check_case("snapkv", "25%", 2, &mr_snap);
    printf("(max running: full %d, snapkv 25%% %d) ", mr_full, mr_snap);
    CU_ASSERT(mr_full == 2 && mr_snap > 2);
}

static void test_chunked_prefill_between_steps_decodes_as_alone(void) {
    int mr = 0;
    prefill_chunk = 64; /* the contexts' n_batch: the 96-token prompts prefill in two steps */
    check_case(NULL, NULL, 3, &mr);
    check_case("snapkv", "50%", 3, &mr);
    check_case("h2o", "40%", 3, &mr);
    prefill_chunk = 0;
}

static int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* SnapKV and StreamingLLM end their prefill layer by layer when the prompt is prefilled whole: each prefill is measured
 * (at every layer's attention) to peak at the compressed layers plus one layer's whole prompt, which the admission
 * promises; prefilled in pieces, the prefill holds the whole prompt in every layer, the promise is full attention's,
 * and fewer sequences run in the same pool. No overdraft either way (check_case), each request decodes as alone. */
static void test_layer_local_methods_are_promised_the_compressed_cache_and_one_layer(void) {
    static const char *methods[] = {"snapkv", "streamingllm"};
    const int64_t keep = PROMPT / 4; /* 25% of the prompt per head */
    const int64_t layerwise = NKV * ((L - 1) * div_up(keep, 16) + div_up(PROMPT, 16)), whole = NKV * L * div_up(PROMPT, 16);
    for (int k = 0; k < 2; k++) {
        int mr_pieces = 0, mr_whole = 0;
        prefill_chunk = 64;
        check_case(methods[k], "25%", 2, &mr_pieces);
        const int64_t peak_pieces = last.peak_prefill;
        prefill_chunk = 0;
        check_case(methods[k], "25%", 2, &mr_whole);
        printf("(%s: prefill peak %lld pages whole, %lld in pieces; %d and %d running) ", methods[k],
               (long long)last.peak_prefill, (long long)peak_pieces, mr_whole, mr_pieces);
        CU_ASSERT(last.peak_prefill == layerwise && peak_pieces == whole);
        CU_ASSERT(mr_whole > mr_pieces);
    }
}

/* OmniKV ends its prefill layer by layer too: a sparse layer moves to the host as its attention ends, a filter layer's
 * selection is loaded packed once the last sparse layer it serves has ended. At 25% on these 16 layers its default
 * filter layers (the paper's 2;8;18 of 32 scaled: 1;4;9, holding 7/16) drop to layer 1 (methods/omnikv.c): layers
 * 0-2 keep the prompt, 3-15 T = llround((25% - 3/16) / (13/16) x 96) = 7 tokens per head. Its promise: those kept
 * sizes, each with room for NEW more, plus the most one layer adds while it holds the prompt; its measured peak: at a
 * sparse layer's attention, the three full layers and that layer at the whole prompt (the packed load comes after the
 * last layer). Without the layer-wise end, or with offload=0 (every layer stays on the device), full attention's
 * pages. No overdraft, each request decodes as alone (check_case), more run when prefilled whole. */
static void test_omnikv_prefilled_whole_is_promised_its_kept_layers_and_one_layer(void) {
    char err[384];
    const int64_t at_full = div_up(PROMPT + NEW, 16), at_t = div_up(7 + NEW, 16);
    const int64_t promise = NKV * (3 * at_full + (L - 3) * at_t + (at_full - at_t)), full = NKV * L * at_full;
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX), *c0 = util_tiny_ctx(KVB_F16, CTX);
    kvp_pool p;
    CU_ASSERT_FATAL(kvp_init(&p, 1 << 30, kvc_slot_bytes(c->kv), 16, err, sizeof err) == 0);
    kvb_method *m = util_make_method("omnikv", c, "25%", NULL), *m0 = util_make_method("omnikv", c0, "25%", "offload=0");
    const kvb_config *cfg = &util_tiny->cfg;
    CU_ASSERT(kvb_sched_peak_pages(&p, cfg, m, 1, PROMPT, NEW, err, sizeof err) == promise);
    CU_ASSERT(kvb_sched_peak_pages(&p, cfg, m, 0, PROMPT, NEW, err, sizeof err) == full);
    CU_ASSERT(kvb_sched_peak_pages(&p, cfg, m0, 1, PROMPT, NEW, err, sizeof err) == full);
    kvb_method_free(m, c);
    kvb_method_free(m0, c0);
    kvb_ctx_free(c);
    kvb_ctx_free(c0);

    int mr_pieces = 0, mr_whole = 0;
    prefill_chunk = 64;
    check_case("omnikv", "25%", 2, &mr_pieces);
    const int64_t peak_pieces = last.peak_prefill;
    prefill_chunk = 0;
    check_case("omnikv", "25%", 2, &mr_whole);
    printf("(omnikv: promised %lld pages, prefill peak %lld whole, %lld in pieces; %d and %d running) ", (long long)promise,
           (long long)last.peak_prefill, (long long)peak_pieces, mr_whole, mr_pieces);
    CU_ASSERT(last.peak_prefill == NKV * 4 * div_up(PROMPT, 16) && last.peak_prefill <= promise);
    CU_ASSERT(peak_pieces == NKV * L * div_up(PROMPT, 16));
    CU_ASSERT(mr_whole > mr_pieces);
}

static void test_request_larger_than_the_pool_is_refused_others_complete(void) {
    kvb_ctx *probe = util_tiny_ctx(KVB_F16, CTX);
    kvb_sched *s = new_sched(NULL, NULL, pool_for(1, probe));
    kvb_ctx_free(probe);
    char err[384];
    outcome *o = calloc(1, sizeof *o);
    static int32_t big[PROMPT * 2];
    for (int i = 0; i < PROMPT * 2; i++) big[i] = prompts[i % NREQ][i % PROMPT];
    kvb_sched_req r = {0};
    r.id = 0, r.ids = big, r.n = PROMPT * 2, r.max_new = NEW, r.ignore_eos = 1;
    CU_ASSERT_FATAL(kvb_sched_submit(s, &r, err, sizeof err) == 0);
    for (int i = 1; i < 3; i++) {
        r.id = i, r.ids = prompts[i], r.n = PROMPT;
        CU_ASSERT_FATAL(kvb_sched_submit(s, &r, err, sizeof err) == 0);
    }
    for (int it = 0; o->n_done < 3 && it < 1000; it++) CU_ASSERT_FATAL(kvb_sched_step(s, on_done, o, err, sizeof err) == 0);
    CU_ASSERT(o->n_done == 3 && o->n_ok == 2 && !o->ok[0] && strstr(o->err[0], "the pool holds"));
    kvb_sched_stats st;
    kvb_sched_get_stats(s, &st);
    CU_ASSERT(st.refused == 1 && st.finished == 2 && st.max_running == 1);
    kvb_sched_free(s);
    free(o);
}

static void test_malformed_requests_refused_at_submit(void) {
    kvb_sched *s = new_sched(NULL, NULL, 0);
    char err[384];
    int32_t bad[2] = {1, V};
    kvb_sched_req r = {0};
    r.ids = prompts[0], r.n = 0, r.max_new = 4;
    CU_ASSERT(kvb_sched_submit(s, &r, err, sizeof err) == -1 && strstr(err, "no prompt"));
    r.n = PROMPT, r.max_new = 0;
    CU_ASSERT(kvb_sched_submit(s, &r, err, sizeof err) == -1 && strstr(err, "max_new"));
    r.max_new = CTX;
    CU_ASSERT(kvb_sched_submit(s, &r, err, sizeof err) == -1 && strstr(err, "context"));
    r.ids = bad, r.n = 2, r.max_new = 4;
    CU_ASSERT(kvb_sched_submit(s, &r, err, sizeof err) == -1 && strstr(err, "out of range"));
    r.ids = prompts[0], r.method = "nosuch";
    CU_ASSERT(kvb_sched_submit(s, &r, err, sizeof err) == -1 && strstr(err, "unknown method"));
    CU_ASSERT(kvb_sched_waiting(s) == 0);
    kvb_sched_free(s);
}

/* ---- streaming, cancellation, sampling per request ---- */

typedef struct {
    char text[4096];
    size_t n;
    int tokens, cancel_after; /* cancel_after > 0: cancel once that many tokens were streamed */
} stream_user;

static void on_token(void *user, const char *piece, size_t n) {
    stream_user *u = user;
    if (u->n + n < sizeof u->text) memcpy(u->text + u->n, piece, n), u->n += n;
    u->tokens++;
}

static int cancel_fn(void *user) {
    stream_user *u = user;
    return u->cancel_after > 0 && u->tokens >= u->cancel_after;
}

static char texts[NREQ][4096];

static void on_done_text(void *user, const kvb_sched_result *r) {
    on_done(user, r);
    if (r->text) snprintf(texts[r->id], sizeof texts[r->id], "%s", r->text);
}

static void test_streaming_cancel_and_sampling_per_request(void) {
    char err[384];
    kvb_ctx *probe = util_tiny_ctx(KVB_F16, CTX);
    kvb_sched *s = new_sched(NULL, NULL, pool_for(2, probe));
    kvb_ctx_free(probe);
    outcome *o = calloc(1, sizeof *o);
    stream_user su[3];
    memset(su, 0, sizeof su);
    su[1].cancel_after = 3;
    for (int i = 0; i < 3; i++) {
        kvb_sched_req r = {0};
        r.id = i, r.ids = prompts[i], r.n = PROMPT, r.max_new = NEW, r.ignore_eos = 1;
        r.on_token = on_token, r.cancel = cancel_fn, r.user = &su[i];
        if (i == 2) r.temp = 0.8f, r.top_p = 0.9f, r.seed = 7;
        CU_ASSERT_FATAL(kvb_sched_submit(s, &r, err, sizeof err) == 0);
    }
    for (int it = 0; o->n_done < 3 && it < 1000; it++) CU_ASSERT_FATAL(kvb_sched_step(s, on_done_text, o, err, sizeof err) == 0);
    CU_ASSERT(o->n_done == 3 && o->ok[0] && !o->ok[1] && o->ok[2] && strstr(o->err[1], "cancelled"));
    CU_ASSERT(su[1].tokens == 3);
    /* the streamed pieces are the reply's text */
    CU_ASSERT(su[0].tokens == NEW && su[0].n == strlen(texts[0]) && memcmp(su[0].text, texts[0], su[0].n) == 0);
    CU_ASSERT(su[2].n == strlen(texts[2]) && memcmp(su[2].text, texts[2], su[2].n) == 0);
    kvb_sched_stats st;
    kvb_sched_get_stats(s, &st);
    CU_ASSERT(st.cancelled == 1 && st.finished == 2);
    kvb_sched_free(s);
    /* the sampled request decodes as alone with the same seed */
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_gen_params gp = {0};
    gp.max_new = NEW, gp.ignore_eos = 1, gp.temp = 0.8f, gp.top_p = 0.9f, gp.seed = 7;
    kvb_session ses;
    CU_ASSERT_FATAL(kvb_session_init(&ses, c, NULL, &gp, err, sizeof err) == 0);
    int64_t end = PROMPT;
    kvb_rounds r = {prompts[2], PROMPT, &end, 1, 0, 0};
    CU_ASSERT_FATAL(kvb_session_prefill(&ses, &r, 0, err, sizeof err) == 0 && kvb_session_decode(&ses, err, sizeof err) == 0);
    CU_ASSERT(ses.n_gen == NEW && o->n_gen[2] == NEW && memcmp(ses.gen, o->gen[2], NEW * sizeof(int32_t)) == 0);
    kvb_session_free(&ses);
    kvb_ctx_free(c);
    free(o);
}

static int setup(void) {
    const util_tiny_shape shape = {"sched", L, E, NH, NKV, FF, V, CTX};
    if (util_tiny_setup(&shape, &rng)) return -1;
    for (int i = 0; i < NREQ; i++)
        for (int t = 0; t < PROMPT; t++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            prompts[i][t] = (int32_t)((rng >> 33) % V);
        }
    return 0;
}

static int teardown(void) { return util_tiny_teardown(); }

/* A promise moved down gives pages back, moved up takes them while the pool has them, and beyond the pool takes them
 * anyway and says so (an overdraft: the free count goes negative, never hidden). */
static void test_repromise_moves_the_reserved_pages(void) {
    char err[128];
    kvp_pool p;
    CU_ASSERT_FATAL(kvp_init(&p, 10 * 16 * 64, 64, 16, err, sizeof err) == 0); /* 10 pages of 16 slots */
    CU_ASSERT_EQUAL(p.n_pages, 10);
    int64_t promised = 0;
    CU_ASSERT_EQUAL(kvp_repromise(&p, &promised, 6), 0);
    CU_ASSERT(promised == 6 && kvp_free_pages(&p) == 4);
    CU_ASSERT_EQUAL(kvp_repromise(&p, &promised, 2), 0);
    CU_ASSERT(promised == 2 && kvp_free_pages(&p) == 8);
    CU_ASSERT_EQUAL(kvp_repromise(&p, &promised, 12), 1);
    CU_ASSERT(promised == 12 && kvp_free_pages(&p) == -2);
    CU_ASSERT_EQUAL(kvp_repromise(&p, &promised, 12), 0);
    CU_ASSERT_EQUAL(kvp_repromise(&p, &promised, 0), 0);
    CU_ASSERT_EQUAL(kvp_free_pages(&p), 10);
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("sched", setup, teardown);
    CU_add_test(s, "kvp_repromise: pages given back, taken, and overdrawn", test_repromise_moves_the_reserved_pages);
    CU_add_test(s, "full attention, a pool for two: two run, the rest wait, each decodes as alone",
                test_full_attention_pool_of_two_runs_two_and_decodes_as_alone);
    CU_add_test(s, "SnapKV at 25% runs more sequences than full in the same pool, each as alone",
                test_snapkv_25_runs_more_in_the_same_pool);
    CU_add_test(s, "prefill in pieces between decode steps (full, SnapKV, H2O): each request decodes as alone",
                test_chunked_prefill_between_steps_decodes_as_alone);
    CU_add_test(s, "SnapKV, StreamingLLM prefilled whole: promised and measured at the compressed cache + one layer",
                test_layer_local_methods_are_promised_the_compressed_cache_and_one_layer);
    CU_add_test(s, "OmniKV prefilled whole: promised its kept layers + one layer, measured within it, no overdraft",
                test_omnikv_prefilled_whole_is_promised_its_kept_layers_and_one_layer);
    CU_add_test(s, "a request larger than the pool is refused with an error; the others complete",
                test_request_larger_than_the_pool_is_refused_others_complete);
    CU_add_test(s, "malformed requests are refused at submit", test_malformed_requests_refused_at_submit);
    CU_add_test(s, "tokens stream as sampled, a cancel ends one request, a seeded sampler decodes as alone",
                test_streaming_cancel_and_sampling_per_request);
    return util_run_suites();
}
