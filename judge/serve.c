/* serve.c — the OpenAI-compatible server (see serve.h). One connection thread per client (libmicrohttpd);
 * an engine semaphore runs `parallel` generations at a time; a counter bounds the waiting ones. With batching,
 * the engine thread of serve_batch.h decodes the running generations together instead, and a connection thread
 * admits and prefills its request, then waits for the engine's tokens.
 *
 * Hostile clients: the bearer token and the framing headers are checked when the headers are in, before any
 * body is read; every connection is tracked from its start (socket context) so a request that is not read
 * whole within request_timeout_s is cut off however slowly it trickles, and a new connection beyond
 * max_connections takes the place of the oldest one still sending its request. Message content is
 * tokenized as plain text: only the chat template's own control tokens are parsed as such. */
#define _GNU_SOURCE /* memmem */
#include "judge/serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/chat.h"
#include "engine/sampler.h"
#include "engine/synthetic.h"
#include "judge/sched.h"
#include "judge/serve_batch.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define PREFILL_CHUNK 512 /* tokens per prefill step: a gone client or a stop is noticed between steps */
#define GEN_TIMEOUT_S 600 /* inactivity allowed to a connection once its request is read and being answered */
#define REQUEST_TIMEOUT_S 30    /* default request_timeout_s */
#define EVICT_HEADROOM 16       /* connections libmicrohttpd accepts beyond max_connections: room to evict into */
#define PROMPT_BYTES_PER_TOKEN 6 /* default max_prompt_bytes: this many bytes per token of the context (n_ctx) */

/* A connection, from its start to its close (libmicrohttpd's socket context). */
typedef struct conn_state {
    struct conn_state *prev, *next;
    int fd;
    double since_s; /* when its current request began: the connection's start, or the end of the previous reply */
    int reading;    /* 1 while a request is being read (headers, body): the request deadline applies */
    int evicted;    /* shut down by the server (past the deadline, or room for a new connection) */
} conn_state;

typedef struct {
    const kvb_serve_opts *o;
    kvb_model *model;
    char name[256];
    char *token;           /* bearer token, or NULL */
    sem_t engine;          /* `parallel` generations at a time */
    sb_engine *eng;        /* --batching: the engine thread that decodes every generation in one step; NULL = none */
    int threads_per;
    atomic_int in_flight;  /* running + waiting */
    atomic_long next_id;
    volatile sig_atomic_t *stop; /* set: generations end at their next step, waiting ones do not start */
    size_t max_prompt_bytes;
    kvb_ctx_params ctx;       /* every generation's context (kvb_serve_opts.ctx, or the defaults) */
    int n_ctx;                /* the largest prompt + max_tokens + 1: --ctx, else the model's context */
    pthread_mutex_t conns_mu; /* the connection list */
    conn_state *conns;        /* oldest first */
    int n_conns, max_conns;
    double request_timeout_s;
    atomic_int running;  /* the daemon is up: libmicrohttpd's messages go to stderr (on_mhd_log) */
    char mhd_error[200]; /* until then, its last one: why it could not start */
} server;

typedef struct {
    char *body;
    size_t n, cap;
    int too_large;
    int answered; /* a response was queued when the headers came in (401, 400, 413): the body is not read */
} upload;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- replies ---- */

static enum MHD_Result send_json(struct MHD_Connection *conn, unsigned status, cJSON *j) {
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *conn, unsigned status, const char *type, const char *param,
                                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(struct MHD_Connection *conn, unsigned status, const char *type, const char *param,
                                  const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    return send_json(conn, status, j);
}

/* 1 when a JSON text holds a NUL: a raw byte, or a \u0000 escape inside a string (cJSON would cut the string
 * there, silently changing the message). */
static int json_has_nul(const char *t, size_t n) {
    if (memchr(t, 0, n)) return 1;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_str) {
            in_str = t[i] == '"';
            continue;
        }
        if (t[i] == '"') in_str = 0;
        else if (t[i] == '\\' && i + 1 < n) {
            if (t[i + 1] == 'u' && i + 5 < n && !strncmp(t + i + 2, "0000", 4)) return 1;
            i++; /* the escaped character */
        }
    }
    return 0;
}

/* ---- one generation ---- */

typedef struct {
    server *s;
    char id[48];
    kvb_ctx *c;
    kvb_method *m;
    kvb_session ses;       /* the sample: sampling, stop rules, generated text */
    int prompt_tokens, stream, sent_role, finished_sent, locked;
    char **stop;
    int n_stop;
    char *pending;         /* stream bytes not yet handed to MHD */
    size_t pend_n, pend_off;
    struct MHD_Connection *conn;
    int gone;              /* the client was seen gone */
    sb_job job;            /* --batching: the generation in the engine's running set */
    int admitted;          /* --batching: it holds an admission (sb_start ran) */
} gen;

static void gen_free(gen *g) {
    if (!g) return;
    sb_engine *e = g->s->eng;
    if (e) sb_lock(e); /* the engine must not step it while it goes; its pages go back to the pool */
    if (e && g->admitted) sb_forget(e, &g->job);
    kvb_method_free(g->m, g->c);
    kvb_session_free(&g->ses);
    kvb_ctx_free(g->c);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->pending);
    if (e) sb_unlock(e);
    if (g->locked) sem_post(&g->s->engine);
    atomic_fetch_sub(&g->s->in_flight, 1);
    free(g);
}

static const char *finish_reason(const gen *g) { return g->ses.finish == KVB_FINISH_LENGTH ? "length" : "stop"; }

static int parse_messages(const cJSON *msgs, chat_msg **out, int *n, size_t *bytes, char *err, size_t err_len) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) return ERR("'messages' must be a non-empty array");
    int k = cJSON_GetArraySize(msgs);
    *out = calloc((size_t)k, sizeof **out);
    if (!*out) return ERR("out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content)) return ERR("messages[%d] needs string 'role' and 'content'", i);
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant"))
            return ERR("messages[%d].role must be system, user or assistant", i);
        (*out)[i].role = role->valuestring;
        (*out)[i].content = content->valuestring;
        *bytes += strlen(content->valuestring);
        i++;
    }
    *n = k;
    return 0;
}

