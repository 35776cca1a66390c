/* tokenizer.c — byte-level BPE and SentencePiece from GGUF metadata (see tokenizer.h).
 *
 * Follows llama.cpp's llama-vocab.cpp behaviour: control / user-defined token texts are
 * partitioned out first (longest first); BPE pre-tokenizes with the regex list of the
 * vocabulary's `pre` type (each regex re-splits the pieces of the previous one, text
 * between matches kept as its own piece), maps bytes to GPT-2's printable code points,
 * then merges the lowest-ranked adjacent pair (leftmost on ties) until none applies;
 * SentencePiece merges the highest-scoring pair whose concatenation is a token and falls
 * back to <0xXX> byte tokens. */
#define _GNU_SOURCE /* memmem */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };
enum { MODEL_BPE, MODEL_SPM };
enum { MAX_REGEX = 4 };

/* ---------- string -> int hash map (open addressing) ---------- */
typedef struct {
    const char **key;
    uint32_t *key_len;
    int32_t *val;
    uint64_t cap;
} strmap;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int map_init(strmap *m, uint64_t n) {
    m->cap = 16;
    while (m->cap < n * 2) m->cap *= 2;
    m->key = calloc(m->cap, sizeof *m->key);
    m->key_len = calloc(m->cap, sizeof *m->key_len);
    m->val = calloc(m->cap, sizeof *m->val);
    return m->key && m->key_len && m->val ? 0 : -1;
}

static void map_free(strmap *m) {
    free(m->key);
    free(m->key_len);
    free(m->val);
}

/* insert if absent (first wins, like llama.cpp's token_to_id for duplicates) */
static void map_put(strmap *m, const char *k, size_t n, int32_t v) {
    uint64_t i = fnv(k, n) & (m->cap - 1);
    while (m->key[i]) {
        if (m->key_len[i] == n && !memcmp(m->key[i], k, n)) return;
        i = (i + 1) & (m->cap - 1);
    }
    m->key[i] = k;
    m->key_len[i] = (uint32_t)n;
    m->val[i] = v;
}

static int32_t map_get(const strmap *m, const char *k, size_t n) {
    uint64_t i = fnv(k, n) & (m->cap - 1);
    while (m->key[i]) {
        if (m->key_len[i] == n && !memcmp(m->key[i], k, n)) return m->val[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

struct kvb_tokenizer {
    int model;
    int n_vocab;
    const gguf_str *tokens; /* into the gguf mapping */
    int32_t *types;
    float *scores;
    strmap tok_map, merge_map; /* merge key: "left right" */
    pcre2_code *re[MAX_REGEX];
    int n_re;
    int ignore_merges;
    int32_t bos, eos, eot, eom, unk;
    int add_bos, add_eos, add_space_prefix;
    int32_t *special; /* control/user/unknown tokens, longest text first */
    int n_special;
    uint8_t *eog; /* [n_vocab] */
    uint16_t byte_to_cp[256];
    int16_t cp_to_byte[324]; /* code points 0..323 -> byte, -1 if none */
    int32_t byte_tok[256];   /* SPM: <0xXX> ids */
};

/* ---------- UTF-8 ---------- */
static int utf8_len(uint8_t c) { return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0; }

int64_t tok_utf8_invalid_at(const char *s, size_t len) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        int n = utf8_len(p[i]);
        if (n == 0 || i + (size_t)n > len) return (int64_t)i;
        uint32_t cp = n == 1 ? p[i] : (uint32_t)(p[i] & (0x7F >> n));
        for (int k = 1; k < n; k++) {
            if ((p[i + (size_t)k] & 0xC0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (p[i + (size_t)k] & 0x3F);
        }
        if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return (int64_t)i;
        i += (size_t)n;
    }
    return -1;
}

static int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static void init_byte_map(kvb_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 324; i++) t->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        t->byte_to_cp[b] = (uint16_t)(printable ? b : 256 + n++);
        t->cp_to_byte[t->byte_to_cp[b]] = (int16_t)b;
    }
}

/* ---------- pre-tokenizer regexes (llama.cpp's lists per `pre`) ---------- */
static const char *RE_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char *RE_LLAMA3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *RE_QWEN2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int add_regex(kvb_tokenizer *t, const char *pat, char *err, size_t err_len) {
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, err_len, "tokenizer: regex error at %zu: %s", (size_t)off, (char *)msg);
        return -1;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    t->re[t->n_re++] = re;
    return 0;
}

