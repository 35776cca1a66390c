/* test_prompt.c — prompt building (benchmarks/prompt.h) on a tiny model whose vocabulary has one token per byte
 * (tests/util_gguf_writer.h GW_BYTE_VOCAB), so every expected id list is written here by hand: the chat markers
 * are ids 0-2 and any other byte b is 3 + b. Pinned down: LongBench pred.py's middle truncation (first and last
 * max_length/2 tokens), the chat template around a single prompt (the sample's system message or the model's
 * default one, the assistant prefill), fixed-size chunk rounds of a single prompt, a dialogue's real rounds with
 * the latest history rounds dropped when over budget, and the one-line errors. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "benchmarks/prompt.h"

static kvb_model *model;
static char model_path[64] = "/tmp/kvb_prompt_XXXXXX";
static char err[512];

/* The tiny model's template opens a literal default system turn, as SmolLM2's does. */
#define DEFAULT_SYSTEM "You are tiny."
#define TEMPLATE                                                                                                        \
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n" DEFAULT_SYSTEM "<|im_end|>\n{% endif %}"           \
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"

/* Ids of text under the byte vocabulary, computed here: chat markers are single tokens, every other byte b is 3 + b.
 * Returns the count (at most cap). */
static int ref_ids(const char *text, int32_t *out, int cap) {
    static const char *const marks[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    int n = 0;
    for (const char *p = text; *p && n < cap;) {
        int id = -1;
        for (int k = 0; k < 3 && id < 0; k++)
            if (!strncmp(p, marks[k], strlen(marks[k]))) id = k, p += strlen(marks[k]);
        out[n++] = id >= 0 ? id : 3 + (unsigned char)*p++;
    }
    return n;
}

/* 1 when p's ids are exactly the reference ids of text (prints both on a mismatch). */
static int ids_are(const kvb_prompt *p, const char *text) {
    int32_t want[4096];
    int n = ref_ids(text, want, 4096);
    int same = p->n == n && !memcmp(p->ids, want, (size_t)n * sizeof *want);
    if (!same) {
        char *got = NULL;
        tok_decode(model->tok, p->ids, (int)p->n, &got);
        fprintf(stderr, "\n  want %d ids of \"%s\"\n  got %lld ids of \"%s\" (markers decode to nothing)\n", n, text,
                (long long)p->n, got ? got : "?");
        free(got);
    }
    return same;
}

static void single(kvb_sample *s, const char *prompt, int use_chat) {
    kvb_sample_init(s);
    s->id = strdup("s1");
    s->prompt = strdup(prompt);
    s->use_chat = use_chat;
}

static const char ALPHABET[] = "abcdefghijklmnopqrstuvwxyz";

/* pred.py: a prompt longer than max_length keeps its first and last int(max_length/2) tokens, decoded and
 * concatenated. A raw prompt (use_chat 0) keeps 4 tokens of the budget free, so max_length = max_tokens - 4. */
static void test_raw_prompt_over_budget_keeps_first_and_last_halves_as_pred_py(void) {
    kvb_sample s;
    single(&s, ALPHABET, 0);
    kvb_prompt p;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 100, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, ALPHABET) && !p.truncated);
    kvb_prompt_free(&p);
    /* max_length 10: "abcde" + "vwxyz" */
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 14, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "abcdevwxyz") && p.truncated == 1);
    CU_ASSERT(p.n_rounds == 1 && p.round_end[0] == 10 && p.real_rounds == 0);
    kvb_prompt_free(&p);
    /* odd max_length 11: int(11 / 2) = 5 from each end, as pred.py (one token of the budget unused) */
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 15, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "abcdevwxyz") && p.truncated == 1);
    kvb_prompt_free(&p);
    /* exactly max_length tokens: nothing is cut */
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 30, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, ALPHABET) && !p.truncated);
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* A cut inside a character: each half decodes as pred.py's tokenizer.decode does (bytes.decode("utf-8", "replace")),
 * the broken character one U+FFFD, so the kept text is valid UTF-8 the tokenizer takes (raw halves were refused) */
