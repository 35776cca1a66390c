/* serve.c — the OpenAI-compatible server (see serve.h). One connection thread per client (libmicrohttpd);
 * an engine mutex runs one generation at a time; a counter bounds the waiting ones. */
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

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define PREFILL_CHUNK 512 /* tokens per prefill step: a gone client is noticed between steps */
#define GEN_TIMEOUT_S 600 /* inactivity allowed to a connection once its request is read and being answered */

typedef struct {
    const kvb_serve_opts *o;
    kvb_model *model;
    char name[256];
    char *token;           /* bearer token, or NULL */
    sem_t engine;          /* `parallel` generations at a time */
    int threads_per;
    atomic_int in_flight;  /* running + waiting */
    atomic_long next_id;
} server;

typedef struct {
    char *body;
    size_t n, cap;
    int too_large;
} upload;

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
} gen;

static void gen_free(gen *g) {
    if (!g) return;
    kvb_method_free(g->m, g->c);
    kvb_session_free(&g->ses);
    kvb_ctx_free(g->c);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->pending);
    if (g->locked) sem_post(&g->s->engine);
    atomic_fetch_sub(&g->s->in_flight, 1);
    free(g);
}

static const char *finish_reason(const gen *g) { return g->ses.finish == KVB_FINISH_LENGTH ? "length" : "stop"; }

static int parse_messages(const cJSON *msgs, chat_msg **out, int *n, char *err, size_t err_len) {
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
    return kvb_opts_add_json(o, oo, "kvbench.method_opts", err, err_len);
}

