/* longbench_v2.c — LongBench v2's records, prompts and answer extraction (longbench_v2.h), following THUDM/LongBench
 * (the repository root: pred.py get_pred, query_llm and extract_answer; the prompts folder; result.py). */
#include "benchmarks/longbench_v2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"

/* prompts/0shot.txt and prompts/0shot_cot.txt, byte for byte (no newline at the end; "Let’s" with U+2019). */
static const char T_0SHOT[] =
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    "Format your response as follows: \"The correct answer is (insert answer here)\".";
static const char T_COT[] =
    "Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    "Let\xe2\x80\x99s think step by step:";
/* prompts/0shot_cot_ans.txt, byte for byte: the second question after the chain of thought. It holds no $DOC$ (the
 * text is "omitted here"), so get_pred's $DOC$ replacement leaves it as it is; $COT$ is replaced last. */
static const char T_COT_ANS[] =
    "Please read the following text and answer the questions below.\n\nThe text is too long and omitted here.\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    "Let\xe2\x80\x99s think step by step: $COT$\n\nBased on the above, what is the single, most likely answer choice? "
    "Format your response as follows: \"The correct answer is (insert answer here)\".";

static const char *const LENGTHS[] = {"short", "medium", "long"};

const char *lbv2_length_bin(long long code) { return code >= 0 && code < 3 ? LENGTHS[code] : NULL; }

/* get_pred's chain after $DOC$: $Q$, $C_A$ .. $C_D$ replaced in turn over text (consumed); malloc'd or NULL. */
static char *chain(char *text, char *const vals[5]) {
    static const char *const KEYS[5] = {"$Q$", "$C_A$", "$C_B$", "$C_C$", "$C_D$"};
    for (int i = 0; text && i < 5; i++) {
        char *next = kvb_replace_all(text, KEYS[i], vals[i]);
        free(text);
        text = next;
    }
    return text;
}

static int one_of(const char *v, const char *const *set, int n) {
    if (n <= 0) return 1;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, set[i])) return 1;
    return 0;
}

/* One record into s; NULL, or what is wrong. *keep = 0 when the filters leave it out. */
static const char *fill(const cJSON *rec, const lbv2_opts *o, kvb_sample *s, int *keep) {
#define F(k) {k, "'" k "' is missing or not a string"}
    static const char *const KEYS[12][2] = {F("_id"), F("domain"), F("sub_domain"), F("difficulty"), F("length"),
                                            F("question"), F("choice_A"), F("choice_B"), F("choice_C"), F("choice_D"),
                                            F("answer"), F("context")};
#undef F
    if (!cJSON_IsObject(rec)) return "the record is not a JSON object";
    const char *f[12];
    for (int i = 0; i < 12; i++) {
        const cJSON *v = kvb_json_get(rec, KEYS[i][0]);
        if (!cJSON_IsString(v)) return KEYS[i][1];
        f[i] = v->valuestring;
    }
    int len = -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(f[4], LENGTHS[i])) len = i;
    if (len < 0) return "'length' is not short, medium or long";
    if (strcmp(f[3], "easy") && strcmp(f[3], "hard")) return "'difficulty' is not easy or hard";
    if (strlen(f[10]) != 1 || !strchr("ABCD", f[10][0])) return "'answer' is not a letter A-D";
    *keep = one_of(f[4], o->length, o->n_length) && one_of(f[3], o->difficulty, o->n_difficulty) &&
            one_of(f[1], o->domain, o->n_domain);
    if (!*keep) return NULL;
    const char *tmpl = o->cot ? T_COT : T_0SHOT, *doc = strstr(tmpl, "$DOC$");
    char *vals[5] = {kvb_py_strip(f[5]), kvb_py_strip(f[6]), kvb_py_strip(f[7]), kvb_py_strip(f[8]), kvb_py_strip(f[9])};
    int ok = vals[0] && vals[1] && vals[2] && vals[3] && vals[4];
    char *ctx = ok ? chain(kvb_py_strip(f[11]), vals) : NULL, *tail = ok ? chain(strdup(doc + 5), vals) : NULL;
    if (o->cot && ok) { /* the second question: filled now but for $COT$, which the runner fills with the reply */
        s->followup = chain(strdup(T_COT_ANS), vals);
        s->followup_slot = strdup("$COT$");
        s->followup_max_new = 128;
        if (!s->followup || !s->followup_slot) ok = 0;
    }
    for (int i = 0; i < 5; i++) free(vals[i]);
    if (!ok || !ctx || !tail) return free(ctx), free(tail), "out of memory";
    kvb_sb b = {0};
    kvb_sb_add(&b, tmpl, (size_t)(doc - tmpl));
    kvb_sb_adds(&b, ctx);
    kvb_sb_adds(&b, tail);
    s->prompt = kvb_sb_take(&b);
    s->context = ctx;
    s->question = tail;
    s->id = kvb_strdup(f[0]);
    s->task = kvb_strdup(o->cot ? "longbench_v2_cot" : "longbench_v2");
    s->qtype = kvb_strdup(f[2]);
    s->domain = kvb_strdup(f[1]);
    s->difficulty = kvb_strdup(f[3]);
    s->length = len;
    s->max_new_tokens = o->cot ? 1024 : 128;
    s->use_chat = 1; /* query_llm sends the prompt as one user message */
    if (kvb_sample_add_answer(s, f[10])) return "out of memory";
    return !s->prompt || !s->id || !s->task || !s->qtype || !s->domain || !s->difficulty ? "out of memory" : NULL;
}

