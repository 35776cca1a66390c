/* scbench.c — SCBench's records, prompts (both modes) and per-turn scorers (scbench.h), following
 * microsoft/MInference scbench/ (eval_utils.py, run_scbench.py, compute_scores.py, repo_qa_utils.py). */
#include "benchmarks/scbench.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchmarks/infbench.h"
#include "benchmarks/jsonl.h"
#include "benchmarks/rouge.h"

#define ERR(...) (kvb_seterr(err, err_len, __VA_ARGS__), -1)

/* ---- the task table: templates of eval_utils.py, DATA_NAME_TO_MAX_NEW_TOKENS, capability group ---- */

enum { K_PLAIN, K_CHOICE, K_QA, K_MF, K_SUMMARY }; /* how create_*_prompt fills a task's templates */

typedef struct {
    const char *name, *group;
    int kind, max_new;  /* max_new 0: per turn task (the multi-tasking sets) */
    const char *first;  /* multiturn_templates */
    const char *follow; /* multiturn_follow_up_templates_in_chat_tempate */
    const char *scdq;   /* multiturn_templates_scdq (the context part); the query part is `follow` */
} scb_task;

#define STR "String Retrieval"
#define SEM "Semantic Retrieval"
#define GLO "Global Information"
#define MUL "Multi-tasking"
#define KV_HEAD "Extract the value corresponding to the specified key in the JSON object below.\n\n"
#define CHOICE_Q "Question: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe the correct answer is"
#define REPOQA_HEAD "Based on the function description and code context, please retrieve and repeat the exact described function from the code context in a code block wrapped by ```:\n\n"
#define QA_HEAD "Read the book and answer the question. Be very concise in your answer.\n\n"
#define CHN_HEAD "\xe9\x98\x85\xe8\xaf\xbb\xe4\xbb\xa5\xe4\xb8\x8b\xe4\xb9\xa6\xe7\xb1\x8d\xe7\x84\xb6\xe5\x90\x8e\xe5\x9b\x9e\xe7\xad\x94\xe9\x97\xae\xe9\xa2\x98\xe3\x80\x82\n\n"
#define CHN_Q "\xe9\x97\xae\xe9\xa2\x98\xef\xbc\x9a{question}\n\xe7\xad\x94\xe6\xa1\x88\xef\xbc\x9a"

static const scb_task TASKS[] = {
    {"scbench_kv", STR, K_PLAIN, 150, KV_HEAD "{context}\n\n{input}", "{input}", KV_HEAD "{context}"},
    {"scbench_prefix_suffix", STR, K_PLAIN, 150, "{context}\n\n{input}", "{input}", "{context}"},
    {"scbench_vt", STR, K_PLAIN, 30, "{context}\n\n{input}", "{input}", "{context}"},
    {"scbench_repoqa", SEM, K_PLAIN, 1024, REPOQA_HEAD "{context}\n\n{input}", "{input}", REPOQA_HEAD "{context}"},
    {"scbench_qa_eng", SEM, K_QA, 40, QA_HEAD "{context}\n\nQuestion: {question}\nAnswer:", "Question: {question}\nAnswer:",
     QA_HEAD "{context}"},
    {"scbench_qa_chn", SEM, K_QA, 40, CHN_HEAD "{context}\n\n" CHN_Q, CHN_Q, CHN_HEAD "{context}"},
    {"scbench_choice_eng", SEM, K_CHOICE, 40, "Read the book and answer the question.\n\n{context}\n\n" CHOICE_Q, CHOICE_Q,
     "Read the book and answer the question.\n\n{context}"},
    {"scbench_many_shot", GLO, K_PLAIN, 10, "{context}\n\n{input}", "{input}", "{context}"},
    {"scbench_mf", GLO, K_MF, 5, "{prefix}\n\n{context}\n\n{input}", "{prefix}\n\n{input}", "{prefix}\n\n{context}"},
    {"scbench_summary", GLO, K_SUMMARY, 200, "{context}\n\n{input}", "{input}", "{context}"},
    {"scbench_summary_with_needles", MUL, K_PLAIN, 0, "{context}\n\n{input}", "{input}", "{context}"},
    {"scbench_repoqa_and_kv", MUL, K_PLAIN, 0, "{context}\n\n{input}", "{input}", "{context}"},
};
#define N_TASKS ((int)(sizeof TASKS / sizeof TASKS[0]))

static const scb_task *find_task(const char *name) {
    for (int i = 0; name && i < N_TASKS; i++)
        if (!strcmp(TASKS[i].name, name)) return &TASKS[i];
    return NULL;
}

int scb_task_known(const char *task) { return find_task(task) != NULL; }

const char *scb_task_group(const char *task) {
    const scb_task *t = find_task(task);
    return t ? t->group : NULL;
}

int scb_data_path(const char *dir, const char *task, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s/%s.jsonl", dir, task);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int scb_max_new_tokens(const char *task, const char *turn_task) {
    const scb_task *t = find_task(task);
    if (!t) return 0;
    if (t->max_new) return t->max_new;
    static const struct { const char *set, *turn; int n; } PER[] = {
        {"scbench_summary_with_needles", "scbench_summary", 800}, {"scbench_summary_with_needles", "scbench_passkey", 15},
        {"scbench_repoqa_and_kv", "scbench_repoqa", 1024}, {"scbench_repoqa_and_kv", "scbench_kv", 80}};
    for (size_t i = 0; turn_task && i < sizeof PER / sizeof PER[0]; i++)
        if (!strcmp(PER[i].set, task) && !strcmp(PER[i].turn, turn_task)) return PER[i].n;
    return 0;
}

/* ---- Python's str() of a JSON value, and str.format over a template ---- */

static void py_repr_str(kvb_sb *b, const char *s) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    kvb_sb_add(b, &q, 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\' || *p == (unsigned char)q) kvb_sb_addf(b, "\\%c", *p);
        else if (*p == '\n') kvb_sb_adds(b, "\\n");
        else if (*p == '\r') kvb_sb_adds(b, "\\r");
        else if (*p == '\t') kvb_sb_adds(b, "\\t");
        else if (*p < 0x20 || *p == 0x7f) kvb_sb_addf(b, "\\x%02x", *p);
        else kvb_sb_add(b, (const char *)p, 1);
    }
    kvb_sb_add(b, &q, 1);
}

