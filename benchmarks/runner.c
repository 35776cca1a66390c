/* runner.c — the suite runner (runner.h): expand cells, share one exact prefill per sample across methods,
 * decode, score, append one fsynced JSONL record per cell; resume by skipping recorded cells. */
#include "benchmarks/runner.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/text.h"
#include "benchmarks/cells.h"
#include "benchmarks/fingerprint.h"
#include "benchmarks/hostload.h"
#include "benchmarks/hidden.h"
#include "benchmarks/jsonl.h"
#include "benchmarks/judging.h"
#include "benchmarks/loaders.h"
#include "benchmarks/progress.h"
#include "benchmarks/prompt.h"
#include "benchmarks/provenance.h"
#include "benchmarks/registry.h"
#include "benchmarks/runcal.h"
#include "benchmarks/runopts.h"
#include "benchmarks/score.h"
#include "benchmarks/shared_prefill.h"
#include "benchmarks/serve_suite.h"
#include "benchmarks/suitecheck.h"
#include "base/clock.h"
#include "base/fsutil.h"
#include "engine/sampler.h"
#include "engine/synthetic.h"
#include "judge/redact.h"
#include "methods/method.h"
#include "methods/profile.h"
#include "reports/report.h"
#include "reports/results.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define MAX_CELLS KVB_MAX_CELLS
#define MAX_TASKS 64

typedef kvb_run_cell cell;

typedef struct {
    char name[64], benchmark[32];
    kvb_samples samples;
    kvb_judge_kind judge; /* how its samples are scored when not by score.c */
    const cJSON *bench;   /* its benchmark object in the suite (for the records' fingerprints) */
    int hidden;           /* "question": "hidden": compress the context before the question is prefilled */
    kvb_prompt_fn prompt; /* its benchmark row's prompt builder (registry.h) */
} task;

typedef struct {
    const kvb_run_opts *o;
    cJSON *suite;
    const char *suite_name; /* the suite's "name", whole (run.json's "suite"); printed as suite_shown */
    char suite_shown[96], out_dir[1024], results_path[1100], model_path[1024], model_sha[65];
    kvb_model *model;
    kvb_cells cs;        /* the suite's method x budget cells */
    const cell *cells;   /* = cs.v */
    int n_cells;
    task tasks[MAX_TASKS];
    int n_tasks;
    kvb_runner_judge *judge; /* NULL when the suite and flags configure none */
    kvb_fp_index done; /* the last record of each key already in results.jsonl (benchmarks/fingerprint.h) */
    unsigned char *keep[MAX_TASKS]; /* per task, [sample * n_cells + cell]: 1 when in this run's shard */
    int fd;
    int lock_fd;         /* holds DIR/kvbench.lock for the whole run (base/fsutil.h kvb_lock_dir) */
    int round_chunk;
    long total, finished, ran;
    double t_start;
    FILE *out;
    kvb_progress prog;
    kvb_hostload load;
    char doing[160]; /* the sample or cell being worked on, for progress within it */
    char engine[192]; /* engine settings beside the defaults, for the fingerprints */
    FILE *kept;      /* --dump-kept file, or NULL */
    kvb_shared_prefill pf; /* the current sample's prefill; kept for the next question of a context group */
} run_state;

static void progress(run_state *st, kvb_prog_kind kind, const char *what);

/* "~/x" and "$KVB_DATA/x" expanded into out[cap]; -1 when the result does not fit (it is cut then). */
static int expand_path_fits(const char *in, char *out, size_t cap) {
    const char *home = getenv("HOME"), *data = getenv("KVB_DATA");
    int n;
    if (!strncmp(in, "~/", 2)) n = snprintf(out, cap, "%s/%s", home ? home : ".", in + 2);
    else if (!strncmp(in, "$KVB_DATA/", 10)) {
        if (data && *data) n = snprintf(out, cap, "%s/%s", data, in + 10);
        else n = snprintf(out, cap, "%s/.cache/kvbench/datasets/%s", home ? home : ".", in + 10);
    }
    else n = snprintf(out, cap, "%s", in);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static task *new_task(run_state *st, const char *name, const char *bench, char *err, size_t err_len) {
    if (st->n_tasks == MAX_TASKS) { ERR("suite: more than %d tasks", MAX_TASKS); return NULL; }
    const kvb_benchmark *row = kvb_benchmark_find(bench);
    if (!row) { ERR("task %s: benchmark %s has no row in the benchmark table", name, bench); return NULL; }
    task *t = &st->tasks[st->n_tasks++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->benchmark, sizeof t->benchmark, "%s", bench);
    t->prompt = row->prompt;
    return t;
}

static kvb_samples *add_task(void *ctx, const char *name, const char *bench, kvb_judge_kind judge, char *err,
                             size_t err_len) {
    task *t = new_task(ctx, name, bench, err, err_len);
    if (t) t->judge = judge;
    return t ? &t->samples : NULL;
}

static int ready_judge(void *ctx, kvb_judge_kind kind, char *err, size_t err_len) {
    run_state *st = ctx;
    return kind == KVB_JK_LONGMEMEVAL ? kvb_runner_judge_need_lme(st->judge, err, err_len) : 0;
}

static void expand_path(const char *in, char *out, size_t cap) { expand_path_fits(in, out, cap); }

/* A suite entry through its benchmark's loader (registry.h). */
static int load_benchmark(run_state *st, const cJSON *b, char *err, size_t err_len) {
    const char *type = kvb_json_str(b, "type", NULL);
    if (!type) return ERR("suite %s: every benchmark needs a \"type\"", st->o->suite_path);
    const kvb_benchmark *bm = kvb_benchmark_find(type);
    if (!bm) {
        char known[256];
        kvb_benchmark_names(known, sizeof known);
        return ERR("suite %s: unknown benchmark type '%s' (known: %s)", st->o->suite_path, type, known);
    }
    int limit = (int)kvb_json_num(b, "limit", 0);
    if (st->o->limit > 0 && (limit <= 0 || st->o->limit < limit)) limit = st->o->limit;
    kvb_bench_env env = {st->o->suite_path, st->model->cfg.n_ctx_train, limit, (uint64_t)kvb_json_num(st->suite, "seed", 1),
                         cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "optional")), expand_path_fits,
                         kvb_count_tokens, st->model, add_task, st, st->judge != NULL, ready_judge};
    return bm->load(&env, b, err, err_len);
}