static int set_pre(kvb_tokenizer *t, gguf_str pre, char *err, size_t err_len) {
    if (gguf_str_eq(pre, "smollm") || gguf_str_eq(pre, "starcoder") || gguf_str_eq(pre, "refact") ||
        gguf_str_eq(pre, "command-r")) {
        return add_regex(t, "\\p{N}", err, err_len) || add_regex(t, RE_GPT2, err, err_len);
    }
    if (gguf_str_eq(pre, "gpt2") || gguf_str_eq(pre, "gpt-2") || gguf_str_eq(pre, "phi-2") || gguf_str_eq(pre, "default"))
        return add_regex(t, RE_GPT2, err, err_len);
    if (gguf_str_eq(pre, "llama-bpe") || gguf_str_eq(pre, "llama3") || gguf_str_eq(pre, "smaug-bpe")) {
        t->ignore_merges = 1;
        return add_regex(t, RE_LLAMA3, err, err_len);
    }
    if (gguf_str_eq(pre, "qwen2") || gguf_str_eq(pre, "deepseek-r1-qwen")) return add_regex(t, RE_QWEN2, err, err_len);
    char shown[72];
    snprintf(err, err_len, "tokenizer: unsupported pre-tokenizer '%s' (supported: smollm, llama-bpe, qwen2, gpt2)",
             gguf_str_safe(pre, shown, sizeof shown));
    return -1;
}

/* ---------- loading ---------- */
static int32_t opt_id(const gguf_file *f, const char *key, int32_t def) {
    uint32_t v;
    char e[8];
    return gguf_find(f, key) && gguf_get_u32(f, key, &v, e, sizeof e) == 0 ? (int32_t)v : def;
}

static int opt_bool(const gguf_file *f, const char *key, int def) {
    int v;
    char e[8];
    return gguf_find(f, key) && gguf_get_bool(f, key, &v, e, sizeof e) == 0 ? v : def;
}

