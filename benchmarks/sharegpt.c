/* sharegpt.c — ShareGPT multi-round dialogues for round-level methods (Round Attention's evaluation,
 * papers/000 §4: dialogues bucketed by rounds, the last user prompt is q_n). File layout: FastChat's
 * ShareGPT_V3_unfiltered_cleaned_split.json, where split_long_conversation cut each conversation into
 * chunks with id "<orig_id>_<start_message_index>" (BENCHMARKS.md §3).
 * Choices where the sources are silent: chunks are merged by the id before the last '_' when what
 * follows it is all digits, in increasing index (file order breaks ties), in order of the
 * conversation's first appearance; every leading assistant message is dropped (a chunk that starts
 * mid-conversation with "gpt"); "system" is kept only as the first message, later ones are dropped;
 * roles: human|user -> user, gpt|assistant|chatgpt|bard|bing -> assistant, anything else is an error;
 * consecutive messages of one side get an empty partner (kvb_sample_add_message); the final round is
 * the last one whose user message is not empty; answers = [its recorded reply] when not empty;
 * max_new_tokens = 512 (the paper gives none); buckets are half-open: [0,10) mini, [10,30) small,
 * [30,50) medium, >= 50 large (the paper's "50-100"; longer dialogues stay "large"). */
#include "benchmarks/loaders.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"

#define SHAREGPT_MAX_NEW_TOKENS 512

const char *sharegpt_bucket(int n_rounds) {
    return n_rounds < 10 ? "mini" : n_rounds < 30 ? "small" : n_rounds < 50 ? "medium" : "large";
}

typedef struct {
    long idx, order;
    cJSON *conv; /* the chunk's "conversations", detached from its record */
} sg_chunk;

typedef struct {
    char *prefix;
    sg_chunk *chunks;
    int n, cap;
} sg_group;

typedef struct {
    sg_group *g;
    int n, cap;
    int *slots; /* open addressing: group index + 1, 0 = empty */
    size_t n_slots;
} sg_groups;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void groups_free(sg_groups *gs) {
    for (int i = 0; i < gs->n; i++) {
        for (int k = 0; k < gs->g[i].n; k++) cJSON_Delete(gs->g[i].chunks[k].conv);
        free(gs->g[i].chunks);
        free(gs->g[i].prefix);
    }
    free(gs->g);
    free(gs->slots);
}

/* Slot of prefix: its group's slot, or the empty slot where it would go. */
static size_t find_slot(const sg_groups *gs, const char *prefix) {
    size_t mask = gs->n_slots - 1, i = hash_str(prefix) & mask;
    while (gs->slots[i] && strcmp(gs->g[gs->slots[i] - 1].prefix, prefix)) i = (i + 1) & mask;
    return i;
}

static int rehash(sg_groups *gs) {
    size_t n = gs->n_slots ? gs->n_slots * 2 : 1024;
    int *old = gs->slots;
    size_t old_n = gs->n_slots;
    gs->slots = calloc(n, sizeof *gs->slots);
    if (!gs->slots) {
        gs->slots = old;
        return -1;
    }
    gs->n_slots = n;
    for (size_t i = 0; i < old_n; i++)
        if (old[i]) gs->slots[find_slot(gs, gs->g[old[i] - 1].prefix)] = old[i];
    free(old);
    return 0;
}

/* The group of prefix, created when new and allowed (limit); NULL if skipped; *oom set on failure. */
static sg_group *group_for(sg_groups *gs, const char *prefix, int limit, int *oom) {
    if ((size_t)gs->n * 2 >= gs->n_slots && rehash(gs)) goto fail;
    size_t slot = find_slot(gs, prefix);
    if (gs->slots[slot]) return &gs->g[gs->slots[slot] - 1];
    if (limit > 0 && gs->n >= limit) return NULL;
    if (gs->n == gs->cap) {
        int cap = gs->cap ? gs->cap * 2 : 64;
        sg_group *ng = realloc(gs->g, (size_t)cap * sizeof *ng);
        if (!ng) goto fail;
        gs->g = ng;
        gs->cap = cap;
    }
    sg_group g = {kvb_strdup(prefix), NULL, 0, 0};
    if (!g.prefix) goto fail;
    gs->g[gs->n++] = g;
    gs->slots[slot] = gs->n;
    return &gs->g[gs->n - 1];
fail:
    *oom = 1;
    return NULL;
}

static int group_add(sg_group *g, long idx, long order, cJSON *conv) {
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 4;
        sg_chunk *nc = realloc(g->chunks, (size_t)cap * sizeof *nc);
        if (!nc) return -1;
        g->chunks = nc;
        g->cap = cap;
    }
    g->chunks[g->n++] = (sg_chunk){idx, order, conv};
    return 0;
}

/* Splits "abc_12" in place into prefix "abc" and 12; other ids are their own prefix, index 0. */
static long split_id(char *id) {
    char *us = strrchr(id, '_');
    size_t digits = us ? strspn(us + 1, "0123456789") : 0;
    if (!us || digits == 0 || digits > 9 || us[1 + digits]) return 0;
    *us = 0;
    return strtol(us + 1, NULL, 10);
}

static const char *map_role(const char *from) {
    static const char *const map[][2] = {{"human", "user"},         {"user", "user"},     {"gpt", "assistant"},
                                         {"assistant", "assistant"}, {"chatgpt", "assistant"},
                                         {"bard", "assistant"},      {"bing", "assistant"}, {"system", "system"}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(from, map[i][0])) return map[i][1];
    return NULL;
}