/* A request's fields, validated. */
typedef struct {
    int max_tokens, stream;
    double temp, top_p, seed;
    chat_msg *msgs; /* borrowed strings of the request */
    int n_msgs;
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
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "n")) && (!cJSON_IsNumber(v) || v->valuedouble != 1.0))
        return ERR("'n': only n = 1 is supported");
    if ((v = cJSON_GetObjectItemCaseSensitive(req, "stream"))) {
        if (!cJSON_IsBool(v)) return ERR("'stream' must be a boolean");
        p->stream = cJSON_IsTrue(v);
    }
    if (parse_messages(cJSON_GetObjectItemCaseSensitive(req, "messages"), &p->msgs, &p->n_msgs, err, err_len) ||
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

typedef struct {
    gen *g;
    struct MHD_Connection *conn;
    int gone;
} prefill_watch;

/* Between prefill chunks: has the client gone? (then nobody is left to answer: stop) */
static int client_left(void *user) {
    prefill_watch *w = user;
    return w->gone = client_gone(w->conn);
}

/* Build the generation: validates the request (400 on error) and prefills. */
static gen *gen_start(server *s, struct MHD_Connection *conn, const cJSON *req, unsigned *status, char *err, size_t err_len) {
    *status = 400;
    req_params p;
    if (parse_request(s, req, &p, err, err_len)) return NULL;
    int max_tokens = p.max_tokens;
    double temp = p.temp, top_p = p.top_p, seed = p.seed;
    chat_msg *msgs = p.msgs;
    int n_msgs = p.n_msgs;
    const char *method = p.method;
    kvb_budget budget = p.budget;
    kvb_opts opts = p.opts;
    gen *g = calloc(1, sizeof *g);
    if (!g) { req_params_free(&p); ERR("out of memory"); return NULL; }
    g->s = s;
    atomic_fetch_add(&s->in_flight, 1);
    g->stream = p.stream;
    g->stop = p.stop, g->n_stop = p.n_stop; /* the generation owns them now */
    p.stop = NULL, p.n_stop = 0, p.msgs = NULL;
    snprintf(g->id, sizeof g->id, "chatcmpl-kvb%ld", atomic_fetch_add(&s->next_id, 1));
    /* render and tokenize */
    char *def_sys = NULL, *rendered = NULL;
    chat_kind kind = chat_model_kind(s->model->gguf, s->model->cfg.arch, &def_sys);
    int rc = chat_render(kind, msgs, n_msgs, 1, def_sys, &rendered, err, err_len);
    free(def_sys);
    free(msgs);
    int32_t *ids = NULL;
    int n_ids = 0;
    if (!rc) rc = tok_encode(s->model->tok, rendered, strlen(rendered), 1, 1, &ids, &n_ids, err, err_len);
    free(rendered);
    if (rc) { gen_free(g); free(ids); return NULL; }
    if (n_ids + max_tokens + 1 > s->model->cfg.n_ctx_train) {
        ERR("prompt of %d tokens + max_tokens %d exceeds the model's context of %d", n_ids, max_tokens, s->model->cfg.n_ctx_train);
        gen_free(g);
        free(ids);
        return NULL;
    }
    g->prompt_tokens = n_ids;
    /* the engine: one generation at a time */
    while (sem_wait(&s->engine) != 0) {
    }
    g->locked = 1;
    *status = 500;
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = n_ids + max_tokens + 1;
    cp.n_threads = s->threads_per;
    g->c = kvb_ctx_create(s->model, &cp, err, err_len);
    if (g->c) {
        *status = 400;
        g->m = kvb_method_create(method, g->c, &budget, &opts, err, err_len);
    }
    kvb_session_method seam = kvb_method_seam(g->m);
    prefill_watch w = {g, conn, 0};
    kvb_gen_params gp = {.max_new = max_tokens, .stop = g->stop, .n_stop = g->n_stop, .temp = (float)temp, .top_p = (float)top_p,
                         .seed = (uint64_t)seed, .chunk = PREFILL_CHUNK, .cancel = client_left, .user = &w};
    kvb_rounds prompt = {.ids = ids, .n = n_ids};
    rc = !g->c || !g->m || kvb_session_init(&g->ses, g->c, &seam, &gp, err, err_len) ||
         kvb_rounds_chunk(&prompt, 0, err, err_len);
    if (!rc) {
        *status = 500;
        rc = kvb_session_prefill(&g->ses, &prompt, 0, err, err_len);
        if (rc && w.gone) {
            *status = 499;
            if (s->o->verbose) fprintf(stderr, "serve: %s: client gone during the prefill of %d prompt tokens; prefill stopped\n", g->id, n_ids);
        }
    }
    kvb_rounds_free(&prompt);
    if (rc) {
        if (!err[0]) ERR("out of memory");
        gen_free(g);
        return NULL;
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
    if (g->m->describe) g->m->describe(g->m, desc, sizeof desc);
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
    if (kvb_session_decode(&g->ses, err, sizeof err)) {
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

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
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
            sse_chunk(g, NULL, NULL, 0, finish_reason(g));
            const char *done = "data: [DONE]\n\n";
            char *p = realloc(g->pending, g->pend_n + strlen(done));
            if (p) {
                g->pending = p;
                memcpy(p + g->pend_n, done, strlen(done));
                g->pend_n += strlen(done);
            }
            g->finished_sent = 1;
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

static int authorized(server *s, struct MHD_Connection *conn) {
    if (!s->token) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->token);
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
    if (!g) return send_error(conn, status, status == 400 ? "invalid_request_error" : "server_error", NULL, "%s", err);
    if (s->o->verbose) fprintf(stderr, "serve: %s %s %d prompt tokens%s\n", g->id, g->m->name, g->prompt_tokens, stream ? " (stream)" : "");
    return stream ? reply_stream(conn, g) : reply_whole(conn, g);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **con_cls) {
    (void)version;
    server *s = cls;
    if (!*con_cls) {
        upload *up = calloc(1, sizeof *up);
        if (!up) return MHD_NO;
        *con_cls = up;
        return MHD_YES;
    }
    upload *up = *con_cls;
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
    if (!authorized(s, conn)) return send_error(conn, 401, "invalid_request_error", NULL, "missing or wrong bearer token");
    if (!strcmp(url, "/v1/models") && !strcmp(method, "GET")) return handle_models(s, conn);
    if (!strcmp(url, "/v1/chat/completions") && !strcmp(method, "POST")) return handle_completion(s, conn, up);
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/models"))
        return send_error(conn, 405, "invalid_request_error", NULL, "method %s not allowed on %s", method, url);
    return send_error(conn, 404, "invalid_request_error", NULL, "no route %s %s", method, url);
}

static void on_done(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)conn, (void)toe;
    upload *up = *con_cls;
    if (up) {
        free(up->body);
        free(up);
        *con_cls = NULL;
    }
}

int kvb_serve(const kvb_serve_opts *o, volatile sig_atomic_t *stop, int *port_out, void (*ready)(void *user, int port),
              void *user, char *err, size_t err_len) {
    server s;
    memset(&s, 0, sizeof s);
    s.o = o;
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
    const char *base = strrchr(o->model_path, '/');
    snprintf(s.name, sizeof s.name, "%s", o->model_name ? o->model_name : (base ? base + 1 : o->model_path));
    int parallel = o->parallel > 0 ? o->parallel : 1;
    sem_init(&s.engine, 0, (unsigned)parallel);
    int total = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    s.threads_per = total / parallel > 0 ? total / parallel : 1;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) != 1) {
        kvb_model_free(s.model);
        free(s.token);
        return ERR("serve: bad IPv4 address '%s'", o->host);
    }
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                                            (uint16_t)o->port, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR, &addr,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_CONNECTION_LIMIT,
                                            (unsigned)(o->max_connections > 0 ? o->max_connections : 256),
                                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(o->max_per_ip > 0 ? o->max_per_ip : 32),
                                            MHD_OPTION_CONNECTION_TIMEOUT,
                                            (unsigned)(o->read_timeout_s > 0 ? o->read_timeout_s : 10), MHD_OPTION_END);
    if (!d) {
        kvb_model_free(s.model);
        free(s.token);
        return ERR("serve: cannot listen on %s:%d (in use?)", o->host ? o->host : "127.0.0.1", o->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : o->port;
    if (port_out) *port_out = port;
    if (ready) ready(user, port);
    while (!*stop) usleep(100000);
    MHD_stop_daemon(d);
    sem_destroy(&s.engine);
    kvb_model_free(s.model);
    free(s.token);
    return 0;
}
