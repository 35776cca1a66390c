/* judging.c — the runner's judge (judging.h): prompts per kind, one client batch per sample, verdicts into
 * the records. */
#include "benchmarks/judging.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"
#include "benchmarks/sample.h"
#include "judge/client.h"
#include "judge/judges.h"
#include "judge/redact.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
/* The quality judge sees at most this much of the conversation (its tail): judges have finite contexts. */
#define HISTORY_TAIL_BYTES 12000

struct kvb_runner_judge {
    kvb_judge_cfg cfg;
    char url[512], url_full[512], model[128], key_env[128], cache_dir[1024], templates_path[1024];
    kvb_lme_templates *lme;
};

static int jnum(const cJSON *o, const char *k, double lo, double hi, double *out, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi)
        return ERR("suite judge: \"%s\" must be a number in [%g, %g]", k, lo, hi);
    *out = v->valuedouble;
    return 0;
}

kvb_runner_judge *kvb_runner_judge_create(const cJSON *sj, const kvb_judge_flags *fl,
                                          void (*resolve)(const char *in, char *out, size_t cap), char *err,
                                          size_t err_len) {
    if (err_len) err[0] = 0;
    if (sj && !cJSON_IsObject(sj) && !cJSON_IsNull(sj)) {
        ERR("suite: \"judge\" must be an object");
        return NULL;
    }
    /* the keys read below: another (a misspelled "timeout") would leave its default in place without a word */
    static const char *const KEYS[] = {"base_url", "model", "api_key_env", "cache_dir", "templates", "concurrency", "timeout_s",
                                       "max_retries", "breaker", "n", "retry_after_max_s", "deadline_s", NULL};
    if (cJSON_IsObject(sj) && kvb_json_check_keys(sj, KEYS, "suite: \"judge\": ", err, err_len)) return NULL;
    const char *env = getenv("KVB_JUDGE_URL");
    const char *url = fl && fl->url ? fl->url : env && *env ? env : kvb_json_str(sj, "base_url", NULL);
    if (!url && fl && (fl->model || fl->key_env || fl->refresh)) { /* they would be dropped without a word */
        ERR("judge: %s needs a judge: --judge-url, $KVB_JUDGE_URL or the suite's judge.base_url",
            fl->model ? "--judge-model" : fl->key_env ? "--judge-key-env" : "--judge-refresh");
        return NULL;
    }
    if (!url) return NULL;
    if (kvb_judge_check_url(url, err, err_len)) return NULL; /* now, not after the first sample's generation */
    /* a --judge-key-env that names nothing would send every request without its key (the suite's may be unset) */
    const char *fk = fl ? fl->key_env : NULL, *fv = fk ? getenv(fk) : NULL;
    if (fk && (!fv || !*fv)) {
        ERR("judge: --judge-key-env %s: the environment variable is empty or unset", fk);
        return NULL;
    }
    kvb_runner_judge *j = calloc(1, sizeof *j);
    if (!j) { ERR("out of memory"); return NULL; }
    kvb_judge_cfg_defaults(&j->cfg);
    snprintf(j->url_full, sizeof j->url_full, "%s", url); /* what the client sends to (userinfo and all) */
    kvb_url_strip_userinfo(url, j->url, sizeof j->url, NULL, 0, NULL, 0); /* what is written anywhere */
    snprintf(j->model, sizeof j->model, "%s", fl && fl->model ? fl->model : kvb_json_str(sj, "model", "default"));
    const char *ke = fl && fl->key_env ? fl->key_env : kvb_json_str(sj, "api_key_env", NULL);
    if (ke) snprintf(j->key_env, sizeof j->key_env, "%s", ke);
    resolve(kvb_json_str(sj, "cache_dir", "~/.cache/kvbench/judge"), j->cache_dir, sizeof j->cache_dir);
    resolve(kvb_json_str(sj, "templates", "$KVB_DATA/longmemeval/judge_templates.json"), j->templates_path, sizeof j->templates_path);
    double conc = j->cfg.concurrency, to = j->cfg.timeout_s, retries = j->cfg.max_retries, brk = j->cfg.breaker,
           n = j->cfg.n, ra_max = j->cfg.retry_after_max_s, deadline = j->cfg.deadline_s;
    if (jnum(sj, "concurrency", 1, 256, &conc, err, err_len) || jnum(sj, "timeout_s", 0.1, 3600, &to, err, err_len) ||
        jnum(sj, "max_retries", 0, 20, &retries, err, err_len) || jnum(sj, "breaker", 1, 1000, &brk, err, err_len) ||
        jnum(sj, "n", 1, 16, &n, err, err_len) || jnum(sj, "retry_after_max_s", 0, 86400, &ra_max, err, err_len) ||
        jnum(sj, "deadline_s", 0, 7 * 86400, &deadline, err, err_len)) {
        free(j);
        return NULL;
    }
    j->cfg.base_url = j->url_full;
    j->cfg.retry_after_max_s = ra_max;
    j->cfg.deadline_s = deadline;
    j->cfg.model = j->model;
    j->cfg.api_key_env = j->key_env[0] ? j->key_env : NULL;
    j->cfg.cache_dir = j->cache_dir;
    j->cfg.refresh = fl ? fl->refresh : 0;
    j->cfg.concurrency = (int)conc;
    j->cfg.timeout_s = to;
    j->cfg.max_retries = (int)retries;
    j->cfg.breaker = (int)brk;
    j->cfg.n = (int)n;
    return j;
}