static const char *check_entry(const cJSON *e) {
    const cJSON *m;
    if (!cJSON_IsObject(e)) return "the entry is not a JSON object";
    if (!cJSON_IsString(kvb_json_get(e, "id"))) return "'id' is missing or not a string";
    if (!cJSON_IsArray(kvb_json_get(e, "conversations"))) return "'conversations' is missing or not a list";
    cJSON_ArrayForEach(m, kvb_json_get(e, "conversations")) {
        const cJSON *from = kvb_json_get(m, "from");
        if (!cJSON_IsObject(m)) return "a message is not an object";
        if (!cJSON_IsString(from)) return "a message has no string 'from'";
        if (!map_role(from->valuestring)) return "a message has an unknown 'from' (human|gpt|system expected)";
        if (!cJSON_IsString(kvb_json_get(m, "value"))) return "a message has no string 'value'";
    }
    return NULL;
}

/* Reads every entry into groups (only the first `limit` conversations are kept). */
static int collect(kvb_jarray *a, sg_groups *gs, int limit, char *err, size_t err_len) {
    cJSON *e;
    long line, order = 0;
    int rc;
    while ((rc = kvb_jarray_next(a, &e, &line, err, err_len)) == 1) {
        const char *bad = check_entry(e);
        int oom = 0;
        sg_group *g = NULL;
        if (!bad) {
            char *prefix = kvb_json_get(e, "id")->valuestring; /* cut in place: e is ours */
            long idx = split_id(prefix);
            g = group_for(gs, prefix, limit, &oom);
            cJSON *conv = g ? cJSON_DetachItemViaPointer(e, kvb_json_get(e, "conversations")) : NULL;
            if (g && group_add(g, idx, order++, conv)) {
                cJSON_Delete(conv);
                oom = 1;
            }
        }
        cJSON_Delete(e);
        if (bad || oom) {
            kvb_seterr(err, err_len, "%s:%ld: %s", a->path, line, bad ? bad : "out of memory");
            return -1;
        }
    }
    return rc;
}

static int cmp_chunk(const void *a, const void *b) {
    const sg_chunk *x = a, *y = b;
    if (x->idx != y->idx) return x->idx < y->idx ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* All messages of the conversation as alternating rounds (leading assistant messages dropped). */
static int build_turns(kvb_sample *s, sg_group *g) {
    qsort(g->chunks, (size_t)g->n, sizeof *g->chunks, cmp_chunk);
    int seen_user = 0;
    for (int k = 0; k < g->n; k++) {
        const cJSON *m;
        cJSON_ArrayForEach(m, g->chunks[k].conv) {
            const char *role = map_role(kvb_json_get(m, "from")->valuestring);
            seen_user |= !strcmp(role, "user");
            if (!seen_user && !strcmp(role, "assistant")) continue;
            if (kvb_sample_add_message(s, role, kvb_json_get(m, "value")->valuestring, NULL) < 0) return -1;
        }
    }
    return kvb_sample_close_rounds(s);
}

/* Moves the last round with a non-empty user message out of the turns into question/answers;
 * 1 if there is none (the conversation is skipped). */
static int take_last_round(kvb_sample *s) {
    int u = s->n_turns - 2;
    while (u >= 0 && (strcmp(s->turns[u].role, "user") || !s->turns[u].content[0])) u--;
    if (u < 0) return 1;
    s->question = s->turns[u].content;
    s->turns[u].content = NULL;
    if (s->turns[u + 1].content[0] && kvb_sample_add_answer(s, s->turns[u + 1].content)) return -1;
    for (int k = u; k < s->n_turns; k++) {
        free(s->turns[k].role);
        free(s->turns[k].content);
        free(s->turns[k].date);
    }
    s->n_turns = u;
    return 0;
}

static int emit(sg_group *g, kvb_samples *out) {
    kvb_sample s;
    kvb_sample_init(&s);
    int rc = build_turns(&s, g);
    if (rc == 0) rc = take_last_round(&s);
    if (rc == 0) {
        s.id = kvb_strdup(g->prefix);
        s.task = kvb_strdup("sharegpt");
        s.qtype = kvb_strdup(sharegpt_bucket(kvb_sample_n_rounds(&s) + 1));
        s.max_new_tokens = SHAREGPT_MAX_NEW_TOKENS;
        s.use_chat = 1;
        if (!s.id || !s.task || !s.qtype) rc = -1;
    }
    if (rc) {
        kvb_sample_free(&s);
        return rc < 0 ? -1 : 0;
    }
    return kvb_samples_push(out, &s);
}

int sharegpt_load(const char *path, int limit, kvb_samples *out, char *err, size_t err_len) {
    size_t len;
    char *buf = kvb_read_file(path, &len, err, err_len);
    if (!buf) return -1;
    int n0 = out->n, rc = -1;
    sg_groups gs = {0};
    kvb_jarray a;
    if (kvb_jarray_begin(&a, path, buf, len, err, err_len) == 0) rc = collect(&a, &gs, limit, err, err_len);
    free(buf);
    for (int i = 0; rc == 0 && i < gs.n; i++) {
        if (emit(&gs.g[i], out)) {
            kvb_seterr(err, err_len, "%s: out of memory", path);
            rc = -1;
        }
    }
    groups_free(&gs);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}
