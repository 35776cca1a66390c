/* longmemeval.c — LongMemEval loader. Follows xiaowu0162/LongMemEval src/generation/run_generation.py,
 * prepare_prompt() for the full-history readers (retriever "orig-session"/"oracle-session", all
 * sessions kept, no user-only filter, no fact expansion): has_answer keys dropped, sessions sorted by
 * their date string (stable), each rendered as "\n### Session {i}:\nSession Date: {date}\nSession
 * Content:\n{sess}\n" with sess = "\n" + json.dumps(turns) ("json") or "\n\n{role}: {content.strip()}"
 * per turn ("nl"); prompt = the CoT or plain reader template; the history is cut to its first
 * model_max_len - gen_len - 1000 tokens (gen_len 500, 800 with CoT) — lme_truncate_head, done by the
 * caller who holds the tokenizer.
 * Choices where the official code is silent: the rounds given to round-level methods are the same
 * date-sorted sessions' turns, each session closed on its own (a session starting with an assistant
 * turn gets an empty user turn before it, an unanswered user turn an empty reply), with the session
 * date and index on each turn; their final question is the prompt's tail "Current Date: ...\nQuestion:
 * ...\nAnswer:" (the instruction sentence stays in the single prompt only); an instance without
 * sessions is an error (the official code asserts a non-empty history); haystack_dates, _session_ids and
 * _sessions must have equal lengths (zip() would silently drop the excess); task = the file's base name
 * up to its first '.' when it starts with "longmemeval", else "longmemeval". */
#include "benchmarks/loaders.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"

static const char PROMPT_PLAIN[] =
    "I will give you several history chats between you and a user. Please answer the question based on the "
    "relevant chat history.\n\n\nHistory Chats:\n\n%s\n\nCurrent Date: %s\nQuestion: %s\nAnswer:";
static const char PROMPT_COT[] =
    "I will give you several history chats between you and a user. Please answer the question based on the "
    "relevant chat history. Answer the question step by step: first extract all the relevant information, and "
    "then reason over the information to get the answer.\n\n\nHistory Chats:\n\n%s\n\nCurrent Date: %s\n"
    "Question: %s\nAnswer (step by step):";

char *lme_render_prompt(int cot, const char *history, const char *question_date, const char *question) {
    kvb_sb b = {0};
    kvb_sb_addf(&b, cot ? PROMPT_COT : PROMPT_PLAIN, history, question_date, question);
    return kvb_sb_take(&b);
}

int64_t lme_max_history_tokens(int64_t model_max_len, int64_t gen_len) {
    return model_max_len - gen_len - 1000;
}

int64_t lme_truncate_head(int64_t n, int64_t max_len) {
    if (max_len < 0 || n < 0) return -1;
    return n < max_len ? n : max_len;
}

/* ---- Python str.strip() ---- */

/* Length of the UTF-8 whitespace character (str.isspace) at s, 0 if none. */
static size_t space_at(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20))) return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    unsigned cp = ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
    if ((s[0] & 0xf0) != 0xe0 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
    int sp = cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f
          || cp == 0x205f || cp == 0x3000;
    return sp ? 3 : 0;
}

/* Start of the last whitespace character ending exactly at s + n, or n if none. */
static size_t space_before(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (space_at(s + n - k, k) == k) return n - k;
    return n;
}

static void add_stripped(kvb_sb *b, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text), a = 0, k;
    while (a < n && (k = space_at(s + a, n - a))) a += k;
    while (n > a && (k = space_before(s, n)) < n) n = k;
    kvb_sb_add(b, text + a, n - a);
}

/* ---- one instance ---- */

typedef struct {
    const char *date;
    const cJSON *turns;
    int orig; /* index in the file: qsort is not stable, Python's sort is */
} lme_session;

static int cmp_session(const void *a, const void *b) {
    const lme_session *x = a, *y = b;
    int c = strcmp(x->date, y->date);
    return c ? c : (x->orig > y->orig) - (x->orig < y->orig);
}