static void py_str(kvb_sb *b, const cJSON *v, int repr) {
    if (cJSON_IsString(v)) {
        if (repr) py_repr_str(b, v->valuestring);
        else kvb_sb_adds(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 9e15) kvb_sb_addf(b, "%lld", (long long)d);
        else kvb_sb_addf(b, "%.17g", d);
    } else if (cJSON_IsBool(v)) {
        kvb_sb_adds(b, cJSON_IsTrue(v) ? "True" : "False");
    } else if (cJSON_IsNull(v)) {
        kvb_sb_adds(b, "None");
    } else if (cJSON_IsArray(v)) {
        const cJSON *x;
        int first = 1;
        kvb_sb_adds(b, "[");
        cJSON_ArrayForEach(x, v) {
            if (!first) kvb_sb_adds(b, ", ");
            py_str(b, x, 1);
            first = 0;
        }
        kvb_sb_adds(b, "]");
    } else {
        kvb_sb_adds(b, "{...}"); /* objects do not occur in SCBench's fields */
    }
}

static char *py_str_dup(const cJSON *v) {
    kvb_sb b = {0};
    py_str(&b, v, 0);
    return kvb_sb_take(&b);
}

/* str.format(**kv): each {name} of tmpl replaced by its value (one pass; values are not searched again). */
static char *format(const char *tmpl, const char *const *keys, const char *const *vals, int n) {
    kvb_sb b = {0};
    for (const char *p = tmpl; *p;) {
        const char *o = strchr(p, '{');
        if (!o) { kvb_sb_adds(&b, p); break; }
        kvb_sb_add(&b, p, (size_t)(o - p));
        const char *c = strchr(o, '}');
        int hit = 0;
        for (int i = 0; c && i < n; i++)
            if ((size_t)(c - o - 1) == strlen(keys[i]) && !strncmp(o + 1, keys[i], (size_t)(c - o - 1))) {
                kvb_sb_adds(&b, vals[i] ? vals[i] : "None");
                hit = 1;
                break;
            }
        if (!hit) { kvb_sb_add(&b, o, c ? (size_t)(c - o + 1) : 1); }
        p = hit || c ? c + 1 : o + 1;
    }
    return kvb_sb_take(&b);
}

/* scbench_mf's prefix: "What is " + re.findall(r"The .+ is", input)[0].lower()[:-3] + "?"; NULL when no match. */
static char *mf_prefix(const char *input) {
    for (const char *p = strstr(input, "The "); p; p = strstr(p + 1, "The ")) {
        const char *eol = strchr(p + 4, '\n');
        if (!eol) eol = p + strlen(p);
        /* greedy .+ then " is": the last " is" of the line with at least one character before it */
        for (const char *q = eol - 3; q >= p + 5; q--) /* .+ takes at least one character */
            if (!strncmp(q, " is", 3)) {
                kvb_sb b = {0};
                kvb_sb_adds(&b, "What is ");
                for (const char *x = p; x < q; x++) {
                    char ch = (char)tolower((unsigned char)*x);
                    kvb_sb_add(&b, &ch, 1);
                }
                kvb_sb_adds(&b, "?");
                return kvb_sb_take(&b);
            }
    }
    return NULL;
}

/* ---- loading ---- */

/* The middle cut of the context to max tokens: its first and last h bytes (whole UTF-8 characters), h the largest
 * tried whose halves count at most max tokens together. malloc'd. */
static char *cut_context(const char *ctx, const scb_opts *o) {
    size_t len = strlen(ctx);
    if (o->max_context_tokens <= 0 || !o->count_tokens) return strdup(ctx);
    int64_t n = o->count_tokens(o->tok_ctx, ctx);
    if (n >= 0 && n <= o->max_context_tokens) return strdup(ctx);
    double h = n > 0 ? (double)len * (double)o->max_context_tokens / (2.0 * (double)n) : (double)len / 2;
    for (int tries = 0; tries < 60; tries++, h *= 0.97) {
        size_t a = (size_t)h, z = len - (size_t)h;
        while (a > 0 && ((unsigned char)ctx[a] & 0xc0) == 0x80) a--;
        while (z < len && ((unsigned char)ctx[z] & 0xc0) == 0x80) z++;
        char *head = strndup(ctx, a);
        int64_t t = head ? o->count_tokens(o->tok_ctx, head) + o->count_tokens(o->tok_ctx, ctx + z) : -1;
        if (t >= 0 && t <= o->max_context_tokens) {
            kvb_sb b = {0};
            kvb_sb_adds(&b, head);
            kvb_sb_adds(&b, ctx + z);
            free(head);
            return kvb_sb_take(&b);
        }
        free(head);
    }
    return strdup("");
}

/* The template values of one turn: input, question (= input), OPTION_A..D, prefix. */
typedef struct { const char *keys[7]; const char *vals[7]; char *own[2]; } turn_vals;

static const char *turn_fill(const scb_task *t, const cJSON *turn, turn_vals *v) {
    memset(v, 0, sizeof *v);
    static const char *const K[7] = {"input", "question", "OPTION_A", "OPTION_B", "OPTION_C", "OPTION_D", "prefix"};
    memcpy(v->keys, K, sizeof K);
    const cJSON *in = kvb_json_get(turn, "input");
    if (!cJSON_IsString(in)) return "a turn's 'input' is missing or not a string";
    v->vals[0] = v->vals[1] = in->valuestring;
    if (t->kind == K_CHOICE) {
        const cJSON *op = kvb_json_get(turn, "options");
        if (!cJSON_IsArray(op) || cJSON_GetArraySize(op) < 4) return "a turn's 'options' is not a list of four";
        for (int i = 0; i < 4; i++) {
            const cJSON *x = cJSON_GetArrayItem(op, i);
            if (!cJSON_IsString(x)) return "a turn's 'options' holds a non-string";
            v->vals[2 + i] = x->valuestring;
        }
    }
    if (t->kind == K_MF) {
        if (!(v->own[0] = mf_prefix(in->valuestring))) return "an scbench_mf turn's input has no \"The ... is\"";
        v->vals[6] = v->own[0];
    }
    return NULL;
}

