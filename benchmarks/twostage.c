/* twostage.c — 2StageRetr (OmniKV, papers/004 appendix A). Follows antgroup/OmniKV
 * tiny_runs/make_2_stage_questions.py (make_one: dict {i: colour} for i < n as a Python repr, target
 * key uniform in [0, n-1], a uniform in [0, target], b = target - a; make_dataset: sizes cycling over
 * [40, 50, 60, 70, 80, 90, 100, 140, 180, 200]) and benchmark/long_bench/cot_pred.py (greedy, 200 new
 * tokens; CoT: the llama_cot_2stage chat template's system message and assistant prefill; direct: the
 * "MUST first output ..." sentence replaced and the assistant turn prefilled with "The equation result
 * should be used as a key ..."; correct = any answer is a case-insensitive substring of the output).
 * Choices where the sources are silent: our own PRNG (splitmix64) instead of Python's random, so the
 * file is not reproduced byte for byte, only its recipe; other (min_pairs, max_pairs) than (40, 200)
 * cycle over 10 sizes min + round((max - min) * k / 9); both variants use the chat template (the direct
 * prefill only exists inside it); the system messages keep the templates' exact text ("You are a
 * helpful assistant. " with its trailing space for CoT); qtype = "pairs=<n>". */
#include "benchmarks/loaders.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/jsonl.h"

#define TWOSTAGE_MAX_PAIRS 10000
#define TWOSTAGE_MAX_NEW_TOKENS 200

static const char *const COLORS[] = {"red",   "green",  "blue",  "yellow", "orange",  "purple", "pink", "brown",
                                     "black", "white",  "gray",  "cyan",   "magenta", "indigo", "violet", "beige",
                                     "maroon", "navy",  "olive", "teal",   "lime",    "silver", "gold"};
#define N_COLORS (sizeof COLORS / sizeof *COLORS)

static const char INTRO[] =
    "Let's play a game. You have a dict and a mathematical addition equation. The keys of a dictionary can be any "
    "number. You need to find the corresponding key value in the dictionary after performing the addition and "
    "output the value corresponding to that key.";
static const char COT_SENTENCE[] =
    "MUST first output the result of the addition, and then answer the corresponding value based on the result.";
static const char DIRECT_SENTENCE[] = "Directly answer the corresponding color based on the equation result.";
static const char COT_PREFILL[] =
    "First, for a precise answer, we can break down this multi-hop question into two to four sub-questions, as "
    "follows:";
static const char DIRECT_PREFILL[] =
    "The equation result should be used as a key to find the value in the dictionary.\nThen, i will directly give "
    "the color. The corresponding color is";
static const char COT_SYSTEM[] = "You are a helpful assistant. ";
static const char DIRECT_SYSTEM[] = "You are a helpful assistant.";

/* s with the first occurrence of from replaced by to (Python's str.replace replaces all; the sentence
 * occurs once); a copy of s when from is absent. NULL on OOM. */
static char *replace_once(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    kvb_sb b = {0};
    if (!at) {
        kvb_sb_adds(&b, s);
    } else {
        kvb_sb_add(&b, s, (size_t)(at - s));
        kvb_sb_adds(&b, to);
        kvb_sb_adds(&b, at + strlen(from));
    }
    return kvb_sb_take(&b);
}

int twostage_set_variant(kvb_sample *s, int cot) {
    char *p = s->prompt ? replace_once(s->prompt, cot ? DIRECT_SENTENCE : COT_SENTENCE,
                                       cot ? COT_SENTENCE : DIRECT_SENTENCE)
                        : NULL;
    char *pre = kvb_strdup(cot ? COT_PREFILL : DIRECT_PREFILL), *sys = kvb_strdup(cot ? COT_SYSTEM : DIRECT_SYSTEM);
    if ((s->prompt && !p) || !pre || !sys) {
        free(p);
        free(pre);
        free(sys);
        return -1;
    }
    if (p) {
        free(s->prompt);
        s->prompt = p;
    }
    free(s->prefill);
    free(s->system);
    s->prefill = pre;
    s->system = sys;
    return 0;
}

static void dict_sizes(int min_pairs, int max_pairs, int sizes[10]) {
    static const int omnikv[10] = {40, 50, 60, 70, 80, 90, 100, 140, 180, 200};
    for (int k = 0; k < 10; k++)
        sizes[k] = min_pairs == 40 && max_pairs == 200 ? omnikv[k]
                                                       : min_pairs + ((max_pairs - min_pairs) * 2 * k + 9) / 18;
}