static int parse_method(server *s, const cJSON *req, const char **method, kvb_budget *b, kvb_opts *o, char *err,
                        size_t err_len) {
    *method = s->o->method ? s->o->method : "full";
    *b = s->o->budget;
    *o = s->o->opts;
    const cJSON *ext = cJSON_GetObjectItemCaseSensitive(req, "kvbench");
    if (!ext) return 0;
    if (!cJSON_IsObject(ext)) return ERR("'kvbench' must be an object");
    const cJSON *mm = cJSON_GetObjectItemCaseSensitive(ext, "method"), *bb = cJSON_GetObjectItemCaseSensitive(ext, "budget"),
                *oo = cJSON_GetObjectItemCaseSensitive(ext, "method_opts");
    if (mm) {
        if (!cJSON_IsString(mm) || !kvb_method_find(mm->valuestring)) return ERR("kvbench.method: unknown method");
        *method = mm->valuestring;
        memset(o, 0, sizeof *o);
        b->kind = KVB_BUDGET_NONE;
    }
    if (bb && (!cJSON_IsString(bb) || kvb_budget_parse(bb->valuestring, b, err, err_len))) {
        if (!cJSON_IsString(bb)) ERR("kvbench.budget must be a string like \"30%%\"");
        return -1;
    }
    /* a file on the server's disk is the server's to name (kvbench serve --method-opt kvzap:scorer=DIR) */
    if (cJSON_GetObjectItemCaseSensitive(oo, "scorer"))
        return ERR("kvbench.method_opts: scorer names a file on the server: set it when the server starts");
    return kvb_opts_add_json(o, oo, "kvbench.method_opts", err, err_len);
}

/* A request's fields, validated. */
typedef struct {
    int max_tokens, stream, ignore_eos;
    double temp, top_p, seed;
    chat_msg *msgs; /* borrowed strings of the request */
    int n_msgs;
    size_t prompt_bytes; /* of the messages' content */
    const char *method;
    kvb_budget budget;
    kvb_opts opts;
    char **stop;
    int n_stop;
} req_params;

static void req_params_free(req_params *p) {
    free(p->msgs);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    memset(p, 0, sizeof *p);
}

/* Validate a parsed request body into p (no engine work): 0, or -1 + a one-line error naming the field. */
static int parse_request(server *s, const cJSON *req, req_params *p, char *err, size_t err_len) {
    memset(p, 0, sizeof *p);
    p->max_tokens = 256, p->top_p = 1.0, p->seed = 42;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "max_tokens"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1 << 20 || v->valuedouble != (double)v->valueint)
            return ERR("'max_tokens' must be a positive integer");
        p->max_tokens = v->valueint;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "temperature"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 2) return ERR("'temperature' must be in [0, 2]");
        p->temp = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "top_p"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble <= 0 || v->valuedouble > 1) return ERR("'top_p' must be in (0, 1]");
        p->top_p = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "seed")) && cJSON_IsNumber(v)) p->seed = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "ignore_eos"))) { /* vLLM's and llama.cpp's extension */
        if (!cJSON_IsBool(v)) return ERR("'ignore_eos' must be a boolean");
        p->ignore_eos = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "n")) && (!cJSON_IsNumber(v) || v->valuedouble != 1.0))
        return ERR("'n': only n = 1 is supported");
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "stream"))) {
        if (!cJSON_IsBool(v)) return ERR("'stream' must be a boolean");
        p->stream = cJSON_IsTrue(v);
    }
    if (parse_messages(cJSON_GetObjectItemCaseSensitive(req, "messages"), &p->msgs, &p->n_msgs, &p->prompt_bytes, err, err_len) ||
        parse_method(s, req, &p->method, &p->budget, &p->opts, err, err_len)) {
        req_params_free(p);
        return -1;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "stop")) && !cJSON_IsNull(v)) {
        int k = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
        if (k < 0 || k > 4) {
            req_params_free(p);
            return ERR("'stop' must be a string or up to 4 strings");
        }
        p->stop = calloc((size_t)k + 1, sizeof *p->stop);
        for (int i = 0; i < k && p->stop; i++) {
            const cJSON *x = cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, i);
            if (!cJSON_IsString(x) || !x->valuestring[0]) {
                req_params_free(p);
                return ERR("'stop' entries must be non-empty strings");
            }
            p->stop[p->n_stop++] = strdup(x->valuestring);
        }
    }
    return 0;
}

/* 1 when the client has closed its connection (an orderly EOF or an error on the socket). */
static int client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = conn ? MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD) : NULL;
    if (!ci) return 0;
    char b;
    ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Between prefill chunks and decode steps: has the client gone (then nobody is left to answer), or is the
 * server stopping? Either ends the generation. */
static int client_left(void *user) {
    gen *g = user;
    if (*g->s->stop) return 1;
    return g->gone = client_gone(g->conn);
}

/* ---- the prompt ---- */

typedef struct {
    int32_t *ids;
    int n, cap;
} idvec;

static int idvec_add(idvec *v, const int32_t *ids, int n) {
    if (n > INT32_MAX - v->n) return -1;
    if (v->n + n > v->cap) {
        int cap = v->n + n > 1 << 29 ? v->n + n : (v->n + n) * 2;
        int32_t *p = realloc(v->ids, (size_t)cap * sizeof *p);
        if (!p) return -1;
        v->ids = p, v->cap = cap;
    }
    memcpy(v->ids + v->n, ids, (size_t)n * sizeof *ids);
    v->n += n;
    return 0;
}

/* Text waiting to be tokenized as one plain fragment (a run between two control tokens). */
typedef struct {
    char *s;
    size_t n, cap;
} textbuf;

static int textbuf_add(textbuf *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *q = realloc(b->s, cap);
        if (!q) return -1;
        b->s = q, b->cap = cap;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    return 0;
}

/* The plain run so far, tokenized with no special-token parsing, onto out. */
static int flush_plain(const kvb_tokenizer *t, textbuf *b, idvec *out, char *err, size_t err_len) {
    if (!b->n) return 0;
    int32_t *ids = NULL;
    int n = 0;
    int rc = tok_encode(t, b->s, b->n, 0, 0, &ids, &n, err, err_len) || idvec_add(out, ids, n);
    free(ids);
    b->n = 0;
    if (rc && !err[0]) ERR("out of memory");
    return rc ? -1 : 0;
}

/* A piece of the template's own text: its control tokens (found by tokenizing it with special parsing) go to
 * out as they are, the text around them joins the plain run. */
