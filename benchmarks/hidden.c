/* hidden.c — where the question starts in a prompt (hidden.h). The prompt is rendered exactly as prompt.c
 * renders a single prompt (chat template with the sample's system message, or the bare text), cut after the
 * context, and tokenized with the same flags; the split is where those ids stop agreeing with the prompt's.
 * A prompt cut in the middle to fit the model (LongBench's truncation) is matched from its end instead: the
 * rendered text after the context, tokenized alone, against the prompt's last ids. */
#include "benchmarks/hidden.h"

#include <stdlib.h>
#include <string.h>

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