/* ---- records on disk ---- */

/* Read finished records (reports/results.h: the reader every command shares); cut a torn last line (a crash
 * mid-append) so appends stay line-aligned. */
static int load_done(run_state *st, char *err, size_t err_len) {
    kvb_results_reader rd;
    if (kvb_results_open(&rd, st->results_path, err, err_len)) return errno == ENOENT ? (err[0] = 0, 0) : -1;
    rd.lean = 1; /* the index keeps what it needs of the line itself */
    kvb_record rec;
    cJSON *r;
    int rc;
    while ((rc = kvb_results_next(&rd, &rec, &r, err, err_len)) == 1) {
        int no_id = !rec.sample_id, oom = !no_id && kvb_fp_index_add(&st->done, r, rec.line);
        kvb_record_free(&rec);
        cJSON_Delete(r);
        if (no_id || oom) {
            rc = no_id ? ERR("%s:%ld: field \"sample_id\" is missing (a resume finds a record by it)", st->results_path, rd.line_no)
                       : ERR("out of memory");
            break;
        }
    }
    long good_end = rd.good_end;
    int torn = rd.n_torn;
    kvb_results_close(&rd);
    if (rc) return -1;
    struct stat sb;
    if (stat(st->results_path, &sb) == 0 && sb.st_size > good_end) {
        if (torn) fprintf(stderr, "resume: dropping a torn last record in %s\n", st->results_path);
        if (truncate(st->results_path, good_end)) return ERR("cannot truncate %s: %s", st->results_path, strerror(errno));
    }
    kvb_fp_index_finish(&st->done);
    return 0;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int append_record(run_state *st, cJSON *rec, char *err, size_t err_len) {
    char *text = cJSON_PrintUnformatted(rec);
    if (!text) return ERR("out of memory");
    size_t n = strlen(text);
    text[n] = '\n'; /* cJSON's buffer has the NUL there: one write of the whole line */
    int rc = write_all(st->fd, text, n + 1) || fsync(st->fd) ? ERR("cannot append to %s: %s", st->results_path, strerror(errno)) : 0;
    free(text);
    return rc;
}

/* Every cell of the suite with its shard (benchmarks/shard.h), in run order, added to DIR/plan.jsonl
 * (kvb_plan_write) so `kvbench merge` can name missing cells and the report records no plan has; st->keep
 * marks the cells of this run's shard. */
static int plan_shard(run_state *st, char *err, size_t err_len) {
    int count = st->o->shard.count > 0 ? st->o->shard.count : 1;
    char *opts[MAX_CELLS] = {0}, *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc = f ? 0 : ERR("out of memory");
    for (int k = 0; !rc && k < st->n_cells; k++)
        if (st->cells[k].opts && !(opts[k] = cJSON_PrintUnformatted(st->cells[k].opts))) rc = ERR("out of memory");
    for (int i = 0; !rc && i < st->n_tasks; i++) {
        const task *t = &st->tasks[i];
        if (!(st->keep[i] = calloc((size_t)t->samples.n * st->n_cells + 1, 1))) rc = ERR("out of memory");
        for (int s = 0; !rc && s < t->samples.n; s++)
            for (int k = 0; !rc && k < st->n_cells; k++) {
                const cell *c = &st->cells[k];
                const char *id = t->samples.v[s].id ? t->samples.v[s].id : "";
                int sh = kvb_shard_of(st->model_sha, c->method, c->budget_str, opts[k], t->benchmark, t->name, id, count);
                if (sh < 0) { rc = ERR("shard: SHA-256 failed"); break; }
                st->keep[i][s * st->n_cells + k] = sh == st->o->shard.index || st->o->shard.count == 0;
                cJSON *row = cJSON_CreateArray();
                const char *fields[] = {c->method, c->budget_str, t->benchmark, t->name, id};
                for (int x = 0; x < 5; x++) cJSON_AddItemToArray(row, cJSON_CreateString(fields[x]));
                cJSON_AddItemToArray(row, cJSON_CreateNumber(sh));
                char *line = cJSON_PrintUnformatted(row);
                cJSON_Delete(row);
                if (!line) { rc = ERR("out of memory"); break; }
                fprintf(f, "%s\n", line);
                free(line);
            }
    }
    for (int k = 0; k < st->n_cells; k++) free(opts[k]);
    if (f && fclose(f) && !rc) rc = ERR("out of memory");
    char *path = rc ? NULL : kvb_path_join(st->out_dir, "plan.jsonl");
    if (!rc) rc = path ? kvb_plan_write(path, text ? text : "", err, err_len) : ERR("out of memory");
    free(text), free(path);
    return rc;
}

/* run.json: written once; a later run must be the same suite on the same model. */
static int prepare_run_json(run_state *st, char *err, size_t err_len) {
    char path[1100], shard[32];
    snprintf(path, sizeof path, "%s/run.json", st->out_dir);
    kvb_shard_format(&st->o->shard, shard, sizeof shard);
    char *buf = access(path, F_OK) == 0 ? kvb_read_file(path, NULL, err, err_len) : NULL;
    if (!buf && access(path, F_OK) == 0) return -1;
    if (buf) {
        cJSON *j = cJSON_Parse(buf);
        free(buf);
        const char *s = kvb_json_str(j, "suite", NULL), *sha = kvb_json_str(j, "model_sha256", NULL);
        int rc = 0;
        if (!j || !s) rc = ERR("%s is not a kvbench run.json", path);
        else if (strcmp(s, st->suite_name)) {
            char shown[96];
            rc = ERR("%s holds results of suite '%s', not '%s' (use another --out)", st->out_dir, kvb_str_shown(s, shown, sizeof shown),
                     st->suite_shown);
        }
        else if (!sha || strcmp(sha, st->model_sha)) rc = ERR("%s holds results of another model (sha256 %.12s...)", st->out_dir, sha ? sha : "?");
        else if (strcmp(kvb_json_str(j, "shard", ""), shard)) rc = ERR("%s holds shard '%s', not '%s' (use another --out)", st->out_dir, kvb_json_str(j, "shard", ""), shard);
        cJSON_Delete(j);
        return rc;
    }
    cJSON *j = cJSON_CreateObject();
    char ts[64];
    time_t t = time(NULL);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON_AddStringToObject(j, "suite", st->suite_name);
    cJSON_AddStringToObject(j, "suite_path", st->o->suite_path);
    cJSON_AddStringToObject(j, "model", st->model_path);
    cJSON_AddStringToObject(j, "model_sha256", st->model_sha);
    kvb_provenance_add(j, kvb_run_ctx_params(st->o).backend); /* the backend the cells run on (--backend) */
    if (shard[0]) cJSON_AddStringToObject(j, "shard", shard);
    else cJSON_AddNullToObject(j, "shard");
    cJSON_AddNumberToObject(j, "threads", st->o->n_threads);
    cJSON_AddStringToObject(j, "flags", st->o->argv_line ? st->o->argv_line : "");
    cJSON_AddStringToObject(j, "created", ts);
    cJSON_AddItemToObject(j, "suite_config", cJSON_Duplicate(st->suite, 1));
    cJSON *judge = kvb_runner_judge_describe(st->judge);
    if (judge) cJSON_AddItemToObject(j, "judge", judge);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return ERR("out of memory");
    kvb_redact_url_userinfo(text);
    int rc = kvb_write_file_atomic(path, text, err, err_len);
    free(text);
    return rc;
}

/* ---- one sample ---- */

typedef kvb_shared_prefill shared_prefill;

static int cell_opts(const cell *c, kvb_opts *o, char *err, size_t err_len) {
    memset(o, 0, sizeof *o);
    char where[64];
    snprintf(where, sizeof where, "method %s", c->method);
    return kvb_opts_add_json(o, c->opts, where, err, err_len);
}

/* Session progress (engine/session.h) as the runner's step events. */
static void on_progress(void *user, const char *phase, int64_t done, int64_t total) {
    run_state *st = user;
    char what[240];
    snprintf(what, sizeof what, "%s: %s %lld/%lld tokens", st->doing, phase, (long long)done, (long long)total);
    progress(st, KVB_PROG_STEP, what);
}

/* The sample's one exact prefill (shared_prefill.h), kept for the next question of its context group. */
static int run_prefill(run_state *st, const task *t, const kvb_sample *s, const kvb_method_needs *u, int max_new,
                       char *err, size_t err_len) {
    kvb_prefill_env e = {st->model, kvb_run_ctx_params(st->o), st->model->cfg.n_ctx_train, st->round_chunk,
                         {.progress = on_progress, .user = st}, t->prompt};
    if (st->o->n_ctx > 0 && st->o->n_ctx < e.n_ctx) e.n_ctx = st->o->n_ctx;
    return kvb_shared_prefill_run(&e, s, t->hidden, u, max_new, &st->pf, err, err_len);
}

typedef struct {
    kvb_session ses;
    char params[240], note[160];
} cell_result;

/* One cell on the shared prefill: fork, install the method (it adopts the prefill's statistics, or prefills the
 * question round itself), decode through the session. */
static int run_cell(run_state *st, const cell *cl, const kvb_sample *s, shared_prefill *sp,
                    int max_new, cell_result *res, char *err, size_t err_len) {
    const kvb_method_needs *nd = &cl->needs;
    kvb_opts o;
    if (cell_opts(cl, &o, err, err_len)) return -1;
    if (nd->own_prefill && sp->split)
        return ERR("%s: question hidden and carried turns are not supported (the method prefills the question round itself)", cl->method);
    const kvb_ctx *from = nd->own_prefill && sp->hist ? sp->hist : sp->base;
    double t0 = kvb_now_s();
    /* the window this method reads, not the shared prefill's (the union of the cells'): a window kept is a window
     * recorded at every decode step */
    kvb_ctx *c = kvb_ctx_fork(from, nd->own_prefill ? 0 : nd->obs_window, err, err_len);
    if (!c) return -1;
    kvb_method *m = kvb_method_create(cl->method, c, &cl->budget, &o, err, err_len);
    kvb_session_method seam = kvb_method_seam(m);
    kvb_kept *kept = st->kept && m ? kvb_kept_attach(c) : NULL;
    char *stop[1] = {(char *)s->stop};
    kvb_gen_params gp = {.max_new = max_new, .stop = stop, .n_stop = s->stop ? 1 : 0, .ignore_eos = s->ignore_eos,
                          .progress = on_progress, .user = st};
    int rc = -1;
    if (!m || kvb_session_init(&res->ses, c, &seam, &gp, err, err_len)) goto done;
    if (nd->own_prefill && sp->hist) {
        res->ses.prefill_ms = sp->hist_ms + (kvb_now_s() - t0) * 1e3;
        if (kvb_session_prefill(&res->ses, &sp->p, sp->p.n_rounds - 1, err, err_len)) goto done;
        if (!sp->p.real_rounds)
            snprintf(m->note, sizeof m->note, "single prompt: rounds are %d-token chunks (%d rounds)", st->round_chunk, sp->p.n_rounds);
    } else {
        /* a method that prefills itself, given a single round (nothing to select from), adopts like the others;
         * hidden: the question reaches the compressed cache only after the end of prefill, so the method never saw
         * it; a question reusing its group's context prefill counts only its own part (the first one holds it) */
        double shared_ms = (sp->reused ? 0 : kvb_shared_prefill_cell_ms(sp, nd)) + (kvb_now_s() - t0) * 1e3;
        if (kvb_shared_prefill_adopt(&res->ses, sp, shared_ms, err, err_len)) goto done;
    }
    if (kvb_run_kept_note(st->kept, kept, c, m, cl->budget_str, s->id ? s->id : "", st->doing, NULL, "prefill", err, err_len) ||
        kvb_session_decode(&res->ses, err, err_len) ||
        kvb_run_kept_note(st->kept, kept, c, m, cl->budget_str, s->id ? s->id : "", st->doing, NULL, "end", err, err_len))
        goto done;
    if (m->def->describe) m->def->describe(m, res->params, sizeof res->params);
    snprintf(res->note, sizeof res->note, "%s", m->note);
    rc = 0;
done:
    res->ses.c = NULL; /* the context goes; the measurements stay */
    kvb_kept_free(kept, c);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    return rc;
}

/* The sample's follow-up (kvb_sample.followup: LongBench v2's CoT answer question, as pred.py asks it) after the
 * cell's first reply: its own prompt (cut in the middle like the first), prefilled for this cell alone, then the
 * same method and budget generate the second reply. s2 and sp2 are the caller's to free. */
static int run_followup(run_state *st, const cell *cl, const kvb_sample *s, const char *reply, kvb_sample *s2,
                        shared_prefill *sp2, cell_result *res2, char *err, size_t err_len) {
    kvb_sample_init(s2);
    s2->id = kvb_strdup(s->id);
    s2->task = kvb_strdup(s->task);
    s2->prompt = kvb_sample_followup_prompt(s, reply);
    s2->use_chat = s->use_chat;
    s2->max_new_tokens = s->followup_max_new > 0 ? s->followup_max_new : 64;
    if ((s->id && !s2->id) || (s->task && !s2->task) || !s2->prompt) return ERR("out of memory");
    /* the follow-up is one prompt whatever the first question's benchmark */
    kvb_prefill_env e = {st->model, kvb_run_ctx_params(st->o), st->model->cfg.n_ctx_train, st->round_chunk,
                         {.progress = on_progress, .user = st}, kvb_prompt_single};
    if (st->o->n_ctx > 0 && st->o->n_ctx < e.n_ctx) e.n_ctx = st->o->n_ctx;
    if (kvb_shared_prefill_run(&e, s2, 0, &cl->needs, s2->max_new_tokens, sp2, err, err_len)) return -1;
    return run_cell(st, cl, s2, sp2, s2->max_new_tokens, res2, err, err_len);
}

static cJSON *phase_obj(const double *ms) {
    cJSON *o = cJSON_CreateObject();
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++)
        if (ms[ph] > 0) cJSON_AddNumberToObject(o, prof_phase_name((prof_phase)ph), ms[ph]);
    return o;
}

