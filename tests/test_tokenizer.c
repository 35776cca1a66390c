/* test_tokenizer.c — tokenizers against llama.cpp's ids (tests/fixtures/llamacpp_ref.json, written by
 * scripts/llamacpp_ref.py), round trips, special tokens, UTF-8 handling, streaming decode, a hand-built
 * SentencePiece vocabulary, and the chat templates against jinja2's rendering of the model's template. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "engine/chat.h"
#include "engine/tokenizer.h"
#include "util_gguf_writer.h"

static gguf_file *gf;
static kvb_tokenizer *tok;
static char model_path[1024];
static char err[512];

static void test_fixture_prompts_encode_to_llamacpp_ids_and_round_trip(void) {
    UTIL_REQUIRE_FILE(model_path);
    char *json = util_read_file("tests/fixtures/llamacpp_ref.json", NULL);
    CU_ASSERT_FATAL(json != NULL);
    cJSON *ref = cJSON_Parse(json);
    free(json);
    CU_ASSERT_FATAL(ref != NULL);
    const cJSON *rec;
    int n_checked = 0;
    cJSON_ArrayForEach(rec, cJSON_GetObjectItem(ref, "prompts")) {
        char path[512];
        snprintf(path, sizeof path, "tests/fixtures/prompts/%s", cJSON_GetObjectItem(rec, "name")->valuestring);
        size_t len = 0;
        char *text = util_read_file(path, &len);
        CU_ASSERT_FATAL(text != NULL);
        int32_t *ids;
        int n;
        CU_ASSERT_FATAL(tok_encode(tok, text, len, 1, 1, &ids, &n, err, sizeof err) == 0);
        const cJSON *want = cJSON_GetObjectItem(rec, "prompt_ids");
        int same = cJSON_GetArraySize(want) == n;
        for (int i = 0; same && i < n; i++) same = cJSON_GetArrayItem(want, i)->valueint == ids[i];
        CU_ASSERT(same);
        if (!same) printf("\n  %s: ids differ from llama.cpp", path);
        char *back;
        CU_ASSERT_FATAL(tok_decode(tok, ids, n, &back) == 0);
        /* control tokens (chat markers) decode to nothing, so compare only texts without them */
        if (!strstr(text, "<|im_start|>")) CU_ASSERT(strcmp(back, text) == 0);
        free(back);
        free(ids);
        free(text);
        n_checked++;
    }
    CU_ASSERT(n_checked >= 8);
    cJSON_Delete(ref);
}

static int encode(const char *s, int parse_special, int32_t *out, int cap) {
    int32_t *ids;
    int n;
    if (tok_encode(tok, s, strlen(s), 0, parse_special, &ids, &n, err, sizeof err)) return -1;
    for (int i = 0; i < n && i < cap; i++) out[i] = ids[i];
    free(ids);
    return n;
}

static void test_special_tokens_split_only_when_parse_special(void) {
    UTIL_REQUIRE_FILE(model_path);
    int32_t ids[64];
    int n = encode("<|im_start|>user\nhi<|im_end|>", 1, ids, 64);
    CU_ASSERT(n > 2 && ids[0] == 1 && ids[n - 1] == 2); /* ids of <|im_start|>, <|im_end|> in the vocab */
    n = encode("<|im_start|>user", 0, ids, 64);
    CU_ASSERT(n > 2 && ids[0] != 1);
    CU_ASSERT(tok_is_eog(tok, 2) && tok_is_eog(tok, 0) && !tok_is_eog(tok, 1));
}

static void test_digits_are_split_one_by_one_for_smollm(void) {
    UTIL_REQUIRE_FILE(model_path);
    int32_t ids[64];
    int n = encode("12345", 0, ids, 64);
    CU_ASSERT_EQUAL(n, 5);
    char piece[16];
    int l = tok_piece(tok, ids[2], 0, piece, sizeof piece);
    CU_ASSERT(l == 1 && piece[0] == '3');
}

static void test_invalid_utf8_is_rejected_with_the_byte_offset(void) {
    UTIL_REQUIRE_FILE(model_path);
    int32_t *ids;
    int n;
    CU_ASSERT(tok_encode(tok, "ok \xc3\x28 no", 9, 0, 0, &ids, &n, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "invalid UTF-8 at byte 3") != NULL);
    CU_ASSERT(tok_utf8_invalid_at("\xed\xa0\x80", 3) == 0);  /* surrogate */
    CU_ASSERT(tok_utf8_invalid_at("\xc0\xaf", 2) == 0);      /* overlong */
    CU_ASSERT(tok_utf8_invalid_at("\xf4\x90\x80\x80", 4) == 0); /* past U+10FFFF */
    CU_ASSERT(tok_utf8_invalid_at("h\xc3\xa9", 3) == -1);
}