static const char *check_turns(const cJSON *sess) {
    const cJSON *t;
    if (!cJSON_IsArray(sess)) return "a haystack session is not a list";
    cJSON_ArrayForEach(t, sess) {
        const cJSON *role = kvb_json_get(t, "role"), *ha = kvb_json_get(t, "has_answer");
        if (!cJSON_IsObject(t)) return "a session turn is not an object";
        if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
            return "a session turn has no role 'user' or 'assistant'";
        if (!cJSON_IsString(kvb_json_get(t, "content"))) return "a session turn has no string 'content'";
        if (ha && !cJSON_IsBool(ha) && !cJSON_IsNull(ha)) return "'has_answer' is not a boolean";
    }
    return NULL;
}

static int all_strings(const cJSON *arr) {
    const cJSON *it;
    if (!cJSON_IsArray(arr)) return 0;
    cJSON_ArrayForEach(it, arr)
        if (!cJSON_IsString(it)) return 0;
    return 1;
}

static const char *check_instance(const cJSON *e) {
    static const char *const keys[][2] = {{"question_id", "'question_id' is missing or not a string"},
                                          {"question_type", "'question_type' is missing or not a string"},
                                          {"question", "'question' is missing or not a string"},
                                          {"question_date", "'question_date' is missing or not a string"}};
    if (!cJSON_IsObject(e)) return "the instance is not a JSON object";
    for (size_t i = 0; i < 4; i++)
        if (!cJSON_IsString(kvb_json_get(e, keys[i][0]))) return keys[i][1];
    const cJSON *ans = kvb_json_get(e, "answer"), *dates = kvb_json_get(e, "haystack_dates");
    const cJSON *ids = kvb_json_get(e, "haystack_session_ids"), *sess = kvb_json_get(e, "haystack_sessions");
    if (!cJSON_IsString(ans) && !cJSON_IsNumber(ans)) return "'answer' is missing or not a string or number";
    if (!all_strings(dates)) return "'haystack_dates' is missing or not a list of strings";
    if (!all_strings(ids)) return "'haystack_session_ids' is missing or not a list of strings";
    if (!cJSON_IsArray(sess)) return "'haystack_sessions' is missing or not a list";
    int n = cJSON_GetArraySize(sess);
    if (cJSON_GetArraySize(dates) != n || cJSON_GetArraySize(ids) != n)
        return "haystack_dates, haystack_session_ids and haystack_sessions differ in length";
    if (n == 0) return "the instance has no history sessions";
    const cJSON *s;
    cJSON_ArrayForEach(s, sess) {
        const char *bad = check_turns(s);
        if (bad) return bad;
    }
    return NULL;
}

/* The instance's sessions sorted by date; NULL on OOM. */
static lme_session *sorted_sessions(const cJSON *e, int *n) {
    const cJSON *dates = kvb_json_get(e, "haystack_dates"), *sess = kvb_json_get(e, "haystack_sessions");
    *n = cJSON_GetArraySize(sess);
    lme_session *v = malloc((size_t)*n * sizeof *v);
    if (!v) return NULL;
    const cJSON *d = dates->child, *s = sess->child;
    for (int i = 0; i < *n; i++, d = d->next, s = s->next) v[i] = (lme_session){d->valuestring, s, i};
    qsort(v, (size_t)*n, sizeof *v, cmp_session);
    return v;
}

static void add_session_text(kvb_sb *b, const lme_session *s, int nl) {
    if (!nl) {
        kvb_sb_add(b, "\n", 1);
        kvb_json_dumps_py(b, s->turns, "has_answer");
        return;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, s->turns) {
        kvb_sb_addf(b, "\n\n%s: ", kvb_json_get(t, "role")->valuestring);
        add_stripped(b, kvb_json_get(t, "content")->valuestring);
    }
}

static char *history_string(const lme_session *v, int n, int nl) {
    kvb_sb b = {0};
    for (int i = 0; i < n; i++) {
        kvb_sb_addf(&b, "\n### Session %d:\nSession Date: %s\nSession Content:\n", i + 1, v[i].date);
        add_session_text(&b, &v[i], nl);
        kvb_sb_add(&b, "\n", 1);
    }
    return kvb_sb_take(&b);
}

static int add_rounds(kvb_sample *s, const lme_session *v, int n) {
    for (int i = 0; i < n; i++) {
        int first = s->n_turns;
        const cJSON *t;
        cJSON_ArrayForEach(t, v[i].turns) {
            if (kvb_sample_add_message(s, kvb_json_get(t, "role")->valuestring,
                                       kvb_json_get(t, "content")->valuestring, v[i].date))
                return -1;
            s->turns[s->n_turns - 1].has_answer = cJSON_IsTrue(kvb_json_get(t, "has_answer"));
        }
        if (kvb_sample_close_rounds(s)) return -1;
        for (int k = first; k < s->n_turns; k++) s->turns[k].session = i;
    }
    return 0;
}