/* A copy of s into *dst (NULL stays NULL); *oom set when the copy fails. */
static void set_str(char **dst, const char *s, int *oom) {
    *dst = s ? strdup(s) : NULL;
    *oom |= s && !*dst;
}

/* The record of cell cl on sample s (reports/record.h: every field it has is a row of its table); -1 when out of
 * memory (*r is freed then). */
static int make_record(run_state *st, const task *t, const cell *cl, const kvb_sample *s, const shared_prefill *sp,
                       const cell_result *res, const shared_prefill *sp2, const cell_result *res2, const char *error,
                       kvb_record *r) {
    /* sp2, res2: the follow-up's prefill and reply (NULL without one): the second reply is the prediction and is
     * scored, the first is kept as first_prediction; the costs are both generations' (KV held: the first's, the
     * one over the context) */
    const cell_result *last = res2 ? res2 : res;
    int oom = 0;
    kvb_record_init(r);
    set_str(&r->method, cl->method, &oom);
    set_str(&r->budget, cl->budget_str, &oom);
    set_str(&r->method_params, res->params, &oom);
    set_str(&r->benchmark, t->benchmark, &oom);
    set_str(&r->task, t->name, &oom);
    set_str(&r->sample_id, s->id ? s->id : "", &oom);
    set_str(&r->qtype, s->qtype, &oom);
    set_str(&r->difficulty, s->difficulty, &oom);
    set_str(&r->domain, s->domain, &oom);
    const kvb_benchmark *bm = kvb_benchmark_find(t->benchmark);
    set_str(&r->length_bin, bm && bm->length_bin ? bm->length_bin(s) : NULL, &oom);
    if (s->ctx_tokens > 0) r->ctx_len = s->ctx_tokens, r->depth = s->depth;
    r->abstention = s->abstention;
    r->prompt_tokens = (double)sp->p.n;
    set_str(&r->question, t->hidden ? "hidden" : "visible", &oom);
    /* several questions over one context, question hidden: the context's prefill runs once, and its cost is in
     * the record of the group's first question ("first"); a later one ("reused") counts its question only */
    if (s->group && (t->hidden || s->carried)) {
        set_str(&r->context_group, s->group, &oom);
        set_str(&r->shared_prefill, sp->reused ? "reused" : "first", &oom);
    }
    r->prefill_tokens = (double)(kvb_shared_prefill_tokens(sp) + (sp2 ? kvb_shared_prefill_tokens(sp2) : 0));
    r->prompt_rounds = sp->p.n_rounds;
    r->prompt_truncated = sp->p.truncated || (sp2 && sp2->p.truncated);
    r->generated_tokens = res->ses.n_gen + (res2 ? res2->ses.n_gen : 0);
    { /* the generation as the official scripts' tokenizer.decode gives it: a character cut in two (the last token
       * at max_new_tokens) becomes U+FFFD, so the record is valid UTF-8 and JSON */
        char *text = kvb_utf8_lossy(last->ses.text ? last->ses.text : "");
        if (!text) oom = 1;
        set_str(&r->prediction, text ? text : "", &oom);
        free(text);
        if (res2 && !(text = kvb_utf8_lossy(res->ses.text ? res->ses.text : ""))) oom = 1;
        if (res2) set_str(&r->first_prediction, text ? text : "", &oom), free(text);
    }
    if (s->n_answers > 0 && !(r->answers.v = calloc((size_t)s->n_answers, sizeof *r->answers.v))) oom = 1;
    for (int i = 0; r->answers.v && i < s->n_answers; i++) set_str(&r->answers.v[r->answers.n++], s->answers[i], &oom);
    char metric[48] = "";
    double score = 0;
    int scored = !error && kvb_score_sample(t->benchmark, s, last->ses.text ? last->ses.text : "", &score, metric, sizeof metric) == 0;
    set_str(&r->metric, metric, &oom);
    if (scored) r->score = score;
    set_str(&r->error, error, &oom);
    r->ttft_ms = r->prefill_ms = res->ses.prefill_ms + (res2 ? res2->ses.prefill_ms : 0);
    r->decode_ms_per_token = kvb_session_ms_per_token(&res->ses);
    if (res2 && res->ses.steps + res2->ses.steps > 0)
        r->decode_ms_per_token = (res->ses.decode_ms + res2->ses.decode_ms) / (res->ses.steps + res2->ses.steps);
    double pre[PROF_PHASE_COUNT], dec[PROF_PHASE_COUNT];
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) {
        pre[ph] = (sp->reused ? 0 : sp->pre_phase_ms[ph]) + res->ses.pre_phase_ms[ph];
        if (ph == PROF_SELECT && !sp->reused && !cl->needs.scorer[0]) pre[ph] -= sp->scorer_ms; /* KVzap's, in its hook */
        dec[ph] = res->ses.dec_phase_ms[ph];
        if (res2) pre[ph] += sp2->pre_phase_ms[ph] + res2->ses.pre_phase_ms[ph], dec[ph] += res2->ses.dec_phase_ms[ph];
    }
    if (!st->o->profile) {
        /* phases are timed with --profile only: the breakdown stays null */
    } else if ((r->breakdown = cJSON_CreateObject())) {
        cJSON_AddItemToObject(r->breakdown, "prefill", phase_obj(pre));
        cJSON_AddItemToObject(r->breakdown, "decode", phase_obj(dec));
    } else oom = 1;
    r->kv_device_bytes = (double)res->ses.kv_prefill.device_bytes;
    r->kv_device_bytes_end = (double)res->ses.kv_end.device_bytes;
    r->kv_host_bytes = (double)res->ses.kv_end.host_bytes;
    r->kv_full_bytes = (double)res->ses.kv_prefill.full_bytes;
    r->moved_bytes = (double)(res->ses.kv_end.moved_h2d + res->ses.kv_end.moved_d2h);
    if (res2) r->moved_bytes += (double)(res2->ses.kv_end.moved_h2d + res2->ses.kv_end.moved_d2h);
    r->attended_per_layer = res->ses.attended;
    set_str(&r->note, res->note, &oom);
    r->seed = kvb_json_num(st->suite, "seed", 1);
    set_str(&r->model_sha256, st->model_sha, &oom);
    if (oom) kvb_record_free(r);
    return oom ? -1 : 0;
}

