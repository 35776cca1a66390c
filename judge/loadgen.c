/* loadgen.c — the load of bench-serve, in process or over HTTP (loadgen.h). */
#include "judge/loadgen.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "judge/redact.h"
#include "judge/sched.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)
#define MAX_REPLY_BYTES (16 << 20) /* a streamed reply longer than this is a failed request */

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* nearest-rank percentile of v[0..n) (sorted here); NAN when empty */
static double pct(double *v, int n, double p) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)ceil(p / 100.0 * n);
    return v[k < 1 ? 0 : k - 1];
}

#define MAX_ARRIVALS 1000000 /* an open-loop schedule (--rate x --duration) longer than this is refused */

/* Open loop: arrival times (ms on a clock starting at t0) from a seeded exponential stream, the same schedule for
 * every method and target: lo->requests of them (0: no count limit), none after duration_s (0: no time limit);
 * *n gets the count. NULL + err when out of memory or over MAX_ARRIVALS. */
static double *arrivals(const kvb_load_opts *lo, double duration_s, double t0, int *n, char *err, size_t err_len) {
    const int limit = lo->requests > 0 ? lo->requests : MAX_ARRIVALS + 1;
    int cap = limit < 4096 ? limit : 4096;
    double *a = malloc((size_t)cap * sizeof *a);
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (lo->seed > 1 ? (lo->seed - 1) * 0xbf58476d1ce4e5b9ull : 0); /* --seed */
    double t = t0;
    *n = 0;
    for (; a && *n < limit; ++*n) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const double u = ((double)(rng >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
        t -= log(u) / lo->rate * 1e3;
        if (duration_s > 0 && t - t0 > duration_s * 1e3) break;
        if (*n == MAX_ARRIVALS) {
            free(a);
            snprintf(err, err_len, "--rate %g for --duration %g makes over %d arrivals; give --requests or less", lo->rate,
                     duration_s, MAX_ARRIVALS);
            return NULL;
        }
        if (*n == cap) {
            double *b = realloc(a, (size_t)(cap *= 2) * sizeof *a);
            if (!b) free(a);
            a = b;
            if (!a) break;
        }
        a[*n] = t;
    }
    if (!a) snprintf(err, err_len, "out of memory");
    return a;
}

/* The per-request times of a row, from ended requests. */
typedef struct {
    int n_done, n_ok;
    double *ttft, *tpot; /* cap entries each, grown as requests end (a duration has no count up front) */
    int n_ttft, n_tpot, cap;
    int64_t out_tokens;
    double t_last_done;
    char first_err[384];
} collect;

static int collect_init(collect *c, int requests) {
    memset(c, 0, sizeof *c);
    c->cap = requests > 0 && requests < 4096 ? requests : 4096;
    c->ttft = calloc((size_t)c->cap, sizeof *c->ttft);
    c->tpot = calloc((size_t)c->cap, sizeof *c->tpot);
    return c->ttft && c->tpot ? 0 : -1;
}

/* Room for one more time of each kind; -1 when out of memory (the request is then counted as failed). */
static int collect_room(collect *c) {
    if (c->n_ttft < c->cap && c->n_tpot < c->cap) return 0;
    const int cap = c->cap * 2;
    double *a = realloc(c->ttft, (size_t)cap * sizeof *a);
    if (!a) return -1;
    c->ttft = a;
    double *b = realloc(c->tpot, (size_t)cap * sizeof *b);
    if (!b) return -1;
    c->tpot = b;
    c->cap = cap;
    return 0;
}

static void collect_free(collect *c) {
    free(c->ttft);
    free(c->tpot);
}

/* One ended request: ok, its generated tokens, the times of its arrival, first and last token and end (ms). */
static void collect_add(collect *c, int ok, const char *why, int n_gen, double t_arrive, double t_first, double t_last,
                        double t_done) {
    c->n_done++;
    if (t_done > c->t_last_done) c->t_last_done = t_done;
    if (ok && collect_room(c)) ok = 0, why = "out of memory (bench-serve's own record of the request)";
    if (!ok) {
        if (!c->first_err[0]) snprintf(c->first_err, sizeof c->first_err, "%s", why);
        return;
    }
    c->n_ok++;
    c->out_tokens += n_gen;
    if (n_gen > 0) c->ttft[c->n_ttft++] = t_first - t_arrive;
    if (n_gen > 1) c->tpot[c->n_tpot++] = (t_last - t_first) / (n_gen - 1);
}

/* The client-side part of a row. */
static void row_from(const collect *cc, int sent, double t_start, kvb_load_row *out) {
    collect *c = (collect *)cc;
    memset(out, 0, sizeof *out);
    out->requests = sent;
    out->wall_s = c->n_done ? (c->t_last_done - t_start) / 1e3 : 0; /* none sent (a duration shorter than the first arrival) */
    out->ok = c->n_ok;
    out->failed = c->n_done - c->n_ok;
    out->lost = sent - c->n_done;
    out->out_tokens = c->out_tokens;
    out->req_s = out->wall_s > 0 ? c->n_ok / out->wall_s : 0;
    out->tok_s = out->wall_s > 0 ? c->out_tokens / out->wall_s : 0;
    out->ttft50 = pct(c->ttft, c->n_ttft, 50);
    out->ttft90 = pct(c->ttft, c->n_ttft, 90);
    out->ttft99 = pct(c->ttft, c->n_ttft, 99);
    out->tpot50 = pct(c->tpot, c->n_tpot, 50);
    out->tpot90 = pct(c->tpot, c->n_tpot, 90);
    out->tpot99 = pct(c->tpot, c->n_tpot, 99);
    out->step_tok_s = out->mean_seqs = out->max_seqs = NAN;
    out->pool_mean = out->pool_peak = out->held_mean = out->pool_mib = NAN;
    out->waits = out->overdrafts = out->server_ok = out->server_failed = -1;
    snprintf(out->first_err, sizeof out->first_err, "%s", c->first_err);
}

/* ---- in process ---- */

typedef struct {
    collect c;
    int idle; /* closed loop: clients whose request ended */
} local_run;

static void on_done(void *user, const kvb_sched_result *r) {
    local_run *l = user;
    l->idle++;
    collect_add(&l->c, r->ok, r->err, r->n_gen, r->t_arrive, r->t_first, r->t_last, r->t_done);
}

int kvb_load_run_local(kvb_model *m, const kvb_ctx_params *cp, const char *method, const kvb_budget *b,
                       const kvb_opts *o, const kvb_load_opts *lo, const kvb_rounds *prompts, int n_prompts, kvb_load_row *out, char *err,
                       size_t err_len) {
    return kvb_load_run_local_plan(m, cp, method, b, o, lo, NULL, prompts, n_prompts, out, err, err_len);
}

int kvb_load_run_local_plan(kvb_model *m, const kvb_ctx_params *cp, const char *method, const kvb_budget *b,
                            const kvb_opts *o, const kvb_load_opts *lo, const kvb_load_plan *plan, const kvb_rounds *prompts,
                            int n_prompts, kvb_load_row *out, char *err, size_t err_len) {
    const kvb_load_plan none = {0};
    if (!plan) plan = &none;
    kvb_sched_opts so;
    memset(&so, 0, sizeof so);
    so.model = m;
    so.ctx = *cp;
    so.max_batch = lo->max_batch;
    so.pool_bytes = lo->pool_bytes;
    so.page_tokens = lo->page_tokens;
    so.prefill_chunk = lo->prefill_chunk;
    so.method = method;
    if (b) so.budget = *b;
    if (o) so.opts = *o;
    kvb_sched *s = kvb_sched_create(&so, err, err_len);
    if (!s) return -1;
    local_run l;
    int rc = collect_init(&l.c, lo->requests) ? ERR("out of memory") : 0;
    l.idle = lo->rate > 0 ? 0 : lo->clients;
    int submitted = 0, limit = lo->requests > 0 ? lo->requests : INT_MAX;
    const double t_start = kvb_sched_now(s), t_end = plan->duration_s > 0 ? t_start + plan->duration_s * 1e3 : INFINITY;
    double *arrive = NULL;
    if (lo->rate > 0 && !rc) rc = (arrive = arrivals(lo, plan->duration_s, t_start, &limit, err, err_len)) ? 0 : -1;
    for (;;) {
        if (rc) break;
        /* sending ends at the count, or (closed loop) at the duration; the open-loop schedule already ends there */
        const int sending = submitted < limit && (arrive || kvb_sched_now(s) < t_end);
        if (!sending && l.c.n_done == submitted) break;
        if (arrive) { /* the requests due by now; idle until the next when there is nothing to do */
            const double now = kvb_sched_now(s);
            l.idle = 0; /* (on_done counts ends as free clients: none here) */
            while (submitted + l.idle < limit && arrive[submitted + l.idle] <= now) l.idle++;
            if (l.idle == 0 && kvb_sched_waiting(s) == 0 && kvb_sched_running(s) == 0) {
                if (submitted < limit && arrive[submitted] > now) usleep((useconds_t)((arrive[submitted] - now) * 1e3));
                continue;
            }
        }
        for (; sending && l.idle > 0 && submitted < limit; submitted++, l.idle--) {
            const int k = submitted % n_prompts;
            const kvb_rounds *p = &prompts[k];
            kvb_sched_req r;
            memset(&r, 0, sizeof r);
            r.id = submitted;
            r.ids = p->ids;
            r.n = (int)p->n;
            r.max_new = plan->max_new ? plan->max_new[k] : lo->max_new;
            r.ignore_eos = lo->ignore_eos;
            if (arrive) r.arrive_ms = arrive[submitted]; /* TTFT from the arrival, not from when the loop got to it */
            if (plan->on_submit) plan->on_submit(plan->user, submitted, k, r.max_new, r.ids, r.n);
            if (kvb_sched_submit(s, &r, err, err_len)) rc = -1;
            if (rc) break;
        }
        if (!rc) rc = kvb_sched_step(s, on_done, &l, err, err_len);
    }
    if (!rc) {
        kvb_sched_stats st;
        kvb_sched_get_stats(s, &st);
        row_from(&l.c, submitted, t_start, out);
        /* the tokens the batched steps made per second of step time (prefills left out): batching's own gain */
        out->step_tok_s = st.decode_ms > 0 ? st.step_seqs / (st.decode_ms / 1e3) : 0;
        out->mean_seqs = st.decode_ms > 0 ? st.running_ms / st.decode_ms : 0;
        out->max_seqs = st.max_running;
        if (st.pool_pages) {
            out->pool_mib = st.pool_pages * (double)st.page_bytes / 1048576.0;
            out->pool_mean = st.decode_ms > 0 ? 100.0 * st.reserved_page_ms / st.decode_ms / st.pool_pages : NAN;
            out->held_mean = st.decode_ms > 0 ? 100.0 * st.held_page_ms / st.decode_ms / st.pool_pages : NAN;
            out->pool_peak = 100.0 * st.peak_reserved / st.pool_pages;
        }
        out->waits = st.waits;
        out->overdrafts = st.overdrafts;
    }
    free(arrive);
    collect_free(&l.c);
    kvb_sched_free(s);
    return rc;
}

/* ---- over HTTP ---- */

/* The server's counters (GET /v1/kvbench/stats), cumulative since it started. */
typedef struct {
    int ok;
    double finished, failed, waits, steps, step_seqs, decode_ms, running_ms, reserved_page_ms, pool_pages, page_bytes;
    double held_page_ms, overdrafts; /* NAN from a server without them */
    double running, reserved;
} server_stats;

typedef struct {
    char *p;
    size_t n;
    int too_long;
} buf;

static size_t buf_write(char *data, size_t size, size_t nmemb, void *user) {
    buf *b = user;
    size_t n = size * nmemb;
    if (b->n + n > MAX_REPLY_BYTES) {
        b->too_long = 1;
        return 0;
    }
    char *q = realloc(b->p, b->n + n + 1);
    if (!q) return 0;
    memcpy(q + b->n, data, n);
    b->n += n;
    q[b->n] = 0;
    b->p = q;
    return n;
}

/* A handle limited to http(s), no redirects, the bearer token when one is set. */
static CURL *new_handle(struct curl_slist *headers) {
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    return h;
}

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* GET url: the body and the HTTP status (0 + why when unreachable). */
static long http_get(CURL *h, const char *url, buf *b, char *why, size_t why_len) {
    char eb[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, eb);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    CURLcode c = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 0L);
    if (c != CURLE_OK) {
        snprintf(why, why_len, "%s", eb[0] ? eb : curl_easy_strerror(c));
        return 0;
    }
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    return code;
}

