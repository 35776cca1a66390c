/* niah.c — needle in a haystack. Follows gkamradt/LLMTest_NeedleInAHaystack
 * needlehaystack/llm_needle_haystack_tester.py (read_context_files: whole passes over the haystack
 * files until the text holds max(context_lengths) tokens; encode_and_trim + insert_needle: the context
 * is cut to context_length - final_context_length_buffer (200) - tokens(needle) tokens, the needle goes
 * in at int(tokens(context) * depth/100), moved back until what precedes it ends with '.', depth 100
 * appends it) and needlehaystack/providers/openai.py (system message; user message 1 = the context,
 * user message 2 = "<question> Don't give information outside the document or repeat your findings";
 * max_tokens 300), with run.py's default needle and question.
 * The official code works on token ids; here a token-count callback stands in for the tokenizer, so
 * "the first k tokens" is the longest prefix (cut at a UTF-8 character boundary) that counts <= k
 * tokens, found by binary search, and "ends with a '.' token" is "ends with the character '.'".
 * Choices where the sources are silent: haystack files are read in sorted name order (the official
 * glob order is the filesystem's); the single-message prompt joins the two user messages with "\n\n";
 * the built-in filler (haystack_dir NULL) is text generated here from a fixed seed, never an essay. */
#include "benchmarks/loaders.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"

static const char SYSTEM_MSG[] =
    "You are a helpful AI bot that answers questions for a user. Keep your response short and direct";
static const char QUESTION_SUFFIX[] = " Don't give information outside the document or repeat your findings";
#define NIAH_MAX_NEW_TOKENS 300
#define FILLER_SEED 0x6b7662656e636801ULL

int64_t niah_count_words(void *ctx, const char *text) {
    (void)ctx;
    int64_t n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p;) {
        while (*p && isspace(*p)) p++;
        if (*p) n++;
        while (*p && !isspace(*p)) p++;
    }
    return n;
}

void niah_linspace_round(double lo, double hi, int n, double *out) {
    double step = n > 1 ? (hi - lo) / (n - 1) : 0;
    for (int k = 0; k < n; k++) out[k] = rint(k == n - 1 && n > 1 ? hi : lo + k * step);
}

/* ---- the built-in filler ---- */

static const char *const ADJ[] = {"quiet", "old", "bright", "narrow", "patient", "careful", "distant", "small",
                                  "curious", "steady", "plain", "early", "honest", "heavy", "simple", "gentle"};
static const char *const NOUN[] = {"engineer", "river", "village", "notebook", "market", "teacher", "garden",
                                   "machine", "bridge", "letter", "company", "harbor", "student", "library",
                                   "winter", "workshop", "farmer", "question", "lantern", "orchard"};
static const char *const VERB[] = {"carried", "noticed", "built", "followed", "described", "repaired", "measured",
                                   "visited", "painted", "studied", "collected", "remembered"};
static const char *const PREP[] = {"near", "behind", "across", "beyond", "under", "beside", "after", "before"};
static const char *const OPENER[] = {"In the morning", "Years later", "By the end of the season", "At first",
                                     "Most of the time", "Every so often", "For a while", "Eventually"};

#define PICK(rng, arr) (arr[kvb_rng_below(rng, sizeof arr / sizeof *arr)])

static void filler_sentence(kvb_sb *b, uint64_t *rng) {
    switch (kvb_rng_below(rng, 4)) {
    case 0:
        kvb_sb_addf(b, "The %s %s %s the %s %s %s the %s.", PICK(rng, ADJ), PICK(rng, NOUN), PICK(rng, VERB),
                    PICK(rng, ADJ), PICK(rng, NOUN), PICK(rng, PREP), PICK(rng, NOUN));
        break;
    case 1:
        kvb_sb_addf(b, "%s, a %s %s %s every %s %s the %s.", PICK(rng, OPENER), PICK(rng, ADJ), PICK(rng, NOUN),
                    PICK(rng, VERB), PICK(rng, NOUN), PICK(rng, PREP), PICK(rng, NOUN));
        break;
    case 2:
        kvb_sb_addf(b, "Nobody expected the %s to be so %s, but the %s %s it anyway.", PICK(rng, NOUN),
                    PICK(rng, ADJ), PICK(rng, NOUN), PICK(rng, VERB));
        break;
    default:
        kvb_sb_addf(b, "It is %s to say that the %s and the %s were %s %d times.", PICK(rng, ADJ),
                    PICK(rng, NOUN), PICK(rng, NOUN), PICK(rng, VERB), 2 + (int)kvb_rng_below(rng, 40));
    }
}

