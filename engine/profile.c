#include "engine/profile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_EVENTS = 2000000 };

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
    int64_t *layer_ns; /* [stage][phase][n_layer] */
    prof_event *ev;
    int64_t n_ev, cap_ev, dropped;
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
    return p;
}

void prof_free(prof *p) {
    if (!p) return;
    free(p->layer_ns);
    free(p->ev);
    free(p);
}

void prof_set_stage(prof *p, prof_stage s) {
    if (p) p->stage = s;
}

void prof_begin(prof *p, prof_phase ph, int layer) {
    if (!p || !p->enabled) return;
    (void)layer;
    p->open_ns[ph] = now_ns();
}

void prof_end(prof *p, prof_phase ph, int layer, int64_t tokens, int64_t bytes) {
    if (!p || !p->enabled) return;
    int64_t t = now_ns(), d = t - p->open_ns[ph];
    p->total_ns[p->stage][ph] += d;
    p->calls[p->stage][ph]++;
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
int64_t prof_layer_ns(const prof *p, prof_stage s, prof_phase ph, int layer) {
    if (!p || layer < 0 || layer >= p->n_layer) return 0;
    return p->layer_ns[((size_t)s * PROF_PHASE_COUNT + ph) * (size_t)p->n_layer + (size_t)layer];
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
}

int prof_write_trace(const prof *p, const char *path, char *err, size_t err_len) {
    if (!p || !p->trace) {
        snprintf(err, err_len, "trace: tracing was not enabled");
        return -1;
    }
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        snprintf(err, err_len, "trace: path too long");
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, err_len, "trace: cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"kvbench\",\"dropped_events\":%lld},"
               "\"traceEvents\":[\n", (long long)p->dropped);
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