/* The server's stats; st->ok 0 when it has none (404, or not a kvbench server) or it is not batching. */
static void get_stats(CURL *h, const char *base, server_stats *st) {
    memset(st, 0, sizeof *st);
    char url[1200], why[256];
    snprintf(url, sizeof url, "%s/kvbench/stats", base);
    buf b = {0};
    long code = http_get(h, url, &b, why, sizeof why);
    cJSON *j = code == 200 && b.p ? cJSON_Parse(b.p) : NULL;
    if (j && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "batching"))) {
        st->finished = jnum(j, "finished"), st->failed = jnum(j, "failed"), st->waits = jnum(j, "waits");
        st->steps = jnum(j, "steps"), st->step_seqs = jnum(j, "step_seqs"), st->decode_ms = jnum(j, "decode_ms");
        st->running_ms = jnum(j, "running_ms"), st->reserved_page_ms = jnum(j, "reserved_page_ms");
        st->pool_pages = jnum(j, "pool_pages"), st->page_bytes = jnum(j, "page_bytes");
        st->running = jnum(j, "running"), st->reserved = jnum(j, "pool_reserved");
        st->held_page_ms = jnum(j, "held_page_ms"), st->overdrafts = jnum(j, "overdrafts");
        st->ok = !isnan(st->finished) && !isnan(st->decode_ms) && !isnan(st->running_ms) && !isnan(st->step_seqs);
    }
    cJSON_Delete(j);
    free(b.p);
}

