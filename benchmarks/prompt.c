/* prompt.c — samples to token ids with round boundaries (see prompt.h). */
#include "benchmarks/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "engine/chat.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int append_ids(kvb_prompt *p, const int32_t *ids, int n) {
    int32_t *v = realloc(p->ids, (size_t)(p->n + n + 1) * sizeof *v);
    if (!v) return -1;
    p->ids = v;
    memcpy(p->ids + p->n, ids, (size_t)n * sizeof *ids);
    p->n += n;
    return 0;
}

static int tokenize_into(const kvb_model *m, kvb_prompt *p, const char *text, int first, int parse_special, char *err,
                         size_t err_len) {
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(m->tok, text, strlen(text), first, parse_special, &ids, &n, err, err_len)) return -1;
    int rc = append_ids(p, ids, n) ? ERR("out of memory") : 0;
    free(ids);
    return rc;
}

/* pred.py: tokens of the bare prompt text; if too long keep the first and last halves, decoded back to text. */
static char *middle_truncate(const kvb_model *m, const char *text, int64_t max_tokens, int *truncated, char *err,
                             size_t err_len) {
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(m->tok, text, strlen(text), 0, 0, &ids, &n, err, err_len)) return NULL;
    if (n > max_tokens && max_tokens < 2) { free(ids); ERR("the budget leaves no room for the prompt beside its template"); return NULL; }
    char *out = NULL;
    if (n <= max_tokens) {
        out = strdup(text);
    } else {
        int64_t half = max_tokens / 2;
        char *a = NULL, *b = NULL;
        char *ra = NULL, *rb = NULL;
        /* each half decoded as pred.py's tokenizer.decode does: a cut inside a character becomes U+FFFD (raw, the
         * halves would be invalid UTF-8, which the tokenizer then refuses) */
        if (tok_decode(m->tok, ids, (int)half, &ra) == 0 && tok_decode(m->tok, ids + n - half, (int)half, &rb) == 0) {
            a = kvb_utf8_lossy(ra);
            b = kvb_utf8_lossy(rb);
        }
        free(ra);
        free(rb);
        if (a && b) {
            size_t la = strlen(a), lb = strlen(b);
            out = malloc(la + lb + 1);
            if (out) {
                memcpy(out, a, la);
                memcpy(out + la, b, lb + 1);
            }
        }
        free(a);
        free(b);
        *truncated = 1;
    }
    free(ids);
    if (!out) ERR("out of memory");
    return out;
}

char *kvb_prompt_render(const kvb_model *m, const kvb_sample *s, const char *text, char *err, size_t err_len) {
    if (!s->use_chat) {
        char *out = strdup(text);
        if (!out) ERR("out of memory");
        return out;
    }
    char *def_sys = NULL, *rendered = NULL;
    chat_kind k = chat_model_kind(m->gguf, m->cfg.arch, &def_sys);
    chat_msg msgs[2];
    int nm = 0;
    if (s->system) msgs[nm++] = (chat_msg){"system", s->system};
    msgs[nm++] = (chat_msg){"user", text};
    int rc = chat_render(k, msgs, nm, 1, def_sys, &rendered, err, err_len);
    free(def_sys);
    if (rc) return NULL;
    if (s->prefill) {
        size_t a = strlen(rendered), b = strlen(s->prefill);
        char *r2 = realloc(rendered, a + b + 1);
        if (!r2) {
            free(rendered);
            ERR("out of memory");
            return NULL;
        }
        memcpy(r2 + a, s->prefill, b + 1);
        rendered = r2;
    }
    return rendered;
}

/* The room left for the template around a single prompt. */
static int64_t template_overhead(const kvb_sample *s) {
    int64_t overhead = s->use_chat ? 64 : 4;
    if (s->system) overhead += (int64_t)strlen(s->system) / 2;
    if (s->prefill) overhead += (int64_t)strlen(s->prefill) / 2;
    return overhead;
}

char *kvb_prompt_cut_text(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, char *err, size_t err_len) {
    int truncated = 0;
    if (!s->prompt) return ERR("sample %s has no prompt", s->id ? s->id : "?"), NULL;
    return middle_truncate(m, s->prompt, max_tokens - template_overhead(s), &truncated, err, err_len);
}

static int build_single(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk, kvb_prompt *p,
                        char *err, size_t err_len) {
    char *text = middle_truncate(m, s->prompt, max_tokens - template_overhead(s), &p->truncated, err, err_len);
    if (!text) return -1;
    char *rendered = kvb_prompt_render(m, s, text, err, err_len);
    int rc = rendered ? tokenize_into(m, p, rendered, 1, s->use_chat, err, err_len) : -1;
    free(rendered);
    free(text);
    if (rc) return -1;
    if (p->n > max_tokens) return ERR("sample %s: prompt of %lld tokens does not fit %lld", s->id ? s->id : "?", (long long)p->n, (long long)max_tokens);
    return kvb_rounds_chunk(p, round_chunk, err, err_len);
}

/* Render messages[0..n) (with the assistant prompt when open) and return the text. */
static char *render(const kvb_model *m, const chat_msg *msgs, int n, int open) {
    char *def_sys = NULL, *out = NULL, e[64];
    chat_kind k = chat_model_kind(m->gguf, m->cfg.arch, &def_sys);
    if (chat_render(k, msgs, n, open, def_sys, &out, e, sizeof e)) out = NULL;
    free(def_sys);
    return out;
}

