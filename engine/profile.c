#include "engine/profile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#ifdef KVB_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

enum { MAX_EVENTS = 2000000, COPY_DIRS = 3 };

static const char *COPY_DIR_NAMES[COPY_DIRS] = {"h2d", "d2h", "d2d"};

typedef struct {
    int64_t start_ns, dur_ns, tokens, bytes;
    int16_t phase, layer;
    int8_t stage;
} prof_event;

struct prof {
    int n_layer, enabled, trace;
    prof_stage stage;
    int64_t t0_ns;
    int64_t open_ns[PROF_PHASE_COUNT];
    int64_t total_ns[PROF_STAGE_COUNT][PROF_PHASE_COUNT], calls[PROF_STAGE_COUNT][PROF_PHASE_COUNT];
    int64_t total_bytes[PROF_STAGE_COUNT][PROF_PHASE_COUNT];
    int64_t *layer_ns; /* [stage][phase][n_layer] */
    int64_t copies[PROF_STAGE_COUNT][COPY_DIRS], copy_bytes[PROF_STAGE_COUNT][COPY_DIRS];
    prof_event *ev;
    int64_t n_ev, cap_ev, dropped;
    void (*sync)(void *); /* wait for the device before reading the clock (GPU backends) */
    void *sync_user;
#ifdef KVB_HAVE_NVTX
    nvtxDomainHandle_t nvtx;        /* NULL: no NVTX tool attached, nothing is emitted */
    nvtxStringHandle_t *nvtx_names; /* [phase][n_layer + 1]: "L07 mlp"; slot n_layer = not per layer */
#endif
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const char *PHASE_NAMES[PROF_PHASE_COUNT] = {"embed", "calc_qkv_and_rope", "update_cache", "attn_forward",
                                                    "attn_output", "mlp", "lm_head", "select", "h2d", "d2h", "sample"};

const char *prof_phase_name(prof_phase ph) { return (unsigned)ph < PROF_PHASE_COUNT ? PHASE_NAMES[ph] : "?"; }
const char *prof_stage_name(prof_stage s) { return s == PROF_PREFILL ? "prefill" : "decode"; }

#ifdef KVB_HAVE_NVTX
/* NVTX v3 (header-only) on every backend, whenever the headers were found at configure (KVB_HAVE_NVTX).
 *
 * Domain "kvbench"; categories 1 "prefill" and 2 "decode" (the stage); each range is pushed with the registered
 * name "L07 mlp" ("embed", "select"... outside the layers) and an ARGB colour by kind of work. A range's token
 * and byte counts are known only when it ends, and a pop carries no attributes, so each range closes with a
 * mark in the same domain and category, just before its pop:
 *     message "L07 mlp tokens=16 bytes=0", payload INT64 = tokens.
 * prof_add_copies leaves a mark "copies h2d n=3 bytes=4096" with payload UNSIGNED_INT64 = bytes.
 *
 * Without a tool (no NVTX_INJECTION64_PATH: nsys, tests/nvtx_inject.c) nvtxDomainCreateA returns NULL; then
 * nothing more is registered or formatted, and each begin/end costs one branch. */
static void nvtx_create(prof *p) {
    p->nvtx = nvtxDomainCreateA("kvbench");
    if (!p->nvtx) return;
    p->nvtx_names = calloc((size_t)PROF_PHASE_COUNT * (size_t)(p->n_layer + 1), sizeof *p->nvtx_names);
    if (!p->nvtx_names) {
        nvtxDomainDestroy(p->nvtx);
        p->nvtx = NULL;
        return;
    }
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++)
        for (int l = 0; l <= p->n_layer; l++) {
            char name[64];
            if (l < p->n_layer) snprintf(name, sizeof name, "L%02d %s", l, PHASE_NAMES[ph]);
            else snprintf(name, sizeof name, "%s", PHASE_NAMES[ph]);
            p->nvtx_names[(size_t)ph * (size_t)(p->n_layer + 1) + (size_t)l] = nvtxDomainRegisterStringA(p->nvtx, name);
        }
    nvtxDomainNameCategoryA(p->nvtx, 1 + PROF_PREFILL, "prefill");
    nvtxDomainNameCategoryA(p->nvtx, 1 + PROF_DECODE, "decode");
}