void kvb_runner_judge_free(kvb_runner_judge *j) {
    if (!j) return;
    kvb_lme_templates_free(j->lme);
    free(j);
}

int kvb_runner_judge_need_lme(kvb_runner_judge *j, char *err, size_t err_len) {
    if (!j || j->lme) return 0;
    char e[512];
    if (!(j->lme = kvb_lme_templates_load(j->templates_path, e, sizeof e)))
        return ERR("LongMemEval judge prompts: %s (scripts/fetch-datasets.sh longmemeval writes them)", e);
    return 0;
}

cJSON *kvb_runner_judge_describe(const kvb_runner_judge *j) {
    if (!j) return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "base_url", j->url);
    cJSON_AddStringToObject(o, "model", j->model);
    return o;
}

/* LongMemEval's raw question: the sample's question is "Current Date: D\nQuestion: Q\nAnswer:" (the reader's
 * tail); the official judge is given Q alone. */
static char *lme_question(const kvb_sample *s) {
    const char *q = s->question ? s->question : "";
    const char *p = strstr(q, "\nQuestion: ");
    if (p) q = p + strlen("\nQuestion: ");
    char *out = strdup(q);
    if (!out) return NULL;
    char *a = strstr(out, "\nAnswer");
    if (a && !strchr(a + 1, '\n')) *a = 0;
    return out;
}

/* The conversation before the last question, as "User: ...\nAssistant: ..." lines, its last
 * HISTORY_TAIL_BYTES bytes (cut at a line start). */
static char *history_text(const kvb_sample *s) {
    kvb_sb b = {0};
    for (int i = 0; i < s->n_turns; i++) {
        const kvb_turn *t = &s->turns[i];
        if (!t->content || !t->content[0]) continue;
        const char *who = !strcmp(t->role, "user") ? "User" : !strcmp(t->role, "assistant") ? "Assistant" : "System";
        kvb_sb_addf(&b, "%s: %s\n", who, t->content);
    }
    char *all = kvb_sb_take(&b);
    if (!all) return strdup("");
    size_t n = strlen(all);
    if (n <= HISTORY_TAIL_BYTES) return all;
    const char *tail = all + n - HISTORY_TAIL_BYTES, *nl = strchr(tail, '\n');
    char *out = strdup(nl && nl[1] ? nl + 1 : tail);
    free(all);
    return out;
}

static const char *kind_name(kvb_judge_kind k) {
    return k == KVB_JK_LONGMEMEVAL ? "longmemeval" : k == KVB_JK_QUALITY ? "quality" : "rubric";
}

/* The prompt for one record's prediction (malloc'd), or NULL + err. */
static char *prompt_for(const kvb_runner_judge *j, kvb_judge_kind kind, const kvb_sample *s, const char *pred,
                        char *err, size_t err_len) {
    const char *ref = s->n_answers ? s->answers[0] : "";
    if (kind == KVB_JK_LONGMEMEVAL) {
        char *q = lme_question(s);
        char *p = q ? kvb_lme_prompt(j->lme, s->qtype ? s->qtype : "", s->abstention, q, ref, pred, err, err_len) : NULL;
        free(q);
        return p;
    }
    if (kind == KVB_JK_QUALITY) {
        char *h = history_text(s);
        char *p = h ? kvb_quality_prompt(h, s->question ? s->question : "", pred) : NULL;
        free(h);
        return p;
    }
    return kvb_rubric_prompt(s->question ? s->question : "", ref, pred);
}

/* Parse the replies of one request into a score in [0, 1]; -1 when none parses. */
static int parse_replies(kvb_judge_kind kind, const kvb_judge_req *r, double *parsed, double *score) {
    if (kind == KVB_JK_LONGMEMEVAL) {
        if (r->n_replies < 1 || !r->replies[0]) return -1;
        *parsed = kvb_lme_verdict(r->replies[0]);
        *score = *parsed;
        return 0;
    }
    double sum = 0;
    int k = 0;
    for (int i = 0; i < r->n_replies; i++) {
        double v;
        if (r->replies[i] && (kind == KVB_JK_QUALITY ? kvb_quality_parse(r->replies[i], &v) : kvb_rubric_parse(r->replies[i], &v)) == 0)
            sum += v, k++;
    }
    if (!k) return -1;
    *parsed = sum / k;
    *score = *parsed / 10.0;
    return 0;
}

