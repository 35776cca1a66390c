/* hidden.c — where the question starts in a prompt (hidden.h). The prompt is rendered exactly as prompt.c
 * renders a single prompt (chat template with the sample's system message, or the bare text), cut after the
 * context, and tokenized with the same flags; the split is where those ids stop agreeing with the prompt's. */
#include "benchmarks/hidden.h"

#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "engine/gguf.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* The rendered single prompt up to the end of its context; malloc'd, NULL + err on failure. */
static char *render_through_context(const kvb_model *m, const kvb_sample *s, char *err, size_t err_len) {
    const char *at = strstr(s->prompt, s->context);
    if (!at) { ERR("sample %s: its context is not part of its prompt", s->id ? s->id : "?"); return NULL; }
    size_t keep = (size_t)(at - s->prompt) + strlen(s->context);
    if (!s->use_chat) return strndup(s->prompt, keep);
    const gguf_kv *kv = gguf_find(m->gguf, "tokenizer.chat_template");
    char *t = kv && kv->val.type == GGUF_VT_STRING ? strndup(kv->val.v.s.ptr, kv->val.v.s.len) : NULL;
    chat_kind k = chat_detect(t, m->cfg.arch);
    free(t);
    char *def_sys = chat_default_system_from_model(m->gguf), *out = NULL;
    chat_msg msgs[2];
    int nm = 0;
    if (s->system) msgs[nm++] = (chat_msg){"system", s->system};
    msgs[nm++] = (chat_msg){"user", s->prompt};
    int rc = chat_render(k, msgs, nm, 1, def_sys, &out, err, err_len);
    free(def_sys);
    if (rc) return NULL;
    /* the user message appears verbatim in the rendering: cut after its context */
    char *u = strstr(out, s->prompt);
    if (!u) { free(out); ERR("sample %s: the chat template changes the prompt text", s->id ? s->id : "?"); return NULL; }
    u[keep] = 0;
    return out;
}

int kvb_hidden_split(const kvb_model *m, const kvb_sample *s, const kvb_prompt *p, int64_t *split, char *err,
                     size_t err_len) {
    if (!s->prompt || !s->context || !s->context[0] || !s->question)
        return ERR("sample %s: question hidden needs a benchmark whose samples keep the context apart from the question "
                   "(ruler, niah, longmemeval)", s->id ? s->id : "?");
    if (p->truncated)
        return ERR("sample %s: the prompt was truncated to fit the model: the question cannot be hidden behind a cut "
                   "context", s->id ? s->id : "?");
    char *head = render_through_context(m, s, err, err_len);
    if (!head) return -1;
    int32_t *ids = NULL;
    int n = 0;
    int rc = tok_encode(m->tok, head, strlen(head), 1, s->use_chat, &ids, &n, err, err_len);
    free(head);
    if (rc) return -1;
    int64_t k = 0;
    while (k < n && k < p->n && ids[k] == p->ids[k]) k++;
    free(ids);
    /* a token merged across the boundary stays with the question: the context loses at most that token */
    if (k < 1 || k >= p->n) return ERR("sample %s: no question tokens after the context", s->id ? s->id : "?");
    *split = k;
    return 0;
}