/* One streamed request as the client sees it. */
typedef struct {
    buf raw;           /* bytes of the stream not yet parsed into events */
    size_t parsed;
    double t_first, t_last;
    int n_gen;         /* usage.completion_tokens of the final event; -1 before */
    int done;          /* "data: [DONE]" seen */
    char err[256];     /* an error event or a malformed one */
    long status;
    buf body;          /* a non-200 reply's body */
} stream_state;

/* One SSE event's data (NUL-terminated): [DONE], a chunk, or an error object. */
static void on_event(stream_state *s, const char *data) {
    if (!strcmp(data, "[DONE]")) {
        s->done = 1;
        return;
    }
    cJSON *j = cJSON_Parse(data);
    if (!j) {
        if (!s->err[0]) snprintf(s->err, sizeof s->err, "malformed SSE event (not JSON): %.80s", data);
        return;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e) {
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
        if (!s->err[0]) snprintf(s->err, sizeof s->err, "error event: %.200s", msg ? msg : "(no message)");
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "delta"), "content"));
    if (content && content[0]) {
        const double t = mono_ms();
        if (s->t_first == 0) s->t_first = t;
        s->t_last = t;
    }
    const double ct = jnum(cJSON_GetObjectItemCaseSensitive(j, "usage"), "completion_tokens");
    if (!isnan(ct) && !(ct >= 0 && ct <= INT_MAX && ct == floor(ct))) { /* a count no int holds: never cast */
        if (!s->err[0]) snprintf(s->err, sizeof s->err, "malformed SSE event: usage.completion_tokens %.6g is not a token count", ct);
    } else if (!isnan(ct)) {
        s->n_gen = (int)ct;
    }
    cJSON_Delete(j);
}