static void test_stream_holds_back_partial_utf8_until_complete(void) {
    UTIL_REQUIRE_FILE(model_path);
    const char *text = "rocket 🚀 done";
    int32_t ids[64];
    int n = encode(text, 0, ids, 64);
    CU_ASSERT_FATAL(n > 0);
    tok_stream s;
    tok_stream_init(&s);
    char out[256] = "";
    size_t len = 0;
    int saw_partial_piece = 0;
    for (int i = 0; i < n; i++) {
        char piece[64];
        int pl = tok_piece(tok, ids[i], 0, piece, sizeof piece);
        if (pl > 0 && tok_utf8_invalid_at(piece, (size_t)pl) >= 0) saw_partial_piece = 1;
        int k = tok_stream_push(&s, tok, ids[i], out + len, sizeof out - len);
        CU_ASSERT_FATAL(k >= 0);
        CU_ASSERT(tok_utf8_invalid_at(out + len, (size_t)k) == -1); /* every emitted chunk is whole characters */
        len += (size_t)k;
    }
    len += (size_t)tok_stream_flush(&s, out + len, sizeof out - len);
    out[len] = 0;
    CU_ASSERT(saw_partial_piece); /* the emoji really is split across byte tokens */
    CU_ASSERT_STRING_EQUAL(out, text);
}

/* A tiny SentencePiece vocabulary whose tokenizations are worked out by hand (*f and *buf: the file behind it,
 * for the caller to close and free). */
static kvb_tokenizer *hand_spm_vocabulary(gguf_file **f, uint8_t **buf) {
    const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab",
                          "\xe2\x96\x81" "ab", "<0x63>", "<0x0A>"};
    float scores[] = {0, 0, 0, -3, -4, -4, -1, -2, -0.5f, 0, 0};
    int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 6};
    gw_writer *w = gw_new();
    gw_kv_str(w, "tokenizer.ggml.model", "llama");
    gw_kv_arr_str(w, "tokenizer.ggml.tokens", toks, 11);
    gw_kv_arr_f32(w, "tokenizer.ggml.scores", scores, 11);
    gw_kv_arr_i32(w, "tokenizer.ggml.token_type", types, 11);
    *f = gw_open(w, buf, err, sizeof err);
    CU_ASSERT_FATAL(*f != NULL);
    kvb_tokenizer *t = tok_load(*f, err, sizeof err);
    CU_ASSERT_FATAL(t != NULL);
    return t;
}

/* The hand-built SentencePiece vocabulary's tokenizations. */
static void test_sentencepiece_merges_by_score_with_byte_fallback(void) {
    uint8_t *buf;
    gguf_file *f;
    kvb_tokenizer *t = hand_spm_vocabulary(&f, &buf);
    int32_t *ids;
    int n;
    /* "ab" -> "▁ab": ▁+a (-1) beats a+b (-2), then ▁a+b = ▁ab; BOS first (SPM default) */
    CU_ASSERT_FATAL(tok_encode(t, "ab", 2, 1, 0, &ids, &n, err, sizeof err) == 0);
    CU_ASSERT(n == 2 && ids[0] == 1 && ids[1] == 8);
    free(ids);
    /* "ba c" -> ▁ b a ▁ c: no merge applies to b/a; "c" falls back to its byte token */
    CU_ASSERT_FATAL(tok_encode(t, "ba c", 4, 0, 0, &ids, &n, err, sizeof err) == 0);
    int want[] = {3, 5, 4, 3, 9};
    CU_ASSERT(n == 5 && memcmp(ids, want, sizeof want) == 0);
    char *back;
    CU_ASSERT(tok_decode(t, ids, n, &back) == 0 && strcmp(back, " ba c") == 0);
    free(back);
    free(ids);
    tok_free(t);
    gguf_close(f);
    free(buf);
}

