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

/* A tiny SentencePiece vocabulary whose tokenizations are worked out by hand. */
static void test_sentencepiece_merges_by_score_with_byte_fallback(void) {
    const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab",
                          "\xe2\x96\x81" "ab", "<0x63>", "<0x0A>"};
    float scores[] = {0, 0, 0, -3, -4, -4, -1, -2, -0.5f, 0, 0};
    int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 6};
    gw_writer *w = gw_new();
    gw_kv_str(w, "tokenizer.ggml.model", "llama");
    gw_kv_arr_str(w, "tokenizer.ggml.tokens", toks, 11);
    gw_kv_arr_f32(w, "tokenizer.ggml.scores", scores, 11);
    gw_kv_arr_i32(w, "tokenizer.ggml.token_type", types, 11);
    uint8_t *buf;
    gguf_file *f = gw_open(w, &buf, err, sizeof err);
    CU_ASSERT_FATAL(f != NULL);
    kvb_tokenizer *t = tok_load(f, err, sizeof err);
    CU_ASSERT_FATAL(t != NULL);
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
    int rc = util_run_suites();
    tok_free(tok);
    gguf_close(gf);
    return rc;
}
