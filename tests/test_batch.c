/* test_batch.c — batched decoding (engine/batch.h, kvb_session_step_batch): sequences decoded together, one
 * forward step for all of them, give each the tokens it gets decoded alone, token for token, and the same logits
 * bit for bit (the CPU backend's rows do not depend on each other). Pinned down on a seeded random-weight model
 * (always): 8 prompts of different lengths under full attention; 8 prompts each under its own method and budget;
 * sequences that join the running batch at different steps and leave it at different lengths (continuous
 * batching); 40 sequences, past the prefill GEMM's 32-row threshold. On the default model when it is present: 8
 * different chat prompts, greedy. A refused step (a full context, the same context twice, another backend)
 * changes no context. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/batch.h"
#include "engine/session.h"
#include "methods/method.h"

enum { L = 3, NH = 4, NKV = 2, HD = 32, E = NH * HD, FF = 96, V = 300, CTX = 640, MAXSEQ = 40 };

static uint64_t rng = 0xba7c4ed5eedull;

/* one sequence of a test: its prompt, method, budget, when it joins the batch and how much it generates */
typedef struct {
    int32_t *ids;
    int64_t n;
    const char *method, *budget; /* method NULL or "full": full attention */
    int join_step, max_new;
    /* results */
    int32_t gen[128];
    int n_gen;
    float *logits; /* the context's logits after its last forward pass */
} seq;