static int add_template(const kvb_tokenizer *t, const char *piece, size_t len, textbuf *b, idvec *out, char *err,
                        size_t err_len) {
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(t, piece, len, 0, 1, &ids, &n, err, err_len)) return -1;
    size_t at = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        char none;
        size_t tl = 0;
        const char *text = tok_token_text(t, ids[i], &tl);
        if (!text || !tl || tok_piece(t, ids[i], 0, &none, 0) != 0) continue; /* a plain token: its text is in the run */
        const char *hit = memmem(piece + at, len - at, text, tl);
        if (!hit) continue;
        rc = textbuf_add(b, piece + at, (size_t)(hit - piece) - at) || flush_plain(t, b, out, err, err_len) ||
             idvec_add(out, &ids[i], 1);
        at = (size_t)(hit - piece) + tl;
    }
    free(ids);
    if (!rc) rc = textbuf_add(b, piece + at, len - at);
    if (rc && !err[0]) ERR("out of memory");
    return rc ? -1 : 0;
}

int kvb_serve_encode_prompt(const kvb_model *m, const chat_msg *msgs, int n, int32_t **ids_out, int *n_out, char *err,
                            size_t err_len) {
    *ids_out = NULL;
    *n_out = 0;
    err[0] = 0;
    /* the template rendered around placeholders: "\x01<i>\x02" stands for message i's content */
    chat_msg *sk = calloc((size_t)(n > 0 ? n : 1), sizeof *sk);
    char (*mark)[16] = calloc((size_t)(n > 0 ? n : 1), sizeof *mark);
    char *def_sys = NULL, *skel = NULL;
    idvec out = {0};
    textbuf run = {0};
    int rc = -1;
    if (!sk || !mark) {
        ERR("out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        snprintf(mark[i], sizeof mark[i], "\x01%d\x02", i);
        sk[i] = (chat_msg){msgs[i].role, mark[i]};
    }
    const kvb_tokenizer *t = m->tok;
    chat_kind kind = chat_model_kind(m->gguf, m->cfg.arch, &def_sys);
    if (chat_render(kind, sk, n, 1, def_sys, &skel, err, err_len)) goto done;
    /* add_special as tok_encode does it: BOS (and EOS) as the vocabulary asks, measured on one letter */
    int32_t *with = NULL, *without = NULL;
    int n_with = 0, n_without = 0;
    if (tok_encode(t, "a", 1, 1, 0, &with, &n_with, err, err_len) || tok_encode(t, "a", 1, 0, 0, &without, &n_without, err, err_len)) {
        free(with);
        goto done;
    }
    int head = tok_add_bos(t) && tok_bos(t) >= 0 && n_with > n_without && with[0] == tok_bos(t);
    int tail = n_with - n_without - head == 1 ? 1 : 0;
    int32_t eos = tail ? with[n_with - 1] : -1;
    if (head && idvec_add(&out, &with[0], 1)) n_with = -1;
    free(with);
    free(without);
    if (n_with < 0) {
        ERR("out of memory");
        goto done;
    }
    size_t len = strlen(skel), at = 0;
    while (at < len) {
        const char *q = memchr(skel + at, '\x01', len - at);
        size_t end = q ? (size_t)(q - skel) : len;
        if (end > at && add_template(t, skel + at, end - at, &run, &out, err, err_len)) goto done;
        if (!q) break;
        char *stop_at;
        long i = strtol(q + 1, &stop_at, 10);
        if (stop_at > q + 1 && *stop_at == '\x02' && i >= 0 && i < n) { /* message i's content: plain text, always */
            if (textbuf_add(&run, msgs[i].content, strlen(msgs[i].content))) {
                ERR("out of memory");
                goto done;
            }
            at = (size_t)(stop_at + 1 - skel);
        } else { /* a \x01 of the template itself */
            if (add_template(t, q, 1, &run, &out, err, err_len)) goto done;
            at = end + 1;
        }
    }
    if (flush_plain(t, &run, &out, err, err_len) || (tail && idvec_add(&out, &eos, 1))) {
        if (!err[0]) ERR("out of memory");
        goto done;
    }
    *ids_out = out.ids, *n_out = out.n;
    out.ids = NULL;
    rc = 0;
done:
    free(out.ids);
    free(run.s);
    free(skel);
    free(def_sys);
    free(mark);
    free(sk);
    return rc;
}

/* What a generation is made from, once its request is validated and its prompt encoded. */
typedef struct {
    gen *g;
    const char *method;
    kvb_budget budget;
    kvb_opts opts;
    int n_ids, max_tokens, ignore_eos;
    double temp, top_p, seed;
    int layerwise;   /* --batching: the method ends its prefill layer by layer, the prompt prefilled as one chunk */
    unsigned status; /* gen_prepare's failure: 400 (the request's method or budget) or 500 (the server's) */
} gen_plan;

/* The generation's context, method and session, ready to prefill (with --batching, made at the head of the
 * admission queue, to work out what it is promised): 0, or -1 + err and pl->status. */
static int gen_prepare(gen_plan *pl, char *err, size_t err_len) {
    gen *g = pl->g;
    server *s = g->s;
    sb_engine *eng = s->eng;
    kvb_ctx_params cp = eng ? sb_ctx_params(eng) : s->ctx;
    cp.n_ctx = pl->n_ids + pl->max_tokens + 1;
    if (!eng) cp.n_threads = s->threads_per;
    if (pl->layerwise && cp.n_batch < pl->n_ids) cp.n_batch = pl->n_ids; /* the prompt in one forward chunk */
    pl->status = 500;
    if (!(g->c = kvb_ctx_create(s->model, &cp, err, err_len))) return -1;
    pl->status = 400;
    if (!(g->m = kvb_method_create(pl->method, g->c, &pl->budget, &pl->opts, err, err_len))) return -1;
    /* a token budget the prompt cannot fill is the request's error (400), found before the prefill, whose
     * budget check would make it a server error */
    int64_t budget_tokens;
    if (g->m->imposes_budget && kvb_budget_tokens(&g->m->budget, pl->n_ids, &budget_tokens, err, err_len)) return -1;
    if (pl->layerwise) kvb_ctx_end_prefill_by_layer(g->c, pl->n_ids);
    kvb_session_method seam = kvb_method_seam(g->m);
    /* a layer-wise end needs the prompt as one chunk: a gone client or a stop is then noticed after the prefill */
    kvb_gen_params gp = {.max_new = pl->max_tokens, .stop = g->stop, .n_stop = g->n_stop, .temp = (float)pl->temp,
                         .top_p = (float)pl->top_p, .seed = (uint64_t)pl->seed, .ignore_eos = pl->ignore_eos,
                         .chunk = pl->layerwise ? 0 : PREFILL_CHUNK, .cancel = client_left, .user = g};
    return kvb_session_init(&g->ses, g->c, &seam, &gp, err, err_len);
}

/* --batching, at the head of the admission queue (the engine's lock held): the generation made, its promise. */
static int64_t plan_peak(void *user, char *err, size_t err_len) {
    gen_plan *pl = user;
    if (gen_prepare(pl, err, err_len)) return -1;
    pl->status = 400; /* a budget the promise cannot work out, or a pool too small for it: the request's */
    return sb_peak_pages(pl->g->s->eng, pl->g->m, pl->layerwise, pl->n_ids, pl->max_tokens, err, err_len);
}

static int plan_left(void *user) { return client_left(((gen_plan *)user)->g); }

/* Build the generation: validates the request (4xx on error) and prefills. */
static void sse_token(sb_job *j, const char *piece, size_t n);

static gen *gen_start(server *s, struct MHD_Connection *conn, const cJSON *req, unsigned *status, char *err, size_t err_len) {
    *status = 400;
    req_params p;
    if (parse_request(s, req, &p, err, err_len)) return NULL;
    if (p.prompt_bytes > s->max_prompt_bytes) { /* refused before the tokenizer sees it */
        *status = 413;
        ERR("messages hold %zu bytes of content, over this server's limit of %zu bytes (max_prompt_bytes)", p.prompt_bytes,
            s->max_prompt_bytes);
        req_params_free(&p);
        return NULL;
    }
    gen_plan pl = {.method = p.method, .budget = p.budget, .opts = p.opts, .max_tokens = p.max_tokens,
                   .ignore_eos = p.ignore_eos, .temp = p.temp, .top_p = p.top_p, .seed = p.seed, .status = 400};
    gen *g = calloc(1, sizeof *g);
    if (!g) { req_params_free(&p); ERR("out of memory"); return NULL; }
    pl.g = g;
    g->s = s;
    g->conn = conn;
    atomic_fetch_add(&s->in_flight, 1);
    g->stream = p.stream;
    g->stop = p.stop, g->n_stop = p.n_stop; /* the generation owns them now */
    p.stop = NULL, p.n_stop = 0;
    snprintf(g->id, sizeof g->id, "chatcmpl-kvb%ld", atomic_fetch_add(&s->next_id, 1));
    if (client_left(g)) { /* nobody to answer (or stopping): no tokenizer time spent on it */
        *status = 499;
        req_params_free(&p);
        gen_free(g);
        return NULL;
    }
    /* the template's control tokens parsed, the messages' content as plain text */
    int32_t *ids = NULL;
    int n_ids = 0;
    int rc = kvb_serve_encode_prompt(s->model, p.msgs, p.n_msgs, &ids, &n_ids, err, err_len);
    req_params_free(&p);
    if (rc) { gen_free(g); free(ids); return NULL; }
    if (n_ids + pl.max_tokens + 1 > s->n_ctx) {
        ERR("prompt of %d tokens + max_tokens %d exceeds the %s context of %d", n_ids, pl.max_tokens,
            s->ctx.n_ctx > 0 ? "server's (--ctx)" : "model's", s->n_ctx);
        gen_free(g);
        free(ids);
        return NULL;
    }
    g->prompt_tokens = pl.n_ids = n_ids;
    /* --batching: wait for room in the batch and the pool for what bench-serve's scheduler promises (a layer-local
     * method's prompt prefilled as one chunk, so the promise is its compressed cache plus one layer's whole prompt);
     * the prefill then runs under the engine's lock, between two decode steps */
    sb_engine *eng = s->eng;
    pl.layerwise = eng && kvb_sched_layerwise(pl.method, 0, n_ids);
    int64_t promised = 0;
    if (eng) {
        int a = sb_admit(eng, plan_peak, &promised, plan_left, &pl, err, err_len);
        if (a) {
            *status = a < 0 ? pl.status : *s->stop ? 503 : 499;
            if (a > 0) ERR("server stopping");
            gen_free(g);
            free(ids);
            return NULL;
        }
    }
    /* the engine: `parallel` generations at a time; a stop ends the wait */
    for (; !eng;) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        if (sem_timedwait(&s->engine, &until) == 0) break;
        if (*s->stop || client_left(g)) {
            *status = *s->stop ? 503 : 499;
            ERR("server stopping");
            gen_free(g);
            free(ids);
            return NULL;
        }
    }
    g->locked = !eng;
    kvb_rounds prompt = {.ids = ids, .n = n_ids};
    rc = !eng && gen_prepare(&pl, err, err_len);
    if (rc) *status = pl.status;
    if (!rc && eng) {
        g->job.promised = promised;
        sb_prefill(eng, &g->job, g->m, g->c);
    }
    if (!rc) {
        *status = 500;
        rc = kvb_rounds_chunk(&prompt, 0, err, err_len) || kvb_session_prefill(&g->ses, &prompt, 0, err, err_len);
        if (rc && (g->gone || *s->stop)) {
            *status = g->gone ? 499 : 503;
            if (s->o->verbose)
                fprintf(stderr, "serve: %s: %s during the prefill of %d prompt tokens; prefill stopped\n", g->id,
                        g->gone ? "client gone" : "server stopping", n_ids);
        }
    }
    kvb_rounds_free(&prompt);
    if (rc) {
        if (!err[0]) ERR("out of memory");
        if (eng) sb_abandon(eng, promised);
        gen_free(g);
        return NULL;
    }
    if (eng) {
        g->job.ses = &g->ses;
        g->job.on_token = g->stream ? sse_token : NULL;
        g->job.user = g;
        g->admitted = 1;
        sb_start(eng, &g->job, pl.max_tokens);
    }
    *status = 200;
    return g;
}

