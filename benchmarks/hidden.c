/* hidden.c — where the question starts in a prompt (hidden.h). The prompt is rendered exactly as prompt.c
 * renders a single prompt (chat template with the sample's system message, or the bare text), cut after the
 * context, and tokenized with the same flags; the split is where those ids stop agreeing with the prompt's.
 * A prompt cut in the middle to fit the model (LongBench's truncation) is matched from its end instead: the
 * rendered text after the context, tokenized alone, against the prompt's last ids. */
#include "benchmarks/hidden.h"

#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "engine/gguf.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* The rendered single prompt (with the sample's assistant prefill) and, in *head, the length of its part up to
 * the end of the context; malloc'd, NULL + err on failure. */
static char *render_split(const kvb_model *m, const kvb_sample *s, size_t *head, char *err, size_t err_len) {
    const char *at = strstr(s->prompt, s->context);
    if (!at) { ERR("sample %s: its context is not part of its prompt", s->id ? s->id : "?"); return NULL; }
    size_t keep = (size_t)(at - s->prompt) + strlen(s->context);
    char *out = NULL;
    if (!s->use_chat) {
        out = strdup(s->prompt);
        *head = keep;
    } else {
        const gguf_kv *kv = gguf_find(m->gguf, "tokenizer.chat_template");
        char *t = kv && kv->val.type == GGUF_VT_STRING ? strndup(kv->val.v.s.ptr, kv->val.v.s.len) : NULL;
        chat_kind k = chat_detect(t, m->cfg.arch);
        free(t);
        char *def_sys = chat_default_system_from_model(m->gguf);
        chat_msg msgs[2];
        int nm = 0;
        if (s->system) msgs[nm++] = (chat_msg){"system", s->system};
        msgs[nm++] = (chat_msg){"user", s->prompt};
        int rc = chat_render(k, msgs, nm, 1, def_sys, &out, err, err_len);
        free(def_sys);
        if (rc) return NULL;
        /* the user message appears verbatim in the rendering: its context ends keep bytes in */
        char *u = strstr(out, s->prompt);
        if (!u) { free(out); ERR("sample %s: the chat template changes the prompt text", s->id ? s->id : "?"); return NULL; }
        *head = (size_t)(u - out) + keep;
    }
    if (out && s->prefill) { /* prompt.c appends the assistant prefill after the rendering */
        size_t a = strlen(out), b = strlen(s->prefill);
        char *r = realloc(out, a + b + 1);
        if (!r) { free(out); out = NULL; }
        else memcpy(r + a, s->prefill, b + 1), out = r;
    }
    if (!out) ERR("out of memory");
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
        k = p->n - n; /* a token merged across the boundary stays with the question */
    }
    free(ids);
    /* a token merged across the boundary stays with the question: the context loses at most that token */
    if (k < 1 || k >= p->n) return ERR("sample %s: no question tokens after the context", s->id ? s->id : "?");
    *split = k;
    return 0;
}