static const kvb_tokenizer *g_sort_tok;
static int by_len_desc(const void *a, const void *b) {
    const kvb_tokenizer *t = g_sort_tok;
    uint64_t la = t->tokens[*(const int32_t *)a].len, lb = t->tokens[*(const int32_t *)b].len;
    if (la != lb) return la < lb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

kvb_tokenizer *tok_load(const gguf_file *f, char *err, size_t err_len) {
    kvb_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return snprintf(err, err_len, "tokenizer: out of memory"), NULL;
    gguf_str model;
    const gguf_value *toks, *types = NULL;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, err, err_len) ||
        gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, err, err_len))
        goto fail;
    if (gguf_str_eq(model, "gpt2")) t->model = MODEL_BPE;
    else if (gguf_str_eq(model, "llama")) t->model = MODEL_SPM;
    else {
        char shown[72];
        snprintf(err, err_len, "tokenizer: unsupported tokenizer model '%s' (supported: gpt2, llama)",
                 gguf_str_safe(model, shown, sizeof shown));
        goto fail;
    }
    if (toks->v.arr.count == 0 || toks->v.arr.count > (1u << 24)) {
        snprintf(err, err_len, "tokenizer: vocabulary of %llu tokens", (unsigned long long)toks->v.arr.count);
        goto fail;
    }
    t->n_vocab = (int)toks->v.arr.count;
    t->tokens = toks->v.arr.strs;
    t->types = malloc((size_t)t->n_vocab * sizeof *t->types);
    t->eog = calloc((size_t)t->n_vocab, 1);
    if (!t->types || !t->eog || map_init(&t->tok_map, (uint64_t)t->n_vocab)) {
        snprintf(err, err_len, "tokenizer: out of memory");
        goto fail;
    }
    if (gguf_find(f, "tokenizer.ggml.token_type")) {
        if (gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, &types, err, err_len)) goto fail;
        if (types->v.arr.count != (uint64_t)t->n_vocab) {
            snprintf(err, err_len, "tokenizer: %llu token types for %d tokens", (unsigned long long)types->v.arr.count,
                     t->n_vocab);
            goto fail;
        }
    }
    for (int i = 0; i < t->n_vocab; i++) {
        t->types[i] = types ? (int32_t)gguf_arr_i64(types, (uint64_t)i) : TOK_NORMAL;
        map_put(&t->tok_map, t->tokens[i].ptr, t->tokens[i].len, i);
    }
    init_byte_map(t);
    t->bos = opt_id(f, "tokenizer.ggml.bos_token_id", t->model == MODEL_SPM ? 1 : -1);
    t->eos = opt_id(f, "tokenizer.ggml.eos_token_id", t->model == MODEL_SPM ? 2 : -1);
    t->eot = opt_id(f, "tokenizer.ggml.eot_token_id", -1);
    t->eom = opt_id(f, "tokenizer.ggml.eom_token_id", -1);
    t->unk = opt_id(f, "tokenizer.ggml.unknown_token_id", t->model == MODEL_SPM ? 0 : -1);
    t->add_bos = opt_bool(f, "tokenizer.ggml.add_bos_token", t->model == MODEL_SPM);
    t->add_eos = opt_bool(f, "tokenizer.ggml.add_eos_token", 0);
    t->add_space_prefix = opt_bool(f, "tokenizer.ggml.add_space_prefix", t->model == MODEL_SPM);
    int32_t ids[] = {t->bos, t->eos, t->eot, t->eom, t->unk};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++)
        if (ids[i] >= t->n_vocab) {
            snprintf(err, err_len, "tokenizer: special token id %d outside the vocabulary (%d)", ids[i], t->n_vocab);
            goto fail;
        }
    static const char *eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                      "<|eom_id|>", "<EOT>", "<|end_of_text|>"};
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    for (size_t i = 0; i < sizeof eog_texts / sizeof *eog_texts; i++) {
        int32_t id = map_get(&t->tok_map, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && t->types[id] == TOK_CONTROL) t->eog[id] = 1;
    }
    /* special tokens for the partition step, longest first */
    t->special = malloc((size_t)t->n_vocab * sizeof *t->special);
    if (!t->special) goto oom;
    for (int i = 0; i < t->n_vocab; i++)
        if ((t->types[i] == TOK_CONTROL || t->types[i] == TOK_USER || t->types[i] == TOK_UNKNOWN) && t->tokens[i].len)
            t->special[t->n_special++] = i;
    g_sort_tok = t;
    qsort(t->special, (size_t)t->n_special, sizeof *t->special, by_len_desc);

    if (t->model == MODEL_BPE) {
        const gguf_value *merges;
        if (gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &merges, err, err_len)) goto fail;
        if (map_init(&t->merge_map, merges->v.arr.count + 1)) goto oom;
        for (uint64_t i = 0; i < merges->v.arr.count; i++)
            map_put(&t->merge_map, merges->v.arr.strs[i].ptr, merges->v.arr.strs[i].len, (int32_t)i);
        gguf_str pre = {"default", 7};
        if (gguf_find(f, "tokenizer.ggml.pre") && gguf_get_str(f, "tokenizer.ggml.pre", &pre, err, err_len)) goto fail;
        if (set_pre(t, pre, err, err_len)) goto fail;
    } else {
        const gguf_value *scores;
        if (gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, &scores, err, err_len)) goto fail;
        if (scores->v.arr.count != (uint64_t)t->n_vocab) {
            snprintf(err, err_len, "tokenizer: %llu scores for %d tokens", (unsigned long long)scores->v.arr.count,
                     t->n_vocab);
            goto fail;
        }
        t->scores = malloc((size_t)t->n_vocab * sizeof *t->scores);
        if (!t->scores) goto oom;
        for (int i = 0; i < t->n_vocab; i++) t->scores[i] = (float)gguf_arr_f64(scores, (uint64_t)i);
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_tok[b] = map_get(&t->tok_map, name, 6);
        }
    }
    return t;