/* Adds rec (deleted here) unless filtered; 1 = added, 0 = left out, -1 = error in err. */
static int take(const char *path, long line, cJSON *rec, const lbv2_opts *o, kvb_samples *out, char *err, size_t err_len) {
    kvb_sample s;
    kvb_sample_init(&s);
    int keep = 1;
    const char *bad = fill(rec, o, &s, &keep);
    cJSON_Delete(rec);
    if (bad || !keep) {
        kvb_sample_free(&s);
        if (bad) kvb_seterr(err, err_len, "%s:%ld: %s", path, line, bad);
        return bad ? -1 : 0;
    }
    if (kvb_samples_push(out, &s)) {
        kvb_seterr(err, err_len, "%s:%ld: out of memory", path, line);
        return -1;
    }
    return 1;
}

int lbv2_load(const char *path, const lbv2_opts *o, kvb_samples *out, char *err, size_t err_len) {
    size_t len;
    char *buf = kvb_read_file(path, &len, err, err_len);
    if (!buf) return -1;
    size_t at = strspn(buf, " \t\r\n");
    int n0 = out->n, rc = 0, got = 0;
    cJSON *rec;
    long line = 0;
    if (at < len && buf[at] == '[') { /* data.json: one array */
        kvb_jarray a;
        rc = kvb_jarray_begin(&a, path, buf, len, err, err_len);
        while (!rc && (o->limit <= 0 || got < o->limit)) {
            int r = kvb_jarray_next(&a, &rec, &line, err, err_len);
            if (r <= 0) { rc = r; break; }
            r = take(path, line, rec, o, out, err, err_len);
            rc = r < 0 ? -1 : 0;
            got += r > 0;
        }
    } else { /* JSONL: one record a line */
        for (char *p = buf, *end = buf + len; !rc && p < end && (o->limit <= 0 || got < o->limit);) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
            line++;
            if (strspn(p, " \t\r") < n) {
                if (!(rec = kvb_json_parse(path, line, p, n, err, err_len))) { rc = -1; break; }
                int r = take(path, line, rec, o, out, err, err_len);
                rc = r < 0 ? -1 : 0;
                got += r > 0;
            }
            p += n + 1;
        }
    }
    free(buf);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}

/* re.search(r"The correct answer is \(([A-D])\)") then re.search(r"The correct answer is ([A-D])"), on the reply
 * with its '*' removed. */
char lbv2_extract_answer(const char *response) {
    static const char KEY[] = "The correct answer is ";
    char *r = malloc(strlen(response) + 1), *w = r;
    if (!r) return 0;
    for (const char *p = response; *p; p++)
        if (*p != '*') *w++ = *p;
    *w = 0;
    char letter = 0;
    for (const char *p = strstr(r, KEY); p && !letter; p = strstr(p + 1, KEY)) {
        const char *x = p + sizeof KEY - 1;
        if (x[0] == '(' && x[1] && strchr("ABCD", x[1]) && x[2] == ')') letter = x[1];
    }
    for (const char *p = strstr(r, KEY); p && !letter; p = strstr(p + 1, KEY)) {
        const char *x = p + sizeof KEY - 1;
        if (x[0] && strchr("ABCD", x[0])) letter = x[0];
    }
    free(r);
    return letter;
}

int lbv2_judge(const char *response, const char *answer) {
    char l = lbv2_extract_answer(response);
    return l && answer && answer[0] == l && !answer[1];
}