/* The record as its line's JSON (the writer of reports/record.h); NULL + err. */
static cJSON *record_json(const kvb_record *r, char *err, size_t err_len) {
    char why[256];
    cJSON *j = kvb_record_to_json(r, why, sizeof why);
    if (!j) ERR("record of %s@%s %s: %s", r->method ? r->method : "?", r->budget ? r->budget : "?", r->task ? r->task : "?", why);
    return j;
}

/* Progress on stderr (benchmarks/progress.h): the runner's counts, then the event. */
static void progress(run_state *st, kvb_prog_kind kind, const char *what) {
    st->prog.total = st->total, st->prog.finished = st->finished, st->prog.ran = st->ran;
    kvb_progress_note(&st->prog, kind, what, kvb_now_s());
}

/* The fingerprint of cell cl on sample s (fingerprint.h). */
static cJSON *fingerprint_of(const run_state *st, const task *t, const cell *cl, const kvb_sample *s, const char *sample_sha) {
    kvb_fp_in in = {st->model_sha, cl->method, cl->budget_str, cl->opts, t->bench, sample_sha,
                    s->max_new_tokens > 0 ? s->max_new_tokens : 64, st->round_chunk, kvb_json_num(st->suite, "seed", 1), st->engine};
    return kvb_fp_make(&in);
}

