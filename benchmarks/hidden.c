/* hidden.c — where the question starts in a prompt (hidden.h). The prompt is rendered exactly as prompt.c
 * renders a single prompt (chat template with the sample's system message, or the bare text), cut after the
 * context, and tokenized with the same flags; the split is where those ids stop agreeing with the prompt's.
 * A prompt cut in the middle to fit the model (LongBench's truncation) is matched from its end instead: the
 * rendered text after the context, tokenized alone, against the prompt's last ids. */
#include "benchmarks/hidden.h"

#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* The rendered single prompt (kvb_prompt_render of the whole prompt) and, in *head, the length of its part up to
 * the end of the context; malloc'd, NULL + err on failure. */
static char *render_split(const kvb_model *m, const kvb_sample *s, size_t *head, char *err, size_t err_len) {
    const char *at = strstr(s->prompt, s->context);
    if (!at) { ERR("sample %s: its context is not part of its prompt", s->id ? s->id : "?"); return NULL; }
    char *out = kvb_prompt_render(m, s, s->prompt, err, err_len);
    if (!out) return NULL;
    /* the prompt appears verbatim in the rendering: its context ends that far in */
    char *u = strstr(out, s->prompt);
    if (!u) { free(out); ERR("sample %s: the chat template changes the prompt text", s->id ? s->id : "?"); return NULL; }
    *head = (size_t)(u - out) + (size_t)(at - s->prompt) + strlen(s->context);
    return out;
}

int kvb_hidden_split(const kvb_model *m, const kvb_sample *s, const kvb_prompt *p, int64_t *split, char *err,
                     size_t err_len) {
    if (!s->prompt || !s->context || !s->context[0] || !s->question)
        return ERR("sample %s: question hidden needs a benchmark whose samples keep the context apart from the question "
                   "(ruler, niah, longmemeval, longbench)", s->id ? s->id : "?");
    size_t head = 0;
    char *text = render_split(m, s, &head, err, err_len);
    if (!text) return -1;
    int32_t *ids = NULL;
    int n = 0, rc;
    if (!p->truncated) { /* the ids of everything through the context: a prefix of the prompt's */
        text[head] = 0;
        rc = tok_encode(m->tok, text, head, 1, s->use_chat, &ids, &n, err, err_len);
    } else { /* the ids of everything after the context: a suffix of the prompt's, unless the cut reached it */
        rc = tok_encode(m->tok, text + head, strlen(text + head), 0, s->use_chat, &ids, &n, err, err_len);
    }
    free(text);
    if (rc) return -1;
    /* a token merged across the boundary stays with the question: the context loses at most that token */
    int64_t k = 0;
    if (!p->truncated) {
        while (k < n && k < p->n && ids[k] == p->ids[k]) k++;
    } else {
        int64_t c = 0; /* common suffix */
        while (c < n && c < p->n && ids[n - 1 - c] == p->ids[p->n - 1 - c]) c++;
        /* the first question token may merge with the context's last text; more than one missing means the
         * middle cut reached the question */
        if (c + 1 < n) {
            free(ids);
            return ERR("sample %s: the prompt was truncated into its question: the question cannot be hidden",
                       s->id ? s->id : "?");
        }
        k = p->n - n;
    }
    free(ids);
    if (k < 1 || k >= p->n) return ERR("sample %s: no question tokens after the context", s->id ? s->id : "?");
    *split = k;
    return 0;
}

/* ---- a carried turn's prompt (hidden.h kvb_carried_build) ---- */

/* The ids of text appended to p as one more round (bos: the model's BOS first); 0 / -1 + err. */
static int add_piece(const kvb_model *m, kvb_prompt *p, const char *text, int bos, char *err, size_t err_len) {
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(m->tok, text, strlen(text), bos, 1, &ids, &n, err, err_len)) return -1;
    int32_t *v = realloc(p->ids, (size_t)(p->n + n + 1) * sizeof *v);
    int64_t *e = realloc(p->round_end, (size_t)(p->n_rounds + 1) * sizeof *e);
    if (v) p->ids = v;
    if (e) p->round_end = e;
    if (!v || !e) {
        free(ids);
        return ERR("out of memory");
    }
    memcpy(p->ids + p->n, ids, (size_t)n * sizeof *ids);
    free(ids);
    p->n += n;
    p->round_end[p->n_rounds++] = p->n;
    return 0;
}