static char *answer_string(const cJSON *a) {
    if (cJSON_IsString(a)) return kvb_strdup(a->valuestring);
    kvb_sb b = {0};
    kvb_json_dumps_py(&b, a, NULL); /* str(int) == json.dumps(int) */
    return kvb_sb_take(&b);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int fill_sample(kvb_sample *s, const cJSON *e, const char *task, int nl, int cot) {
    int n;
    lme_session *v = sorted_sessions(e, &n);
    if (!v) return -1;
    const char *q = kvb_json_get(e, "question")->valuestring, *qd = kvb_json_get(e, "question_date")->valuestring;
    const char *id = kvb_json_get(e, "question_id")->valuestring;
    kvb_sb qb = {0};
    kvb_sb_addf(&qb, "Current Date: %s\nQuestion: %s\n%s", qd, q, cot ? "Answer (step by step):" : "Answer:");
    s->context = history_string(v, n, nl);
    s->prompt = s->context ? lme_render_prompt(cot, s->context, qd, q) : NULL;
    s->question = kvb_sb_take(&qb);
    s->id = kvb_strdup(id);
    s->task = kvb_strdup(task);
    s->qtype = kvb_strdup(kvb_json_get(e, "question_type")->valuestring);
    s->date = kvb_strdup(qd);
    s->abstention = ends_with(id, "_abs");
    s->max_new_tokens = cot ? 800 : 500;
    s->use_chat = 1;
    char *ans = answer_string(kvb_json_get(e, "answer"));
    int rc = !s->prompt || !s->question || !s->id || !s->task || !s->qtype || !s->date || !ans
          || kvb_sample_add_answer(s, ans) || add_rounds(s, v, n);
    free(ans);
    free(v);
    return rc ? -1 : 0;
}

/* "longmemeval_oracle" for ".../longmemeval_oracle.sample.json", else "longmemeval". */
static void task_name(const char *path, char *buf, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strcspn(base, ".");
    if (strncmp(base, "longmemeval", 11) || n >= cap) snprintf(buf, cap, "longmemeval");
    else snprintf(buf, cap, "%.*s", (int)n, base);
}

static int load_array(kvb_jarray *a, const char *task, int nl, int cot, int limit, kvb_samples *out, char *err,
                      size_t err_len) {
    int got = 0, rc = 0;
    cJSON *e;
    long line;
    while ((limit <= 0 || got < limit) && (rc = kvb_jarray_next(a, &e, &line, err, err_len)) == 1) {
        const char *bad = check_instance(e);
        kvb_sample s;
        kvb_sample_init(&s);
        if (bad) {
            kvb_seterr(err, err_len, "%s:%ld: %s", a->path, line, bad);
        } else if (fill_sample(&s, e, task, nl, cot) || kvb_samples_push(out, &s)) {
            kvb_seterr(err, err_len, "%s:%ld: out of memory", a->path, line);
            bad = "oom";
        }
        kvb_sample_free(&s);
        cJSON_Delete(e);
        if (bad) return -1;
        got++;
    }
    return rc < 0 ? -1 : 0;
}

int lme_load(const char *path, const char *format, int cot, int limit, kvb_samples *out, char *err, size_t err_len) {
    int nl = format && !strcmp(format, "nl");
    if (format && !nl && strcmp(format, "json")) {
        kvb_seterr(err, err_len, "%s: unknown LongMemEval history format '%s' (json|nl)", path, format);
        return -1;
    }
    size_t len;
    char *buf = kvb_read_file(path, &len, err, err_len);
    if (!buf) return -1;
    char task[64];
    task_name(path, task, sizeof task);
    int n0 = out->n, rc = -1;
    kvb_jarray a;
    if (kvb_jarray_begin(&a, path, buf, len, err, err_len) == 0)
        rc = load_array(&a, task, nl, cot, limit, out, err, err_len);
    free(buf);
    if (rc) kvb_samples_truncate(out, n0);
    return rc;
}