char *niah_filler_text(size_t min_bytes) {
    kvb_sb b = {0};
    uint64_t rng = FILLER_SEED;
    while (b.n < min_bytes && !b.oom) {
        int n = 4 + (int)kvb_rng_below(&rng, 5);
        for (int i = 0; i < n; i++) {
            filler_sentence(&b, &rng);
            kvb_sb_add(&b, i + 1 < n ? " " : "\n\n", i + 1 < n ? 1 : 2);
        }
    }
    return kvb_sb_take(&b);
}

/* ---- the haystack ---- */

typedef struct {
    kvb_count_tokens_fn count;
    void *ctx;
} counter;

static int64_t count_prefix(const counter *c, char *text, size_t p) {
    char saved = text[p];
    text[p] = 0;
    int64_t n = c->count(c->ctx, text);
    text[p] = saved;
    return n;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the *.txt files in dir (the official glob pattern). */
static char **list_txt(const char *dir, int *n, char *err, size_t err_len) {
    DIR *d = opendir(dir);
    if (!d) {
        kvb_seterr(err, err_len, "%s: cannot open the haystack directory: %s", dir, strerror(errno));
        return NULL;
    }
    char **v = NULL;
    int cap = 0, oom = 0;
    struct dirent *e;
    *n = 0;
    while (!oom && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 4, ".txt")) continue;
        if (*n == cap) {
            char **nv = realloc(v, (size_t)(cap ? cap * 2 : 64) * sizeof *nv);
            if (!nv) {
                oom = 1;
                break;
            }
            v = nv;
            cap = cap ? cap * 2 : 64;
        }
        oom = !(v[*n] = kvb_strdup(e->d_name));
        *n += !oom;
    }
    closedir(d);
    if (!oom && !v) oom = !(v = calloc(1, sizeof *v));
    if (oom) {
        for (int i = 0; i < *n; i++) free(v[i]);
        free(v);
        kvb_seterr(err, err_len, "%s: out of memory", dir);
        return NULL;
    }
    qsort(v, (size_t)*n, sizeof *v, cmp_str);
    return v;
}

/* One pass over the haystack files, concatenated with nothing between them. */
static char *read_pass(const char *dir, char *err, size_t err_len) {
    int n;
    char **names = list_txt(dir, &n, err, err_len);
    if (!names) return NULL;
    kvb_sb b = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        kvb_sb path = {0};
        kvb_sb_addf(&path, "%s/%s", dir, names[i]);
        size_t len;
        char *p = kvb_sb_take(&path), *text = p ? kvb_read_file(p, &len, err, err_len) : NULL;
        if (text) kvb_sb_add(&b, text, len);
        else rc = -1;
        free(text);
        free(p);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!rc && b.n == 0) {
        kvb_seterr(err, err_len, "%s: no text in any *.txt file", dir);
        rc = -1;
    }
    if (rc) kvb_sb_free(&b);
    return rc ? NULL : kvb_sb_take(&b);
}

/* Whole passes until the text holds at least want tokens (read_context_files). */
static char *repeat_until(const char *pass, const counter *c, int64_t want, char *err, size_t err_len) {
    kvb_sb b = {0};
    int64_t have = 0, before = -1;
    size_t pass_len = strlen(pass);
    while (have < want && !b.oom) {
        kvb_sb_add(&b, pass, pass_len);
        have = b.oom ? 0 : c->count(c->ctx, b.p);
        if (have < 0 || have <= before) break; /* a pass that adds no token would repeat forever (found by fuzzing) */
        before = have;
    }
    if (b.oom || have < 0 || (have < want && have <= before)) {
        kvb_seterr(err, err_len, "niah: %s", b.oom ? "out of memory" : have < 0 ? "the token counter failed"
                                                     : "repeating the haystack text adds no tokens");
        kvb_sb_free(&b);
        return NULL;
    }
    return kvb_sb_take(&b);
}