static void turn_vals_free(turn_vals *v) { free(v->own[0]), free(v->own[1]); }

/* A label as the official scorer iterates it: a list's strings (numbers as str()), or a string's characters. */
static int add_labels(kvb_sample *s, const cJSON *ans, int split_chars) {
    if (cJSON_IsArray(ans)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, ans) {
            char *v = py_str_dup(x);
            int rc = v ? kvb_sample_add_answer(s, v) : -1;
            free(v);
            if (rc) return -1;
        }
        return 0;
    }
    char *v = py_str_dup(ans);
    if (!v) return -1;
    int rc = 0;
    if (split_chars && cJSON_IsString(ans)) {
        for (const char *p = v; *p && !rc;) {
            size_t k = 1;
            while (p[k] && ((unsigned char)p[k] & 0xc0) == 0x80) k++;
            char ch[8] = {0};
            memcpy(ch, p, k < 7 ? k : 7);
            rc = kvb_sample_add_answer(s, ch);
            p += k;
        }
    } else {
        rc = kvb_sample_add_answer(s, v);
    }
    free(v);
    return rc;
}

static int add_class(kvb_sample *s, const char *v) {
    char **a = realloc(s->all_classes, (size_t)(s->n_classes + 1) * sizeof *a);
    if (!a) return -1;
    s->all_classes = a;
    if (!(a[s->n_classes] = strdup(v ? v : ""))) return -1;
    s->n_classes++;
    return 0;
}

/* The labels, scoring task and needles of turn k (0-based) of a record whose first n_used turns are asked. */
static const char *turn_labels(const scb_task *t, const cJSON *turns, int k, int n_used, kvb_sample *s) {
    const cJSON *turn = cJSON_GetArrayItem(turns, k), *ans = kvb_json_get(turn, "answer");
    if (!ans || cJSON_IsNull(ans)) return "a turn's 'answer' is missing";
    const char *sub = t->name;
    if (t->max_new == 0) { /* the multi-tasking sets: the turn's own task */
        const cJSON *tt = kvb_json_get(turn, "task");
        if (!cJSON_IsString(tt) || !scb_max_new_tokens(t->name, tt->valuestring))
            return "a turn's 'task' is missing or not one of its set";
        sub = tt->valuestring;
    }
    if (add_class(s, sub)) return "out of memory";
    int rc = 0;
    if (!strcmp(t->name, "scbench_choice_eng")) { /* get_ground_truth: [answer, OPTIONS[options.index(answer)]] */
        const cJSON *op = kvb_json_get(turn, "options");
        int at = -1;
        for (int i = 0; cJSON_IsString(ans) && i < cJSON_GetArraySize(op) && at < 0; i++)
            if (cJSON_IsString(cJSON_GetArrayItem(op, i)) && !strcmp(cJSON_GetArrayItem(op, i)->valuestring, ans->valuestring)) at = i;
        if (at < 0 || at > 3) return "a choice turn's 'answer' is not one of the first four of its 'options'";
        char letter[2] = {"ABCD"[at], 0};
        rc = kvb_sample_add_answer(s, ans->valuestring) || kvb_sample_add_answer(s, letter);
    } else if (!strcmp(t->name, "scbench_qa_eng")) { /* [answer]: the answer whole */
        rc = add_labels(s, ans, 0);
    } else if (!strcmp(sub, "scbench_many_shot") || !strcmp(sub, "scbench_qa_chn") || !strcmp(sub, "scbench_vt")) {
        rc = add_labels(s, ans, 1);
    } else {
        if (!strcmp(sub, "scbench_repoqa") && !cJSON_IsString(ans)) return "a repoqa turn's 'answer' is not a string";
        rc = add_labels(s, ans, 0);
    }
    if (rc) return "out of memory";
    if (!strcmp(sub, "scbench_repoqa")) { /* [1] = own name, then (name, code) of every repoqa turn asked */
        const cJSON *nm = kvb_json_get(turn, "name");
        if (!cJSON_IsString(nm)) return "a repoqa turn's 'name' is missing or not a string";
        if (add_class(s, nm->valuestring)) return "out of memory";
        for (int j = 0; j < n_used; j++) {
            const cJSON *x = cJSON_GetArrayItem(turns, j), *xt = kvb_json_get(x, "task"), *xn = kvb_json_get(x, "name"), *xa = kvb_json_get(x, "answer");
            if (t->max_new == 0 && (!cJSON_IsString(xt) || strcmp(xt->valuestring, "scbench_repoqa"))) continue;
            if (!cJSON_IsString(xn) || !cJSON_IsString(xa)) return "a repoqa turn's 'name' or 'answer' is not a string";
            if (add_class(s, xn->valuestring) || add_class(s, xa->valuestring)) return "out of memory";
        }
    }
    s->max_new_tokens = scb_max_new_tokens(t->name, sub);
    return NULL;
}

/* The first user message's text (multi-turn) or the context part (scdq, with the turn's query appended by the
 * caller): tmpl filled with the context and turn 0's values. */
static char *fill(const char *tmpl, const char *ctx, const turn_vals *v) {
    const char *keys[8], *vals[8];
    keys[0] = "context", vals[0] = ctx;
    for (int i = 0; i < 7; i++) keys[i + 1] = v->keys[i], vals[i + 1] = v->vals[i];
    return format(tmpl, keys, vals, 8);
}

/* The text of tmpl after "{context}", filled (the question part of a prompt whose context ends there). */
static char *after_context(const char *tmpl, const turn_vals *v) {
    const char *c = strstr(tmpl, "{context}");
    return format(c ? c + 9 : tmpl, v->keys, v->vals, 7);
}