/* Parse the events complete in s->raw (blank-line separated; "data:" lines joined by newlines, as the SSE spec says). */
static void parse_events(stream_state *s) {
    for (;;) {
        char *base = s->raw.p + s->parsed, *end = strstr(base, "\n\n");
        char *end_crlf = strstr(base, "\r\n\r\n");
        size_t sep = 2;
        if (end_crlf && (!end || end_crlf < end)) end = end_crlf, sep = 4;
        if (!end) return;
        *end = 0;
        char data[1 << 16];
        size_t dn = 0;
        for (char *line = base; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = 0;
            size_t ln = strlen(line);
            if (ln && line[ln - 1] == '\r') line[--ln] = 0;
            if (!strncmp(line, "data:", 5)) {
                const char *v = line + 5 + (line[5] == ' ');
                size_t vn = strlen(v);
                if (dn && dn < sizeof data - 1) data[dn++] = '\n';
                if (dn + vn >= sizeof data) vn = sizeof data - 1 - dn;
                memcpy(data + dn, v, vn);
                dn += vn;
            }
            line = nl ? nl + 1 : NULL;
        }
        data[dn] = 0;
        if (dn) on_event(s, data);
        s->parsed = (size_t)(end - s->raw.p) + sep;
    }
}

static size_t sse_write(char *data, size_t size, size_t nmemb, void *user) {
    stream_state *s = user;
    size_t n = size * nmemb;
    if (s->status != 200) return buf_write(data, size, nmemb, &s->body) == n ? n : 0;
    if (buf_write(data, size, nmemb, &s->raw) != n) return 0;
    parse_events(s);
    return n;
}

static size_t header_cb(char *data, size_t size, size_t nmemb, void *user) {
    stream_state *s = user;
    size_t n = size * nmemb;
    char line[64]; /* the header is not NUL-terminated: a copy of its start */
    size_t k = n < sizeof line - 1 ? n : sizeof line - 1;
    memcpy(line, data, k);
    line[k] = 0;
    int code;
    const char *sp = strchr(line, ' ');
    if (!strncmp(line, "HTTP/", 5) && sp && sscanf(sp, " %d", &code) == 1)
        s->status = code; /* each status line (a 100 Continue before the final one included) */
    return n;
}

/* The bearer token and the URL's userinfo out of a text that is printed or written (a server may echo them). */
static void scrub(const kvb_secrets *sec, char *text, size_t cap) {
    kvb_redact_url_userinfo(text);
    if (!sec->n) return;
    char *t = kvb_redact(sec, strdup(text));
    if (t) snprintf(text, cap, "%s", t);
    else snprintf(text, cap, "(a message that could not be redacted)");
    free(t);
}

typedef struct {
    const kvb_secrets *secrets;
    const char *url; /* .../chat/completions */
    const char *model, *method, *budget;
    struct curl_slist *headers;
    const kvb_load_opts *lo;
    const kvb_load_plan *plan;
    const kvb_load_text *prompts;
    int n_prompts;
    const double *arrive; /* open loop: arrival per request (ms, mono clock); NULL = closed loop */
    pthread_mutex_t mu;
    int next;   /* the next request to send */
    int limit;  /* requests to send at most (the count, or the open-loop schedule's length) */
    double t_end; /* closed loop: no request sent after this (ms, mono clock; INFINITY = none) */
    int exited; /* client threads that ended */
    collect c;
    double t_start;
} url_run;