oom:
    snprintf(err, err_len, "tokenizer: out of memory");
fail:
    tok_free(t);
    return NULL;
}

void tok_free(kvb_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    map_free(&t->tok_map);
    map_free(&t->merge_map);
    free(t->types);
    free(t->scores);
    free(t->special);
    free(t->eog);
    free(t);
}

/* ---------- output buffer ---------- */
typedef struct {
    int32_t *ids;
    int n, cap;
} idbuf;

static int push(idbuf *b, int32_t id) {
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 256;
        int32_t *p = realloc(b->ids, (size_t)cap * sizeof *p);
        if (!p) return -1;
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return 0;
}

/* ---------- merging (shared by BPE and SPM) ----------
 * As llama.cpp's llm_tokenizer_bpe and llm_tokenizer_spm: the symbols form a linked list and the candidate pairs
 * a binary heap ordered by (priority, left symbol), so a merge costs O(log n) instead of a scan of the word (a
 * run of letters without spaces is one word: 160 KB of them took a minute). A merge pushes the two pairs it
 * creates; a popped pair whose joined length is no longer its symbols' (one of them merged since) is stale and
 * skipped: symbols only grow, so the lengths match only while both are unchanged. */
typedef struct {
    int start, len; /* byte range in the word */
} sym;

typedef struct {
    int start, len;  /* byte range in the word; len 0 once merged into its left neighbour */
    int prev, next;  /* neighbours in the list, -1 at the ends */
} sym_node;

typedef struct {
    double prio;   /* lower merges first */
    int left;      /* left symbol (index = order in the word: leftmost first on ties) */
    int len;       /* joined byte length when pushed */
} pair_cand;

static int cand_before(const pair_cand *a, const pair_cand *b) {
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

typedef struct {
    pair_cand *c;
    int n, cap;
} pair_heap;

static int heap_push(pair_heap *h, pair_cand c) {
    if (h->n == h->cap) { /* at most 2 x the symbols; usually far fewer, as most pairs have no merge */
        int cap = h->cap * 2;
        pair_cand *p = realloc(h->c, (size_t)cap * sizeof *p);
        if (!p) return -1;
        h->c = p;
        h->cap = cap;
    }
    int i = h->n++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_before(&c, &h->c[p])) break;
        h->c[i] = h->c[p];
        i = p;
    }
    h->c[i] = c;
    return 0;
}

static pair_cand heap_pop(pair_heap *h) {
    pair_cand top = h->c[0], last = h->c[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1;
        if (l >= h->n) break;
        int m = r < h->n && cand_before(&h->c[r], &h->c[l]) ? r : l;
        if (!cand_before(&h->c[m], &last)) break;
        h->c[i] = h->c[m];
        i = m;
    }
    h->c[i] = last; /* when the heap is now empty this writes the unused slot 0 */
    return top;
}

/* Priority of joining a and b: BPE, the merge's rank; SPM, minus the joined token's score; 1e300 when they do
 * not join (NaN scores never join either, as the comparison with 1e300 fails). */