/* The task-name suffix of a mode: "_scdq" (multi-request), "_reuse" (multi-turn with KV cache reuse), or "". */
static const char *mode_suffix(const scb_opts *o) { return o->multi_request ? "_scdq" : o->kv_reuse ? "_reuse" : ""; }

static const char *make_turn(const scb_task *t, const scb_opts *o, const cJSON *rec, const char *rid, const char *ctx,
                             int k, int n_used, kvb_sample *s) {
    const cJSON *turns = kvb_json_get(rec, "multi_turns");
    char buf[256];
    snprintf(buf, sizeof buf, "%s/t%d", rid, k + 1);
    s->id = kvb_strdup(buf);
    snprintf(buf, sizeof buf, "%s%s", t->name, mode_suffix(o));
    s->task = kvb_strdup(buf);
    snprintf(buf, sizeof buf, "turn=%d", k + 1);
    s->qtype = kvb_strdup(buf);
    s->domain = kvb_strdup(t->group);
    s->use_chat = 1;
    s->context = kvb_strdup(ctx);
    if (!s->id || !s->task || !s->qtype || !s->domain || !s->context) return "out of memory";
    const char *bad = turn_labels(t, turns, k, n_used, s);
    if (bad) return bad;
    turn_vals v;
    if (o->multi_request) {
        snprintf(buf, sizeof buf, "%s/%s", t->name, rid);
        if (!(s->group = kvb_strdup(buf))) return "out of memory";
        if ((bad = turn_fill(t, cJSON_GetArrayItem(turns, k), &v))) return turn_vals_free(&v), bad;
        /* scbench_mf's context part takes turn 0's input itself as its {prefix} (create_scdq_prompt); the query
         * part has the turn's "What is ...?" */
        turn_vals v0;
        if ((bad = turn_fill(t, cJSON_GetArrayItem(turns, 0), &v0))) return turn_vals_free(&v), turn_vals_free(&v0), bad;
        if (t->kind == K_MF) v0.vals[6] = v0.vals[0];
        char *head = fill(t->scdq, ctx, &v0), *query = format(t->follow, v.keys, v.vals, 7);
        char *tail = after_context(t->scdq, &v0);
        turn_vals_free(&v), turn_vals_free(&v0);
        kvb_sb b = {0}, q = {0};
        kvb_sb_adds(&b, head ? head : ""), kvb_sb_adds(&b, query ? query : "");
        kvb_sb_adds(&q, tail ? tail : ""), kvb_sb_adds(&q, query ? query : "");
        free(head), free(query), free(tail);
        s->prompt = kvb_sb_take(&b);
        s->question = kvb_sb_take(&q);
        return s->prompt && s->question ? NULL : "out of memory";
    }
    if (o->kv_reuse) { /* the record's turns carry one cache (shared_prefill.h); the group is named after the
                        * task, so no multi-request group of the same record can take its prefill */
        snprintf(buf, sizeof buf, "%s/%s", s->task, rid);
        if (!(s->group = kvb_strdup(buf))) return "out of memory";
        s->carried = 1;
    }
    if ((bad = turn_fill(t, cJSON_GetArrayItem(turns, 0), &v))) return turn_vals_free(&v), bad;
    char *first = fill(t->first, ctx, &v);
    if (k == 0) {
        s->question = after_context(t->first, &v);
        turn_vals_free(&v);
        s->prompt = first;
        return s->prompt && s->question ? NULL : "out of memory";
    }
    turn_vals_free(&v);
    int rc = !first || kvb_sample_add_turn(s, "user", first, NULL);
    free(first);
    for (int j = 1; !rc && j <= k; j++) {
        char *prev = py_str_dup(kvb_json_get(cJSON_GetArrayItem(turns, j - 1), "answer"));
        rc = !prev || kvb_sample_add_turn(s, "assistant", prev, NULL);
        free(prev);
        if (rc) break;
        if ((bad = turn_fill(t, cJSON_GetArrayItem(turns, j), &v))) return turn_vals_free(&v), bad;
        char *u = format(t->follow, v.keys, v.vals, 7);
        turn_vals_free(&v);
        if (!u) return "out of memory";
        if (j < k) rc = kvb_sample_add_turn(s, "user", u, NULL), free(u);
        else s->question = u;
    }
    if (rc) return "out of memory";
    if (t->kind == K_SUMMARY && !(s->prefill = kvb_strdup("This paper"))) return "out of memory";
    return NULL;
}

/* One record into out (its first max_turns turns), *repo its "repo" (malloc'd) or NULL; NULL, or what is wrong. */
static const char *take_record(const scb_task *t, const scb_opts *o, const cJSON *rec, long line, kvb_samples *out,
                               char **repo) {
    if (!cJSON_IsObject(rec)) return "the record is not a JSON object";
    const cJSON *turns = kvb_json_get(rec, "multi_turns"), *c = kvb_json_get(rec, "context"), *id = kvb_json_get(rec, "id");
    if (!c) c = kvb_json_get(rec, "input");
    if (!cJSON_IsArray(turns) || !cJSON_GetArraySize(turns)) return "'multi_turns' is missing or not a non-empty list";
    if (!cJSON_IsString(c) && !(t->kind == K_MF && cJSON_IsArray(c))) return "'context' is missing or not a string";
    for (int k = 0; k < cJSON_GetArraySize(turns); k++)
        if (!cJSON_IsObject(cJSON_GetArrayItem(turns, k))) return "a turn is not a JSON object";
    const cJSON *rp = kvb_json_get(rec, "repo");
    if (cJSON_IsString(rp) && !(*repo = strdup(rp->valuestring))) return "out of memory";
    char rid[96];
    if (cJSON_IsNumber(id)) snprintf(rid, sizeof rid, "%lld", (long long)id->valuedouble);
    else if (cJSON_IsString(id)) snprintf(rid, sizeof rid, "%.90s", id->valuestring);
    else snprintf(rid, sizeof rid, "line%ld", line);
    char *raw = py_str_dup(c), *ctx = raw ? cut_context(raw, o) : NULL;
    free(raw);
    if (!ctx) return "out of memory";
    int n = cJSON_GetArraySize(turns), max = o->max_turns > 0 ? o->max_turns : 5;
    if (n > max) n = max;
    const char *bad = NULL;
    for (int k = 0; k < n && !bad; k++) {
        kvb_sample s;
        kvb_sample_init(&s);
        bad = make_turn(t, o, rec, rid, ctx, k, n, &s);
        if (bad) kvb_sample_free(&s);
        else if (kvb_samples_push(out, &s)) bad = "out of memory";
    }
    free(ctx);
    return bad;
}