static int run_sample(run_state *st, const task *t, const kvb_sample *s, char *err, size_t err_len) {
    int todo[MAX_CELLS], n_todo = 0, n_held = 0, rc = 0;
    kvb_method_needs u = {0}; /* the union of the cells' needs */
    cJSON *fps[MAX_CELLS] = {0}, *held[MAX_CELLS]; /* a judged task's records wait for one judge batch per sample */
    int rerun[MAX_CELLS] = {0};
    char sample_sha[65];
    kvb_fp_sample(s, sample_sha);
    for (int k = 0; k < st->n_cells && !rc; k++) {
        const cell *cl = &st->cells[k];
        if (!st->keep[t - st->tasks][(s - t->samples.v) * st->n_cells + k]) continue; /* another shard's */
        char why[400], *key = kvb_fp_key_new(cl->method, cl->budget_str, t->name, s->id ? s->id : "");
        if (!key || !(fps[k] = fingerprint_of(st, t, cl, s, sample_sha))) { free(key), rc = ERR("out of memory"); break; }
        const kvb_fp_entry *e = kvb_fp_index_find(&st->done, key);
        if (e && kvb_fp_compare(e->fingerprint, fps[k], why, sizeof why)) {
            if (!st->o->rerun_changed)
                rc = ERR("%.300s%s: the record in %s was made with other inputs (%s); pass --rerun-changed to run such cells again, or use another --out",
                         key, strlen(key) > 300 ? "..." : "", st->results_path, why);
            else
                e = NULL, rerun[k] = 1; /* run again: the new record supersedes the old one */
        }
        free(key);
        if (rc || (e && !e->pending)) continue;
        if (e) { /* generated before a crash, its verdict never arrived: judge the stored prediction */
            held[n_held++] = cJSON_Duplicate(e->pending, 1);
            continue;
        }
        kvb_method_needs_merge(&u, &cl->needs);
        todo[n_todo++] = k;
    }
    int max_new = s->max_new_tokens > 0 ? s->max_new_tokens : 64;
    shared_prefill *sp = &st->pf;
    char what[240];
    snprintf(st->doing, sizeof st->doing, "%s #%s", t->name, s->id ? s->id : "");
    double t_sample = kvb_now_s();
    char perr[512] = "";
    int prc = 0;
    if (n_todo && !rc) {
        snprintf(what, sizeof what, "%s: shared prefill", st->doing);
        progress(st, KVB_PROG_BEGIN, what);
        prc = run_prefill(st, t, s, &u, max_new, perr, sizeof perr);
    }
    long prompt_tokens = (long)sp->p.n;
    for (int i = 0; i < n_todo && rc == 0; i++) {
        const cell *cl = &st->cells[todo[i]];
        snprintf(st->doing, sizeof st->doing, "%s@%s %s #%s", cl->method, cl->budget_str, t->name, s->id ? s->id : "");
        progress(st, KVB_PROG_STEP, st->doing);
        cell_result res = {0};
        char cerr[512] = "";
        int crc = prc ? -1 : run_cell(st, cl, s, sp, max_new, &res, cerr, sizeof cerr);
        /* a follow-up question (kvb_sample.followup) asks again in this cell from the first reply */
        cell_result res2 = {0};
        kvb_sample s2 = {0};
        shared_prefill sp2 = {0};
        int two = !prc && !crc && s->followup;
        if (two) {
            char *reply = kvb_utf8_lossy(res.ses.text ? res.ses.text : "");
            crc = reply ? run_followup(st, cl, s, reply, &s2, &sp2, &res2, cerr, sizeof cerr)
                        : (kvb_seterr(cerr, sizeof cerr, "out of memory"), -1);
            free(reply);
        }
        kvb_record r;
        int mrc = make_record(st, t, cl, s, sp, &res, two ? &sp2 : NULL, two ? &res2 : NULL,
                              prc ? perr : (crc ? cerr : NULL), &r);
        kvb_session_free(&res.ses);
        kvb_session_free(&res2.ses);
        kvb_shared_prefill_free(&sp2);
        kvb_sample_free(&s2);
        if (mrc) { rc = ERR("out of memory"); break; }
        r.fingerprint = fps[todo[i]];
        fps[todo[i]] = NULL;
        r.rerun = rerun[todo[i]]; /* the report keeps it without a warning */
        cJSON *rec = NULL;
        if (t->judge != KVB_JK_NONE && !r.error) {
            /* written now, completed by a second record when the verdict arrives: a crash loses no generation */
            if (!(r.judge = cJSON_CreateObject()) || !cJSON_AddBoolToObject(r.judge, "pending", 1)) rc = ERR("out of memory");
            cJSON *pend = rc ? NULL : record_json(&r, err, err_len);
            if (!rc) rc = pend ? append_record(st, pend, err, err_len) : -1;
            cJSON_Delete(pend);
            cJSON_Delete(r.judge);
            r.judge = NULL, r.rerun = 0; /* the verdict's record: judging.c fills "judge" */
        }
        if (!rc && !(rec = record_json(&r, err, err_len))) rc = -1;
        kvb_record_free(&r);
        if (rc) break;
        if (t->judge != KVB_JK_NONE) { held[n_held++] = rec; continue; }
        rc = append_record(st, rec, err, err_len);
        cJSON_Delete(rec);
        st->finished++;
        st->ran++;
    }
    if (n_todo && (prc || !sp->group)) kvb_shared_prefill_free(sp); /* a group's context waits for its next question */
    if (n_held && !rc) {
        snprintf(what, sizeof what, "%s #%s: judging %d predictions", t->name, s->id ? s->id : "", n_held);
        progress(st, KVB_PROG_STEP, what);
        rc = kvb_runner_judge_records(st->judge, t->judge, s, held, n_held, err, err_len);
    }
    for (int i = 0; i < n_held; i++) {
        if (!rc) rc = append_record(st, held[i], err, err_len);
        if (!rc) st->finished++, st->ran++;
        cJSON_Delete(held[i]);
    }
    for (int k = 0; k < st->n_cells; k++) cJSON_Delete(fps[k]);
    if (n_todo) {
        kvb_hostload_sample(&st->load);
        snprintf(what, sizeof what, "%s #%s: %d cells, %ld prompt tokens, %.1f s", t->name, s->id ? s->id : "", n_todo,
                 prompt_tokens, kvb_now_s() - t_sample);
        progress(st, KVB_PROG_END, what);
    }
    return rc;
}