static kvb_ctx *new_ctx(kvb_model *m, kvb_backend *share) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = CTX;
    p.n_threads = 2;
    p.n_batch = 64;
    p.share_backend = share;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    if (!c) fprintf(stderr, "\n  ctx: %s\n", err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

static kvb_method *new_method(const seq *q, kvb_ctx *c) {
    if (!q->method || !strcmp(q->method, "full")) return NULL;
    return util_make_method(q->method, c, q->budget, NULL);
}

static kvb_gen_params gen_params(const seq *q) {
    kvb_gen_params gp = {0};
    gp.max_new = q->max_new;
    gp.ignore_eos = 1; /* every sequence runs to its length, so the batch's membership is the test's choice */
    return gp;
}

/* A sequence's context, method and session, prefilled. */
typedef struct {
    kvb_ctx *c;
    kvb_method *m;
    kvb_session s;
} live;

static void start(live *lv, seq *q, kvb_model *m, kvb_backend *share) {
    char err[512];
    lv->c = new_ctx(m, share);
    lv->m = new_method(q, lv->c);
    kvb_session_method seam = kvb_method_seam(lv->m);
    kvb_gen_params gp = gen_params(q);
    CU_ASSERT_FATAL(kvb_session_init(&lv->s, lv->c, &seam, &gp, err, sizeof err) == 0);
    int64_t end = q->n;
    kvb_rounds r = {q->ids, q->n, &end, 1, 0, 0};
    if (kvb_session_prefill(&lv->s, &r, 0, err, sizeof err)) fprintf(stderr, "\n  prefill: %s\n", err);
    CU_ASSERT_FATAL(lv->s.c != NULL && lv->c->in_prefill == 0);
}

static void finish(live *lv, seq *q) {
    char err[512];
    if (kvb_session_finish(&lv->s, err, sizeof err)) fprintf(stderr, "\n  finish (%s): %s\n", q->method, err);
    CU_ASSERT(lv->s.finish == KVB_FINISH_LENGTH);
    q->n_gen = lv->s.n_gen;
    memcpy(q->gen, lv->s.gen, (size_t)q->n_gen * sizeof *q->gen);
    const size_t lb = (size_t)lv->c->model->cfg.n_vocab * sizeof(float);
    q->logits = malloc(lb);
    CU_ASSERT_FATAL(q->logits != NULL);
    memcpy(q->logits, lv->c->logits, lb);
    kvb_session_free(&lv->s);
    kvb_method_free(lv->m, lv->c);
}

/* Each sequence decoded alone, on its own context and backend. */
static void decode_alone(kvb_model *m, seq *qs, int n) {
    char err[512];
    for (int i = 0; i < n; i++) {
        live lv;
        start(&lv, &qs[i], m, NULL);
        CU_ASSERT_FATAL(kvb_session_decode(&lv.s, err, sizeof err) == 0);
        finish(&lv, &qs[i]);
        kvb_ctx_free(lv.c);
    }
}

/* All sequences through one batch: sequence i is prefilled and joins at step join_step (continuous batching), every
 * step runs the running sequences' tokens as one kvb_session_step_batch, a sequence leaves when it is finished. */
static void decode_batched(kvb_model *m, seq *qs, int n) {
    char err[512];
    live lv[MAXSEQ];
    int state[MAXSEQ] = {0}; /* 0 waiting, 1 running, 2 done */
    CU_ASSERT_FATAL(n <= MAXSEQ);
    kvb_ctx *owner = new_ctx(m, NULL); /* owns the backend the others share; holds no sequence */
    kvb_batch *b = kvb_batch_create(m, owner->be, n, err, sizeof err);
    CU_ASSERT_FATAL(b != NULL);
    int done = 0;
    for (int step = 0; done < n; step++) {
        kvb_session *run[MAXSEQ];
        int idx[MAXSEQ], k = 0;
        for (int i = 0; i < n; i++) {
            if (state[i] == 0 && qs[i].join_step <= step) {
                start(&lv[i], &qs[i], m, owner->be);
                state[i] = 1;
            }
            if (state[i] == 1) run[k] = &lv[i].s, idx[k++] = i;
        }
        int ret[MAXSEQ];
        const char *piece[MAXSEQ];
        size_t len[MAXSEQ];
        if (k && kvb_session_step_batch(run, k, b, ret, piece, len, err, sizeof err)) fprintf(stderr, "\n  step: %s\n", err);
        for (int j = 0; j < k; j++) {
            int i = idx[j];
            if (lv[i].s.finish) {
                finish(&lv[i], &qs[i]);
                kvb_ctx_free(lv[i].c);
                state[i] = 2;
                done++;
            }
        }
        CU_ASSERT_FATAL(step < 1000);
    }
    kvb_batch_free(b);
    kvb_ctx_free(owner);
}

/* The batched results equal the lone ones: every token, and the last logits bit for bit. */
static void check_equal(const seq *alone, const seq *batched, int n) {
    const int nv = util_tiny ? util_tiny->cfg.n_vocab : 0;
    for (int i = 0; i < n; i++) {
        CU_ASSERT(alone[i].n_gen == alone[i].max_new);
        CU_ASSERT(batched[i].n_gen == alone[i].n_gen);
        int first_diff = -1;
        for (int t = 0; t < alone[i].n_gen && t < batched[i].n_gen && first_diff < 0; t++)
            if (alone[i].gen[t] != batched[i].gen[t]) first_diff = t;
        if (first_diff >= 0)
            fprintf(stderr, "\n  sequence %d (%s): token %d differs (%d alone, %d batched)", i,
                    alone[i].method ? alone[i].method : "full", first_diff, alone[i].gen[first_diff],
                    batched[i].gen[first_diff]);
        CU_ASSERT(first_diff < 0);
        if (nv) CU_ASSERT(memcmp(alone[i].logits, batched[i].logits, (size_t)nv * sizeof(float)) == 0);
    }
}

static void free_seqs(seq *qs, int n) {
    for (int i = 0; i < n; i++) {
        free(qs[i].ids);
        free(qs[i].logits);
        qs[i].ids = NULL, qs[i].logits = NULL;
    }
}

/* n prompts of seeded random ids, 30 + 17 i tokens (all different), into a and a copy into b */
static void make_prompts(seq *a, seq *b, int n, int base_len) {
    for (int i = 0; i < n; i++) {
        a[i].n = base_len + 17 * (i % 12) + i;
        a[i].ids = malloc((size_t)a[i].n * sizeof(int32_t));
        CU_ASSERT_FATAL(a[i].ids != NULL);
        for (int64_t t = 0; t < a[i].n; t++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            a[i].ids[t] = (int32_t)((rng >> 33) % V);
        }
        b[i] = a[i];
        b[i].ids = malloc((size_t)a[i].n * sizeof(int32_t));
        CU_ASSERT_FATAL(b[i].ids != NULL);
        memcpy(b[i].ids, a[i].ids, (size_t)a[i].n * sizeof(int32_t));
    }
}

static void run_case(seq *a, seq *b, int n) {
    decode_alone(util_tiny, a, n);
    decode_batched(util_tiny, b, n);
    check_equal(a, b, n);
    free_seqs(a, n);
    free_seqs(b, n);
}

static void test_eight_prompts_full_attention_equal_alone(void) {
    seq a[8] = {0}, b[8] = {0};
    make_prompts(a, b, 8, 30);
    for (int i = 0; i < 8; i++) a[i].max_new = b[i].max_new = 24;
    run_case(a, b, 8);
}

static void test_eight_prompts_each_with_its_method_equal_alone(void) {
    static const char *method[8] = {"full", "snapkv", "streamingllm", "h2o", "quest", "tova", "pyramidkv", "kivi"};
    static const char *budget[8] = {NULL, "50%", "30%", "40%", "25%", "50%", "40%", "2"};
    seq a[8] = {0}, b[8] = {0};
    make_prompts(a, b, 8, 120);
    for (int i = 0; i < 8; i++) {
        a[i].method = b[i].method = method[i];
        a[i].budget = b[i].budget = budget[i];
        a[i].max_new = b[i].max_new = 40;
    }
    run_case(a, b, 8);
}

static void test_sequences_join_and_leave_the_running_batch(void) {
    static const char *method[8] = {"snapkv", "full", "h2o", "streamingllm", "full", "tova", "snapkv", "quest"};
    static const char *budget[8] = {"30%", NULL, "50%", "25%", NULL, "30%", "60%", "50%"};
    seq a[8] = {0}, b[8] = {0};
    make_prompts(a, b, 8, 90);
    for (int i = 0; i < 8; i++) {
        a[i].method = b[i].method = method[i];
        a[i].budget = b[i].budget = budget[i];
        a[i].max_new = b[i].max_new = 5 + 7 * ((i * 5) % 8); /* leave at different steps */
        a[i].join_step = b[i].join_step = (i * 3) % 11;      /* join at different steps */
    }
    run_case(a, b, 8);
}

static void test_forty_sequences_past_the_gemm_threshold(void) {
    seq a[40] = {0}, b[40] = {0};
    make_prompts(a, b, 40, 8);
    for (int i = 0; i < 40; i++) a[i].max_new = b[i].max_new = 6;
    run_case(a, b, 40);
}

static void test_refused_step_changes_no_context(void) {
    char err[256];
    kvb_ctx *c0 = new_ctx(util_tiny, NULL), *c1 = new_ctx(util_tiny, c0->be), *lone = new_ctx(util_tiny, NULL);
    int32_t p[3] = {1, 2, 3};
    CU_ASSERT_FATAL(kvb_forward(c0, p, 3, err, sizeof err) == 0 && kvb_forward(c1, p, 2, err, sizeof err) == 0);
    kvb_batch *b = kvb_batch_create(util_tiny, c0->be, 2, err, sizeof err);
    CU_ASSERT_FATAL(b != NULL);
    kvb_ctx *same[2] = {c0, c0}, *other[2] = {c0, lone}, *pair[2] = {c0, c1}, *three[3] = {c0, c1, c0};
    int32_t ids[3] = {4, 5, 6}, bad[2] = {4, V};
    CU_ASSERT(kvb_batch_decode(b, same, ids, 2, err, sizeof err) == -1 && strstr(err, "same context"));
    CU_ASSERT(kvb_batch_decode(b, other, ids, 2, err, sizeof err) == -1 && strstr(err, "another backend"));
    CU_ASSERT(kvb_batch_decode(b, pair, bad, 2, err, sizeof err) == -1 && strstr(err, "sequence 1") && strstr(err, "out of range"));
    CU_ASSERT(kvb_batch_decode(b, three, ids, 3, err, sizeof err) == -1 && strstr(err, "1 to 2"));
    CU_ASSERT(kvb_batch_decode(b, pair, ids, 0, err, sizeof err) == -1);
    CU_ASSERT(c0->n_past == 3 && c1->n_past == 2 && kvc_n(c0->kv, 0, 0) == 3 && kvc_n(c1->kv, 0, 0) == 2);
    c1->params.n_ctx = 2; /* full */
    CU_ASSERT(kvb_batch_decode(b, pair, ids, 2, err, sizeof err) == -1 && strstr(err, "context overflow"));
    CU_ASSERT(c0->n_past == 3 && c1->n_past == 2 && kvc_n(c0->kv, 0, 0) == 3);
    c1->params.n_ctx = CTX;
    CU_ASSERT(kvb_batch_decode(b, pair, ids, 2, err, sizeof err) == 0 && c0->n_past == 4 && c1->n_past == 3);
    CU_ASSERT(kvb_batch_create(util_tiny, c0->be, 0, err, sizeof err) == NULL);
    kvb_batch_free(b);
    kvb_ctx_free(c1);
    kvb_ctx_free(c0);
    kvb_ctx_free(lone);
}

/* The default model (SmolLM2, Q4_1: the integer matmul's tiled path), 8 chat prompts, greedy, full attention. */
static void test_default_model_eight_prompts_equal_alone(void) {
    char path[1024], err[512];
    if (!util_default_model(path, sizeof path)) {
        printf("(default model absent: skipped) ");
        return;
    }
    kvb_model *m = kvb_model_load(path, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    static const char *text[8] = {
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three prime numbers greater than 100.",
        "Explain what a KV cache is in one sentence.",
        "Translate 'good morning' into Spanish and German.",
        "Why is the sky blue? Answer briefly.",
        "Name a famous painting by Vermeer and describe it.",
        "Give me a short recipe for pancakes, step by step, with quantities.",
    };
    seq a[8] = {0}, b[8] = {0};
    for (int i = 0; i < 8; i++) {
        int n = 0;
        CU_ASSERT_FATAL(tok_encode(m->tok, text[i], strlen(text[i]), 1, 0, &a[i].ids, &n, err, sizeof err) == 0);
        a[i].n = n;
        a[i].max_new = 16 + 2 * i;
        a[i].join_step = i / 2;
        b[i] = a[i];
        b[i].ids = malloc((size_t)n * sizeof(int32_t));
        CU_ASSERT_FATAL(b[i].ids != NULL);
        memcpy(b[i].ids, a[i].ids, (size_t)n * sizeof(int32_t));
    }
    decode_alone(m, a, 8);
    decode_batched(m, b, 8);
    for (int i = 0; i < 8; i++) {
        CU_ASSERT(a[i].n_gen == a[i].max_new && b[i].n_gen == a[i].n_gen);
        CU_ASSERT(memcmp(a[i].gen, b[i].gen, (size_t)a[i].n_gen * sizeof(int32_t)) == 0);
        CU_ASSERT(memcmp(a[i].logits, b[i].logits, (size_t)m->cfg.n_vocab * sizeof(float)) == 0);
    }
    free_seqs(a, 8);
    free_seqs(b, 8);
    kvb_model_free(m);
}

static int setup(void) {
    const util_tiny_shape shape = {"batch", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("batch", setup, teardown);
    CU_add_test(s, "8 prompts batched decode as each alone (full attention; tokens and logits)",
                test_eight_prompts_full_attention_equal_alone);
    CU_add_test(s, "8 prompts, each its own method and budget, batched decode as alone",
                test_eight_prompts_each_with_its_method_equal_alone);
    CU_add_test(s, "sequences joining and leaving the running batch decode as alone",
                test_sequences_join_and_leave_the_running_batch);
    CU_add_test(s, "40 sequences (past the 32-row GEMM threshold) decode as alone", test_forty_sequences_past_the_gemm_threshold);
    CU_add_test(s, "a refused step (same context twice, other backend, bad id, full context) changes nothing",
                test_refused_step_changes_no_context);
    CU_pSuite d = CU_add_suite("batch on the default model", NULL, NULL);
    CU_add_test(d, "8 chat prompts on the default model batched decode as alone", test_default_model_eight_prompts_equal_alone);
    return util_run_suites();
}