static cJSON *usage_obj(const gen *g) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", g->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", g->ses.n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", g->prompt_tokens + g->ses.n_gen);
    return u;
}

static cJSON *kv_obj(const gen *g) {
    kvb_kv_usage u;
    kvb_method_usage(g->m, g->c, &u);
    cJSON *o = cJSON_CreateObject();
    char bud[32], desc[240] = "";
    kvb_budget_format(&g->m->budget, bud, sizeof bud);
    if (g->m->def->describe) g->m->def->describe(g->m, desc, sizeof desc);
    cJSON_AddStringToObject(o, "method", g->m->name);
    cJSON_AddStringToObject(o, "budget", bud);
    cJSON_AddStringToObject(o, "method_params", desc);
    cJSON_AddNumberToObject(o, "kv_device_bytes", (double)u.device_bytes);
    cJSON_AddNumberToObject(o, "kv_host_bytes", (double)u.host_bytes);
    cJSON_AddNumberToObject(o, "kv_full_bytes", (double)u.full_bytes);
    return o;
}

static enum MHD_Result reply_whole(struct MHD_Connection *conn, gen *g) {
    char err[512] = "";
    const char *piece;
    size_t n;
    int r = 0;
    sb_engine *eng = g->s->eng;
    if (eng) { /* the engine steps it with the others; a look between steps: a gone client cancels it */
        (void)piece, (void)n;
        sb_lock(eng);
        while (!g->job.done) {
            if (client_left(g)) g->job.cancelled = 1;
            sb_wait(eng, 100);
        }
        if (g->job.err[0] && !g->gone && !*g->s->stop) snprintf(err, sizeof err, "%s", g->job.err), r = -1;
        /* held until the reply is built: finishing measures the method's KV through the shared backend */
    }
    /* kvb_session_decode, with a look between steps: a stopping server or a gone client ends it */
    while (!eng && !client_left(g) && (r = kvb_session_step(&g->ses, &piece, &n, err, sizeof err)) > 0) {
    }
    if (g->gone || *g->s->stop) {
        if (eng) sb_unlock(eng);
        gen_free(g);
        return MHD_NO; /* nobody to answer, or the server is going: close */
    }
    if (r < 0 || kvb_session_finish(&g->ses, err, sizeof err)) {
        if (eng) sb_unlock(eng);
        gen_free(g);
        return send_error(conn, 500, "server_error", NULL, "%s", err);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", g->id);
    cJSON_AddStringToObject(j, "object", "chat.completion");
    cJSON_AddNumberToObject(j, "created", (double)time(NULL));
    cJSON_AddStringToObject(j, "model", g->s->name);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices"), *ch = cJSON_CreateObject(), *msg = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "content", g->ses.text ? g->ses.text : "");
    cJSON_AddItemToObject(ch, "message", msg);
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason(g));
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddItemToObject(j, "usage", usage_obj(g));
    cJSON_AddItemToObject(j, "kvbench", kv_obj(g));
    if (eng) sb_unlock(eng);
    gen_free(g);
    return send_json(conn, 200, j);
}