static void test_middle_cut_inside_a_character_gives_replacement_characters(void) {
    kvb_sample s;
    single(&s, "\xce\xb1\xce\xb2\xce\xb3\xce\xb4\xce\xb5\xce\xb6", 0); /* alpha..zeta, 12 bytes = 12 tokens */
    kvb_prompt p;
    /* max_length 6: the first 3 bytes (alpha, then beta's lead byte) and the last 3 (epsilon's tail, zeta) */
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 10, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "\xce\xb1\xef\xbf\xbd\xef\xbf\xbd\xce\xb6") && p.truncated == 1);
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* With the chat template: the sample's system message, the user turn, the open assistant turn and the prefill,
 * each marker one token; without a system message the model's default one is inserted. */
static void test_chat_prompt_wraps_system_user_and_prefill(void) {
    kvb_sample s;
    single(&s, "What is 2+2?", 1);
    s.system = strdup("Be brief.");
    s.prefill = strdup("The answer is");
    kvb_prompt p;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 400, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                          "<|im_start|>assistant\nThe answer is"));
    CU_ASSERT(!p.truncated && p.n_rounds == 1 && p.round_end[0] == p.n);
    kvb_prompt_free(&p);
    free(s.system), s.system = NULL;
    free(s.prefill), s.prefill = NULL;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 400, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "<|im_start|>system\n" DEFAULT_SYSTEM "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                          "<|im_start|>assistant\n"));
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* A chat prompt is cut before it is wrapped (pred.py truncates the bare prompt, then applies the template), and
 * the wrapped result fits the budget: 64 tokens are kept for the template, plus half the characters of the
 * system message and of the prefill, so max_tokens 100 with "SYS" and "PRE" leaves max_length 34. */
static void test_chat_prompt_is_truncated_before_wrapping(void) {
    char text[80];
    for (int i = 0; i < 78; i++) text[i] = ALPHABET[i % 26];
    text[78] = 0;
    kvb_sample s;
    single(&s, text, 1);
    s.system = strdup("SYS");
    s.prefill = strdup("PRE");
    kvb_prompt p;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 100, 0, &p, err, sizeof err) == 0);
    char want[256];
    snprintf(want, sizeof want, "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\n%.17s%s<|im_end|>\n<|im_start|>assistant\nPRE",
             text, text + 78 - 17);
    CU_ASSERT(ids_are(&p, want) && p.truncated == 1 && p.n <= 100);
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* A budget that leaves no room for the prompt beside the template (64 tokens with the chat template, 4 without)
 * is an error, not a prompt cut to nothing. */
static void test_budget_below_the_template_is_an_error_not_an_empty_prompt(void) {
    kvb_sample s;
    single(&s, ALPHABET, 1);
    kvb_prompt p;
    CU_ASSERT(kvb_prompt_build(model, &s, 40, 0, &p, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "no room for the prompt") && !strchr(err, '\n'));
    s.use_chat = 0;
    CU_ASSERT(kvb_prompt_build(model, &s, 5, 0, &p, err, sizeof err) == -1); /* max_length 1: half of it is nothing */
    CU_ASSERT(kvb_prompt_build(model, &s, 6, 0, &p, err, sizeof err) == 0);  /* max_length 2: "a" + "z" */
    CU_ASSERT(ids_are(&p, "az"));
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* A single prompt in rounds of round_chunk tokens from the start; the last, possibly shorter, chunk is the
 * question round, and a prompt that divides evenly still ends in a whole chunk as its question. */
static void test_single_prompt_rounds_are_chunks_with_the_last_as_question(void) {
    static const struct { const char *text; int chunk, n_rounds; int64_t ends[4]; } cases[] = {
        {"abcdefghij", 4, 3, {4, 8, 10}},   /* 10 = 4 + 4 + 2 */
        {"abcdefghijkl", 4, 3, {4, 8, 12}}, /* 12 = 4 + 4 + 4 */
        {"abc", 4, 1, {3}},                 /* shorter than one chunk: the question alone */
        {"abcdefghij", 0, 1, {10}},         /* no chunking: one round */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvb_sample s;
        single(&s, cases[i].text, 0);
        kvb_prompt p;
        CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 100, cases[i].chunk, &p, err, sizeof err) == 0);
        CU_ASSERT(ids_are(&p, cases[i].text));
        int same = p.n_rounds == cases[i].n_rounds && p.real_rounds == 0;
        for (int r = 0; same && r < p.n_rounds; r++) same = p.round_end[r] == cases[i].ends[r];
        CU_ASSERT(same);
        if (!same) fprintf(stderr, "\n  case %zu: %d rounds, last ends at %lld\n", i, p.n_rounds, (long long)p.round_end[p.n_rounds - 1]);
        kvb_prompt_free(&p);
        kvb_sample_free(&s);
    }
}