static double pair_prio(const kvb_tokenizer *t, const char *w, const sym_node *a, const sym_node *b, char *scratch) {
    if (t->model == MODEL_BPE) {
        memcpy(scratch, w + a->start, (size_t)a->len);
        scratch[a->len] = ' ';
        memcpy(scratch + a->len + 1, w + b->start, (size_t)b->len);
        int32_t r = map_get(&t->merge_map, scratch, (size_t)(a->len + 1 + b->len));
        return r < 0 ? 1e300 : (double)r;
    }
    int32_t id = map_get(&t->tok_map, w + a->start, (size_t)(a->len + b->len));
    return id < 0 ? 1e300 : -(double)t->scores[id];
}

static int push_pair(const kvb_tokenizer *t, const char *w, const sym_node *s, int left, pair_heap *h, char *scratch) {
    int right = s[left].next;
    if (right < 0) return 0;
    double p = pair_prio(t, w, &s[left], &s[right], scratch);
    return p < 1e300 ? heap_push(h, (pair_cand){p, left, s[left].len + s[right].len}) : 0;
}

/* Merge adjacent symbols (UTF-8 characters) of word w[0..n) by priority until none applies.
 * BPE: lowest merge rank first; SPM: highest score of the joined token first; leftmost on ties. */
static int merge_word(const kvb_tokenizer *t, const char *w, int n, sym **out, int *n_out) {
    int n_sym = 0, rc = 0;
    sym_node *s = malloc((size_t)(n + 1) * sizeof *s);
    pair_heap h = {malloc(64 * sizeof *h.c), 0, 64};
    char *scratch = malloc((size_t)n * 2 + 2);
    sym *res = NULL;
    if (!s || !h.c || !scratch) goto oom;
    for (int i = 0; i < n;) {
        int l = utf8_len((uint8_t)w[i]);
        if (l == 0 || i + l > n) l = 1;
        s[n_sym] = (sym_node){i, l, n_sym - 1, -1};
        if (n_sym > 0) s[n_sym - 1].next = n_sym;
        n_sym++;
        i += l;
    }
    for (int i = 0; i + 1 < n_sym; i++)
        if (push_pair(t, w, s, i, &h, scratch)) goto oom;
    while (h.n > 0) {
        pair_cand c = heap_pop(&h);
        sym_node *a = &s[c.left];
        if (a->len == 0 || a->next < 0 || a->len + s[a->next].len != c.len) continue; /* stale */
        sym_node *b = &s[a->next];
        a->len += b->len;
        a->next = b->next;
        if (b->next >= 0) s[b->next].prev = c.left;
        b->len = 0;
        if ((a->prev >= 0 && push_pair(t, w, s, a->prev, &h, scratch)) || push_pair(t, w, s, c.left, &h, scratch))
            goto oom;
    }
    res = malloc((size_t)(n_sym > 0 ? n_sym : 1) * sizeof *res);
    if (!res) goto oom;
    int k = 0;
    for (int i = n_sym > 0 ? 0 : -1; i >= 0; i = s[i].next) res[k++] = (sym){s[i].start, s[i].len};
    *out = res;
    *n_out = k;
    goto done;
oom:
    rc = -1;
done:
    free(s);
    free(h.c);
    free(scratch);
    return rc;
}

/* one pre-tokenized piece of raw bytes -> BPE ids */
static int bpe_piece(const kvb_tokenizer *t, const char *p, size_t n, idbuf *out) {
    char *w = malloc(n * 2 + 1); /* mapped code points take at most 2 bytes each */
    if (!w) return -1;
    int wl = 0;
    for (size_t i = 0; i < n; i++) wl += utf8_put(t->byte_to_cp[(uint8_t)p[i]], w + wl);
    if (t->ignore_merges) {
        int32_t id = map_get(&t->tok_map, w, (size_t)wl);
        if (id >= 0) {
            free(w);
            return push(out, id);
        }
    }
    sym *s;
    int n_sym;
    if (merge_word(t, w, wl, &s, &n_sym)) {
        free(w);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n_sym && !rc; i++) {
        int32_t id = map_get(&t->tok_map, w + s[i].start, (size_t)s[i].len);
        if (id >= 0) {
            rc = push(out, id);
            continue;
        }
        /* not a token: one token per byte of the symbol (each is a single mapped code point) */
        for (int k = 0; k < s[i].len && !rc;) {
            int l = utf8_len((uint8_t)w[s[i].start + k]);
            if (l == 0) l = 1;
            int32_t bid = map_get(&t->tok_map, w + s[i].start + k, (size_t)l);
            if (bid >= 0) rc = push(out, bid);
            k += l;
        }
    }
    free(s);
    free(w);
    return rc;
}

