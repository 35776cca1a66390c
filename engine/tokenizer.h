/* tokenizer.h — tokenizers from GGUF metadata, matching llama.cpp's llama_tokenize.
 *
 * Byte-level BPE (tokenizer.ggml.model "gpt2") with the pre-tokenizer regexes of
 * tokenizer.ggml.pre (smollm, llama-bpe, qwen2, gpt2) run through PCRE2, and
 * SentencePiece ("llama") with score-ordered merges and byte fallback. Special
 * (control) tokens in the text are split out first when parse_special is on. */
#ifndef KVB_TOKENIZER_H
#define KVB_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"

typedef struct kvb_tokenizer kvb_tokenizer;

/* Build the tokenizer from a model's metadata. NULL + err on failure (unknown model or pre-tokenizer, bad arrays). */
kvb_tokenizer *tok_load(const gguf_file *f, char *err, size_t err_len);
void tok_free(kvb_tokenizer *t);
/* Text -> ids (malloc'd into *ids_out). add_special adds BOS (and EOS) as the vocabulary asks; parse_special
 * turns control-token texts like <|im_start|> into their ids. Invalid UTF-8 is an error naming the byte. */
int tok_encode(const kvb_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
               int32_t **ids_out, int *n_out, char *err, size_t err_len);
/* Bytes of one token as text (control tokens give "" unless special); returns the length, or -1 if cap is too small
 * or the id is out of range. Not NUL-terminated. */
int tok_piece(const kvb_tokenizer *t, int32_t id, int special, char *buf, size_t cap);
/* Concatenated pieces of ids (NUL-terminated, malloc'd). 0 = ok. */
int tok_decode(const kvb_tokenizer *t, const int32_t *ids, int n, char **out);
int tok_n_vocab(const kvb_tokenizer *t);
int32_t tok_bos(const kvb_tokenizer *t);
int32_t tok_eos(const kvb_tokenizer *t);
/* 1 when generation should stop at this token (eos, eot, eom, <|im_end|>, <|eot_id|>, ...). */
int tok_is_eog(const kvb_tokenizer *t, int32_t id);
/* 1 when the vocabulary asks for BOS at the start. */
int tok_add_bos(const kvb_tokenizer *t);
/* The vocabulary entry text of an id (NULL if out of range); not NUL-terminated: length in *len. */
const char *tok_token_text(const kvb_tokenizer *t, int32_t id, size_t *len);
/* Id of an exact vocabulary string, or -1. */
int32_t tok_find(const kvb_tokenizer *t, const char *text, size_t len);

/* Streaming detokenizer: holds back an incomplete UTF-8 sequence split across tokens. */
typedef struct {
    char pending[8];
    int n_pending;
} tok_stream;
void tok_stream_init(tok_stream *s);
/* Append token id; writes the complete characters now available to out (returns bytes written, -1 if cap too small). */
int tok_stream_push(tok_stream *s, const kvb_tokenizer *t, int32_t id, char *out, size_t cap);
/* Emit whatever is pending (an incomplete sequence is emitted as is). */
int tok_stream_flush(tok_stream *s, char *out, size_t cap);

/* Validate UTF-8; returns -1 if valid, else the offset of the first bad byte. */
int64_t tok_utf8_invalid_at(const char *s, size_t len);

#endif