/* colours by kind of work: compute, cache traffic, method work, transfers */
static uint32_t phase_colour(int ph) {
    switch (ph) {
    case PROF_UPDATE_CACHE: return 0xFF2E86DE;
    case PROF_ATTN_FORWARD: return 0xFFE67E22;
    case PROF_SELECT: return 0xFF8E44AD;
    case PROF_H2D: case PROF_D2H: return 0xFFC0392B;
    default: return 0xFF27AE60;
    }
}

/* event attributes with the version fields and the current stage's category */
static nvtxEventAttributes_t nvtx_attr(const prof *p) {
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.category = 1 + (uint32_t)p->stage;
    return a;
}

static int nvtx_slot(const prof *p, int layer) { return layer >= 0 && layer < p->n_layer ? layer : p->n_layer; }

static void nvtx_push(prof *p, int ph, int layer) {
    if (!p->nvtx) return;
    nvtxEventAttributes_t a = nvtx_attr(p);
    a.colorType = NVTX_COLOR_ARGB;
    a.color = phase_colour(ph);
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = p->nvtx_names[(size_t)ph * (size_t)(p->n_layer + 1) + (size_t)nvtx_slot(p, layer)];
    nvtxDomainRangePushEx(p->nvtx, &a);
}

static void nvtx_mark(prof *p, const char *msg, nvtxPayloadType_t type, int64_t value) {
    nvtxEventAttributes_t a = nvtx_attr(p);
    a.payloadType = type;
    if (type == NVTX_PAYLOAD_TYPE_INT64) a.payload.llValue = value;
    else a.payload.ullValue = (uint64_t)value;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = msg;
    nvtxDomainMarkEx(p->nvtx, &a);
}

static void nvtx_pop(prof *p, int ph, int layer, int64_t tokens, int64_t bytes) {
    if (!p->nvtx) return;
    char msg[96];
    int l = nvtx_slot(p, layer);
    if (l < p->n_layer) snprintf(msg, sizeof msg, "L%02d %s tokens=%lld bytes=%lld", l, PHASE_NAMES[ph], (long long)tokens, (long long)bytes);
    else snprintf(msg, sizeof msg, "%s tokens=%lld bytes=%lld", PHASE_NAMES[ph], (long long)tokens, (long long)bytes);
    nvtx_mark(p, msg, NVTX_PAYLOAD_TYPE_INT64, tokens);
    nvtxDomainRangePop(p->nvtx);
}
#endif

prof *prof_create(int n_layer, int enabled, int trace) {
    prof *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_layer = n_layer > 0 ? n_layer : 1;
    p->enabled = enabled || trace;
    p->trace = trace;
    p->t0_ns = now_ns();
    p->layer_ns = calloc((size_t)PROF_STAGE_COUNT * PROF_PHASE_COUNT * (size_t)p->n_layer, sizeof *p->layer_ns);
    if (!p->layer_ns) {
        free(p);
        return NULL;
    }
#ifdef KVB_HAVE_NVTX
    nvtx_create(p);
#endif
    return p;
}

void prof_set_sync(prof *p, void (*sync)(void *), void *user) {
    if (!p) return;
    p->sync = sync;
    p->sync_user = user;
}

void prof_free(prof *p) {
    if (!p) return;
#ifdef KVB_HAVE_NVTX
    free(p->nvtx_names);
    if (p->nvtx) nvtxDomainDestroy(p->nvtx);
#endif
    free(p->layer_ns);
    free(p->ev);
    free(p);
}

void prof_set_stage(prof *p, prof_stage s) {
    if (p) p->stage = s;
}