static void dialogue(kvb_sample *s, int n_rounds) {
    kvb_sample_init(s);
    s->id = strdup("d1");
    for (int r = 0; r < n_rounds; r++) {
        char u[16], a[16];
        snprintf(u, sizeof u, "u%d?", r + 1);
        snprintf(a, sizeof a, "a%d.", r + 1);
        CU_ASSERT_FATAL(kvb_sample_add_message(s, "user", u, NULL) == 0 && kvb_sample_add_message(s, "assistant", a, NULL) == 0);
    }
    s->question = strdup("q?");
}

#define SYS_TURN "<|im_start|>system\n" DEFAULT_SYSTEM "<|im_end|>\n"
#define ROUND(r) "<|im_start|>user\nu" #r "?<|im_end|>\n<|im_start|>assistant\na" #r ".<|im_end|>\n"
#define QUESTION "<|im_start|>user\nq?<|im_end|>\n<|im_start|>assistant\n"

/* Each (user, assistant) round of a dialogue is its own segment of the rendered conversation: round 0 carries
 * the system turn (23 tokens) and its 2 x 3 characters plus 21 marker tokens (44 + 6 = 50), every later round
 * 27, the question round 2 + 19 = 21 tokens. */
static void test_dialogue_rounds_are_the_rendered_rounds(void) {
    kvb_sample s;
    dialogue(&s, 3);
    kvb_prompt p;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 1000, 512, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, SYS_TURN ROUND(1) ROUND(2) ROUND(3) QUESTION));
    CU_ASSERT(p.real_rounds == 1 && !p.truncated);
    CU_ASSERT_FATAL(p.n_rounds == 4);
    CU_ASSERT(p.round_end[0] == 50 && p.round_end[1] == 77 && p.round_end[2] == 104 && p.round_end[3] == 125 && p.n == 125);
    kvb_prompt_free(&p);
    /* the sample's system message replaces the default; the prefill ends the question round */
    s.system = strdup("S");
    s.prefill = strdup("A:");
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 1000, 512, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "<|im_start|>system\nS<|im_end|>\n" ROUND(1) ROUND(2) ROUND(3) QUESTION "A:"));
    CU_ASSERT(p.n_rounds == 4 && p.round_end[3] == p.n && p.round_end[3] - p.round_end[2] == 23);
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* Over budget, a dialogue drops its latest history rounds and keeps the head (as LongMemEval's reader keeps the
 * first tokens); the question round always stays. */
static void test_dialogue_over_budget_drops_the_latest_history_rounds(void) {
    kvb_sample s;
    dialogue(&s, 3);
    kvb_prompt p;
    /* 125 tokens in all; 103 keep rounds 1 and 2 (77 + 21 = 98), 97 only round 1 (50 + 21 = 71) */
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 103, 512, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, SYS_TURN ROUND(1) ROUND(2) QUESTION) && p.truncated == 1 && p.n_rounds == 3);
    kvb_prompt_free(&p);
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 97, 512, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, SYS_TURN ROUND(1) QUESTION) && p.truncated == 1 && p.n_rounds == 2 && p.round_end[0] == 50);
    kvb_prompt_free(&p);
    /* the system turn and the question alone (23 + 21 = 44 tokens) */
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 44, 512, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, SYS_TURN QUESTION) && p.n_rounds == 1 && p.truncated == 1);
    kvb_prompt_free(&p);
    /* not even that: a one-line error naming the sample */
    CU_ASSERT(kvb_prompt_build(model, &s, 43, 512, &p, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "d1") && strstr(err, "question alone") && !strchr(err, '\n'));
    CU_ASSERT(p.ids == NULL && p.round_end == NULL);
    kvb_sample_free(&s);
}