/* A loaded record: its repo (NULL: none) and its samples [first, end). */
typedef struct { char *repo; int first, end; } rec_span;

/* The needles of a repoqa sample of record i: compute_scores' needle_by_repo, every repoqa turn asked of every
 * record of the same repo, in file order. Each sample holds its own record's needles (all_classes[2..]) on entry;
 * the pooled lists are built from those first, then set. 0 / -1 (out of memory). */
static int pool_needles(kvb_samples *out, const rec_span *rs, int n_rec) {
    int rc = 0;
    char ***pooled = calloc((size_t)n_rec + 1, sizeof *pooled);
    int *n_pooled = calloc((size_t)n_rec + 1, sizeof *n_pooled);
    if (!pooled || !n_pooled) rc = -1;
    /* own[i]: a repoqa sample of record i (its needles are record i's own), or NULL */
    for (int i = 0; !rc && i < n_rec; i++) {
        if (!rs[i].repo) continue;
        for (int j = 0; !rc && j < n_rec; j++) {
            if (!rs[j].repo || strcmp(rs[i].repo, rs[j].repo)) continue;
            const kvb_sample *own = NULL;
            for (int k = rs[j].first; k < rs[j].end && !own; k++)
                if (out->v[k].n_classes >= 2 && !strcmp(out->v[k].all_classes[0], "scbench_repoqa")) own = &out->v[k];
            for (int c = 2; own && !rc && c < own->n_classes; c++) {
                char **g = realloc(pooled[i], (size_t)(n_pooled[i] + 1) * sizeof *g);
                if (!g || !(g[n_pooled[i]] = strdup(own->all_classes[c]))) { rc = -1; if (g) pooled[i] = g; break; }
                pooled[i] = g, n_pooled[i]++;
            }
        }
    }
    for (int i = 0; !rc && i < n_rec; i++)
        for (int k = rs[i].first; pooled[i] && !rc && k < rs[i].end; k++) {
            kvb_sample *s = &out->v[k];
            if (s->n_classes < 2 || strcmp(s->all_classes[0], "scbench_repoqa")) continue;
            for (int c = 2; c < s->n_classes; c++) free(s->all_classes[c]);
            s->n_classes = 2;
            for (int c = 0; !rc && c < n_pooled[i]; c++) rc = add_class(s, pooled[i][c]);
        }
    for (int i = 0; pooled && i < n_rec; i++) {
        for (int c = 0; c < n_pooled[i]; c++) free(pooled[i][c]);
        free(pooled[i]);
    }
    free(pooled), free(n_pooled);
    return rc;
}

int scb_load(const char *path, const char *task, const scb_opts *o, kvb_samples *out, char *err, size_t err_len) {
    const scb_task *t = find_task(task);
    if (!t) return ERR("SCBench: unknown task \"%s\"", task ? task : "");
    kvb_jsonl r;
    if (kvb_jsonl_open(&r, path, err, err_len)) return -1;
    int n0 = out->n, rc = 0, got = 0, cap = 0;
    rec_span *rs = NULL;
    cJSON *rec;
    while (o->limit <= 0 || got < o->limit) {
        int k = kvb_jsonl_next(&r, &rec, err, err_len);
        if (k <= 0) { rc = k; break; }
        if (got == cap) {
            rec_span *g = realloc(rs, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *g);
            if (!g) { cJSON_Delete(rec); rc = ERR("%s:%ld: out of memory", path, r.lineno); break; }
            rs = g;
        }
        rs[got] = (rec_span){NULL, out->n, out->n};
        const char *bad = take_record(t, o, rec, r.lineno, out, &rs[got].repo);
        rs[got].end = out->n;
        cJSON_Delete(rec);
        got++;
        if (bad) { rc = ERR("%s:%ld: %s", path, r.lineno, bad); break; }
    }
    kvb_jsonl_close(&r);
    int a, b;
    if (!rc && kvb_samples_find_dup_id(out, n0, &a, &b) == 1)
        rc = ERR("%s: two records share the id of sample %s", path, out->v[b].id);
    if (!rc && pool_needles(out, rs, got)) rc = ERR("%s: out of memory", path);
    for (int i = 0; i < got; i++) free(rs[i].repo);
    free(rs);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}

/* ---- scoring (compute_scores.py) ---- */

static int ascii_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }

static char *strip_dup(const char *s) {
    while (*s && ascii_space((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && ascii_space((unsigned char)s[n - 1])) n--;
    return strndup(s, n);
}

static char *case_dup(const char *s, int upper) {
    char *d = strdup(s);
    for (char *p = d; p && *p; p++) *p = (char)(upper ? toupper((unsigned char)*p) : tolower((unsigned char)*p));
    return d;
}

/* string_match_all: round(sum(r.lower() in pred.lower()) / len(ref), 2) */
static double match_all(const char *pred, char *const *refs, int n) {
    if (n <= 0) return 0;
    char *p = case_dup(pred, 0);
    int hit = 0;
    for (int i = 0; p && i < n; i++) {
        char *r = case_dup(refs[i], 0);
        hit += r && strstr(p, r) != NULL;
        free(r);
    }
    free(p);
    return round((double)hit / n * 100.0) / 100.0; /* Python's round(x, 2) on these ratios: no exact halves but k/8 */
}

/* compute_scores.get_score_one_longdialogue_qa_eng: 1 when some label, upper-cased, is in the stripped,
 * upper-cased prediction */
static double dialogue_in(const char *pred, char *const *labels, int n) {
    char *s = strip_dup(pred), *p = s ? case_dup(s, 1) : NULL;
    free(s);
    int hit = 0;
    for (int i = 0; p && i < n && !hit; i++) {
        char *l = case_dup(labels[i], 1);
        hit = l && strstr(p, l) != NULL;
        free(l);
    }
    free(p);
    return hit;
}

/* first_int_match: the first run of ASCII digits, or "" */
static void first_int(const char *p, char *out, size_t cap) {
    while (*p && !isdigit((unsigned char)*p)) p++;
    size_t n = 0;
    while (p[n] && isdigit((unsigned char)p[n])) n++;
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
}

/* math_find with an integer label: the first \d+\.\d+|\d+ as int(float(x)) */
static double math_find(const char *pred, const char *label) {
    const char *p = pred;
    while (*p && !isdigit((unsigned char)*p)) p++;
    if (!*p) return 0;
    double v = strtod(p, NULL); /* digits, then an optional .digits: what the regex takes (no sign, no exponent) */
    const char *e = p;
    while (isdigit((unsigned char)*e)) e++;
    if (*e == '.' && isdigit((unsigned char)e[1])) {
        e++;
        while (isdigit((unsigned char)*e)) e++;
    }
    char *num = strndup(p, (size_t)(e - p));
    v = num ? strtod(num, NULL) : 0;
    free(num);
    return (long long)v == strtoll(label, NULL, 10);
}

/* normalize_zh_answer on one code point: lower-cased, "" when it is whitespace or punctuation (ASCII or its list) */
static int zh_kept(const char *ch) {
    static const char *const CN =
        "\xef\xbc\x81\xef\xbc\x9f\xef\xbd\xa1\xe3\x80\x82\xef\xbc\x82\xef\xbc\x83\xef\xbc\x84\xef\xbc\x85\xef\xbc\x86"
        "\xef\xbc\x87\xef\xbc\x88\xef\xbc\x89\xef\xbc\x8a\xef\xbc\x8b\xef\xbc\x8c\xef\xbc\x8d\xef\xbc\x8f\xef\xbc\x9a"
        "\xef\xbc\x9b\xef\xbc\x9c\xef\xbc\x9d\xef\xbc\x9e\xef\xbc\xa0\xef\xbc\xbb\xef\xbc\xbc\xef\xbc\xbd\xef\xbc\xbe"
        "\xef\xbc\xbf\xef\xbd\x80\xef\xbd\x9b\xef\xbd\x9c\xef\xbd\x9d\xef\xbd\x9e\xef\xbd\x9f\xef\xbd\xa0\xef\xbd\xa2"
        "\xef\xbd\xa3\xef\xbd\xa4\xe3\x80\x81\xe3\x80\x83\xe3\x80\x8b\xe3\x80\x8c\xe3\x80\x8d\xe3\x80\x8e\xe3\x80\x8f"
        "\xe3\x80\x90\xe3\x80\x91\xe3\x80\x94\xe3\x80\x95\xe3\x80\x96\xe3\x80\x97\xe3\x80\x98\xe3\x80\x99\xe3\x80\x9a"
        "\xe3\x80\x9b\xe3\x80\x9c\xe3\x80\x9d\xe3\x80\x9e\xe3\x80\x9f\xe3\x80\xb0\xe3\x80\xbe\xe3\x80\xbf\xe2\x80\x93"
        "\xe2\x80\x94\xe2\x80\x98\xe2\x80\x99\xe2\x80\x9b\xe2\x80\x9c\xe2\x80\x9d\xe2\x80\x9e\xe2\x80\x9f\xe2\x80\xa6"
        "\xe2\x80\xa7\xef\xb9\x8f";
    unsigned char c = (unsigned char)ch[0];
    if (c < 0x80) return !(ascii_space(c) || ispunct(c));
    size_t k = strlen(ch);
    for (const char *p = CN; *p; p += k) /* every entry of the list is 3 bytes; a 3-byte code point compares */
        if (k == 3 && !strncmp(p, ch, 3)) return 0;
    return 1;
}

/* The code points of s kept by normalize_zh_answer, lower-cased, into a malloc'd array of 8-byte strings. */
static int zh_chars(const char *s, char (**out)[8]) {
    size_t n = strlen(s);
    char (*v)[8] = calloc(n + 1, sizeof *v);
    int m = 0;
    if (!v) return -1;
    for (const char *p = s; *p;) {
        size_t k = 1;
        while (p[k] && ((unsigned char)p[k] & 0xc0) == 0x80 && k < 4) k++;
        memcpy(v[m], p, k);
        v[m][k] = 0;
        if (k == 1) v[m][0] = (char)tolower((unsigned char)v[m][0]);
        if (zh_kept(v[m])) m++;
        p += k;
    }
    *out = v;
    return m;
}

/* qa_f1_score_zh: character F1 (Counter intersection), the best over the labels */
static double qa_f1_zh(const char *pred, char *const *labels, int n) {
    char (*pc)[8] = NULL;
    int np = zh_chars(pred, &pc);
    double best = 0;
    for (int i = 0; np >= 0 && i < n; i++) {
        char (*lc)[8] = NULL;
        int nl = zh_chars(labels[i], &lc);
        if (nl < 0) break;
        int same = 0;
        char *used = calloc((size_t)nl + 1, 1);
        for (int a = 0; used && a < np; a++)
            for (int b = 0; b < nl; b++)
                if (!used[b] && !strcmp(pc[a], lc[b])) { used[b] = 1, same++; break; }
        free(used), free(lc);
        if (same) {
            double prec = (double)same / np, rec = (double)same / nl, f1 = 2 * prec * rec / (prec + rec);
            if (f1 > best) best = f1;
        }
    }
    free(pc);
    return best;
}

/* ---- repoqa: nltk BLEU with method4 smoothing ---- */

typedef struct { const char **w; size_t *len; int n; } words;

/* re.split(r"\s+", s.strip()): "" gives one empty word. Points into s (not copied). */
static int split_ws(const char *s, words *out) {
    size_t n = strlen(s), a = 0;
    while (a < n && ascii_space((unsigned char)s[a])) a++;
    while (n > a && ascii_space((unsigned char)s[n - 1])) n--;
    out->w = malloc((n - a + 1) * sizeof *out->w), out->len = malloc((n - a + 1) * sizeof *out->len), out->n = 0;
    if (!out->w || !out->len) return -1;
    size_t i = a;
    do {
        size_t j = i;
        while (j < n && !ascii_space((unsigned char)s[j])) j++;
        out->w[out->n] = s + i, out->len[out->n++] = j - i;
        while (j < n && ascii_space((unsigned char)s[j])) j++;
        i = j;
    } while (i < n);
    return 0;
}

static int gram_eq(const words *x, int i, const words *y, int j, int g) {
    for (int k = 0; k < g; k++)
        if (x->len[i + k] != y->len[j + k] || memcmp(x->w[i + k], y->w[j + k], x->len[i + k])) return 0;
    return 1;
}

/* modified_precision for order g: (clipped matches, max(1, hypothesis n-grams)) */
static void modified_precision(const words *hyp, const words *ref, int g, long *num, long *den) {
    int nh = hyp->n - g + 1, nr = ref->n - g + 1;
    *num = 0, *den = nh > 0 ? nh : 1;
    for (int i = 0; i < nh; i++) {
        int first = 1, ch = 0, cr = 0;
        for (int k = 0; k < i && first; k++) first = !gram_eq(hyp, k, hyp, i, g);
        if (!first) continue; /* each distinct n-gram once: min(count, max_ref_count) */
        for (int k = i; k < nh; k++) ch += gram_eq(hyp, k, hyp, i, g);
        for (int k = 0; k < nr; k++) cr += gram_eq(ref, k, hyp, i, g);
        *num += ch < cr ? ch : cr;
    }
}

double scb_bleu_method4(const char *candidate, const char *reference) {
    words h, r;
    if (split_ws(candidate, &h) | split_ws(reference, &r)) return free(h.w), free(h.len), free(r.w), free(r.len), -1;
    long num[4], den[4];
    for (int g = 1; g <= 4; g++) modified_precision(&h, &r, g, &num[g - 1], &den[g - 1]);
    int hl = h.n, rl = r.n;
    free(h.w), free(h.len), free(r.w), free(r.len);
    if (num[0] == 0) return 0;
    double bp = hl > rl ? 1 : hl == 0 ? 0 : exp(1 - (double)rl / hl), p[4], sum = 0;
    int inc = 1;
    for (int g = 0; g < 4; g++) {
        p[g] = (double)num[g] / (double)den[g];
        if (num[g] == 0 && hl > 1) p[g] = 1 / (pow(2, inc++) * 5 / log(hl)) / (double)den[g];
    }
    /* math.fsum of w * log(p) over p > 0, w = 0.25 */
    for (int g = 0; g < 4; g++)
        if (p[g] > 0) sum += 0.25 * log(p[g]);
    return bp * exp(sum);
}

char *scb_code_block(const char *output) {
    char *s = strip_dup(output);
    if (!s) return NULL;
    /* r"^```(?:\w+)?\s*\n(.*?)(?=^```)```" with MULTILINE | DOTALL: the first match's group */
    for (char *p = s; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, "```", 3)) continue;
        char *q = p + 3;
        while (isalnum((unsigned char)*q) || *q == '_') q++;
        /* \s*\n: the body starts after the last newline of the whitespace run (greedy \s* backtracks to it) */
        char *w = q, *nl = NULL;
        while (*w && ascii_space((unsigned char)*w)) {
            if (*w == '\n') nl = w;
            w++;
        }
        if (!nl) continue;
        char *body = nl + 1;
        /* lazily up to the first line start (at or after body) that begins with ``` */
        for (char *e = body; e; e = strchr(e, '\n') ? strchr(e, '\n') + 1 : NULL) {
            if ((e == body || e[-1] == '\n') && !strncmp(e, "```", 3)) {
                char *r = strndup(body, (size_t)(e - body));
                free(s);
                return r;
            }
        }
    }
    return s;
}

