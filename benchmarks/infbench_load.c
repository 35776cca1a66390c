/* infbench_load.c — the official InfiniteBench jsonl files (infbench.h), following OpenBMB/InfiniteBench
 * src/eval_utils.py (DATA_NAME_TO_PATH, DATA_NAME_TO_MAX_NEW_TOKENS, create_prompt, get_answer) and src/prompt.py
 * (yarn_mistral_templates, the open models' prompts: yarn-mistral, Yi-200K, chatglm3), read, not copied. The
 * truncation (eval_yarn_mistral.py's truncate_by_tokens: prompt ids cut to their first and last max//2) is
 * kvb_prompt_build's middle cut, the same rule, applied when the prompt is built for the model. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/infbench.h"
#include "benchmarks/jsonl.h"

typedef enum { ANS_STRING, ANS_CHOICE, ANS_LIST, ANS_NUMBER } answer_kind;

typedef struct {
    const char *name, *template;
    int max_new;
    answer_kind answer;
} task_def;

static const task_def TASKS[] = {
    {"passkey",
     "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
     "about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",
     6, ANS_STRING},
    {"number_string",
     "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important "
     "information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",
     12, ANS_STRING},
    {"kv_retrieval", "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",
     50, ANS_STRING},
    {"longbook_sum_eng", "Summarize the book below.\n\n{context}\n\nSummary:", 1200, ANS_LIST},
    {"longbook_choice_eng",
     "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. "
     "{OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is",
     40, ANS_CHOICE},
    {"longbook_qa_eng",
     "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\nQuestion: {question}\nAnswer:",
     40, ANS_LIST},
    {"longdialogue_qa_eng",
     "Below is a dialogue script where one random occurrence of a character name is replaced with \"$$MASK$$\", and "
     "you should try to guess who that character is.\n\n{context}\n\nThe name that has been replaced with $$MASK$$ is "
     "likely",
     40, ANS_LIST},
    {"math_find", "{prefix}\n\n{context}\n\n{input}", 3, ANS_NUMBER},
    {"code_debug",
     "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it "
     "crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe correct "
     "option is:",
     5, ANS_CHOICE},
};

static const task_def *find_task(const char *task) {
    for (size_t i = 0; task && i < sizeof TASKS / sizeof *TASKS; i++)
        if (!strcmp(task, TASKS[i].name)) return &TASKS[i];
    return NULL;
}

int infbench_has_loader(const char *task) { return find_task(task) != NULL; }

int infbench_data_path(const char *data_dir, const char *task, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s/%s.jsonl", data_dir, task);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* math_find's prefix: "What is <m> in the following list?", m = the first match of re "The .+ of" in input
 * (`.` stops at a newline, greedy: the last " of" of that line), lower-cased, " of" dropped. NULL if none. */
static char *math_find_prefix(const char *input) {
    for (const char *p = strstr(input, "The "); p; p = strstr(p + 1, "The ")) {
        const char *eol = p + strcspn(p, "\n"), *last = NULL;
        for (const char *q = p + 5; q + 3 <= eol; q++) /* "The " and at least one character before " of" */
            if (!strncmp(q, " of", 3)) last = q;
        if (!last) continue;
        kvb_sb b = {0};
        kvb_sb_adds(&b, "What is ");
        for (const char *c = p; c < last; c++) { char l = (char)tolower((unsigned char)*c); kvb_sb_add(&b, &l, 1); }
        kvb_sb_adds(&b, " in the following list?");
        return kvb_sb_take(&b);
    }
    return NULL;
}

typedef struct { const char *name, *value; } field;

/* template.format(**fields): each {name} replaced by its value, copied literally. */
static char *render(const char *tmpl, const field *f, int n_f) {
    kvb_sb b = {0};
    for (const char *p = tmpl; *p;) {
        const char *open = strchr(p, '{'), *close = open ? strchr(open, '}') : NULL;
        if (!close) { kvb_sb_adds(&b, p); break; }
        kvb_sb_add(&b, p, (size_t)(open - p));
        for (int i = 0; i < n_f; i++)
            if (strlen(f[i].name) == (size_t)(close - open - 1) && !strncmp(open + 1, f[i].name, strlen(f[i].name)))
                kvb_sb_adds(&b, f[i].value);
        p = close + 1;
    }
    return kvb_sb_take(&b);
}

/* The record's answer as the scorer's label (get_answer): strings into s->answers; choice tasks [text, letter];
 * math_find its number as "%.17g". NULL, or what is wrong. */