/* one SSE event with a delta (content or role) and an optional finish reason */
static void sse_chunk(gen *g, const char *role, const char *content, size_t content_n, const char *finish) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", g->id);
    cJSON_AddStringToObject(j, "object", "chat.completion.chunk");
    cJSON_AddNumberToObject(j, "created", (double)time(NULL));
    cJSON_AddStringToObject(j, "model", g->s->name);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices"), *ch = cJSON_CreateObject(), *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    if (role) cJSON_AddStringToObject(d, "role", role);
    if (content) {
        char *c = strndup(content, content_n);
        cJSON_AddStringToObject(d, "content", c ? c : "");
        free(c);
    }
    cJSON_AddItemToObject(ch, "delta", d);
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
    if (finish) cJSON_AddItemToObject(j, "usage", usage_obj(g));
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return;
    size_t tn = strlen(text), need = g->pend_n + tn + 8;
    char *p = realloc(g->pending, need);
    if (p) {
        g->pending = p;
        memcpy(p + g->pend_n, "data: ", 6);
        memcpy(p + g->pend_n + 6, text, tn);
        memcpy(p + g->pend_n + 6 + tn, "\n\n", 2);
        g->pend_n += tn + 8;
    }
    free(text);
}

/* the stream's end: the event with the finish reason and usage, then "data: [DONE]" */
static void sse_finish(gen *g) {
    sse_chunk(g, NULL, NULL, 0, finish_reason(g));
    static const char done[] = "data: [DONE]\n\n";
    char *p = realloc(g->pending, g->pend_n + sizeof done - 1);
    if (p) {
        g->pending = p;
        memcpy(p + g->pend_n, done, sizeof done - 1);
        g->pend_n += sizeof done - 1;
    }
    g->finished_sent = 1;
}

/* --batching: a token's event, appended by the engine thread (its lock held) for stream_reader to send */
static void sse_token(sb_job *j, const char *piece, size_t n) {
    gen *g = j->user;
    if (g->pend_off == g->pend_n) g->pend_n = g->pend_off = 0;
    if (!g->sent_role) { /* the role's event first, as the unbatched stream sends it */
        sse_chunk(g, "assistant", NULL, 0, NULL);
        g->sent_role = 1;
    }
    sse_chunk(g, NULL, piece, n, NULL);
}

