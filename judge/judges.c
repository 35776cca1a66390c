/* judges.c — judge prompts and reply parsing (see judges.h). */
#include "judge/judges.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fsutil.h"

static const char *LME_KEYS[] = {"default", "temporal-reasoning", "knowledge-update", "single-session-preference",
                                 "abstention"};
#define N_LME 5

struct kvb_lme_templates {
    char *t[N_LME];
};

kvb_lme_templates *kvb_lme_templates_load(const char *path, char *err, size_t err_len) {
    char *text = kvb_read_file(path, NULL, err, err_len);
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    kvb_lme_templates *t = calloc(1, sizeof *t);
    for (int i = 0; t && i < N_LME; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(j, LME_KEYS[i]);
        if (!cJSON_IsString(v)) {
            snprintf(err, err_len, "%s: judge template '%s' missing (re-run scripts/fetch-datasets.sh longmemeval)", path, LME_KEYS[i]);
            kvb_lme_templates_free(t);
            t = NULL;
            break;
        }
        t->t[i] = strdup(v->valuestring);
    }
    cJSON_Delete(j);
    return t;
}

void kvb_lme_templates_free(kvb_lme_templates *t) {
    if (!t) return;
    for (int i = 0; i < N_LME; i++) free(t->t[i]);
    free(t);
}

char *kvb_format_positional(const char *tmpl, const char *const *args, int n_args) {
    size_t cap = strlen(tmpl) + 1;
    for (int i = 0; i < n_args; i++) cap += strlen(args[i]);
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    int k = 0;
    for (const char *p = tmpl; *p; p++) {
        if (p[0] == '{' && p[1] == '{') { *o++ = '{'; p++; continue; }
        if (p[0] == '}' && p[1] == '}') { *o++ = '}'; p++; continue; }
        if (p[0] == '{' && p[1] == '}' && k < n_args) {
            size_t l = strlen(args[k]);
            memcpy(o, args[k++], l);
            o += l;
            p++;
            continue;
        }
        *o++ = *p;
    }
    *o = 0;
    return out;
}

char *kvb_lme_prompt(const kvb_lme_templates *t, const char *qtype, int abstention, const char *question,
                     const char *answer, const char *response, char *err, size_t err_len) {
    int i;
    if (abstention) i = 4;
    else if (!strcmp(qtype, "single-session-user") || !strcmp(qtype, "single-session-assistant") || !strcmp(qtype, "multi-session")) i = 0;
    else if (!strcmp(qtype, "temporal-reasoning")) i = 1;
    else if (!strcmp(qtype, "knowledge-update")) i = 2;
    else if (!strcmp(qtype, "single-session-preference")) i = 3;
    else {
        snprintf(err, err_len, "LongMemEval judge: unknown question type '%s'", qtype);
        return NULL;
    }
    const char *args[3] = {question, answer, response};
    return kvb_format_positional(t->t[i], args, 3);
}

int kvb_lme_verdict(const char *reply) {
    for (const char *p = reply; *p; p++)
        if (tolower((unsigned char)p[0]) == 'y' && tolower((unsigned char)p[1]) == 'e' && tolower((unsigned char)p[2]) == 's') return 1;
    return 0;
}

static char *join3(const char *fmt, const char *a, const char *b, const char *c) {
    size_t n = strlen(fmt) + strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, fmt, a, b, c);
    return s;
}

char *kvb_quality_prompt(const char *history, const char *question, const char *response) {
    return join3("You are grading an AI assistant's answer to the last question of a multi-turn conversation.\n"
                 "Rate the answer on each dimension from 1 (poor) to 10 (excellent): factual accuracy, meeting user "
                 "needs, fairness and responsibility, creativity, richness. Factual accuracy and meeting the user's "
                 "needs matter most; a good reference answer would score 8. Then give an overall score from 1 to 10.\n"
                 "Reply with a dictionary only, e.g. {'factual accuracy': 7, 'meeting user needs': 6, 'fairness and "
                 "responsibility': 8, 'creativity': 5, 'richness': 6, 'overall score': 6}.\n\n"
                 "[Conversation so far]\n%s\n\n[Last question]\n%s\n\n[Answer to grade]\n%s\n",
                 history, question, response);
}

/* The number after `key` (case-insensitive; quotes, spaces, ':' and '=' skipped). */
static int number_after(const char *reply, const char *key, double *out) {
    size_t kl = strlen(key);
    for (const char *p = reply; *p; p++) {
        if (strncasecmp(p, key, kl)) continue;
        const char *q = p + kl;
        while (*q && (*q == '\'' || *q == '"' || *q == ' ' || *q == ':' || *q == '=' || *q == '*')) q++;
        char *end;
        double v = strtod(q, &end);
        if (end != q) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

int kvb_quality_parse(const char *reply, double *score) {
    double v;
    if (number_after(reply, "overall score", &v) || !(v >= 1 && v <= 10)) return -1; /* NaN too ("score: nan") */
    *score = v;
    return 0;
}

char *kvb_rubric_prompt(const char *question, const char *reference, const char *response) {
    return join3("Score how well the response answers the question compared with the reference answer, from 1 (wrong "
                 "or missing) to 10 (fully correct and complete). Reply with \"Score: N\" only.\n\nQuestion: %s\n\n"
                 "Reference answer: %s\n\nResponse: %s\n", question, reference, response);
}

int kvb_rubric_parse(const char *reply, double *score) {
    double v;
    if (number_after(reply, "score", &v) || !(v >= 1 && v <= 10)) return -1; /* NaN too */
    *score = v;
    return 0;
}