/* needle_evaluator without comments removal: the most similar needle (the first of equal ones, none when all are
 * 0) must be the turn's function, and pass@1 at threshold 0.8 asks similarity >= 0.8 */
static double repoqa_pass(const kvb_sample *s, const char *pred) {
    if (s->n_classes < 2) return 0;
    char *out = scb_code_block(pred);
    if (!out) return 0;
    double best = 0;
    const char *best_name = NULL;
    for (int i = 2; i + 1 < s->n_classes; i += 2) {
        double sim = scb_bleu_method4(out, s->all_classes[i + 1]);
        if (sim > best) best = sim, best_name = s->all_classes[i];
    }
    free(out);
    return best_name && !strcmp(best_name, s->all_classes[1]) && best >= 0.8;
}

int scb_score(const kvb_sample *s, const char *pred, double *score, char *metric, size_t metric_cap) {
    if (!s || s->n_classes < 1 || !pred) return -1;
    const char *sub = s->all_classes[0];
    if (s->n_answers < 1) { /* an empty label: the official loops find nothing (vt's mean divides by zero there) */
        *score = 0;
        snprintf(metric, metric_cap, "%s", sub);
        return 0;
    }
    char *const *a = s->answers;
    int n = s->n_answers;
    if (!strcmp(sub, "scbench_kv") || !strcmp(sub, "scbench_prefix_suffix")) *score = strstr(pred, a[0]) != NULL;
    else if (!strcmp(sub, "scbench_vt")) *score = match_all(pred, a, n);
    else if (!strcmp(sub, "scbench_qa_eng") || !strcmp(sub, "scbench_many_shot")) *score = dialogue_in(pred, a, n);
    else if (!strcmp(sub, "scbench_choice_eng")) {
        cJSON *label = cJSON_CreateStringArray((const char *const *)a, n);
        int rc = label ? infbench_score("longbook_choice_eng", pred, label, score) : -1;
        cJSON_Delete(label);
        if (rc) return -1;
    } else if (!strcmp(sub, "scbench_qa_chn")) *score = qa_f1_zh(pred, a, n);
    else if (!strcmp(sub, "scbench_summary")) {
        double r = kvb_rouge_lsum(pred, (const char *const *)a, n);
        if (r < 0) return -1;
        *score = r;
    } else if (!strcmp(sub, "scbench_passkey")) {
        char got[64];
        first_int(pred, got, sizeof got);
        *score = !strcmp(got, a[0]);
    } else if (!strcmp(sub, "scbench_mf")) *score = math_find(pred, a[0]);
    else if (!strcmp(sub, "scbench_repoqa")) *score = repoqa_pass(s, pred);
    else return -1;
    snprintf(metric, metric_cap, "%s", sub);
    return 0;
}