int prof_enabled(const prof *p) { return p && p->enabled; }

void prof_begin(prof *p, prof_phase ph, int layer) {
    if (!p) return;
#ifdef KVB_HAVE_NVTX
    nvtx_push(p, ph, layer);
#endif
    if (!p->enabled) return;
    if (p->sync) p->sync(p->sync_user);
    p->open_ns[ph] = now_ns();
}

void prof_end(prof *p, prof_phase ph, int layer, int64_t tokens, int64_t bytes) {
    if (!p) return;
#ifdef KVB_HAVE_NVTX
    nvtx_pop(p, ph, layer, tokens, bytes);
#endif
    if (!p->enabled) return;
    if (p->sync) p->sync(p->sync_user);
    int64_t t = now_ns(), d = t - p->open_ns[ph];
    p->total_ns[p->stage][ph] += d;
    p->calls[p->stage][ph]++;
    p->total_bytes[p->stage][ph] += bytes;
    if (layer >= 0 && layer < p->n_layer)
        p->layer_ns[((size_t)p->stage * PROF_PHASE_COUNT + ph) * (size_t)p->n_layer + (size_t)layer] += d;
    if (!p->trace) return;
    if (p->n_ev == p->cap_ev) {
        if (p->cap_ev >= MAX_EVENTS) {
            p->dropped++;
            return;
        }
        int64_t cap = p->cap_ev ? p->cap_ev * 2 : 4096;
        prof_event *e = realloc(p->ev, (size_t)cap * sizeof *e);
        if (!e) {
            p->dropped++;
            return;
        }
        p->ev = e;
        p->cap_ev = cap;
    }
    p->ev[p->n_ev++] = (prof_event){p->open_ns[ph] - p->t0_ns, d, tokens, bytes, (int16_t)ph, (int16_t)layer,
                                    (int8_t)p->stage};
}

int64_t prof_total_ns(const prof *p, prof_stage s, prof_phase ph) { return p ? p->total_ns[s][ph] : 0; }
int64_t prof_calls(const prof *p, prof_stage s, prof_phase ph) { return p ? p->calls[s][ph] : 0; }
int64_t prof_total_bytes(const prof *p, prof_stage s, prof_phase ph) { return p ? p->total_bytes[s][ph] : 0; }
int64_t prof_layer_ns(const prof *p, prof_stage s, prof_phase ph, int layer) {
    if (!p || layer < 0 || layer >= p->n_layer) return 0;
    return p->layer_ns[((size_t)s * PROF_PHASE_COUNT + ph) * (size_t)p->n_layer + (size_t)layer];
}

void prof_add_copies(prof *p, int dir, int64_t n, int64_t bytes) {
    if (!p || dir < 0 || dir >= COPY_DIRS) return;
    p->copies[p->stage][dir] += n;
    p->copy_bytes[p->stage][dir] += bytes;
#ifdef KVB_HAVE_NVTX
    if (p->nvtx && (n || bytes)) {
        char msg[96];
        snprintf(msg, sizeof msg, "copies %s n=%lld bytes=%lld", COPY_DIR_NAMES[dir], (long long)n, (long long)bytes);
        nvtx_mark(p, msg, NVTX_PAYLOAD_TYPE_UNSIGNED_INT64, bytes);
    }
#endif
}

void prof_copies(const prof *p, prof_stage s, int dir, int64_t *n, int64_t *bytes) {
    int ok = p && (unsigned)s < PROF_STAGE_COUNT && dir >= 0 && dir < COPY_DIRS;
    if (n) *n = ok ? p->copies[s][dir] : 0;
    if (bytes) *bytes = ok ? p->copy_bytes[s][dir] : 0;
}