/* --batching: what stream_reader sends, from the events the engine appended; waits for the next one. */
static ssize_t stream_reader_batched(gen *g, char *buf, size_t max) {
    sb_engine *eng = g->s->eng;
    sb_lock(eng);
    ssize_t out = 0;
    for (;;) {
        if (g->pend_off < g->pend_n) {
            size_t n = g->pend_n - g->pend_off < max ? g->pend_n - g->pend_off : max;
            memcpy(buf, g->pending + g->pend_off, n);
            g->pend_off += n;
            out = (ssize_t)n;
            break;
        }
        g->pend_n = g->pend_off = 0;
        if (*g->s->stop || (g->job.done && g->job.err[0])) {
            out = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        if (!g->sent_role) {
            sse_chunk(g, "assistant", NULL, 0, NULL);
            g->sent_role = 1;
        } else if (!g->job.done) {
            if (client_left(g)) g->job.cancelled = 1;
            sb_wait(eng, 100);
        } else if (!g->finished_sent) {
            sse_finish(g);
        } else {
            out = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
    }
    sb_unlock(eng);
    return out;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
    if (*g->s->stop) return MHD_CONTENT_READER_END_WITH_ERROR; /* the server is going */
    if (g->s->eng) return stream_reader_batched(g, buf, max);
    while (g->pend_off == g->pend_n) {
        g->pend_n = g->pend_off = 0;
        if (!g->sent_role) {
            sse_chunk(g, "assistant", NULL, 0, NULL);
            g->sent_role = 1;
        } else if (!g->ses.finish) {
            char err[256];
            const char *piece;
            size_t n;
            if (kvb_session_step(&g->ses, &piece, &n, err, sizeof err) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (n > 0) sse_chunk(g, NULL, piece, n, NULL);
        } else if (!g->finished_sent) {
            sse_finish(g);
        } else {
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
    }
    size_t n = g->pend_n - g->pend_off < max ? g->pend_n - g->pend_off : max;
    memcpy(buf, g->pending + g->pend_off, n);
    g->pend_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { gen_free(cls); }

static enum MHD_Result reply_stream(struct MHD_Connection *conn, gen *g) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, g, stream_free);
    if (!r) {
        gen_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* ---- routing ---- */

static enum MHD_Result handle_models(server *s, struct MHD_Connection *conn) {
    cJSON *j = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(j, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON_AddStringToObject(m, "id", s->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kvbench");
    cJSON_AddItemToArray(data, m);
    return send_json(conn, 200, j);
}

/* GET /v1/kvbench/stats: the batching engine's counters (serve_batch.h's sb_stats), for load generators such as
 * `bench-serve --url`; {"batching": false} without --batching. */
static enum MHD_Result handle_stats(server *s, struct MHD_Connection *conn) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "batching", s->eng != NULL);
    if (s->eng) {
        sb_stats st;
        sb_get_stats(s->eng, &st);
        const struct {
            const char *k;
            double v;
        } f[] = {{"finished", (double)st.finished}, {"failed", (double)st.failed}, {"cancelled", (double)st.cancelled},
                 {"waits", (double)st.waits}, {"steps", (double)st.steps}, {"step_seqs", (double)st.step_seqs},
                 {"decode_ms", st.decode_ms}, {"running_ms", st.running_ms}, {"reserved_page_ms", st.reserved_page_ms},
                 {"held_page_ms", st.held_page_ms}, {"overdrafts", (double)st.overdrafts},
                 {"running", st.running}, {"admitted", st.admitted}, {"max_running", st.max_running},
                 {"max_batch", st.max_batch}, {"pool_pages", (double)st.pool_pages}, {"page_bytes", (double)st.page_bytes},
                 {"pool_reserved", (double)st.pool_reserved}, {"pool_peak_reserved", (double)st.peak_reserved},
                 {"peak_prefill", (double)st.peak_prefill}};
        for (size_t i = 0; i < sizeof f / sizeof *f; i++) cJSON_AddNumberToObject(j, f[i].k, f[i].v);
    }
    return send_json(conn, 200, j);
}

/* 1 when the Authorization header value (value_n bytes: a NUL inside it counts) is exactly "Bearer <token>",
 * trailing spaces and tabs aside (HTTP's optional whitespace, which libmicrohttpd leaves in the value);
 * compared in time independent of where the first difference is. */
static int bearer_matches(const char *value, size_t value_n, const char *token) {
    size_t tn = strlen(token);
    while (value && value_n > 0 && (value[value_n - 1] == ' ' || value[value_n - 1] == '\t')) value_n--;
    if (!value || value_n != 7 + tn || strncmp(value, "Bearer ", 7)) return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < tn; i++) diff |= (unsigned char)(value[7 + i] ^ token[i]);
    return diff == 0;
}

/* The header line that starts nearest after p in libmicrohttpd's read buffer (its key), or NULL. */
typedef struct {
    const char *after, *next;
} next_key;

static enum MHD_Result find_next_key(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_n, const char *value,
                                     size_t value_n) {
    (void)kind, (void)key_n, (void)value, (void)value_n;
    next_key *nk = cls;
    if (key > nk->after && (!nk->next || key < nk->next)) nk->next = key;
    return MHD_YES;
}

/* 1 when the header value [value, value + value_n) was cut short at a NUL byte. libmicrohttpd 0.9.75 ends a
 * header value at its first NUL (so "Bearer <token>\0junk" reads as "Bearer <token>") and keeps the request's
 * lines where they arrived in its read buffer, each line's CR LF (or bare LF) overwritten with NULs: between a
 * value's end and the next line's key (or the end of the header block) only that terminator may lie, as wide
 * as the request line's. Where the layout is not that one (another libmicrohttpd), nothing is refused on its
 * account. */
static int value_cut_at_nul(struct MHD_Connection *conn, const char *method, const char *version, const char *value,
                            size_t value_n) {
    if (!method || !version) return 0;
    next_key first = {version, NULL}, nk = {value, NULL};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, find_next_key, &first);
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, find_next_key, &nk);
    const char *version_end = version + strlen(version);
    if (!first.next || first.next < version_end) return 0;
    size_t eol = (size_t)(first.next - version_end); /* 2: CR LF, 1: LF */
    if (eol != 1 && eol != 2) return 0;
    const char *end = value + value_n, *stop = nk.next;
    size_t allowed = eol;
    if (!stop) { /* the last header line: the block ends header_size bytes after the request line's start */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
        /* method, version, the first key and this value in that order inside one block, or no judgement */
        if (!ci || ci->header_size > (size_t)1 << 20 || !(method < version && version < first.next && first.next <= value) ||
            (size_t)(value - method) >= ci->header_size)
            return 0;
        stop = method + ci->header_size;
        allowed = 2 * eol; /* and the empty line's */
    }
    if (stop < end || (size_t)(stop - end) > 4096) return 0;
    if ((size_t)(stop - end) > allowed) return 1;
    for (const char *p = end; p < stop; p++)
        if (*p && *p != '\r' && *p != '\n') return 1;
    return 0;
}

static int authorized(server *s, struct MHD_Connection *conn, const char *method, const char *version) {
    if (!s->token) return 1;
    const char *h = NULL;
    size_t hn = 0;
    if (MHD_lookup_connection_value_n(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION, strlen(MHD_HTTP_HEADER_AUTHORIZATION), &h,
                                      &hn) != MHD_YES)
        return 0;
    return bearer_matches(h, hn, s->token) && !value_cut_at_nul(conn, method, version, h, hn);
}

/* What the headers alone decide, before any body is read: the token (401), ambiguous framing (400), a declared
 * length over max_body (413). 0 = go on and read the body. */
static int check_headers(server *s, struct MHD_Connection *conn, const char *method, const char *version,
                         unsigned *status, char *err, size_t err_len) {
    if (!authorized(s, conn, method, version)) {
        *status = 401;
        return ERR("missing or wrong bearer token");
    }
    const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    *status = 400;
    if (te && cl) return ERR("Content-Length together with Transfer-Encoding: the body's length is ambiguous");
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (end == cl || *end || errno || cl[0] == '-') return ERR("bad Content-Length '%.40s'", cl);
        if (n > s->o->max_body) {
            *status = 413;
            return ERR("request body of %llu bytes is larger than %zu bytes", n, s->o->max_body);
        }
    }
    return 0;
}

static enum MHD_Result handle_completion(server *s, struct MHD_Connection *conn, const upload *up) {
    if (up->too_large) return send_error(conn, 413, "invalid_request_error", NULL, "request body larger than %zu bytes", s->o->max_body);
    if (atomic_load(&s->in_flight) >= s->o->max_queue + (s->o->parallel > 0 ? s->o->parallel : 1))
        return send_error(conn, 503, "server_busy", NULL, "server busy: %d requests running or queued", atomic_load(&s->in_flight));
    if (up->body && json_has_nul(up->body, up->n))
        return send_error(conn, 400, "invalid_request_error", "messages", "request body holds a NUL character (\\u0000)");
    cJSON *req = up->body ? cJSON_ParseWithLength(up->body, up->n) : NULL;
    if (!req || !cJSON_IsObject(req)) {
        cJSON_Delete(req);
        return send_error(conn, 400, "invalid_request_error", NULL, "request body is not a JSON object");
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (model && !cJSON_IsString(model)) {
        cJSON_Delete(req);
        return send_error(conn, 400, "invalid_request_error", "model", "'model' must be a string");
    }
    if (model && strcmp(model->valuestring, s->name) && strcmp(model->valuestring, "default")) {
        enum MHD_Result rc = send_error(conn, 404, "invalid_request_error", "model",
                                        "model '%.100s' does not exist (this server has '%s')", model->valuestring, s->name);
        cJSON_Delete(req);
        return rc;
    }
    char err[512] = "";
    unsigned status;
    /* the short read timeout guards idle sockets; a generation (and a slow reader of its stream) gets the long one */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)GEN_TIMEOUT_S);
    gen *g = gen_start(s, conn, req, &status, err, sizeof err);
    int stream = g && g->stream;
    cJSON_Delete(req);
    if (!g && status == 499) return MHD_NO; /* the client has gone: close */
    if (!g) return send_error(conn, status, status < 500 ? "invalid_request_error" : "server_error", NULL, "%s", err);
    if (s->o->verbose) fprintf(stderr, "serve: %s %s %d prompt tokens%s\n", g->id, g->m->name, g->prompt_tokens, stream ? " (stream)" : "");
    return stream ? reply_stream(conn, g) : reply_whole(conn, g);
}