static void free_state(run_state *st) {
    for (int i = 0; i < st->n_tasks; i++) kvb_samples_free(&st->tasks[i].samples), free(st->keep[i]);
    kvb_fp_index_free(&st->done);
    kvb_shared_prefill_free(&st->pf);
    if (st->fd >= 0) close(st->fd);
    kvb_unlock_dir(st->lock_fd);
    kvb_model_free(st->model);
    kvb_runner_judge_free(st->judge);
    kvb_cells_free(&st->cs);
    if (st->kept) fclose(st->kept);
    cJSON_Delete(st->suite);
}

/* The suite read strictly (benchmarks/suitecheck.h); what needs the model is checked once it is loaded. */
static int load_suite(run_state *st, char *err, size_t err_len) {
    if (!(st->suite = kvb_suite_parse(st->o->suite_path, err, err_len)) ||
        kvb_suite_check(st->suite, st->o->suite_path, 0, err, err_len) ||
        kvb_serve_suite_check(st->suite, st->o->suite_path, err, err_len))
        return -1;
    st->suite_name = kvb_json_str(st->suite, "name", "suite");
    kvb_str_shown(st->suite_name, st->suite_shown, sizeof st->suite_shown);
    st->round_chunk = (int)kvb_json_num(st->suite, "round_chunk", 512);
    return 0;
}