static const char *take_answer(const task_def *t, const cJSON *rec, kvb_sample *s) {
    const cJSON *a = kvb_json_get(rec, "answer"), *opt = kvb_json_get(rec, "options"), *x;
    if (cJSON_IsArray(a) && cJSON_GetArraySize(a) == 1 && t->answer != ANS_LIST) a = cJSON_GetArrayItem(a, 0);
    if (t->answer == ANS_NUMBER) {
        char num[40], *end = NULL;
        double v = cJSON_IsNumber(a) ? a->valuedouble : cJSON_IsString(a) ? strtod(a->valuestring, &end) : NAN;
        if (!isfinite(v) || (end && (end == a->valuestring || *end))) return "'answer' is not a number";
        snprintf(num, sizeof num, "%.17g", v);
        return kvb_sample_add_answer(s, num) ? "out of memory" : NULL;
    }
    if (t->answer == ANS_CHOICE) {
        if (cJSON_IsArray(a) && cJSON_GetArraySize(a) == 2) { /* already [text, letter] */
            const cJSON *txt = cJSON_GetArrayItem(a, 0), *l = cJSON_GetArrayItem(a, 1);
            if (!cJSON_IsString(txt) || !cJSON_IsString(l) || strlen(l->valuestring) != 1 || !strchr("ABCD", l->valuestring[0]))
                return "'answer' is a pair but not [text, letter A-D]";
            return kvb_sample_add_answer(s, txt->valuestring) || kvb_sample_add_answer(s, l->valuestring) ? "out of memory" : NULL;
        }
        if (!cJSON_IsString(a)) return "'answer' is not a string";
        int k = 0;
        cJSON_ArrayForEach(x, opt) {
            if (cJSON_IsString(x) && !strcmp(x->valuestring, a->valuestring)) break;
            k++;
        }
        if (k >= 4) return "'answer' is not one of the 4 options";
        char letter[2] = {"ABCD"[k], 0};
        return kvb_sample_add_answer(s, a->valuestring) || kvb_sample_add_answer(s, letter) ? "out of memory" : NULL;
    }
    if (cJSON_IsString(a)) return kvb_sample_add_answer(s, a->valuestring) ? "out of memory" : NULL;
    if (!cJSON_IsArray(a) || !cJSON_GetArraySize(a)) return "'answer' is neither a string nor a non-empty list";
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsString(x)) return "'answer' holds a non-string";
        if (kvb_sample_add_answer(s, x->valuestring)) return "out of memory";
    }
    return NULL;
}

/* One record into s: checks, prompt, answers. NULL, or what is wrong. */
static const char *fill(const task_def *t, const cJSON *rec, long line, kvb_sample *s) {
    const cJSON *ctx = kvb_json_get(rec, "context"), *in = kvb_json_get(rec, "input"), *id = kvb_json_get(rec, "id");
    const cJSON *opt = kvb_json_get(rec, "options");
    if (!cJSON_IsObject(rec)) return "the record is not a JSON object";
    if (!cJSON_IsString(ctx)) return "'context' is missing or not a string";
    if (!cJSON_IsString(in)) return "'input' is missing or not a string";
    if (id && !cJSON_IsNull(id) && (!cJSON_IsNumber(id) || id->valuedouble != floor(id->valuedouble)))
        return "'id' is not an integer";
    int n_opt = t->answer == ANS_CHOICE ? 4 : 0;
    for (int i = 0; i < n_opt; i++)
        if (cJSON_GetArraySize(opt) < 4 || !cJSON_IsString(cJSON_GetArrayItem(opt, i))) return "'options' is not a list of 4 strings";
    const char *bad = take_answer(t, rec, s);
    if (bad) return bad;
    char *prefix = NULL;
    if (!strcmp(t->name, "math_find") && !(prefix = math_find_prefix(in->valuestring)))
        return "math_find 'input' has no \"The ... of\" naming the number to find";
    static const char *const OPTION[4] = {"OPTION_A", "OPTION_B", "OPTION_C", "OPTION_D"};
    field f[8] = {{"context", ctx->valuestring}, {"input", in->valuestring}, {"question", in->valuestring},
                  {"prefix", prefix ? prefix : ""}};
    for (int i = 0; i < n_opt; i++) f[4 + i] = (field){OPTION[i], cJSON_GetArrayItem(opt, i)->valuestring};
    s->prompt = render(t->template, f, 4 + n_opt);
    s->question = render(strstr(t->template, "{context}") + strlen("{context}"), f, 4 + n_opt); /* hidden's question */
    free(prefix);
    char num[32];
    snprintf(num, sizeof num, "%lld", cJSON_IsNumber(id) ? (long long)id->valuedouble : (long long)line);
    s->id = kvb_strdup(num);
    s->task = kvb_strdup(t->name);
    s->context = kvb_strdup(ctx->valuestring);
    s->max_new_tokens = t->max_new;
    s->use_chat = 1; /* as the generators: kvbench's instruct models get the template inside their chat turn */
    return !s->prompt || !s->id || !s->task || !s->context || !s->question ? "out of memory" : NULL;
}

int infbench_load(const char *path, const char *task, int limit, kvb_samples *out, char *err, size_t err_len) {
    const task_def *t = find_task(task);
    if (!t) {
        kvb_seterr(err, err_len, "infinitebench: no loader for task '%s'", task ? task : "(null)");
        return -1;
    }
    kvb_jsonl r = {0};
    int n0 = out->n, rc = kvb_jsonl_open(&r, path, err, err_len), got = 0;
    cJSON *rec;
    while (!rc && (limit <= 0 || got < limit) && (rc = kvb_jsonl_next(&r, &rec, err, err_len)) == 1) {
        kvb_sample s;
        kvb_sample_init(&s);
        const char *bad = fill(t, rec, r.lineno, &s);
        cJSON_Delete(rec);
        if (bad) {
            kvb_seterr(err, err_len, "%s:%ld: %s", path, r.lineno, bad);
            kvb_sample_free(&s);
            rc = -1;
        } else if (kvb_samples_push(out, &s)) {
            kvb_seterr(err, err_len, "%s:%ld: out of memory", path, r.lineno);
            rc = -1;
        } else {
            rc = 0;
            got++;
        }
    }
    kvb_jsonl_close(&r);
    if (rc < 0) kvb_samples_truncate(out, n0);
    return rc < 0 ? -1 : 0;
}
