/* chat.h — chat templates (chatml, llama3, mistral, gemma) rendered in C, multi-turn.
 * Picked from the GGUF tokenizer.chat_template text and arch, or by name. */
#ifndef KVB_CHAT_H
#define KVB_CHAT_H

#include <stddef.h>

#include "engine/gguf.h"

typedef enum { CHAT_CHATML = 0, CHAT_LLAMA3, CHAT_MISTRAL, CHAT_GEMMA } chat_kind;

typedef struct {
    const char *role; /* "system", "user" or "assistant" */
    const char *content;
} chat_msg;

/* Template kind from a Jinja template text (may be NULL or "") and arch (gemma3 without a template: gemma);
 * chatml when nothing matches. */
chat_kind chat_detect(const char *jinja_template, const char *arch);
/* Kind by name ("chatml", "llama3", "mistral", "gemma"); 0 = ok. */
int chat_kind_from_name(const char *name, chat_kind *out);
const char *chat_kind_name(chat_kind k);
/* The default system prompt a chatml template inserts when the first message is not a system message
 * (e.g. SmolLM2's), malloc'd; NULL when the template has none. */
char *chat_default_system(const char *jinja_template);
/* Same, from a model's metadata. */
char *chat_default_system_from_model(const gguf_file *f);
/* The model's template kind (tokenizer.chat_template, else by arch) and, when def_sys is given, its default
 * system prompt (malloc'd or NULL). */
chat_kind chat_model_kind(const gguf_file *f, const char *arch, char **def_sys);
/* Render messages; add_assistant_prompt opens the assistant turn. default_system (may be NULL) is used
 * when the first message is not a system message (chatml only, as the model's template does). 0 = ok. */
int chat_render(chat_kind k, const chat_msg *msgs, int n, int add_assistant_prompt, const char *default_system,
                char **out, char *err, size_t err_len);

#endif