/* The request's JSON body. */
static char *request_body(const url_run *u, int i) {
    const int k = i % u->n_prompts;
    const kvb_load_text *p = &u->prompts[k];
    cJSON *j = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(j, "messages"), *m;
    cJSON_AddStringToObject(j, "model", u->model);
    if (p->system) {
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", p->system);
        cJSON_AddItemToArray(msgs, m);
    }
    for (int h = 0; h < p->n_history; h++) { /* a dialogue's kept rounds: user, assistant, ... */
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", h % 2 ? "assistant" : "user");
        cJSON_AddStringToObject(m, "content", p->history[h]);
        cJSON_AddItemToArray(msgs, m);
    }
    m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", p->user);
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddNumberToObject(j, "max_tokens", u->plan->max_new ? u->plan->max_new[k] : u->lo->max_new);
    cJSON_AddNumberToObject(j, "temperature", 0);
    cJSON_AddBoolToObject(j, "stream", 1);
    cJSON_AddBoolToObject(j, "ignore_eos", u->lo->ignore_eos);
    if (u->method) {
        cJSON *k = cJSON_AddObjectToObject(j, "kvbench");
        cJSON_AddStringToObject(k, "method", u->method);
        if (u->budget && strcmp(u->budget, "-")) cJSON_AddStringToObject(k, "budget", u->budget);
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* Send request i on h and wait for its whole stream; 1 ok, 0 failed (why). */
static int one_request(url_run *u, CURL *h, int i, stream_state *s, char *why, size_t why_len) {
    char *body = request_body(u, i);
    if (!body) return snprintf(why, why_len, "out of memory"), 0;
    char eb[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, u->url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sse_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, eb);
    s->n_gen = -1;
    CURLcode c = curl_easy_perform(h);
    free(body);
    if (s->raw.too_long || s->body.too_long) return snprintf(why, why_len, "reply over %d bytes", MAX_REPLY_BYTES), 0;
    if (c != CURLE_OK && s->status == 200 && s->done) c = CURLE_OK; /* a close after [DONE] is the end, not an error */
    if (c != CURLE_OK) return snprintf(why, why_len, "%s", eb[0] ? eb : curl_easy_strerror(c)), 0;
    if (s->status != 200) {
        cJSON *j = s->body.p ? cJSON_Parse(s->body.p) : NULL;
        const char *msg = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
        snprintf(why, why_len, "HTTP %ld: %.200s", s->status, msg ? msg : s->body.p ? s->body.p : "(empty body)");
        cJSON_Delete(j);
        return 0;
    }
    if (s->err[0]) return snprintf(why, why_len, "%s", s->err), 0;
    if (!s->done) return snprintf(why, why_len, "malformed SSE stream: it ended without \"data: [DONE]\""), 0;
    if (s->n_gen < 0) return snprintf(why, why_len, "malformed SSE stream: no usage.completion_tokens in its last event"), 0;
    if (s->n_gen > 0 && s->t_first == 0) return snprintf(why, why_len, "malformed SSE stream: %d tokens and no content", s->n_gen), 0;
    return 1;
}

static void *client_main(void *arg) {
    url_run *u = arg;
    CURL *h = new_handle(u->headers); /* one connection per client, kept alive from request to request */
    for (;;) {
        pthread_mutex_lock(&u->mu);
        const int i = u->next < u->limit && (u->arrive || mono_ms() < u->t_end) ? u->next++ : -1;
        if (i >= 0 && u->plan->on_submit) {
            const int k = i % u->n_prompts;
            u->plan->on_submit(u->plan->user, i, k, u->plan->max_new ? u->plan->max_new[k] : u->lo->max_new, NULL, 0);
        }
        pthread_mutex_unlock(&u->mu);
        if (i < 0) break;
        double t_arrive = mono_ms();
        if (u->arrive) {
            if (u->arrive[i] > t_arrive) usleep((useconds_t)((u->arrive[i] - t_arrive) * 1e3));
            t_arrive = u->arrive[i]; /* TTFT from the arrival, even when every connection was busy then */
        }
        stream_state s;
        memset(&s, 0, sizeof s);
        char why[384] = "";
        const int ok = h ? one_request(u, h, i, &s, why, sizeof why) : (snprintf(why, sizeof why, "no curl handle"), 0);
        const double t_done = mono_ms();
        scrub(u->secrets, why, sizeof why);
        pthread_mutex_lock(&u->mu);
        collect_add(&u->c, ok, why, s.n_gen, t_arrive - u->t_start, s.t_first - u->t_start, s.t_last - u->t_start,
                    t_done - u->t_start);
        pthread_mutex_unlock(&u->mu);
        free(s.raw.p);
        free(s.body.p);
    }
    if (h) curl_easy_cleanup(h);
    pthread_mutex_lock(&u->mu);
    u->exited++;
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

int kvb_load_run_url(const char *base_url, const char *api_key_env, const char *model, const char *method,
                     const char *budget, const kvb_load_opts *lo, const kvb_load_text *prompts, int n_prompts,
                     kvb_load_row *out, char *err, size_t err_len) {
    return kvb_load_run_url_plan(base_url, api_key_env, model, method, budget, lo, NULL, prompts, n_prompts, out, err,
                                 err_len);
}

int kvb_load_run_url_plan(const char *base_url, const char *api_key_env, const char *model, const char *method,
                          const char *budget, const kvb_load_opts *lo, const kvb_load_plan *plan,
                          const kvb_load_text *prompts, int n_prompts, kvb_load_row *out, char *err, size_t err_len) {
    const kvb_load_plan none = {0};
    if (!plan) plan = &none;
    if (strncmp(base_url, "http://", 7) && strncmp(base_url, "https://", 8)) {
        snprintf(err, err_len, "--url %s: expected http://host:port[/v1] or https://...", base_url);
        kvb_redact_url_userinfo(err);
        return -1;
    }
    char base[1024];
    size_t bl = strlen(base_url);
    while (bl && base_url[bl - 1] == '/') bl--;
    if (bl >= sizeof base - 16) return ERR("--url: longer than %zu characters", sizeof base - 16);
    memcpy(base, base_url, bl);
    base[bl] = 0;
    if (!strchr(strstr(base, "://") + 3, '/')) strcat(base, "/v1"); /* the server's root: its API lives under /v1 */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Accept: text/event-stream");
    const char *key = api_key_env ? getenv(api_key_env) : NULL;
    if (api_key_env && !key) {
        curl_slist_free_all(headers);
        return ERR("--api-key-env %s: the variable is not set", api_key_env);
    }
    kvb_secrets sec = {{0}, 0};
    char ui[512], pw[512], plain[1024];
    kvb_url_strip_userinfo(base_url, plain, sizeof plain, ui, sizeof ui, pw, sizeof pw);
    if ((key && kvb_secrets_add(&sec, key)) || (ui[0] && kvb_secrets_add_url_part(&sec, ui)) ||
        (pw[0] && kvb_secrets_add_url_part(&sec, pw))) {
        kvb_secrets_free(&sec);
        curl_slist_free_all(headers);
        return ERR("out of memory");
    }
    if (key) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
        headers = curl_slist_append(headers, auth);
        memset(auth, 0, sizeof auth);
    }
    CURL *h = new_handle(headers);
    if (!h) {
        kvb_secrets_free(&sec);
        curl_slist_free_all(headers);
        return ERR("cannot create a curl handle");
    }
    /* reachable, and speaking the API, before any request is counted */
    char url[1200], why[256] = "";
    snprintf(url, sizeof url, "%s/models", base);
    buf b = {0};
    long code = http_get(h, url, &b, why, sizeof why);
    int rc = 0;
    if (code == 0) rc = ERR("cannot reach %s: %s", url, why);
    else if (code != 200) rc = ERR("%s answered HTTP %ld (is it an OpenAI-compatible server? is --api-key-env needed?)", url, code);
    char served[256] = "kvbench"; /* the model field: the caller's, or the first model the server lists */
    if (model) snprintf(served, sizeof served, "%s", model);
    else if (!rc) {
        cJSON *j = b.p ? cJSON_Parse(b.p) : NULL;
        const char *id = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "data"), 0), "id"));
        if (id) snprintf(served, sizeof served, "%s", id);
        cJSON_Delete(j);
    }
    free(b.p);
    server_stats s0, s1;
    if (!rc) get_stats(h, base, &s0);
    url_run u;
    memset(&u, 0, sizeof u);
    snprintf(url, sizeof url, "%s/chat/completions", base);
    u.secrets = &sec;
    u.url = url, u.model = served, u.method = method, u.budget = budget, u.headers = headers, u.lo = lo, u.plan = plan;
    u.prompts = prompts, u.n_prompts = n_prompts;
    pthread_mutex_init(&u.mu, NULL);
    if (!rc && collect_init(&u.c, lo->requests)) rc = ERR("out of memory");
    u.t_start = mono_ms();
    u.limit = lo->requests > 0 ? lo->requests : INT_MAX;
    u.t_end = plan->duration_s > 0 ? u.t_start + plan->duration_s * 1e3 : INFINITY;
    double *arrive = NULL;
    if (!rc && lo->rate > 0) rc = (arrive = arrivals(lo, plan->duration_s, u.t_start, &u.limit, err, err_len)) ? 0 : -1;
    u.arrive = arrive;
    const int n_threads = lo->clients < u.limit ? lo->clients : u.limit;
    pthread_t *th = rc || n_threads < 1 ? NULL : calloc((size_t)n_threads, sizeof *th);
    if (!rc && n_threads > 0 && !th) rc = ERR("out of memory");
    int started = 0;
    for (; !rc && started < n_threads; started++)
        if (pthread_create(&th[started], NULL, client_main, &u)) {
            rc = ERR("cannot start client thread %d", started);
            break;
        }
    /* the most sequences at once and the peak of the pool, sampled while the clients run */
    double max_running = NAN, peak_reserved = NAN;
    while (started && !rc) {
        pthread_mutex_lock(&u.mu);
        const int all_done = u.exited == started;
        pthread_mutex_unlock(&u.mu);
        if (all_done) break;
        server_stats si;
        if (s0.ok) {
            get_stats(h, base, &si);
            if (si.ok) {
                max_running = isnan(max_running) || si.running > max_running ? si.running : max_running;
                peak_reserved = isnan(peak_reserved) || si.reserved > peak_reserved ? si.reserved : peak_reserved;
            }
        }
        usleep(50000);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (!rc) {
        row_from(&u.c, u.next, 0, out);
        get_stats(h, base, &s1);
        if (s0.ok && s1.ok) { /* the server's counters over the row */
            const double dec = s1.decode_ms - s0.decode_ms;
            out->server_ok = (int64_t)(s1.finished - s0.finished);
            out->server_failed = (int64_t)(s1.failed - s0.failed);
            out->waits = (int64_t)(s1.waits - s0.waits);
            out->step_tok_s = dec > 0 ? (s1.step_seqs - s0.step_seqs) / (dec / 1e3) : 0;
            out->mean_seqs = dec > 0 ? (s1.running_ms - s0.running_ms) / dec : 0;
            out->max_seqs = max_running;
            if (s1.pool_pages > 0) {
                out->pool_mib = s1.pool_pages * s1.page_bytes / 1048576.0;
                out->pool_mean = dec > 0 ? 100.0 * (s1.reserved_page_ms - s0.reserved_page_ms) / dec / s1.pool_pages : NAN;
                out->pool_peak = isnan(peak_reserved) ? NAN : 100.0 * peak_reserved / s1.pool_pages;
                out->held_mean = dec > 0 ? 100.0 * (s1.held_page_ms - s0.held_page_ms) / dec / s1.pool_pages : NAN;
                if (!isnan(s1.overdrafts) && !isnan(s0.overdrafts)) out->overdrafts = (int64_t)(s1.overdrafts - s0.overdrafts);
            }
        }
    }
    free(arrive);
    free(th);
    collect_free(&u.c);
    pthread_mutex_destroy(&u.mu);
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    if (rc) scrub(&sec, err, err_len);
    if (!rc) scrub(&sec, out->first_err, sizeof out->first_err);
    kvb_secrets_free(&sec);
    return rc;
}