/* Follow-up piece: [system "", assistant answer, user question] rendered with the assistant prompt opened, less
 * the rendering of [system ""] with it opened (the official .replace(sys_prompt_with_generation_prompt, "")),
 * then prefill; malloc'd, NULL + err. */
static char *follow_piece(chat_kind k, const char *answer, const char *question, const char *prefill, char *err,
                          size_t err_len) {
    chat_msg msgs[3] = {{"system", ""}, {"assistant", answer}, {"user", question}};
    char *head = NULL, *full = NULL, *out = NULL;
    if (chat_render(k, msgs, 1, 1, NULL, &head, err, err_len) || chat_render(k, msgs, 3, 1, NULL, &full, err, err_len)) {
        free(head), free(full);
        return NULL;
    }
    /* Python's str.replace removes every occurrence: in ChatML and Llama 3 the head occurs once, at the start; a
     * template whose head is only the assistant prompt (no system turn) has it again at the end, which kvbench keeps,
     * so the turn still opens the assistant's reply */
    const char *at = strstr(full, head);
    if (!at) {
        ERR("the chat template's rendering of a follow-up turn does not hold its system head (SCBench's follow-up prompts need it)");
    } else {
        size_t hl = strlen(head), pl = prefill ? strlen(prefill) : 0, fl = strlen(full);
        if ((out = malloc(fl - hl + pl + 1))) {
            memcpy(out, full, (size_t)(at - full));
            strcpy(out + (at - full), at + hl);
            if (prefill) strcat(out, prefill);
        } else {
            ERR("out of memory");
        }
    }
    free(head), free(full);
    return out;
}

int kvb_carried_build(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, kvb_prompt *p, int64_t *split,
                      int64_t *own, char *err, size_t err_len) {
    memset(p, 0, sizeof *p);
    const char *id = s->id ? s->id : "?";
    int k = s->prompt ? 0 : s->n_turns / 2; /* earlier turns */
    if (!s->prompt && (!s->question || s->n_turns < 2 || s->n_turns % 2))
        return ERR("sample %s: a carried turn is a first prompt, or (user, assistant) turns and a question", id);
    if (!s->use_chat) return ERR("sample %s: a carried turn needs the chat template (its pieces are chat turns)", id);
    kvb_sample first = *s; /* piece 1: the first user message alone, as a single prompt renders it */
    first.prefill = NULL;
    char *text = kvb_prompt_render(m, &first, s->prompt ? s->prompt : s->turns[0].content, err, err_len);
    int rc = text ? add_piece(m, p, text, 1, err, err_len) : -1;
    free(text);
    char *def_sys = NULL;
    chat_kind kind = chat_model_kind(m->gguf, m->cfg.arch, &def_sys);
    free(def_sys);
    for (int j = 1; !rc && j <= k; j++) { /* the reference answer of turn j, then turn j + 1's question */
        const char *q = j < k ? s->turns[2 * j].content : s->question;
        text = follow_piece(kind, s->turns[2 * j - 1].content, q, s->prefill, err, err_len);
        rc = text ? add_piece(m, p, text, 0, err, err_len) : -1;
        free(text);
    }
    if (!rc && p->n > max_tokens)
        rc = ERR("sample %s: the turn's prompt of %lld tokens does not fit %lld (a carried turn is never cut; lower "
                 "\"max_context_tokens\" or \"max_turns\")", id, (long long)p->n, (long long)max_tokens);
    if (rc) {
        kvb_prompt_free(p);
        return -1;
    }
    p->real_rounds = 1;
    *split = p->round_end[0];
    *own = k ? p->round_end[k - 1] : 0;
    return 0;
}