static void test_unknown_pre_tokenizer_is_a_clear_error(void) {
    const char *toks[] = {"a"};
    gw_writer *w = gw_new();
    gw_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gw_kv_str(w, "tokenizer.ggml.pre", "klingon");
    gw_kv_arr_str(w, "tokenizer.ggml.tokens", toks, 1);
    gw_kv_arr_str(w, "tokenizer.ggml.merges", toks, 0);
    uint8_t *buf;
    gguf_file *f = gw_open(w, &buf, err, sizeof err);
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT(tok_load(f, err, sizeof err) == NULL && strstr(err, "klingon"));
    gguf_close(f);
    free(buf);
}

/* tests/fixtures/prompts/chat_multiturn.txt is jinja2's rendering of the model's own template
 * (scripts/llamacpp_ref.py --make-prompts) for these messages. */
static void test_chatml_render_equals_jinja2_rendering_of_the_model_template(void) {
    UTIL_REQUIRE_FILE(model_path);
    const gguf_kv *kv = gguf_find(gf, "tokenizer.chat_template");
    CU_ASSERT_FATAL(kv != NULL);
    char *tmpl = strndup(kv->val.v.s.ptr, kv->val.v.s.len);
    CU_ASSERT(chat_detect(tmpl, "llama") == CHAT_CHATML);
    char *def = chat_default_system(tmpl);
    CU_ASSERT(def && strcmp(def, "You are a helpful AI assistant named SmolLM, trained by Hugging Face") == 0);
    chat_msg msgs[] = {{"user", "I have three apples and buy five more. How many do I have?"},
                       {"assistant", "You have eight apples."},
                       {"user", "And if I give two of them to my sister, how many are left?"}};
    char *out;
    CU_ASSERT_FATAL(chat_render(CHAT_CHATML, msgs, 3, 1, def, &out, err, sizeof err) == 0);
    char *want = util_read_file("tests/fixtures/prompts/chat_multiturn.txt", NULL);
    CU_ASSERT_FATAL(want != NULL);
    CU_ASSERT_STRING_EQUAL(out, want);
    free(out);
    free(want);
    free(def);
    free(tmpl);
}

/* tests/fixtures/chat/qwen2.5-coder.{jinja,json}: Qwen2.5-Coder's own template and jinja2's renderings of it
 * (scripts/chat_ref.py). Its first system turn is in the tools branch and built from expressions; the default
 * system prompt is the literal of the plain branch, and a conversation without a system turn gets it. */
static void test_qwen_template_default_system_and_renderings_equal_jinja2(void) {
    char *tmpl = util_read_file("tests/fixtures/chat/qwen2.5-coder.jinja", NULL);
    char *js = util_read_file("tests/fixtures/chat/qwen2.5-coder.json", NULL);
    CU_ASSERT_FATAL(tmpl && js);
    CU_ASSERT(chat_detect(tmpl, "qwen2") == CHAT_CHATML);
    char *def = chat_default_system(tmpl);
    CU_ASSERT_FATAL(def != NULL);
    CU_ASSERT_STRING_EQUAL(def, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    cJSON *root = cJSON_Parse(js);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    CU_ASSERT_FATAL(cJSON_GetArraySize(cases) >= 3);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *ms = cJSON_GetObjectItem(c, "messages"), *m;
        chat_msg msgs[8];
        int n = 0;
        cJSON_ArrayForEach(m, ms) {
            if (n == 8) break;
            msgs[n].role = cJSON_GetObjectItem(m, "role")->valuestring;
            msgs[n].content = cJSON_GetObjectItem(m, "content")->valuestring;
            n++;
        }
        char *out = NULL;
        CU_ASSERT_FATAL(chat_render(CHAT_CHATML, msgs, n, 1, def, &out, err, sizeof err) == 0);
        CU_ASSERT_STRING_EQUAL(out, cJSON_GetObjectItem(c, "rendered")->valuestring);
        free(out);
    }
    cJSON_Delete(root);
    free(def);
    free(js);
    free(tmpl);
}