/* ---- rows ---- */

static void md_cell(FILE *f, double v, const char *fmt) {
    if (isnan(v)) {
        fputs(" - |", f);
        return;
    }
    fputc(' ', f);
    fprintf(f, fmt, v);
    fputs(" |", f);
}

void kvb_load_md_header(FILE *f) {
    fputs("| method | budget | ok/requests | failed | lost | req/s | out tok/s | step tok/s | TTFT p50 ms | TTFT p90 ms | "
          "TTFT p99 ms | TPOT p50 ms | TPOT p90 ms | TPOT p99 ms | mean seqs | max seqs | pool promised mean / peak % | "
          "pool held mean % | waits | dataset |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", f);
}

void kvb_load_md_row(FILE *f, const char *method, const char *budget, const kvb_load_row *r) {
    fprintf(f, "| %s | %s | %d/%d | %d | %d |", method, budget, r->ok, r->requests, r->failed, r->lost);
    md_cell(f, r->req_s, "%.2f");
    md_cell(f, r->tok_s, "%.1f");
    md_cell(f, r->step_tok_s, "%.1f");
    md_cell(f, r->ttft50, "%.0f");
    md_cell(f, r->ttft90, "%.0f");
    md_cell(f, r->ttft99, "%.0f");
    md_cell(f, r->tpot50, "%.1f");
    md_cell(f, r->tpot90, "%.1f");
    md_cell(f, r->tpot99, "%.1f");
    md_cell(f, r->mean_seqs, "%.2f");
    md_cell(f, r->max_seqs, "%.0f");
    if (isnan(r->pool_mean)) fputs(" - |", f);
    else if (isnan(r->pool_peak)) fprintf(f, " %.0f / - |", r->pool_mean);
    else fprintf(f, " %.0f / %.0f |", r->pool_mean, r->pool_peak);
    md_cell(f, r->held_mean, "%.0f");
    if (r->waits < 0) fputs(" - |", f);
    else fprintf(f, " %lld |", (long long)r->waits);
    fprintf(f, " %s |\n", r->dataset[0] ? r->dataset : "-");
}

