/* chat.c — chat templates. The strings reproduce what the models' own Jinja templates render
 * (checked against jinja2 in tests/test_chat.c fixtures), without a Jinja interpreter. */
#include "engine/chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

chat_kind chat_detect(const char *tmpl, const char *arch) {
    if (tmpl && *tmpl) {
        if (strstr(tmpl, "<|im_start|>")) return CHAT_CHATML;
        if (strstr(tmpl, "<|start_header_id|>")) return CHAT_LLAMA3;
        if (strstr(tmpl, "[INST]")) return CHAT_MISTRAL;
        if (strstr(tmpl, "<start_of_turn>")) return CHAT_GEMMA;
    }
    /* Gemma 3 GGUFs often carry no template (Gemma-3-270M's has none): its turns, as llama.cpp's "gemma" */
    if (arch && !strcmp(arch, "gemma3")) return CHAT_GEMMA;
    return CHAT_CHATML; /* qwen2 and llama models without a template: chatml is the common default */
}

int chat_kind_from_name(const char *name, chat_kind *out) {
    if (!strcmp(name, "chatml")) *out = CHAT_CHATML;
    else if (!strcmp(name, "llama3")) *out = CHAT_LLAMA3;
    else if (!strcmp(name, "mistral")) *out = CHAT_MISTRAL;
    else if (!strcmp(name, "gemma")) *out = CHAT_GEMMA;
    else return -1;
    return 0;
}

const char *chat_kind_name(chat_kind k) {
    return k == CHAT_CHATML ? "chatml" : k == CHAT_LLAMA3 ? "llama3" : k == CHAT_GEMMA ? "gemma" : "mistral";
}

char *chat_default_system(const char *tmpl) {
    if (!tmpl) return NULL;
    /* The template may open a system turn in several branches (Qwen2.5's tools branch first, with the text
     * built from expressions; its plain branch later, with the literal default): take the first literal one. */
    static const char *heads[] = {"<|im_start|>system\n", "<|im_start|>system\\n"};
    const char *best = NULL, *best_end = NULL;
    for (int h = 0; h < 2; h++)
        for (const char *p = strstr(tmpl, heads[h]); p; p = strstr(p + 1, heads[h])) {
            const char *b = p + strlen(heads[h]);
            const char *e = strstr(b, "<|im_end|>");
            if (!e || e == b) continue;
            /* only a literal default: no Jinja expressions or string ends inside */
            size_t n = (size_t)(e - b);
            if (memchr(b, '{', n) || memchr(b, '\'', n)) continue;
            if (!best || b < best) best = b, best_end = e;
            break;
        }
    return best ? strndup(best, (size_t)(best_end - best)) : NULL;
}

char *chat_default_system_from_model(const gguf_file *f) {
    const gguf_kv *kv = gguf_find(f, "tokenizer.chat_template");
    if (!kv || kv->val.type != GGUF_VT_STRING) return NULL;
    char *t = strndup(kv->val.v.s.ptr, kv->val.v.s.len);
    char *d = t ? chat_default_system(t) : NULL;
    free(t);
    return d;
}

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int need = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (need < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->n + (size_t)need < b->cap) {
            b->n += (size_t)need;
            return;
        }
        size_t cap = (b->cap ? b->cap : 256) * 2 + (size_t)need;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
}

int chat_render(chat_kind k, const chat_msg *msgs, int n, int add_assistant_prompt, const char *default_system,
                char **out, char *err, size_t err_len) {
    sbuf b = {0};
    put(&b, "%s", "");
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            free(b.s);
            snprintf(err, err_len, "chat: unknown role '%s' (system, user, assistant)", r);
            return -1;
        }
    }
    if (k == CHAT_CHATML) {
        if (default_system && (n == 0 || strcmp(msgs[0].role, "system")))
            put(&b, "<|im_start|>system\n%s<|im_end|>\n", default_system);
        for (int i = 0; i < n; i++) put(&b, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role, msgs[i].content);
        if (add_assistant_prompt) put(&b, "<|im_start|>assistant\n");
    } else if (k == CHAT_LLAMA3) {
        for (int i = 0; i < n; i++)
            put(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", msgs[i].role, msgs[i].content);
        if (add_assistant_prompt) put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (k == CHAT_GEMMA) {
        /* Gemma 3's template: roles user and model, a system message folded into the first user turn ("S\n\nU"),
         * every content trimmed of surrounding whitespace (Jinja's | trim) */
        int first = 0;
        const char *sys = NULL;
        if (n > 0 && !strcmp(msgs[0].role, "system")) sys = msgs[0].content, first = 1;
        for (int i = first; i < n; i++) {
            const char *c = msgs[i].content;
            size_t len = strlen(c);
            while (len && strchr(" \t\n\r", c[len - 1])) len--;
            while (len && strchr(" \t\n\r", *c)) c++, len--;
            put(&b, "<start_of_turn>%s\n", strcmp(msgs[i].role, "assistant") ? "user" : "model");
            if (sys && i == first) put(&b, "%s\n\n", sys);
            put(&b, "%.*s<end_of_turn>\n", (int)len, c);
        }
        if (add_assistant_prompt) put(&b, "<start_of_turn>model\n");
    } else {
        const char *sys = NULL;
        for (int i = 0; i < n; i++) {
            if (!strcmp(msgs[i].role, "system")) sys = msgs[i].content;
            else if (!strcmp(msgs[i].role, "user")) {
                if (sys) put(&b, "[INST] %s\n\n%s [/INST]", sys, msgs[i].content), sys = NULL;
                else put(&b, "[INST] %s [/INST]", msgs[i].content);
            } else
                put(&b, " %s</s>", msgs[i].content);
        }
        (void)add_assistant_prompt; /* the open [/INST] is the assistant prompt */
    }
    if (b.oom) {
        free(b.s);
        snprintf(err, err_len, "chat: out of memory");
        return -1;
    }
    *out = b.s;
    return 0;
}

chat_kind chat_model_kind(const gguf_file *f, const char *arch, char **def_sys) {
    const gguf_kv *kv = gguf_find(f, "tokenizer.chat_template");
    char *t = kv && kv->val.type == GGUF_VT_STRING ? strndup(kv->val.v.s.ptr, kv->val.v.s.len) : NULL;
    chat_kind k = chat_detect(t, arch);
    free(t);
    if (def_sys) *def_sys = chat_default_system_from_model(f);
    return k;
}