static char *build_haystack(const char *dir, const counter *c, int64_t want, char *err, size_t err_len) {
    if (dir) {
        char *pass = read_pass(dir, err, err_len);
        if (!pass) return NULL;
        int64_t t = c->count(c->ctx, pass);
        char *hay = t > 0 ? repeat_until(pass, c, want, err, err_len) : NULL;
        if (t <= 0) kvb_seterr(err, err_len, "%s: the haystack text counts no tokens", dir);
        free(pass);
        return hay;
    }
    for (size_t bytes = (size_t)want * 4 + 4096;; bytes *= 2) { /* the filler is prefix-stable: grow it */
        char *hay = niah_filler_text(bytes);
        if (!hay) break;
        int64_t t = c->count(c->ctx, hay);
        if (t >= want || t < 0 || bytes > ((size_t)1 << 34)) {
            if (t >= want) return hay;
            free(hay);
            break;
        }
        free(hay);
    }
    kvb_seterr(err, err_len, "niah: cannot generate %lld tokens of filler", (long long)want);
    return NULL;
}

/* ---- token-prefix search ---- */

static size_t char_start(const char *s, size_t p) {
    while (p > 0 && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
    return p;
}

/* The longest prefix of text[0..n) (at a character boundary) that counts <= k tokens. */
static size_t prefix_for_tokens(const counter *c, char *text, size_t n, int64_t k) {
    size_t lo = 0, hi = (size_t)(k > 0 ? k : 1) * 8;
    while (hi < n && count_prefix(c, text, char_start(text, hi)) <= k) lo = hi, hi *= 2;
    if (hi > n) hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (count_prefix(c, text, char_start(text, mid)) <= k) lo = mid;
        else hi = mid - 1;
    }
    return char_start(text, lo);
}

/* ---- samples ---- */

typedef struct {
    const char *needle, *question_msg, *key;
    int64_t needle_tokens;
    counter c;
} niah_args;

static char *insert_needle(const niah_args *a, char *ctx, size_t ctx_len, int64_t ctx_tokens, double depth) {
    size_t p = ctx_len;
    if (depth < 100) {
        int64_t at = (int64_t)((double)ctx_tokens * (depth / 100.0));
        p = prefix_for_tokens(&a->c, ctx, ctx_len, at);
        while (p > 0 && ctx[p - 1] != '.') p--;
    }
    kvb_sb b = {0};
    kvb_sb_add(&b, ctx, p);
    kvb_sb_adds(&b, a->needle);
    kvb_sb_add(&b, ctx + p, ctx_len - p);
    return kvb_sb_take(&b);
}

static int make_sample(const niah_args *a, char *ctx, size_t ctx_len, int64_t ctx_tokens, int len, double depth,
                       kvb_samples *out) {
    kvb_sample s;
    kvb_sample_init(&s);
    char id[64], qtype[64];
    snprintf(id, sizeof id, "%d_%g", len, depth);
    snprintf(qtype, sizeof qtype, "len=%d,depth=%g", len, depth);
    s.context = insert_needle(a, ctx, ctx_len, ctx_tokens, depth);
    kvb_sb pb = {0};
    if (s.context) kvb_sb_addf(&pb, "%s\n\n%s", s.context, a->question_msg);
    s.prompt = kvb_sb_take(&pb);
    s.question = kvb_strdup(a->question_msg);
    s.system = kvb_strdup(SYSTEM_MSG);
    s.id = kvb_strdup(id);
    s.task = kvb_strdup("niah");
    s.qtype = kvb_strdup(qtype);
    s.max_new_tokens = NIAH_MAX_NEW_TOKENS;
    s.use_chat = 1;
    s.ctx_tokens = len;
    s.depth = depth;
    s.length = s.context ? a->c.count(a->c.ctx, s.context) : -1;
    if (!s.context || !s.prompt || !s.question || !s.system || !s.id || !s.task || !s.qtype
        || kvb_sample_add_answer(&s, a->key)) {
        kvb_sample_free(&s);
        return -1;
    }
    return kvb_samples_push(out, &s);
}