int kvb_run_suite(const kvb_run_opts *o, FILE *out, char *err, size_t err_len) {
    run_state st;
    memset(&st, 0, sizeof st);
    st.o = o;
    st.out = out;
    st.fd = st.lock_fd = -1;
    int rc = -1;
    if (load_suite(&st, err, err_len)) goto done;
    kvb_judge_flags jf = {o->judge_url, o->judge_model, o->judge_key_env, o->judge_refresh};
    st.judge = kvb_runner_judge_create(cJSON_GetObjectItemCaseSensitive(st.suite, "judge"), &jf, expand_path, err, err_len);
    if (!st.judge && err[0]) goto done;
    const char *model = o->model ? o->model : kvb_json_str(st.suite, "model", "default");
    if (syn_is_name(model)) {
        ERR("synthetic models have no tokenizer: a suite needs text; use a GGUF model");
        goto done;
    }
    if (kvb_model_resolve(model, st.model_path, sizeof st.model_path, err, err_len)) goto done;
    if (!(st.model = kvb_model_load(st.model_path, err, err_len))) goto done;
    if (kvb_model_sha256(st.model, st.model_sha, err, err_len)) goto done;
    int n_ctx = o->n_ctx > 0 && o->n_ctx < st.model->cfg.n_ctx_train ? o->n_ctx : st.model->cfg.n_ctx_train;
    if (kvb_suite_check(st.suite, o->suite_path, n_ctx, err, err_len)) goto done; /* max_new_tokens against the context */
    const char *out_dir = o->out_dir ? o->out_dir : kvb_json_str(st.suite, "output", "runs/suite");
    if (!*out_dir) {
        ERR("the output folder (%s) is empty; name one", o->out_dir ? "--out" : "the suite's \"output\"");
        goto done;
    }
    if (expand_path_fits(out_dir, st.out_dir, sizeof st.out_dir)) {
        ERR("the output folder \"%.40s...\" (%s) is longer than the %zu bytes kvbench takes; use a shorter --out",
            out_dir, o->out_dir ? "--out" : "the suite's \"output\"", sizeof st.out_dir - 1);
        goto done;
    }
    kvb_cells_args ca = {o->suite_path, o->methods, o->budgets, o->method_opts, o->n_method_opts};
    if (kvb_cells_expand(st.suite, &ca, &st.cs, err, err_len)) goto done;
    st.cells = st.cs.v;
    st.n_cells = st.cs.n;
    kvb_ctx_params cp = kvb_run_ctx_params(o);
    if (kvb_suite_check_methods(&st.cs, o->suite_path, st.model, &cp, 0, err, err_len)) goto done; /* before anything is written */
    kvb_run_engine_fingerprint(o, st.engine, sizeof st.engine);
    if (o->dump_kept && !(st.kept = fopen(o->dump_kept, "a"))) {
        ERR("--dump-kept %s: %s", o->dump_kept, strerror(errno));
        goto done;
    }
    const cJSON *benches = cJSON_GetObjectItemCaseSensitive(st.suite, "benchmarks"), *b;
    if (!cJSON_IsArray(benches)) { ERR("suite %s: \"benchmarks\" must be an array", o->suite_path); goto done; }
    if (!cJSON_GetArraySize(benches) && !cJSON_GetObjectItemCaseSensitive(st.suite, "serve")) {
        ERR("suite %s: \"benchmarks\" is empty: nothing to run", o->suite_path);
        goto done;
    }
    cJSON_ArrayForEach(b, benches) {
        int first = st.n_tasks;
        if (load_benchmark(&st, b, err, err_len)) goto done;
        for (int i = first; i < st.n_tasks; i++) { /* a loader's own check names the file and line; this is for all */
            int x, y, dup = kvb_samples_find_dup_id(&st.tasks[i].samples, 0, &x, &y);
            if (dup) {
                if (dup < 0) ERR("out of memory");
                else ERR("suite %s: task %s: samples %d and %d have one id '%.80s': every sample needs its own", o->suite_path,
                         st.tasks[i].name, x + 1, y + 1, st.tasks[i].samples.v[y].id ? st.tasks[i].samples.v[y].id : "");
                goto done;
            }
        }
        for (int i = first; i < st.n_tasks; i++) st.tasks[i].bench = b;
        /* "max_new_tokens" on a benchmark caps generation (cost control; the official lengths otherwise) */
        /* "question": "hidden" (kvpress's protocol) or "visible" (the default: the benchmarks' own code) */
        const char *q = kvb_json_str(b, "question", "visible");
        if (strcmp(q, "visible") && strcmp(q, "hidden")) { ERR("suite %s: \"question\" must be \"visible\" or \"hidden\", not \"%s\"", o->suite_path, q); goto done; }
        for (int i = first; !strcmp(q, "hidden") && i < st.n_tasks; i++) {
            st.tasks[i].hidden = 1;
            size_t l = strlen(st.tasks[i].name);
            snprintf(st.tasks[i].name + l, sizeof st.tasks[i].name - l, "+hidden");
        }
        int cap = (int)kvb_json_num(b, "max_new_tokens", 0);
        for (int i = first; cap > 0 && i < st.n_tasks; i++)
            for (int k = 0; k < st.tasks[i].samples.n; k++) {
                kvb_sample *x = &st.tasks[i].samples.v[k];
                x->max_new_tokens = cap;
                if (x->followup_max_new > cap) x->followup_max_new = cap; /* a follow-up's generation too */
            }
        /* "ignore_eos": true generates max_new_tokens whatever the model says (as bench and vLLM's benchmarks do:
         * for timing; in the benchmark object, so in the records' fingerprints) */
        int no_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "ignore_eos"));
        for (int i = first; no_eos && i < st.n_tasks; i++)
            for (int k = 0; k < st.tasks[i].samples.n; k++) st.tasks[i].samples.v[k].ignore_eos = 1;
    }
    if (kvb_mkdirs(st.out_dir)) { ERR("cannot create %s: %s", st.out_dir, strerror(errno)); goto done; }
    /* one run per folder: a second one would append the same cells again and rewrite run.json under the first */
    if ((st.lock_fd = kvb_lock_dir(st.out_dir, err, err_len)) < 0) {
        if (strstr(err, "is in use")) {
            size_t l = strlen(err);
            snprintf(err + l, err_len - l, "; wait for it to end or use another --out");
        }
        goto done;
    }
    if (prepare_run_json(&st, err, err_len) || plan_shard(&st, err, err_len) ||
        kvb_run_calibrate(o, st.model, st.suite, &st.cs, st.out_dir, stderr, err, err_len) ||
        kvb_suite_check_methods(&st.cs, o->suite_path, st.model, &cp, 1, err, err_len)) /* those reading the profile made now */
        goto done;
    snprintf(st.results_path, sizeof st.results_path, "%s/results.jsonl", st.out_dir);
    if (load_done(&st, err, err_len)) goto done;
    if ((st.fd = kvb_open_regular(st.results_path, O_WRONLY | O_CREAT | O_APPEND, 0644, err, err_len)) < 0) goto done;
    for (int i = 0; i < st.n_tasks; i++)
        for (int k = 0; k < st.tasks[i].samples.n * st.n_cells; k++) st.total += st.keep[i][k];
    st.finished = st.done.n < st.total ? st.done.n : st.total;
    fprintf(stderr, "suite %s: %d tasks, %d method/budget cells, %ld records (%ld already done) -> %s\n", st.suite_shown,
            st.n_tasks, st.n_cells, st.total, st.finished, st.out_dir);
    st.t_start = kvb_now_s();
    kvb_progress_init(&st.prog, stderr, isatty(2), o->quiet, st.t_start);
    char run_json[1100];
    snprintf(run_json, sizeof run_json, "%s/run.json", st.out_dir);
    /* the threads the CPU backend uses: --threads, else $KVB_THREADS or the usable cores (kernels/backend.h), not
     * every online CPU (the host load's default) */
    const int threads = o->n_threads > 0 || (cp.backend && strcmp(cp.backend, "cpu")) ? o->n_threads : kvb_backend_cpu_default_threads();
    if (kvb_hostload_begin(&st.load, run_json, threads, err, err_len)) goto done;
    for (int i = 0; i < st.n_tasks; i++)
        for (int k = 0; k < st.tasks[i].samples.n; k++)
            if (run_sample(&st, &st.tasks[i], &st.tasks[i].samples.v[k], err, err_len)) goto done;
    progress(&st, KVB_PROG_DONE, "done");
    /* the suite's "serve" block: throughput rows beside the accuracy ones (a sharded run: shard 0 only) */
    kvb_ctx_params serve_cp = cp; /* --ctx caps the serve block's requests as it caps the samples */
    serve_cp.n_ctx = n_ctx;
    if (o->shard.index == 0 &&
        kvb_serve_suite_run(st.suite, o->suite_path, st.model, &serve_cp, &st.cs, st.out_dir, stderr, err, err_len))
        goto done;
    if (kvb_hostload_end(&st.load, run_json, err, err_len)) goto done;
    close(st.fd);
    st.fd = -1;
    if (kvb_report_write(st.out_dir, err, err_len)) goto done;
    if (out && kvb_report_print_main(st.out_dir, out, err, err_len)) goto done;
    rc = 0;
done:
    free_state(&st);
    return rc;
}