/* regex split of [p, p+n) by regex list starting at index r; calls bpe_piece on the final pieces */
static int bpe_split(const kvb_tokenizer *t, int r, const char *p, size_t n, idbuf *out, pcre2_match_data *md) {
    if (n == 0) return 0;
    if (r >= t->n_re || r >= MAX_REGEX) return bpe_piece(t, p, n, out);
    size_t pos = 0, last = 0;
    while (pos < n) {
        int rc = pcre2_match(t->re[r], (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character */
            pos = ms + (size_t)(utf8_len((uint8_t)p[ms]) ? utf8_len((uint8_t)p[ms]) : 1);
            continue;
        }
        if (ms > last && bpe_split(t, r + 1, p + last, ms - last, out, md)) return -1;
        if (bpe_split(t, r + 1, p + ms, me - ms, out, md)) return -1;
        pos = last = me;
    }
    if (last < n && bpe_split(t, r + 1, p + last, n - last, out, md)) return -1;
    return 0;
}

static int spm_fragment(const kvb_tokenizer *t, const char *p, size_t n, int prefix_space, idbuf *out) {
    /* spaces become U+2581 (3 bytes) */
    char *w = malloc(n * 3 + 4);
    if (!w) return -1;
    int wl = 0;
    if (prefix_space) memcpy(w, "\xe2\x96\x81", 3), wl = 3;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') memcpy(w + wl, "\xe2\x96\x81", 3), wl += 3;
        else w[wl++] = p[i];
    }
    sym *s;
    int n_sym, rc = 0;
    if (merge_word(t, w, wl, &s, &n_sym)) {
        free(w);
        return -1;
    }
    for (int i = 0; i < n_sym && !rc; i++) {
        int32_t id = map_get(&t->tok_map, w + s[i].start, (size_t)s[i].len);
        if (id >= 0) {
            rc = push(out, id);
            continue;
        }
        for (int k = 0; k < s[i].len && !rc; k++) {
            int32_t bid = t->byte_tok[(uint8_t)w[s[i].start + k]];
            rc = push(out, bid >= 0 ? bid : t->unk);
        }
    }
    free(s);
    free(w);
    return rc;
}

/* ---------- encode ---------- */
typedef struct {
    size_t off, len;
    int32_t id; /* >= 0: a special token; -1: raw text */
} frag;

/* Double both fragment lists (the current one and the one being built). */
static int grow_frags(frag **a, frag **b, int *cap) {
    int nc = *cap * 2;
    frag *na = realloc(*a, (size_t)nc * sizeof *na);
    if (!na) return -1;
    *a = na;
    frag *nb = realloc(*b, (size_t)nc * sizeof *nb);
    if (!nb) return -1;
    *b = nb;
    *cap = nc;
    return 0;
}