/* Two rows under the phase table: copies, then MiB, per direction and stage. */
static void print_copies(const prof *p, FILE *out) {
    fprintf(out, "\n| traffic | prefill h2d | prefill d2h | prefill d2d | decode h2d | decode d2h | decode d2d |\n");
    fprintf(out, "|---|---:|---:|---:|---:|---:|---:|\n| copies |");
    for (int s = 0; s < PROF_STAGE_COUNT; s++)
        for (int d = 0; d < COPY_DIRS; d++) fprintf(out, " %lld |", (long long)p->copies[s][d]);
    fprintf(out, "\n| MiB |");
    for (int s = 0; s < PROF_STAGE_COUNT; s++)
        for (int d = 0; d < COPY_DIRS; d++) fprintf(out, " %.3f |", p->copy_bytes[s][d] / (1024.0 * 1024.0));
    fprintf(out, "\n");
}

void prof_print_table(const prof *p, FILE *out) {
    if (!p || !p->enabled) return;
    double stage_ms[PROF_STAGE_COUNT] = {0, 0};
    for (int s = 0; s < PROF_STAGE_COUNT; s++)
        for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) stage_ms[s] += p->total_ns[s][ph] / 1e6;
    fprintf(out, "\n| phase | prefill ms | prefill %% | calls | decode ms | decode %% | calls | decode ms/call |\n");
    fprintf(out, "|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) {
        const int64_t *c0 = p->calls[PROF_PREFILL], *c1 = p->calls[PROF_DECODE];
        if (!c0[ph] && !c1[ph]) continue;
        double m0 = p->total_ns[PROF_PREFILL][ph] / 1e6, m1 = p->total_ns[PROF_DECODE][ph] / 1e6;
        fprintf(out, "| %s | %.2f | %.1f | %lld | %.2f | %.1f | %lld | %.4f |\n", PHASE_NAMES[ph], m0,
                stage_ms[0] > 0 ? 100.0 * m0 / stage_ms[0] : 0.0, (long long)c0[ph], m1,
                stage_ms[1] > 0 ? 100.0 * m1 / stage_ms[1] : 0.0, (long long)c1[ph], c1[ph] ? m1 / (double)c1[ph] : 0.0);
    }
    fprintf(out, "| total | %.2f | 100.0 | | %.2f | 100.0 | | |\n", stage_ms[0], stage_ms[1]);
    print_copies(p, out);
}

int prof_write_trace(const prof *p, const char *path, char *err, size_t err_len) {
    if (!p || !p->trace) {
        snprintf(err, err_len, "trace: tracing was not enabled");
        return -1;
    }
    char tmp[4096];
    /* a temporary of this process's own (two writers of one trace path never share one), renamed into place */
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp) {
        snprintf(err, err_len, "trace: path too long");
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, err_len, "trace: cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"kvbench\",\"dropped_events\":%lld,\"copies\":{",
            (long long)p->dropped);
    for (int s = 0; s < PROF_STAGE_COUNT; s++) { /* "copies":{"prefill":{"h2d":{"n":3,"bytes":4096},...},...} */
        fprintf(f, "%s\"%s\":{", s ? "," : "", prof_stage_name((prof_stage)s));
        for (int d = 0; d < COPY_DIRS; d++)
            fprintf(f, "%s\"%s\":{\"n\":%lld,\"bytes\":%lld}", d ? "," : "", COPY_DIR_NAMES[d],
                    (long long)p->copies[s][d], (long long)p->copy_bytes[s][d]);
        fprintf(f, "}");
    }
    fprintf(f, "}},\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"kvbench\"}}");
    for (int64_t i = 0; i < p->n_ev; i++) {
        const prof_event *e = &p->ev[i];
        fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,"
                   "\"args\":{\"layer\":%d,\"tokens\":%lld,\"bytes\":%lld}}",
                PHASE_NAMES[e->phase], prof_stage_name((prof_stage)e->stage), e->start_ns / 1e3, e->dur_ns / 1e3,
                e->layer, (long long)e->tokens, (long long)e->bytes);
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        snprintf(err, err_len, "trace: cannot write %s", path);
        remove(tmp);
        return -1;
    }
    return 0;
}