static void set_item(cJSON *o, const char *key, cJSON *v) {
    if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else cJSON_AddItemToObject(o, key, v);
}

static void record_verdict(const kvb_runner_judge *j, kvb_judge_kind kind, const kvb_judge_req *r, cJSON *rec) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "kind", kind_name(kind));
    cJSON_AddStringToObject(v, "model", j->model);
    cJSON_AddStringToObject(v, "base_url", j->url);
    cJSON *reps = cJSON_AddArrayToObject(v, "replies");
    for (int i = 0; i < r->n_replies; i++) cJSON_AddItemToArray(reps, cJSON_CreateString(r->replies[i] ? r->replies[i] : ""));
    double parsed = 0, score = 0;
    const char *error = NULL;
    if (!r->ok) error = r->error[0] ? r->error : "the judge did not answer";
    else if (parse_replies(kind, r, &parsed, &score)) error = kind == KVB_JK_LONGMEMEVAL ? "empty reply" : "no score in the reply";
    if (error) cJSON_AddNullToObject(v, "parsed");
    else cJSON_AddNumberToObject(v, "parsed", parsed);
    if (error) cJSON_AddStringToObject(v, "error", error);
    else cJSON_AddNullToObject(v, "error");
    cJSON_AddNumberToObject(v, "attempts", r->attempts);
    cJSON_AddBoolToObject(v, "from_cache", r->from_cache);
    cJSON_AddStringToObject(v, "cache_key", r->key);
    set_item(rec, "judge", v);
    set_item(rec, "metric", cJSON_CreateString(kind == KVB_JK_LONGMEMEVAL ? "judge_yes" : kind == KVB_JK_QUALITY ? "judge_quality" : "judge_rubric"));
    set_item(rec, "score", error ? cJSON_CreateNull() : cJSON_CreateNumber(score));
}

static void record_error(kvb_judge_kind kind, const char *why, cJSON *rec) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "kind", kind_name(kind));
    cJSON_AddStringToObject(v, "error", why);
    set_item(rec, "judge", v);
    set_item(rec, "score", cJSON_CreateNull());
}

int kvb_runner_judge_records(kvb_runner_judge *j, kvb_judge_kind kind, const kvb_sample *s, cJSON **recs, int n,
                             char *err, size_t err_len) {
    if (kind == KVB_JK_NONE || n <= 0) return 0;
    kvb_judge_req *reqs = calloc((size_t)n, sizeof *reqs);
    int *idx = calloc((size_t)n, sizeof *idx), m = 0, rc = 0;
    if (!reqs || !idx) { free(reqs); free(idx); return ERR("out of memory"); }
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(recs[i], "error");
        if (cJSON_IsString(e)) continue; /* the sample failed before there was anything to judge */
        if (!j) { record_error(kind, "no judge configured (--judge-url or the suite's \"judge\")", recs[i]); continue; }
        const char *pred = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(recs[i], "prediction"));
        char perr[256];
        char *prompt = prompt_for(j, kind, s, pred ? pred : "", perr, sizeof perr);
        if (!prompt) { record_error(kind, perr, recs[i]); continue; }
        reqs[m].messages_json = kvb_judge_user_message(prompt);
        free(prompt);
        if (!reqs[m].messages_json) { rc = ERR("out of memory"); break; }
        idx[m++] = i;
    }
    if (!rc && m) {
        kvb_judge_cfg cfg = j->cfg;
        cfg.max_tokens = kind == KVB_JK_LONGMEMEVAL ? 10 : kind == KVB_JK_QUALITY ? 128 : 16;
        if (kind == KVB_JK_LONGMEMEVAL) cfg.n = 1;
        int reached = 0;
        const kvb_judge_req *down = NULL;
        if (kvb_judge_run(&cfg, reqs, m, err, err_len)) rc = -1;
        for (int k = 0; !rc && k < m; k++) {
            reached += reqs[k].ok || reqs[k].from_cache || reqs[k].http_status;
            if (reqs[k].unreachable && !down) down = &reqs[k];
        }
        /* no judgement got an answer and the server could not be reached: the judge is down or the URL is wrong, not
         * a bad reply; stop, leaving the generations' records pending (a run resumed with a judge judges them) */
        if (!rc && !reached && down)
            rc = ERR("judge %s unreachable: %s (the predictions are kept, unjudged: run again when it answers)", j->url,
                     down->error);
        for (int k = 0; !rc && k < m; k++) record_verdict(j, kind, &reqs[k], recs[idx[k]]);
    }
    for (int k = 0; k < m; k++) {
        kvb_judge_req_clear(&reqs[k]);
        free(reqs[k].messages_json);
    }
    free(reqs);
    free(idx);
    return rc;
}