static int build_dialogue(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, kvb_prompt *p, char *err,
                          size_t err_len) {
    int n_msgs = s->n_turns + 2;
    chat_msg *msgs = calloc((size_t)n_msgs, sizeof *msgs);
    if (!msgs) return ERR("out of memory");
    int nm = 0, first_round_msg;
    if (s->system) msgs[nm++] = (chat_msg){"system", s->system};
    first_round_msg = nm;
    for (int i = 0; i < s->n_turns; i++) {
        if (!strcmp(s->turns[i].role, "system")) {
            if (nm == 0) { msgs[nm++] = (chat_msg){"system", s->turns[i].content}; first_round_msg = nm; }
            continue;
        }
        msgs[nm++] = (chat_msg){s->turns[i].role, s->turns[i].content};
    }
    int hist_end = nm; /* messages [first_round_msg, hist_end) are the history rounds (pairs) */
    msgs[nm++] = (chat_msg){"user", s->question};
    int rc = -1;
    for (int keep = hist_end; keep >= first_round_msg; keep -= 2) {
        /* history = messages [first_round_msg, keep); question appended */
        kvb_prompt_free(p);
        memset(p, 0, sizeof *p);
        int n_hist_rounds = (keep - first_round_msg) / 2;
        p->round_end = malloc((size_t)(n_hist_rounds + 1) * sizeof *p->round_end);
        if (!p->round_end) { ERR("out of memory"); break; }
        char *prev = strdup("");
        int ok = prev != NULL;
        for (int r = 0; ok && r <= n_hist_rounds; r++) {
            chat_msg tmp[n_msgs];
            int tn = 0;
            for (int i = 0; i < first_round_msg; i++) tmp[tn++] = msgs[i];
            int upto = r < n_hist_rounds ? first_round_msg + 2 * (r + 1) : keep;
            for (int i = first_round_msg; i < upto; i++) tmp[tn++] = msgs[i];
            if (r == n_hist_rounds) tmp[tn++] = msgs[nm - 1];
            char *full = render(m, tmp, tn, r == n_hist_rounds);
            size_t pl = strlen(prev);
            if (!full || strncmp(full, prev, pl)) { free(full); ok = 0; break; }
            const char *seg = full + pl;
            if (r == n_hist_rounds && s->prefill) {
                char *f2 = malloc(strlen(full) + strlen(s->prefill) + 1);
                if (!f2) { free(full); ok = 0; break; }
                strcpy(f2, full);
                strcat(f2, s->prefill);
                free(full);
                full = f2;
                seg = full + pl;
            }
            if (tokenize_into(m, p, seg, r == 0, 1, err, err_len)) { free(full); free(prev); prev = NULL; ok = -1; break; }
            p->round_end[r] = p->n;
            free(prev);
            prev = full;
        }
        free(prev);
        if (ok == -1) break;
        if (!ok) { ERR("sample %s: the chat template does not render rounds as prefixes", s->id ? s->id : "?"); break; }
        p->n_rounds = n_hist_rounds + 1;
        p->real_rounds = 1;
        p->truncated = keep < hist_end; /* set after the reset at the top of the loop */
        if (p->n <= max_tokens) { rc = 0; break; }
    }
    if (rc && !err[0]) ERR("sample %s: the question alone is longer than %lld tokens", s->id ? s->id : "?", (long long)max_tokens);
    free(msgs);
    return rc;
}

static int is_dialogue(const kvb_sample *s) { return s->turns && s->n_turns > 0 && s->question && !s->prompt; }

int kvb_prompt_single(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk, kvb_prompt *out,
                      char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    err[0] = 0;
    int rc = s->prompt ? build_single(m, s, max_tokens, round_chunk, out, err, err_len)
                       : ERR("sample %s has no prompt (its benchmark builds single prompts)", s->id ? s->id : "?");
    if (rc) kvb_prompt_free(out);
    return rc;
}

int kvb_prompt_dialogue(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk, kvb_prompt *out,
                        char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    err[0] = 0;
    int rc = is_dialogue(s) ? build_dialogue(m, s, max_tokens, out, err, err_len)
                            : ERR("sample %s is not a dialogue (turns and a question, no prompt; its benchmark builds dialogues)",
                                  s->id ? s->id : "?");
    if (rc) kvb_prompt_free(out);
    return rc;
}

int kvb_prompt_build(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk, kvb_prompt *out,
                     char *err, size_t err_len) {
    if (is_dialogue(s)) return kvb_prompt_dialogue(m, s, max_tokens, round_chunk, out, err, err_len);
    if (s->prompt) return kvb_prompt_single(m, s, max_tokens, round_chunk, out, err, err_len);
    memset(out, 0, sizeof *out);
    return ERR("sample %s has neither a prompt nor a dialogue", s->id ? s->id : "?");
}

void kvb_prompt_free(kvb_prompt *p) {
    if (p) kvb_rounds_free(p);
}

int64_t kvb_count_tokens(void *model, const char *text) {
    const kvb_model *m = model;
    int32_t *ids = NULL;
    int n = 0;
    char e[64];
    if (tok_encode(m->tok, text, strlen(text), 0, 0, &ids, &n, e, sizeof e)) return -1;
    free(ids);
    return n;
}