static conn_state *state_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **con_cls) {
    server *s = cls;
    if (!*con_cls) { /* the headers are in; no byte of the body has been read */
        upload *up = calloc(1, sizeof *up);
        if (!up) return MHD_NO;
        *con_cls = up;
        char err[256];
        unsigned status;
        if (check_headers(s, conn, method, version, &status, err, sizeof err)) {
            up->answered = 1; /* libmicrohttpd closes the connection after this reply instead of reading the body */
            return send_error(conn, status, "invalid_request_error", NULL, "%s", err);
        }
        return MHD_YES;
    }
    upload *up = *con_cls;
    conn_state *cs = state_of(conn);
    if (up->answered || (cs && cs->evicted)) {
        *data_size = 0;
        return up->answered ? MHD_YES : MHD_NO;
    }
    if (*data_size) {
        if (up->n + *data_size > s->o->max_body) up->too_large = 1;
        else {
            if (up->n + *data_size + 1 > up->cap) {
                size_t cap = (up->n + *data_size + 1) * 2;
                char *b = realloc(up->body, cap);
                if (!b) return MHD_NO;
                up->body = b;
                up->cap = cap;
            }
            memcpy(up->body + up->n, data, *data_size);
            up->n += *data_size;
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (cs) { /* the request is whole: the request deadline no longer applies */
        pthread_mutex_lock(&s->conns_mu);
        cs->reading = 0;
        pthread_mutex_unlock(&s->conns_mu);
    }
    if (!strcmp(url, "/v1/models") && !strcmp(method, "GET")) return handle_models(s, conn);
    if (!strcmp(url, "/v1/kvbench/stats") && !strcmp(method, "GET")) return handle_stats(s, conn);
    if (!strcmp(url, "/v1/chat/completions") && !strcmp(method, "POST")) return handle_completion(s, conn, up);
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/models"))
        return send_error(conn, 405, "invalid_request_error", NULL, "method %s not allowed on %s", method, url);
    return send_error(conn, 404, "invalid_request_error", NULL, "no route %s %s", method, url);
}

static void on_done(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    server *s = cls;
    upload *up = *con_cls;
    if (up) {
        free(up->body);
        free(up);
        *con_cls = NULL;
    }
    conn_state *cs = conn ? state_of(conn) : NULL;
    if (cs) { /* a kept-alive connection's next request starts now */
        pthread_mutex_lock(&s->conns_mu);
        cs->reading = 1;
        cs->since_s = now_s();
        pthread_mutex_unlock(&s->conns_mu);
    }
}

/* Shut a connection's socket (under conns_mu, so libmicrohttpd has not closed it yet): its thread sees the end
 * of the stream and closes the connection. */
static void evict(conn_state *c) {
    if (c->evicted || c->fd < 0) return;
    shutdown(c->fd, SHUT_RDWR);
    c->evicted = 1;
}

/* Every connection from its start to its close. A new one beyond max_connections takes the place of the
 * connection that has been reading its request the longest (a slow or idle client; its own place when none
 * is reading), so slow clients from however many addresses cannot hold every place. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_state *c = calloc(1, sizeof *c);
        if (!c) return; /* untracked: only the idle timeout applies to it */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        c->since_s = now_s();
        c->reading = 1;
        pthread_mutex_lock(&s->conns_mu);
        c->prev = NULL;
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c; /* newest first */
        if (++s->n_conns > s->max_conns) {
            conn_state *oldest = NULL;
            for (conn_state *p = c->next; p; p = p->next)
                if (p->reading && !p->evicted && (!oldest || p->since_s <= oldest->since_s)) oldest = p;
            evict(oldest ? oldest : c);
        }
        pthread_mutex_unlock(&s->conns_mu);
        *socket_context = c;
    } else if (*socket_context) {
        conn_state *c = *socket_context;
        pthread_mutex_lock(&s->conns_mu);
        if (c->prev) c->prev->next = c->next;
        else s->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        s->n_conns--;
        pthread_mutex_unlock(&s->conns_mu);
        free(c);
        *socket_context = NULL;
    }
}

/* libmicrohttpd's messages: while the daemon starts, the last one is kept for serve's one error line ("Failed to
 * bind to port 80: Permission denied"); once it runs, each goes to stderr as libmicrohttpd's own logger prints it. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    server *s = cls;
    if (atomic_load(&s->running)) {
        vfprintf(stderr, fmt, ap);
        return;
    }
    vsnprintf(s->mhd_error, sizeof s->mhd_error, fmt, ap);
    for (size_t n = strlen(s->mhd_error); n && (s->mhd_error[n - 1] == '\n' || s->mhd_error[n - 1] == '\r');)
        s->mhd_error[--n] = 0;
}

/* A request not read whole within request_timeout_s of its start is cut off, however slowly it trickles in
 * (the idle timeout only sees silent connections). */