static const char *const CSV_COLS =
    "method,budget,requests,ok,failed,lost,wall_s,requests_per_s,output_tokens_per_s,step_tokens_per_s,ttft_p50_ms,"
    "ttft_p90_ms,ttft_p99_ms,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms,mean_seqs,max_seqs,pool_mib,pool_promised_mean_pct,"
    "pool_promised_peak_pct,pool_held_mean_pct,waits,overdrafts,server_ok,server_failed,dataset";

void kvb_load_csv_header(FILE *f) { fprintf(f, "%s\n", CSV_COLS); }

static void csv_num(FILE *f, double v, const char *fmt) {
    fputc(',', f);
    if (!isnan(v)) fprintf(f, fmt, v);
}

static void csv_int(FILE *f, int64_t v) {
    fputc(',', f);
    if (v >= 0) fprintf(f, "%lld", (long long)v);
}

void kvb_load_csv_row(FILE *f, const char *method, const char *budget, const kvb_load_row *r) {
    fprintf(f, "%s,%s,%d,%d,%d,%d", method, budget, r->requests, r->ok, r->failed, r->lost);
    csv_num(f, r->wall_s, "%.3f");
    csv_num(f, r->req_s, "%.4f");
    csv_num(f, r->tok_s, "%.2f");
    csv_num(f, r->step_tok_s, "%.2f");
    const double ms[] = {r->ttft50, r->ttft90, r->ttft99, r->tpot50, r->tpot90, r->tpot99};
    for (int i = 0; i < 6; i++) csv_num(f, ms[i], i < 3 ? "%.1f" : "%.2f");
    csv_num(f, r->mean_seqs, "%.3f");
    csv_num(f, r->max_seqs, "%.0f");
    csv_num(f, r->pool_mib, "%.2f");
    csv_num(f, r->pool_mean, "%.1f");
    csv_num(f, r->pool_peak, "%.1f");
    csv_num(f, r->held_mean, "%.1f");
    csv_int(f, r->waits);
    csv_int(f, r->overdrafts);
    csv_int(f, r->server_ok);
    csv_int(f, r->server_failed);
    fprintf(f, ",%s\n", r->dataset[0] ? r->dataset : "-");
}

