/* kept.c — the positions a method kept and attended (kept.h). */
#include "engine/kept.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kvcache.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

typedef struct {
    int32_t *pos;
    int64_t n, cap;
} pos_list;

struct kvb_kept {
    int n_layer, n_head_kv;
    pos_list *attended; /* [layer][KV head]: what the latest decode call read */
    int have_attended, failed;
};

int kvb_src_positions(kvb_ctx *c, const kvb_src *s, int32_t *out, int64_t *n) {
    kvb_backend *be = c->be;
    char err[8];
    *n = s->idx ? s->n_idx : s->n;
    if (!s->idx) {
        int rc = s->n ? be->copy(be, out, s->pos, (size_t)s->n * sizeof *out, KVB_COPY_D2H, err, sizeof err) : 0;
        return rc || (be->sync && be->sync(be)) ? -1 : 0;
    }
    int32_t *pos = malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof *pos);
    int rc = pos ? 0 : -1;
    if (!rc && s->n) rc = be->copy(be, pos, s->pos, (size_t)s->n * sizeof *pos, KVB_COPY_D2H, err, sizeof err);
    if (!rc && *n) rc = be->copy(be, out, s->idx, (size_t)*n * sizeof *out, KVB_COPY_D2H, err, sizeof err);
    if (!rc && be->sync) rc = be->sync(be);
    for (int64_t i = 0; i < *n && !rc; i++) out[i] = pos[out[i]];
    free(pos);
    return rc;
}

static int fit(pos_list *p, int64_t n) {
    if (n <= p->cap) return 0;
    int32_t *np = realloc(p->pos, (size_t)n * sizeof *np);
    if (!np) return -1;
    p->pos = np;
    p->cap = n;
    return 0;
}

/* A local layer's attention reads its window: of the listed positions, those after the latest query's position
 * (the newest listed) minus the window; the store may still hold the token that fell out during the step. */
static void keep_window(pos_list *p, int32_t window) {
    int32_t newest = INT32_MIN;
    for (int64_t i = 0; i < p->n; i++) newest = p->pos[i] > newest ? p->pos[i] : newest;
    int64_t m = 0;
    for (int64_t i = 0; i < p->n; i++)
        if ((int64_t)newest - p->pos[i] < window) p->pos[m++] = p->pos[i];
    p->n = m;
}

static void on_visible(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q) {
    (void)n_q;
    kvb_kept *k = user;
    if (c->in_prefill || k->failed) return;
    const int window = kvb_layer_window(&c->model->cfg, layer);
    for (int h = 0; h < k->n_head_kv; h++) {
        pos_list *p = &k->attended[(size_t)layer * k->n_head_kv + h];
        int64_t n = src[h].idx ? src[h].n_idx : src[h].n;
        if (fit(p, n > 0 ? n : 1) || kvb_src_positions(c, &src[h], p->pos, &p->n)) k->failed = 1;
        else if (window) keep_window(p, window);
    }
    k->have_attended = 1;
}

kvb_kept *kvb_kept_attach(kvb_ctx *c) {
    kvb_kept *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->n_layer = c->model->cfg.n_layer;
    k->n_head_kv = c->model->cfg.n_head_kv;
    k->attended = calloc((size_t)k->n_layer * k->n_head_kv, sizeof *k->attended);
    if (!k->attended) {
        free(k);
        return NULL;
    }
    c->on_visible = on_visible;
    c->on_visible_user = k;
    return k;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void put_list(FILE *out, const char *key, const int32_t *v, int64_t n) {
    fprintf(out, ", \"%s\": [", key);
    for (int64_t i = 0; i < n; i++) fprintf(out, i ? ", %d" : "%d", v[i]);
    fputc(']', out);
}

/* One head's positions in the store, ascending (all), and those of them in the host tier (host). */
static int head_positions(kvb_ctx *c, int l, int h, pos_list *all, pos_list *host) {
    kvc_view v = kvc_head_view(c->kv, l, h);
    all->n = host->n = 0;
    if (fit(all, v.n > 0 ? v.n : 1) || fit(host, v.n > 0 ? v.n : 1)) return -1;
    if (v.n == 0) return 0;
    kvb_src s = {.pos = v.pos, .n = v.n};
    if (v.tier == KVB_TIER_HOST) { /* host memory: read in place */
        memcpy(all->pos, v.pos, (size_t)v.n * sizeof *v.pos);
        memcpy(host->pos, v.pos, (size_t)v.n * sizeof *v.pos);
        all->n = host->n = v.n;
    } else if (kvb_src_positions(c, &s, all->pos, &all->n)) {
        return -1;
    }
    qsort(all->pos, (size_t)all->n, sizeof *all->pos, cmp_i32);
    qsort(host->pos, (size_t)host->n, sizeof *host->pos, cmp_i32);
    return 0;
}

int kvb_kept_header(FILE *out, const char *fields, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    fprintf(out, "{%s%s\"n_prompt\": %lld", fields, fields[0] ? ", " : "", (long long)n);
    if (ids) put_list(out, "prompt_ids", ids, n);
    fputs("}\n", out);
    return fflush(out) || ferror(out) ? ERR("dump-kept: write failed (disk full?)") : 0;
}

int kvb_kept_write(kvb_kept *k, kvb_ctx *c, const char *when, FILE *out, char *err, size_t err_len) {
    if (k->failed) return ERR("dump-kept: reading the attended positions failed");
    pos_list all = {0}, host = {0}, att = {0};
    int rc = 0;
    for (int l = 0; l < k->n_layer && !rc; l++)
        for (int h = 0; h < k->n_head_kv && !rc; h++) {
            if (head_positions(c, l, h, &all, &host)) {
                rc = ERR("dump-kept: reading layer %d head %d's positions failed", l, h);
                break;
            }
            fprintf(out, "{\"when\": \"%s\", \"layer\": %d, \"kv_head\": %d", when, l, h);
            if (kvb_layer_window(&c->model->cfg, l)) /* a local layer: its kept set is its window */
                fprintf(out, ", \"window\": %d", kvb_layer_window(&c->model->cfg, l));
            fprintf(out, ", \"n\": %lld", (long long)all.n);
            put_list(out, "positions", all.pos, all.n);
            put_list(out, "host", host.pos, host.n);
            const pos_list *a = &k->attended[(size_t)l * k->n_head_kv + h];
            if (k->have_attended && !fit(&att, a->n > 0 ? a->n : 1)) {
                memcpy(att.pos, a->pos, (size_t)a->n * sizeof *a->pos);
                qsort(att.pos, (size_t)a->n, sizeof *att.pos, cmp_i32);
                put_list(out, "attended", att.pos, a->n);
            }
            fputs("}\n", out);
        }
    free(all.pos);
    free(host.pos);
    free(att.pos);
    if (!rc && (fflush(out) || ferror(out))) rc = ERR("dump-kept: write failed (disk full?)");
    return rc;
}

void kvb_kept_free(kvb_kept *k, kvb_ctx *c) {
    if (!k) return;
    if (c && c->on_visible_user == k) {
        c->on_visible = NULL;
        c->on_visible_user = NULL;
    }
    for (int i = 0; i < k->n_layer * k->n_head_kv; i++) free(k->attended[i].pos);
    free(k->attended);
    free(k);
}