static void reap_slow_requests(server *s) {
    double t = now_s();
    pthread_mutex_lock(&s->conns_mu);
    for (conn_state *c = s->conns; c; c = c->next)
        if (c->reading && t - c->since_s > s->request_timeout_s) evict(c);
    pthread_mutex_unlock(&s->conns_mu);
}

int kvb_serve(const kvb_serve_opts *o, volatile sig_atomic_t *stop, int *port_out, void (*ready)(void *user, int port),
              void *user, char *err, size_t err_len) {
    server s;
    memset(&s, 0, sizeof s);
    s.o = o;
    s.stop = stop;
    if (syn_is_name(o->model_path)) return ERR("synthetic models have no tokenizer: serve needs text; use a GGUF model");
    if (o->api_key_env) {
        const char *t = getenv(o->api_key_env);
        if (!t || !*t) return ERR("serve: environment variable %s (the bearer token) is empty or unset", o->api_key_env);
        s.token = strdup(t);
    }
    s.model = kvb_model_load(o->model_path, err, err_len);
    if (!s.model) {
        free(s.token);
        return -1;
    }
    /* the default method, budget and options made once on a small context: a bad one (an unknown option, a method
     * that needs a budget and has none) is refused now, not in every request that does not name its own */
    s.ctx = o->ctx.backend ? o->ctx : kvb_ctx_default_params(); /* its n_threads: each context sets its share */
    if (s.ctx.n_ctx > s.model->cfg.n_ctx_train) {
        const int train = s.model->cfg.n_ctx_train;
        kvb_model_free(s.model);
        free(s.token);
        return ERR("serve: --ctx %d exceeds the model's context of %d", s.ctx.n_ctx, train);
    }
    s.n_ctx = s.ctx.n_ctx > 0 ? s.ctx.n_ctx : s.model->cfg.n_ctx_train;
    if (!strcmp(s.ctx.backend, "cuda") && o->parallel > 1 && !o->batching) {
        kvb_model_free(s.model);
        free(s.token);
        return ERR("serve: --backend cuda runs one generation at a time (its one stream is shared): --parallel 1, "
                   "or --batching (one engine thread decodes them together)");
    }
    kvb_ctx_params small = s.ctx;
    small.n_ctx = 256, small.n_threads = 1;
    kvb_ctx *chk = kvb_ctx_create(s.model, &small, err, err_len);
    kvb_opts chk_opts = o->opts;
    kvb_method *chk_m =
        chk ? kvb_method_create(o->method ? o->method : "full", chk, &o->budget, &chk_opts, err, err_len) : NULL;
    kvb_method_free(chk_m, chk);
    kvb_ctx_free(chk);
    if (!chk_m) {
        char why[400];
        snprintf(why, sizeof why, "%s", err);
        kvb_model_free(s.model);
        free(s.token);
        return ERR("serve: %s", why);
    }
    const char *base = strrchr(o->model_path, '/');
    snprintf(s.name, sizeof s.name, "%s", o->model_name ? o->model_name : (base ? base + 1 : o->model_path));
    int parallel = o->parallel > 0 ? o->parallel : 1;
    sem_init(&s.engine, 0, (unsigned)parallel);
    /* $KVB_THREADS, else the usable cores (affinity, cgroup quota), as the CPU backend counts them */
    const int total = o->n_threads > 0 ? o->n_threads : kvb_backend_cpu_default_threads();
    s.threads_per = total / parallel > 0 ? total / parallel : 1;
    s.max_conns = o->max_connections > 0 ? o->max_connections : 256;
    s.request_timeout_s = o->request_timeout_s > 0 ? o->request_timeout_s : REQUEST_TIMEOUT_S;
    s.max_prompt_bytes = o->max_prompt_bytes ? o->max_prompt_bytes : (size_t)s.n_ctx * PROMPT_BYTES_PER_TOKEN;
    pthread_mutex_init(&s.conns_mu, NULL);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) != 1) {
        kvb_model_free(s.model);
        free(s.token);
        pthread_mutex_destroy(&s.conns_mu);
        return ERR("serve: bad IPv4 address '%s'", o->host);
    }
    /* libmicrohttpd accepts EVICT_HEADROOM connections beyond max_connections: a newcomer there evicts the
     * slowest reader (on_connection) instead of being turned away */
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                                            (uint16_t)o->port, NULL, NULL, on_request, &s,
                                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, &s, /* first: start-up messages too */
                                            MHD_OPTION_SOCK_ADDR, &addr,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_done, &s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, &s,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s.max_conns + EVICT_HEADROOM),
                                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(o->max_per_ip > 0 ? o->max_per_ip : 32),
                                            MHD_OPTION_CONNECTION_TIMEOUT,
                                            (unsigned)(o->read_timeout_s > 0 ? o->read_timeout_s : 10), MHD_OPTION_END);
    if (!d) {
        kvb_model_free(s.model);
        free(s.token);
        pthread_mutex_destroy(&s.conns_mu);
        if (s.mhd_error[0])
            return ERR("serve: cannot listen on %s:%d: %s", o->host ? o->host : "127.0.0.1", o->port, s.mhd_error);
        return ERR("serve: cannot listen on %s:%d (in use?)", o->host ? o->host : "127.0.0.1", o->port);
    }
    atomic_store(&s.running, 1);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : o->port;
    if (o->batching) { /* every generation's context shares the engine's backend and all the threads */
        kvb_ctx_params cp = s.ctx;
        cp.n_threads = total;
        s.eng = sb_create(s.model, &cp, parallel, o->kv_pool_bytes, stop, err, err_len);
        if (!s.eng) {
            MHD_stop_daemon(d);
            kvb_model_free(s.model);
            free(s.token);
            pthread_mutex_destroy(&s.conns_mu);
            return -1;
        }
    }
    if (port_out) *port_out = port;
    if (ready) ready(user, port);
    while (!*stop) {
        usleep(100000);
        reap_slow_requests(&s);
    }
    /* generations see *stop between steps and end; then the connection threads can be joined */
    MHD_stop_daemon(d);
    sb_free(s.eng);
    pthread_mutex_destroy(&s.conns_mu);
    sem_destroy(&s.engine);
    kvb_model_free(s.model);
    free(s.token);
    return 0;
}