/* A leading "system" turn of the dialogue is its system message. */
static void test_dialogue_leading_system_turn_is_the_system_message(void) {
    kvb_sample s;
    kvb_sample_init(&s);
    s.id = strdup("d2");
    CU_ASSERT_FATAL(kvb_sample_add_message(&s, "system", "Sys.", NULL) == 0);
    CU_ASSERT_FATAL(kvb_sample_add_message(&s, "user", "u1?", NULL) == 0 && kvb_sample_add_message(&s, "assistant", "a1.", NULL) == 0);
    s.question = strdup("q?");
    kvb_prompt p;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 1000, 512, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "<|im_start|>system\nSys.<|im_end|>\n" ROUND(1) QUESTION));
    CU_ASSERT(p.n_rounds == 2 && p.round_end[0] == 1 + 7 + 4 + 2 + 27);
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* LongMemEval samples carry both the official single prompt and the sessions' rounds: the prompt is what is
 * built. A sample with neither is a one-line error. */
static void test_prompt_wins_over_turns_and_an_empty_sample_is_an_error(void) {
    kvb_sample s;
    dialogue(&s, 2);
    s.prompt = strdup("official prompt");
    kvb_prompt p;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 1000, 4, &p, err, sizeof err) == 0);
    CU_ASSERT(ids_are(&p, "official prompt") && p.real_rounds == 0 && p.n_rounds == 4);
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
    kvb_sample_init(&s);
    s.id = strdup("e1");
    CU_ASSERT(kvb_prompt_build(model, &s, 1000, 4, &p, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "e1") && strstr(err, "neither a prompt nor a dialogue") && !strchr(err, '\n'));
    kvb_sample_free(&s);
}

static int setup(void) {
    int fd = mkstemp(model_path);
    if (fd < 0) return -1;
    close(fd);
    gw_random r = {7, 0.5f, NULL};
    gw_tiny t = {"llama", 2, 32, 4, 2, 48, GW_BYTE_VOCAB, 512, 1, TEMPLATE, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model_path);
    free(r.buf);
    if (rc) return -1;
    model = kvb_model_load(model_path, err, sizeof err);
    if (!model) fprintf(stderr, "tiny model: %s\n", err);
    return model ? 0 : -1;
}

static int teardown(void) {
    kvb_model_free(model);
    unlink(model_path);
    return 0;
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("prompt", setup, teardown);
    CU_add_test(s, "raw prompt over budget keeps first and last halves as pred.py",
                test_raw_prompt_over_budget_keeps_first_and_last_halves_as_pred_py);
    CU_add_test(s, "a middle cut inside a character decodes as pred.py (U+FFFD)",
                test_middle_cut_inside_a_character_gives_replacement_characters);
    CU_add_test(s, "chat prompt wraps system, user and prefill", test_chat_prompt_wraps_system_user_and_prefill);
    CU_add_test(s, "chat prompt is truncated before wrapping", test_chat_prompt_is_truncated_before_wrapping);
    CU_add_test(s, "budget below the template is an error, not an empty prompt",
                test_budget_below_the_template_is_an_error_not_an_empty_prompt);
    CU_add_test(s, "single prompt rounds are chunks, the last the question",
                test_single_prompt_rounds_are_chunks_with_the_last_as_question);
    CU_add_test(s, "dialogue rounds are the rendered rounds", test_dialogue_rounds_are_the_rendered_rounds);
    CU_add_test(s, "dialogue over budget drops the latest history rounds", test_dialogue_over_budget_drops_the_latest_history_rounds);
    CU_add_test(s, "dialogue's leading system turn is the system message", test_dialogue_leading_system_turn_is_the_system_message);
    CU_add_test(s, "prompt wins over turns; an empty sample is an error", test_prompt_wins_over_turns_and_an_empty_sample_is_an_error);
    return util_run_suites();
}