static void test_llama3_and_mistral_templates_render_their_markers(void) {
    chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
    char *out;
    CU_ASSERT_FATAL(chat_render(CHAT_LLAMA3, msgs, 4, 1, NULL, &out, err, sizeof err) == 0);
    CU_ASSERT_STRING_EQUAL(out, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    CU_ASSERT_FATAL(chat_render(CHAT_MISTRAL, msgs, 4, 1, NULL, &out, err, sizeof err) == 0);
    CU_ASSERT_STRING_EQUAL(out, "[INST] Be brief.\n\nHi [/INST] Hello</s>[INST] Bye [/INST]");
    free(out);
    chat_kind k;
    CU_ASSERT(chat_kind_from_name("llama3", &k) == 0 && k == CHAT_LLAMA3);
    CU_ASSERT(chat_kind_from_name("jinja", &k) != 0);
    chat_msg bad[] = {{"tool", "x"}};
    CU_ASSERT(chat_render(CHAT_CHATML, bad, 1, 0, NULL, &out, err, sizeof err) != 0 && strstr(err, "tool"));
}

/* The textbook BPE loop (Sennrich et al. 2016; what tokenizer.c ran before its heap of pairs): merge the adjacent
 * pair of lowest rank, leftmost on ties, until no merge applies; quadratic, so only for short words. For ASCII
 * letters the byte-level symbols are the letters themselves. Returns the token count written to ids. */
typedef struct {
    const char *s;
    size_t n;
    int rank;
} ref_merge;

static int ref_merge_cmp(const void *a, const void *b) {
    const ref_merge *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static int ref_rank(const ref_merge *m, size_t n_m, const char *w, int a0, int al, int b0, int bl) {
    char key[512];
    if (al + bl + 1 > (int)sizeof key) return -1;
    memcpy(key, w + a0, (size_t)al);
    key[al] = ' ';
    memcpy(key + al + 1, w + b0, (size_t)bl);
    ref_merge k = {key, (size_t)(al + 1 + bl), 0};
    const ref_merge *hit = bsearch(&k, m, n_m, sizeof *m, ref_merge_cmp);
    return hit ? hit->rank : -1;
}

static int ref_bpe_letters(const char *w, int n, int32_t *ids) {
    const gguf_value *merges;
    CU_ASSERT_FATAL(gguf_get_arr(gf, "tokenizer.ggml.merges", GGUF_VT_STRING, &merges, err, sizeof err) == 0);
    size_t n_m = (size_t)merges->v.arr.count;
    ref_merge *m = malloc(n_m * sizeof *m);
    for (size_t i = 0; i < n_m; i++) m[i] = (ref_merge){merges->v.arr.strs[i].ptr, merges->v.arr.strs[i].len, (int)i};
    qsort(m, n_m, sizeof *m, ref_merge_cmp);
    int *start = malloc((size_t)n * sizeof *start), *len = malloc((size_t)n * sizeof *len);
    int *rank = malloc((size_t)n * sizeof *rank), k = n;
    for (int i = 0; i < n; i++) start[i] = i, len[i] = 1;
    for (int i = 0; i + 1 < k; i++) rank[i] = ref_rank(m, n_m, w, start[i], len[i], start[i + 1], len[i + 1]);
    for (;;) {
        int best = -1;
        for (int i = 0; i + 1 < k; i++)
            if (rank[i] >= 0 && (best < 0 || rank[i] < rank[best])) best = i;
        if (best < 0) break;
        len[best] += len[best + 1];
        memmove(start + best + 1, start + best + 2, (size_t)(k - best - 2) * sizeof *start);
        memmove(len + best + 1, len + best + 2, (size_t)(k - best - 2) * sizeof *len);
        memmove(rank + best + 1, rank + best + 2, (size_t)(k - best - 2) * sizeof *rank);
        k--;
        if (best > 0) rank[best - 1] = ref_rank(m, n_m, w, start[best - 1], len[best - 1], start[best], len[best]);
        if (best + 1 < k) rank[best] = ref_rank(m, n_m, w, start[best], len[best], start[best + 1], len[best + 1]);
    }
    for (int i = 0; i < k; i++) ids[i] = tok_find(tok, w + start[i], (size_t)len[i]);
    free(start), free(len), free(rank), free(m);
    return k;
}

/* A run of letters without spaces is one pre-tokenized word, merged as a whole: the merge loop (now a heap of
 * candidate pairs over a linked list of symbols, O(n log n)) gives the textbook loop's tokens for random runs,
 * one repeated letter and two alternating ones; a 160 KB run (a minute before the heap, at quadratic cost)
 * encodes and decodes back to itself. */
static void test_long_letter_runs_encode_as_the_textbook_bpe_loop(void) {
    UTIL_REQUIRE_FILE(model_path);
    enum { N = 3000, BIG = 160 * 1024 };
    char *w = malloc(BIG + 1);
    int32_t *want = malloc(N * sizeof *want);
    uint64_t state = 42;
    for (int run = 0; run < 4; run++) {
        for (int i = 0; i < N; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = run == 0 ? 'a' : run == 1 ? "ab"[i % 2] : (char)('a' + (state >> 33) % 26);
        }
        int n_want = ref_bpe_letters(w, N, want);
        int32_t *ids;
        int n;
        CU_ASSERT_FATAL(tok_encode(tok, w, N, 0, 0, &ids, &n, err, sizeof err) == 0);
        int same = n == n_want;
        for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
        CU_ASSERT(same);
        if (!same) printf("\n  run %d: %d tokens, the textbook loop %d\n", run, n, n_want);
        free(ids);
    }
    for (int i = 0; i < BIG; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (char)('a' + (state >> 33) % 26);
    }
    w[BIG] = 0;
    int32_t *ids;
    int n;
    CU_ASSERT_FATAL(tok_encode(tok, w, BIG, 0, 0, &ids, &n, err, sizeof err) == 0);
    CU_ASSERT(n > BIG / 4 && n < BIG);
    char *back;
    CU_ASSERT_FATAL(tok_decode(tok, ids, n, &back) == 0);
    CU_ASSERT(strcmp(back, w) == 0);
    free(back);
    free(ids);
    free(want);
    free(w);
}

/* The hand-built SentencePiece vocabulary of the test above on one long word, "abab...ab" (20000 bytes): "▁a" (-1)
 * merges first, then "▁a"+"b" = "▁ab" (-0.5), then every "ab" (-2) left to right; "abab" is no token. */
static void test_sentencepiece_long_word_merges_as_worked_out_by_hand(void) {
    uint8_t *buf;
    gguf_file *f;
    kvb_tokenizer *t = hand_spm_vocabulary(&f, &buf);
    enum { PAIRS = 10000 };
    char *text = malloc(2 * PAIRS);
    for (int i = 0; i < PAIRS; i++) text[2 * i] = 'a', text[2 * i + 1] = 'b';
    int32_t *ids;
    int n;
    CU_ASSERT_FATAL(tok_encode(t, text, 2 * PAIRS, 0, 0, &ids, &n, err, sizeof err) == 0);
    int bad = n != PAIRS || ids[0] != 8;
    for (int i = 1; i < n; i++) bad += ids[i] != 7;
    CU_ASSERT_EQUAL(bad, 0);
    free(ids);
    free(text);
    tok_free(t);
    gguf_close(f);
    free(buf);
}

int main(void) {
    if (util_default_model(model_path, sizeof model_path)) {
        gf = gguf_open(model_path, err, sizeof err);
        tok = gf ? tok_load(gf, err, sizeof err) : NULL;
        if (!tok) {
            fprintf(stderr, "cannot load the tokenizer of %s: %s\n", model_path, err);
            return 1;
        }
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("tokenizer", NULL, NULL);
    CU_add_test(s, "fixture prompts encode to llama.cpp ids and round trip", test_fixture_prompts_encode_to_llamacpp_ids_and_round_trip);
    CU_add_test(s, "special tokens split only when parse_special", test_special_tokens_split_only_when_parse_special);
    CU_add_test(s, "digits are split one by one for smollm", test_digits_are_split_one_by_one_for_smollm);
    CU_add_test(s, "invalid UTF-8 is rejected with the byte offset", test_invalid_utf8_is_rejected_with_the_byte_offset);
    CU_add_test(s, "stream holds back partial UTF-8 until complete", test_stream_holds_back_partial_utf8_until_complete);
    CU_add_test(s, "SentencePiece merges by score with byte fallback", test_sentencepiece_merges_by_score_with_byte_fallback);
    CU_add_test(s, "unknown pre-tokenizer is a clear error", test_unknown_pre_tokenizer_is_a_clear_error);
    CU_add_test(s, "chatml render equals jinja2 rendering of the model template", test_chatml_render_equals_jinja2_rendering_of_the_model_template);
    CU_add_test(s, "Qwen template: default system and renderings equal jinja2", test_qwen_template_default_system_and_renderings_equal_jinja2);
    CU_add_test(s, "llama3 and mistral templates render their markers", test_llama3_and_mistral_templates_render_their_markers);
    CU_add_test(s, "long letter runs encode as the textbook BPE loop", test_long_letter_runs_encode_as_the_textbook_bpe_loop);
    CU_add_test(s, "SentencePiece long word merges as worked out by hand", test_sentencepiece_long_word_merges_as_worked_out_by_hand);
    int rc = util_run_suites();
    tok_free(tok);
    gguf_close(gf);
    return rc;
}