int tok_encode(const kvb_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
               int32_t **ids_out, int *n_out, char *err, size_t err_len) {
    *ids_out = NULL;
    *n_out = 0;
    int64_t bad = tok_utf8_invalid_at(text, len);
    if (bad >= 0) return snprintf(err, err_len, "invalid UTF-8 at byte %lld", (long long)bad), -1;
    /* partition out special tokens, longest first; each token's pass rebuilds the fragment list in one sweep
     * (splitting in place moved the tail of the list at every hit: quadratic in the hits) */
    int n_frag = 1, cap_frag = 64;
    frag *fr = malloc((size_t)cap_frag * sizeof *fr), *nf = malloc((size_t)cap_frag * sizeof *nf);
    idbuf out = {0};
    pcre2_match_data *md = t->n_re ? pcre2_match_data_create(4, NULL) : NULL;
    if (!fr || !nf || (t->n_re && !md)) goto oom;
    fr[0] = (frag){0, len, -1};
    for (int si = 0; si < t->n_special; si++) {
        int32_t id = t->special[si];
        if (!parse_special && t->types[id] != TOK_USER) continue;
        const char *st = t->tokens[id].ptr;
        size_t sl = t->tokens[id].len;
        int n_new = 0, hits = 0;
        for (int f = 0; f < n_frag; f++) {
            size_t off = fr[f].off, rest = fr[f].len;
            const char *hit = NULL;
            while (fr[f].id < 0 && rest >= sl && (hit = memmem(text + off, rest, st, sl))) {
                size_t pre = (size_t)(hit - (text + off));
                if (n_new + 3 > cap_frag && grow_frags(&fr, &nf, &cap_frag)) goto oom;
                if (pre > 0) nf[n_new++] = (frag){off, pre, -1};
                nf[n_new++] = (frag){off + pre, sl, id};
                off += pre + sl;
                rest -= pre + sl;
                hits++;
            }
            if (n_new + 1 > cap_frag && grow_frags(&fr, &nf, &cap_frag)) goto oom;
            if (fr[f].id >= 0) nf[n_new++] = fr[f];
            else if (rest > 0) nf[n_new++] = (frag){off, rest, -1};
        }
        if (hits) {
            frag *tmp = fr;
            fr = nf;
            nf = tmp;
            n_frag = n_new;
        }
    }
    if (add_special && t->add_bos && t->bos >= 0 && push(&out, t->bos)) goto oom;
    int prev_special = 1;
    for (int f = 0; f < n_frag; f++) {
        if (fr[f].id >= 0) {
            if (push(&out, fr[f].id)) goto oom;
            prev_special = 1;
            continue;
        }
        int rc = t->model == MODEL_BPE
                     ? bpe_split(t, 0, text + fr[f].off, fr[f].len, &out, md)
                     : spm_fragment(t, text + fr[f].off, fr[f].len, t->add_space_prefix && prev_special, &out);
        if (rc) goto oom;
        prev_special = 0;
    }
    if (add_special && t->add_eos && t->eos >= 0 && push(&out, t->eos)) goto oom;
    free(fr);
    free(nf);
    if (md) pcre2_match_data_free(md);
    *ids_out = out.ids;
    *n_out = out.n;
    return 0;
oom:
    free(fr);
    free(nf);
    free(out.ids);
    if (md) pcre2_match_data_free(md);
    snprintf(err, err_len, "tokenizer: out of memory");
    return -1;
}