/* ---- the suite entry ---- */

/* The task of a file named <task>.jsonl, or NULL. */
static const char *task_of_file(const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    for (int i = 0; i < N_TASKS; i++) {
        size_t l = strlen(TASKS[i].name);
        if (!strncmp(b, TASKS[i].name, l) && !strcmp(b + l, ".jsonl")) return TASKS[i].name;
    }
    return NULL;
}

int scb_bench_load(const kvb_bench_env *e, const cJSON *b, char *err, size_t err_len) {
    char base[1024], path[1100];
    if (e->expand_path(kvb_json_str(b, "path", "$KVB_DATA/scbench"), base, sizeof base))
        return ERR("%s: scbench \"path\" is longer than the %zu bytes a path may have here", e->suite_path, sizeof base - 1);
    const char *mode = kvb_json_str(b, "mode", "multi_turn");
    if (strcmp(mode, "multi_turn") && strcmp(mode, "multi_request"))
        return ERR("suite %s: scbench \"mode\" must be \"multi_turn\" or \"multi_request\", not \"%s\"", e->suite_path, mode);
    if (!strcmp(mode, "multi_turn") && !strcmp(kvb_json_str(b, "question", "visible"), "hidden"))
        return ERR("suite %s: scbench \"question\": \"hidden\" needs \"mode\": \"multi_request\" (a multi-turn record's "
                   "first question is seen by the compression, as in the official code)", e->suite_path);
    const cJSON *reuse = cJSON_GetObjectItemCaseSensitive(b, "kv_reuse");
    if (reuse && !cJSON_IsBool(reuse))
        return ERR("suite %s: scbench \"kv_reuse\" must be true or false", e->suite_path);
    if (reuse && strcmp(mode, "multi_turn"))
        return ERR("suite %s: scbench \"kv_reuse\" is for \"mode\": \"multi_turn\" (multi_request reuses the context with "
                   "\"question\": \"hidden\")", e->suite_path);
    scb_opts o = {.multi_request = !strcmp(mode, "multi_request"), .max_turns = (int)kvb_json_num(b, "max_turns", 5),
                  .count_tokens = e->count_tokens, .tok_ctx = e->tok_ctx};
    o.kv_reuse = !o.multi_request && (!reuse || cJSON_IsTrue(reuse));
    o.limit = (int)kvb_json_num(b, "samples", 0);
    if (e->limit > 0 && (o.limit <= 0 || e->limit < o.limit)) o.limit = e->limit;
    const char *one = task_of_file(base);
    const cJSON *tasks = cJSON_GetObjectItemCaseSensitive(b, "tasks"), *x;
    if (!one && !cJSON_IsArray(tasks))
        return ERR("suite %s: scbench needs \"tasks\" (an array of SCBench task names) or a \"path\" to <task>.jsonl", e->suite_path);
    int n_tasks = one ? 1 : cJSON_GetArraySize(tasks);
    for (int i = 0; i < n_tasks; i++) {
        x = one ? NULL : cJSON_GetArrayItem(tasks, i);
        const char *task = one ? one : cJSON_IsString(x) ? x->valuestring : NULL;
        const scb_task *t = find_task(task);
        if (!t) return ERR("suite %s: scbench \"tasks\"[%d] is not an SCBench task (scbench_kv, ..., scbench_repoqa_and_kv)", e->suite_path, i);
        if (one) snprintf(path, sizeof path, "%s", base);
        else if (scb_data_path(base, task, path, sizeof path)) return ERR("%s: path too long", e->suite_path);
        if (access(path, R_OK)) {
            const char *hint = "the official data/<task>.jsonl of microsoft/SCBench on the Hugging Face Hub (scripts/fetch-datasets.sh scbench)";
            if (e->optional) { fprintf(stderr, "skipping SCBench %s: %s not found (%s)\n", task, path, hint); continue; }
            return ERR("SCBench %s: %s not found (%s)", task, path, hint);
        }
        /* get_pred's room: max_seq_length - max_new_tokens * turns (the multi-tasking sets: half the sum of both),
         * less 1000 for scdq */
        int per = t->max_new ? t->max_new * o.max_turns
                             : (scb_max_new_tokens(task, !strcmp(task, "scbench_repoqa_and_kv") ? "scbench_repoqa" : "scbench_summary") +
                                scb_max_new_tokens(task, !strcmp(task, "scbench_repoqa_and_kv") ? "scbench_kv" : "scbench_passkey")) *
                                   o.max_turns / 2;
        o.max_context_tokens = (long long)kvb_json_num(b, "max_context_tokens", (double)e->n_ctx_train - per - (o.multi_request ? 1000 : 0) - 64);
        char name[96];
        snprintf(name, sizeof name, "%s%s", task, mode_suffix(&o));
        kvb_samples *out = e->add_task(e->add_ctx, name, "scbench", KVB_JK_NONE, err, err_len);
        if (!out || scb_load(path, task, &o, out, err, err_len)) return -1;
    }
    return 0;
}