/* All depths for one context length. */
static int one_length(const niah_args *a, char *hay, size_t hay_len, int len, const double *depths, int n_depth,
                      kvb_samples *out, char *err, size_t err_len) {
    int64_t budget = (int64_t)len - NIAH_CONTEXT_BUFFER_TOKENS - a->needle_tokens;
    if (budget <= 0) {
        kvb_seterr(err, err_len, "niah: context length %d leaves no room after the %d-token buffer and the needle",
                   len, NIAH_CONTEXT_BUFFER_TOKENS);
        return -1;
    }
    size_t ctx_len = prefix_for_tokens(&a->c, hay, hay_len, budget);
    char saved = hay[ctx_len];
    hay[ctx_len] = 0;
    int64_t ctx_tokens = a->c.count(a->c.ctx, hay);
    int rc = 0;
    for (int d = 0; d < n_depth && !rc; d++) rc = make_sample(a, hay, ctx_len, ctx_tokens, len, depths[d], out);
    hay[ctx_len] = saved;
    if (rc) kvb_seterr(err, err_len, "niah: out of memory");
    return rc;
}

static const char *check_grid(const int *lengths, int n_len, const double *depths, int n_depth) {
    if (n_len < 1 || n_depth < 1 || !lengths || !depths) return "niah: need at least one length and one depth";
    for (int i = 0; i < n_len; i++)
        if (lengths[i] <= 0) return "niah: context lengths must be positive";
    for (int i = 0; i < n_depth; i++)
        if (!(depths[i] >= 0 && depths[i] <= 100)) return "niah: depths must be within [0, 100]";
    return NULL;
}

int niah_generate(const char *haystack_dir, const int *lengths, int n_len, const double *depths, int n_depth,
                  const char *needle, const char *question, const char *key_phrase, kvb_count_tokens_fn count_tokens,
                  void *tok_ctx, kvb_samples *out, char *err, size_t err_len) {
    const char *bad = check_grid(lengths, n_len, depths, n_depth);
    if (bad) {
        kvb_seterr(err, err_len, "%s", bad);
        return -1;
    }
    niah_args a = {needle ? needle : NIAH_DEFAULT_NEEDLE, NULL, key_phrase ? key_phrase : NIAH_DEFAULT_KEY_PHRASE, 0,
                   {count_tokens ? count_tokens : niah_count_words, tok_ctx}};
    kvb_sb qb = {0};
    kvb_sb_addf(&qb, "%s%s", question ? question : NIAH_DEFAULT_QUESTION, QUESTION_SUFFIX);
    char *qmsg = kvb_sb_take(&qb);
    a.question_msg = qmsg;
    a.needle_tokens = a.c.count(a.c.ctx, a.needle);
    int max_len = 0, n0 = out->n, rc = -1;
    for (int i = 0; i < n_len; i++) max_len = lengths[i] > max_len ? lengths[i] : max_len;
    char *hay = qmsg && a.needle_tokens >= 0 ? build_haystack(haystack_dir, &a.c, max_len, err, err_len) : NULL;
    if (!qmsg || a.needle_tokens < 0)
        kvb_seterr(err, err_len, "niah: %s", qmsg ? "the token counter failed" : "out of memory");
    if (hay) {
        size_t hay_len = strlen(hay);
        rc = 0;
        for (int i = 0; i < n_len && rc == 0; i++)
            rc = one_length(&a, hay, hay_len, lengths[i], depths, n_depth, out, err, err_len);
    }
    free(hay);
    free(qmsg);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}