/* make_one(n): the CoT prompt and the answer colour. */
static char *make_prompt(uint64_t *rng, int n, const char **answer, int *target_key) {
    kvb_sb b = {0};
    const char *target_color = NULL;
    int target = (int)kvb_rng_below(rng, (uint64_t)n);
    int a = (int)kvb_rng_below(rng, (uint64_t)target + 1), c = target - a;
    kvb_sb_adds(&b, INTRO);
    kvb_sb_adds(&b, " The Dict is {");
    for (int k = 0; k < n; k++) {
        const char *color = COLORS[kvb_rng_below(rng, N_COLORS)];
        if (k == target) target_color = color;
        kvb_sb_addf(&b, "%s%d: '%s'", k ? ", " : "", k, color);
    }
    kvb_sb_addf(&b, "}\nThe equation is %d + %d = ?\n%s", a, c, COT_SENTENCE);
    *answer = target_color;
    *target_key = target;
    return kvb_sb_take(&b);
}

static int common_fields(kvb_sample *s, const char *id, int cot) {
    s->id = kvb_strdup(id);
    s->task = kvb_strdup("2stage");
    s->max_new_tokens = TWOSTAGE_MAX_NEW_TOKENS;
    s->use_chat = 1;
    return !s->id || !s->task || twostage_set_variant(s, cot) ? -1 : 0;
}

static int generate_one(uint64_t *rng, int i, int n_pairs, int cot, kvb_samples *out) {
    kvb_sample s;
    kvb_sample_init(&s);
    const char *answer;
    int key;
    char id[32], qtype[32];
    snprintf(id, sizeof id, "%d", i);
    snprintf(qtype, sizeof qtype, "pairs=%d", n_pairs);
    s.prompt = make_prompt(rng, n_pairs, &answer, &key);
    s.qtype = kvb_strdup(qtype);
    if (!s.prompt || !s.qtype || kvb_sample_add_answer(&s, answer) || common_fields(&s, id, cot)) {
        kvb_sample_free(&s);
        return -1;
    }
    return kvb_samples_push(out, &s);
}

int twostage_generate(uint64_t seed, int n_samples, int min_pairs, int max_pairs, int cot, kvb_samples *out,
                      char *err, size_t err_len) {
    if (n_samples < 0 || min_pairs < 1 || max_pairs < min_pairs || max_pairs > TWOSTAGE_MAX_PAIRS) {
        kvb_seterr(err, err_len, "2stage: need n_samples >= 0 and 1 <= min_pairs <= max_pairs <= %d (got %d, %d, %d)",
                   TWOSTAGE_MAX_PAIRS, n_samples, min_pairs, max_pairs);
        return -1;
    }
    int sizes[10], n0 = out->n;
    dict_sizes(min_pairs, max_pairs, sizes);
    uint64_t rng = seed;
    for (int i = 0; i < n_samples; i++) {
        if (generate_one(&rng, i, sizes[i % 10], cot, out)) {
            kvb_samples_truncate(out, n0);
            kvb_seterr(err, err_len, "2stage: out of memory");
            return -1;
        }
    }
    return 0;
}

static int all_strings(const cJSON *arr) {
    const cJSON *it;
    if (!cJSON_IsArray(arr) || !cJSON_GetArraySize(arr)) return 0;
    cJSON_ArrayForEach(it, arr)
        if (!cJSON_IsString(it)) return 0;
    return 1;
}

static int load_record(const cJSON *rec, long line, kvb_samples *out) {
    kvb_sample s;
    kvb_sample_init(&s);
    char id[32];
    const cJSON *it;
    snprintf(id, sizeof id, "%ld", line);
    s.prompt = kvb_strdup(kvb_json_get(rec, "prompt")->valuestring);
    int rc = !s.prompt || common_fields(&s, id, 1);
    cJSON_ArrayForEach(it, kvb_json_get(rec, "answers")) rc = rc || kvb_sample_add_answer(&s, it->valuestring);
    if (rc) {
        kvb_sample_free(&s);
        return -1;
    }
    return kvb_samples_push(out, &s);
}

int twostage_load(const char *path, int limit, kvb_samples *out, char *err, size_t err_len) {
    kvb_jsonl r;
    int n0 = out->n, got = 0, rc = kvb_jsonl_open(&r, path, err, err_len);
    cJSON *rec;
    while (rc == 0 && (limit <= 0 || got < limit)) {
        int st = kvb_jsonl_next(&r, &rec, err, err_len);
        if (st <= 0) {
            rc = st;
            break;
        }
        const char *bad = !cJSON_IsObject(rec)                               ? "the record is not a JSON object"
                        : !cJSON_IsString(kvb_json_get(rec, "prompt"))       ? "'prompt' is missing or not a string"
                        : !all_strings(kvb_json_get(rec, "answers"))         ? "'answers' is not a list of strings"
                        : load_record(rec, r.lineno, out) ? "out of memory" : NULL;
        cJSON_Delete(rec);
        if (bad) {
            kvb_seterr(err, err_len, "%s:%ld: %s", path, r.lineno, bad);
            rc = -1;
        }
        got++;
    }
    kvb_jsonl_close(&r);
    if (rc) kvb_samples_truncate(out, n0);
    return rc ? -1 : 0;
}