static void json_num(cJSON *o, const char *k, double v) {
    if (isnan(v)) cJSON_AddNullToObject(o, k);
    else cJSON_AddNumberToObject(o, k, v);
}

void *kvb_load_row_json(const char *method, const char *budget, const kvb_load_row *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "method", method);
    cJSON_AddStringToObject(o, "budget", budget);
    cJSON_AddNumberToObject(o, "requests", r->requests);
    cJSON_AddNumberToObject(o, "ok", r->ok);
    cJSON_AddNumberToObject(o, "failed", r->failed);
    cJSON_AddNumberToObject(o, "lost", r->lost);
    cJSON_AddNumberToObject(o, "output_tokens", (double)r->out_tokens);
    const struct {
        const char *k;
        double v;
    } nums[] = {{"wall_s", r->wall_s}, {"requests_per_s", r->req_s}, {"output_tokens_per_s", r->tok_s},
                {"step_tokens_per_s", r->step_tok_s}, {"ttft_p50_ms", r->ttft50}, {"ttft_p90_ms", r->ttft90},
                {"ttft_p99_ms", r->ttft99}, {"tpot_p50_ms", r->tpot50}, {"tpot_p90_ms", r->tpot90},
                {"tpot_p99_ms", r->tpot99}, {"mean_seqs", r->mean_seqs}, {"max_seqs", r->max_seqs},
                {"pool_mib", r->pool_mib}, {"pool_promised_mean_pct", r->pool_mean},
                {"pool_promised_peak_pct", r->pool_peak}, {"pool_held_mean_pct", r->held_mean},
                {"waits", r->waits < 0 ? NAN : (double)r->waits}, {"overdrafts", r->overdrafts < 0 ? NAN : (double)r->overdrafts},
                {"server_ok", r->server_ok < 0 ? NAN : (double)r->server_ok},
                {"server_failed", r->server_failed < 0 ? NAN : (double)r->server_failed}};
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) json_num(o, nums[i].k, nums[i].v);
    if (r->first_err[0]) cJSON_AddStringToObject(o, "first_error", r->first_err);
    if (r->dataset[0]) cJSON_AddStringToObject(o, "dataset", r->dataset);
    return o;
}