/* ---------- decode ---------- */
int tok_piece(const kvb_tokenizer *t, int32_t id, int special, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return -1;
    const gguf_str s = t->tokens[id];
    int ty = t->types[id];
    if (ty == TOK_CONTROL || ty == TOK_UNKNOWN || ty == TOK_UNUSED) {
        if (!special || ty == TOK_UNUSED) return 0;
        if (s.len > cap) return -1;
        memcpy(buf, s.ptr, s.len);
        return (int)s.len;
    }
    if (ty == TOK_USER) {
        if (s.len > cap) return -1;
        memcpy(buf, s.ptr, s.len);
        return (int)s.len;
    }
    size_t n = 0;
    if (t->model == MODEL_SPM) {
        if (ty == TOK_BYTE && s.len == 6) {
            if (cap < 1) return -1;
            buf[0] = (char)strtol(s.ptr + 3, NULL, 16);
            return 1;
        }
        for (size_t i = 0; i < s.len;) {
            if (i + 3 <= s.len && !memcmp(s.ptr + i, "\xe2\x96\x81", 3)) {
                if (n + 1 > cap) return -1;
                buf[n++] = ' ';
                i += 3;
            } else {
                if (n + 1 > cap) return -1;
                buf[n++] = s.ptr[i++];
            }
        }
        return (int)n;
    }
    /* byte-level BPE: each code point maps back to one byte */
    const uint8_t *p = (const uint8_t *)s.ptr;
    for (size_t i = 0; i < s.len;) {
        int l = utf8_len(p[i]);
        if (l == 0 || i + (size_t)l > s.len) l = 1;
        uint32_t cp = l == 1 ? p[i] : (uint32_t)(p[i] & (0x7F >> l));
        for (int k = 1; k < l; k++) cp = (cp << 6) | (p[i + (size_t)k] & 0x3F);
        if (n + 4 > cap) return -1;
        if (cp < 324 && t->cp_to_byte[cp] >= 0) buf[n++] = (char)t->cp_to_byte[cp];
        else n += (size_t)utf8_put(cp, buf + n);
        i += (size_t)l;
    }
    return (int)n;
}

int tok_decode(const kvb_tokenizer *t, const int32_t *ids, int n, char **out) {
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s) return -1;
    for (int i = 0; i < n; i++) {
        for (;;) {
            int l = tok_piece(t, ids[i], 0, s + len, cap - len - 1);
            if (l >= 0) {
                len += (size_t)l;
                break;
            }
            if (ids[i] < 0 || ids[i] >= t->n_vocab) {
                free(s);
                return -1;
            }
            char *ns = realloc(s, cap * 2);
            if (!ns) {
                free(s);
                return -1;
            }
            s = ns;
            cap *= 2;
        }
    }
    s[len] = 0;
    *out = s;
    return 0;
}

int tok_n_vocab(const kvb_tokenizer *t) { return t->n_vocab; }
int32_t tok_bos(const kvb_tokenizer *t) { return t->bos; }
int32_t tok_eos(const kvb_tokenizer *t) { return t->eos; }
int tok_add_bos(const kvb_tokenizer *t) { return t->add_bos; }
int tok_is_eog(const kvb_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->eog[id]; }

const char *tok_token_text(const kvb_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = t->tokens[id].len;
    return t->tokens[id].ptr;
}

int32_t tok_find(const kvb_tokenizer *t, const char *text, size_t len) { return map_get(&t->tok_map, text, len); }

/* ---------- streaming ---------- */
void tok_stream_init(tok_stream *s) { s->n_pending = 0; }

int tok_stream_push(tok_stream *s, const kvb_tokenizer *t, int32_t id, char *out, size_t cap) {
    char piece[512];
    int l = tok_piece(t, id, 0, piece, sizeof piece);
    if (l < 0) return -1;
    if ((size_t)s->n_pending + (size_t)l > cap) return -1;
    memcpy(out, s->pending, (size_t)s->n_pending);
    memcpy(out + s->n_pending, piece, (size_t)l);
    int n = s->n_pending + l;
    s->n_pending = 0;
    /* hold back a trailing incomplete UTF-8 sequence */
    int start = n - 1, back = 0;
    while (start >= 0 && back < 4 && ((uint8_t)out[start] & 0xC0) == 0x80) start--, back++;
    if (start >= 0) {
        int need = utf8_len((uint8_t)out[start]);
        if (need > 1 && n - start < need) {
            s->n_pending = n - start;
            memcpy(s->pending, out + start, (size_t)s->n_pending);
            n = start;
        }
    }
    return n;
}

int tok_stream_flush(tok_stream *s, char *out, size_t cap) {
    if ((size_t)s->n_pending > cap) return -1;
    memcpy(out, s->pending, (size_t)s->n_pending);
    int n = s->n_pending;
    s->n_pending = 0;
    return n;
}
