/* test_ruler.c — RULER generators and scorers (benchmarks/ruler.h).
 * Scorers: against tests/fixtures/ruler/scores.json, which RULER's own string_match_all / string_match_part and
 * postprocess_pred computed (scripts/ruler_ref.py). Generators: seeded determinism, the needle at the recorded
 * depth, lengths within 1% of the target in the default model's tokens, and the prompt text equal to RULER's
 * templates (scripts/data/synthetic/constants.py, spelled out here literally, with niah.py's singular variant).
 * Word lists: the committed subset of wonderwords (tests/fixtures/ruler/words, made by scripts/ruler_ref.py);
 * essays: ../shared/data/niah/PaulGrahamEssays (the essay tasks are skipped with one line when a fresh clone has
 * nothing beside it, a failure in CI; the others run). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/ruler.h"
#include "benchmarks/prompt.h"
#include "engine/model.h"

#define ESSAYS "../shared/data/niah/PaulGrahamEssays"
#define WORDS "tests/fixtures/ruler/words"

static char err[1024];
static kvb_model *model;

static ruler_opts opts(const char *task, int length, int n, uint64_t seed) {
    ruler_opts o = {task, length, n, seed, ESSAYS, WORDS, NULL, kvb_count_tokens, model, 0};
    return o;
}

static int starts_with(const char *s, const char *p) { return s && !strncmp(s, p, strlen(p)); }

/* 1 when task can run here: its essay haystack, if it has one, is beside the checkout (see UTIL_SHARED_DATA) */
#define RUNNABLE(task) \
    (!(ruler_task_needs(task) & RULER_NEEDS_ESSAY) || UTIL_SHARED_DATA("niah/PaulGrahamEssays", NULL, 0))

/* ---- scorers ---- */

static void test_scorers_equal_official_python(void) {
    char *text = util_read_file("tests/fixtures/ruler/scores.json", NULL);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(j != NULL);
    const cJSON *cases = cJSON_GetObjectItem(j, "cases"), *c;
    CU_ASSERT_FATAL(cJSON_GetArraySize(cases) >= 20);
    int n = cJSON_GetArraySize(cases);
    double *all = calloc((size_t)n, sizeof *all), *part = calloc((size_t)n, sizeof *part);
    int i = 0;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *refs = cJSON_GetObjectItem(c, "refs"), *r;
        const char *rv[16];
        int nr = 0;
        cJSON_ArrayForEach(r, refs) rv[nr++] = r->valuestring;
        char *p = strdup(cJSON_GetObjectItem(c, "pred")->valuestring);
        ruler_postprocess(p);
        CU_ASSERT_STRING_EQUAL(p, cJSON_GetObjectItem(c, "post")->valuestring);
        all[i] = ruler_match_all(p, rv, nr);
        part[i] = ruler_match_part(p, rv, nr);
        CU_ASSERT_DOUBLE_EQUAL(round(all[i] * 10000) / 100, cJSON_GetObjectItem(c, "string_match_all")->valuedouble, 1e-9);
        CU_ASSERT_DOUBLE_EQUAL(round(part[i] * 10000) / 100, cJSON_GetObjectItem(c, "string_match_part")->valuedouble, 1e-9);
        /* ruler_score = postprocess + the task's metric */
        double s;
        CU_ASSERT(ruler_score("niah_single_1", cJSON_GetObjectItem(c, "pred")->valuestring, rv, nr, &s) == 0 && s == all[i]);
        CU_ASSERT(ruler_score("qa_2", cJSON_GetObjectItem(c, "pred")->valuestring, rv, nr, &s) == 0 && s == part[i]);
        free(p);
        i++;
    }
    const cJSON *batches = cJSON_GetObjectItem(j, "batches"), *b;
    CU_ASSERT(cJSON_GetArraySize(batches) >= 4);
    cJSON_ArrayForEach(b, batches) { /* RULER's task score: 100 x mean, rounded to 2 decimals */
        int first = cJSON_GetObjectItem(b, "first")->valueint, k = cJSON_GetObjectItem(b, "n")->valueint;
        double sa = 0, sp = 0;
        for (int q = first; q < first + k; q++) sa += all[q], sp += part[q];
        CU_ASSERT_DOUBLE_EQUAL(round(sa / k * 100 * 100) / 100, cJSON_GetObjectItem(b, "string_match_all")->valuedouble, 1e-9);
        CU_ASSERT_DOUBLE_EQUAL(round(sp / k * 100 * 100) / 100, cJSON_GetObjectItem(b, "string_match_part")->valuedouble, 1e-9);
    }
    CU_ASSERT_STRING_EQUAL(ruler_metric_name("qa_1"), "string_match_part");
    CU_ASSERT_STRING_EQUAL(ruler_metric_name("cwe"), "string_match_all");
    CU_ASSERT_PTR_NULL(ruler_metric_name("niah"));
    free(all), free(part);
    cJSON_Delete(j);
}

/* ---- generators ---- */

static void test_every_synthetic_task_is_seeded_and_within_1_percent_of_4096_tokens(void) {
    CU_ASSERT_FATAL(model != NULL);
    for (int t = 0; t < 11; t++) {
        const char *task = ruler_task_name(t);
        if (!RUNNABLE(task)) continue;
        kvb_samples a = {0}, b = {0}, c = {0};
        ruler_opts o = opts(task, 4096, 2, 7);
        int rc = ruler_generate(&o, &a, err, sizeof err);
        if (rc) fprintf(stderr, "%s: %s\n", task, err);
        CU_ASSERT_FATAL(rc == 0);
        CU_ASSERT_FATAL(a.n == 2);
        o.n_samples = 1;
        CU_ASSERT_FATAL(ruler_generate(&o, &b, err, sizeof err) == 0);
        o.seed = 8;
        CU_ASSERT_FATAL(ruler_generate(&o, &c, err, sizeof err) == 0);
        CU_ASSERT_STRING_EQUAL(a.v[0].prompt, b.v[0].prompt); /* same seed, same sample */
        CU_ASSERT(strcmp(a.v[0].prompt, c.v[0].prompt) != 0);  /* another seed, another sample */
        CU_ASSERT(strcmp(a.v[0].prompt, a.v[1].prompt) != 0);  /* samples differ */
        for (int i = 0; i < a.n; i++) {
            const kvb_sample *s = &a.v[i];
            /* RULER's length: input + answer prefix + tokens_to_generate <= target, and here within 1% */
            /* niah_multikey_3's haystack unit is a whole UUID needle line (~55 tokens, 1.3% of 4096): one unit */
            double tol = !strcmp(task, "niah_multikey_3") ? 0.02 : 0.01;
            CU_ASSERT(s->length <= 4096);
            CU_ASSERT(s->length >= 4096 * (1 - tol));
            if (s->length > 4096 || s->length < 4096 * (1 - tol)) fprintf(stderr, "%s #%d: %lld tokens\n", task, i, (long long)s->length);
            CU_ASSERT(s->n_answers >= 1);
            CU_ASSERT(s->use_chat == 1 && s->prefill && s->context && s->question);
            CU_ASSERT(strstr(s->prompt, s->context) != NULL);
            CU_ASSERT_STRING_EQUAL(s->task, task);
        }
        kvb_samples_free(&a), kvb_samples_free(&b), kvb_samples_free(&c);
    }
}

/* Finds "One of the special magic <v> for <key> is: <value>." after from; copies key; returns the match. */
__attribute__((noinline)) static const char *find_needle(const char *from, const char *v, char *key, size_t cap) {
    char head[64];
    snprintf(head, sizeof head, "One of the special magic %s for ", v);
    const char *p = strstr(from, head);
    if (!p) return NULL;
    const char *k = p + strlen(head), *e = strstr(k, " is: ");
    if (!e || (size_t)(e - k) >= cap) return NULL;
    memcpy(key, k, (size_t)(e - k));
    key[e - k] = 0;
    return p;
}

static void test_niah_single_templates_and_needle_equal_rulers(void) {
    CU_ASSERT_FATAL(model != NULL);
    const char *tasks[3] = {"niah_single_1", "niah_single_2", "niah_single_3"}, *v[3] = {"numbers", "numbers", "uuids"},
               *vs[3] = {"number", "number", "uuid"};
    for (int t = 0; t < 3; t++) {
        if (!RUNNABLE(tasks[t])) continue;
        kvb_samples a = {0};
        ruler_opts o = opts(tasks[t], 2048, 3, 11);
        CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
        for (int i = 0; i < a.n; i++) {
            const kvb_sample *s = &a.v[i];
            char key[128], key2[128], exp[512];
            const char *p = find_needle(s->context, v[t], key, sizeof key);
            CU_ASSERT_FATAL(p != NULL);
            CU_ASSERT(find_needle(p + 1, v[t], key2, sizeof key2) == NULL); /* exactly one needle */
            snprintf(exp, sizeof exp, "One of the special magic %s for %s is: %s.", v[t], key, s->answers[0]);
            CU_ASSERT(starts_with(p, exp));
            CU_ASSERT(s->n_answers == 1);
            size_t al = strlen(s->answers[0]);
            CU_ASSERT(t == 2 ? al == 36 && s->answers[0][14] == '4' : al == 7 && s->answers[0][0] != '0');
            /* constants.py's niah template, with niah.py's singular replacements */
            snprintf(exp, sizeof exp, "A special magic %s is hidden within the following text. Make sure to memorize it. "
                     "I will quiz you about the %s afterwards.\n", vs[t], vs[t]);
            CU_ASSERT(starts_with(s->prompt, exp));
            CU_ASSERT(!strncmp(s->prompt + strlen(exp), s->context, strlen(s->context)));
            snprintf(exp, sizeof exp, "\nWhat is the special magic %s for %s mentioned in the provided text?", vs[t], key);
            CU_ASSERT_STRING_EQUAL(s->question, exp);
            CU_ASSERT_STRING_EQUAL(s->prompt + strlen(s->prompt) - strlen(exp), exp);
            snprintf(exp, sizeof exp, " The special magic %s for %s mentioned in the provided text is", vs[t], key);
            CU_ASSERT_STRING_EQUAL(s->prefill, exp);
            CU_ASSERT(s->max_new_tokens == 128);
            /* the needle at the recorded depth: noise = sentence lines before it; essay = share of the text */
            if (t == 0) {
                int lines = 0;
                for (const char *q = s->context; q < p; q++) lines += *q == '\n';
                int total = 1;
                for (const char *q = s->context; *q; q++) total += *q == '\n';
                CU_ASSERT_DOUBLE_EQUAL(s->depth, 100.0 * lines / (total - 1), 1e-9);
                CU_ASSERT(starts_with(s->context, "The grass is green.") || starts_with(s->context, "One of"));
            } else { /* essay: niah.py puts the needle after int(sentences * depth / 100) sentences */
                int before = 0, ends = 0;
                const char *needle_end = strchr(p, '.');
                for (const char *q = s->context; *q; q++) {
                    if (q >= p && q <= needle_end) continue; /* the needle's own sentence */
                    if (*q != '.' && *q != '?' && *q != '!') continue;
                    const char *r = q + 1;
                    while (*r == '"' || *r == '\'' || *r == ')' || *r == ']') r++;
                    if (*r == ' ' && r[1] && r + 1 != p) ends++, before += q < p;
                }
                /* a needle inside the text hides the boundary it sits on (ends + 2 sentences); at either end (depth 0:
                 * " " + needle, as " ".join(["", needle, ...]) gives; depth 100: appended) it hides none */
                int at_start = p <= s->context + 1, at_end = needle_end[strspn(needle_end + 1, " ") + 1] == 0;
                int sentences = ends + (at_start || at_end ? 1 : 2), after = at_start ? 0 : before + 1;
                int want = (int)(sentences * (s->depth / 100.0));
                CU_ASSERT(after == want);
                if (after != want) fprintf(stderr, "%s: depth %g: %d sentences, needle after %d\n", tasks[t], s->depth, sentences, after);
            }
        }
        kvb_samples_free(&a);
    }
}

static void test_niah_multi_variants_follow_synthetic_yaml(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_samples a = {0};
    char key[128];
    /* multikey_3: the haystack is distractor needles with UUID keys and values */
    ruler_opts o = opts("niah_multikey_3", 2048, 1, 3);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    int n = 0;
    for (const char *p = a.v[0].context; (p = find_needle(p, "uuids", key, sizeof key)); p++) n++;
    CU_ASSERT(n > 20);
    CU_ASSERT(strstr(a.v[0].context, a.v[0].answers[0]) != NULL);
    kvb_samples_free(&a);
    if (!RUNNABLE("niah_multikey_1")) return; /* the others hide their needles in the essays */
    /* multikey_1: 4 keys in the essay, one asked */
    o = opts("niah_multikey_1", 2048, 1, 3);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    n = 0;
    for (const char *p = a.v[0].context; (p = find_needle(p, "numbers", key, sizeof key)); p++) n++;
    CU_ASSERT(n == 4 && a.v[0].n_answers == 1);
    /* multivalue: one key, 4 values, plural template */
    o = opts("niah_multivalue", 2048, 1, 3);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    CU_ASSERT(a.v[1].n_answers == 4);
    CU_ASSERT(starts_with(a.v[1].prompt, "Some special magic numbers are hidden within the following text. Make sure to "
                                         "memorize it. I will quiz you about the numbers afterwards.\n"));
    CU_ASSERT(starts_with(a.v[1].question, "\nWhat are all the special magic numbers for "));
    CU_ASSERT(strstr(a.v[1].prefill, "mentioned in the provided text are") != NULL);
    /* multiquery: 4 keys asked as "a, b, c, and d" */
    o = opts("niah_multiquery", 2048, 1, 3);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    CU_ASSERT(a.v[2].n_answers == 4);
    int commas = 0;
    for (const char *p = a.v[2].question; *p; p++) commas += *p == ',';
    CU_ASSERT(commas == 3 && strstr(a.v[2].question, ", and ") != NULL);
    kvb_samples_free(&a);
}

static void test_vt_cwe_fwe_templates_equal_rulers(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_samples a = {0};
    ruler_opts o = opts("vt", 2048, 1, 5);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    const kvb_sample *s = &a.v[0];
    char exp[512], var[8];
    CU_ASSERT(s->n_answers == 5);
    /* the chain: VAR A = <value>, then VAR B = VAR A ... in order */
    const char *first = strstr(s->context, "VAR ");
    CU_ASSERT_FATAL(first != NULL);
    snprintf(exp, sizeof exp, "VAR %s = ", s->answers[0]);
    CU_ASSERT(starts_with(first, exp));
    const char *value = first + strlen(exp);
    for (int i = 1; i < 5; i++) {
        snprintf(exp, sizeof exp, "VAR %s = VAR %s \n", s->answers[i], s->answers[i - 1]);
        CU_ASSERT(strstr(s->context, exp) != NULL);
    }
    snprintf(var, sizeof var, "%.5s", value);
    snprintf(exp, sizeof exp, "\nQuestion: Find all variables that are assigned the value %s in the text above.", var);
    CU_ASSERT_STRING_EQUAL(s->question, exp);
    snprintf(exp, sizeof exp, " Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
             "assigned the value %s, they are: ", var);
    CU_ASSERT_STRING_EQUAL(s->prefill, exp);
    /* the in-context example comes first, then the task's own template */
    CU_ASSERT(starts_with(s->prompt, "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"));
    CU_ASSERT(strstr(s->prompt, ", they are: ") != NULL);
    CU_ASSERT(strstr(s->prompt, "\n\nMemorize and track the chain(s) of variable assignment hidden in the following text.\n\n") != NULL);

    o = opts("cwe", 4096, 1, 5);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    s = &a.v[1];
    CU_ASSERT(s->n_answers == 10);
    CU_ASSERT(starts_with(s->prompt, "Below is a numbered list of words. In these words, some appear more often than others. "
                                     "Memorize the ones that appear most often.\n1. "));
    CU_ASSERT_STRING_EQUAL(s->question, "\nQuestion: What are the 10 most common words in the above list?");
    CU_ASSERT_STRING_EQUAL(s->prefill, " Answer: The top 10 words that appear most often in the list are:");
    /* each common word appears 30 times in the list (4096 tokens and up) */
    for (int i = 0; i < s->n_answers; i++) {
        char pat[128];
        int k = 0;
        snprintf(pat, sizeof pat, ". %s ", s->answers[i]);
        for (const char *p = s->context; (p = strstr(p, pat)); p++) k++;
        snprintf(pat, sizeof pat, ". %s", s->answers[i]);
        size_t cl = strlen(s->context), pl = strlen(pat);
        k += cl >= pl && !strcmp(s->context + cl - pl, pat);
        CU_ASSERT(k == 30);
    }

    o = opts("fwe", 2048, 1, 5);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    s = &a.v[2];
    CU_ASSERT(starts_with(s->prompt, "Read the following coded text and track the frequency of each coded word. Find the "
                                     "three most frequently appeared coded words. "));
    CU_ASSERT_STRING_EQUAL(s->question, "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are "
                                        "the three most frequently appeared words in the above coded text?");
    CU_ASSERT_STRING_EQUAL(s->prefill, " Answer: According to the coded text above, the three most frequently appeared words are:");
    CU_ASSERT(s->n_answers == 3);
    /* Zipf counts: '...' most, then the answers in order */
    int cnt[4] = {0};
    const char *w[4] = {"...", s->answers[0], s->answers[1], s->answers[2]};
    for (int i = 0; i < 4; i++)
        for (const char *p = s->context; (p = strstr(p, w[i])); p += strlen(w[i])) cnt[i]++;
    CU_ASSERT(cnt[0] > cnt[1] && cnt[1] > cnt[2] && cnt[2] > cnt[3] && cnt[3] > 0);
    kvb_samples_free(&a);
}

/* this run's scratch folder (mkdtemp in main) */
static char tmp_dir[64] = "/tmp/kvb_test_ruler_XXXXXX";

static const char *write_tmp(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_qa_tasks_read_squad_and_hotpotqa_layouts(void) {
    CU_ASSERT_FATAL(model != NULL);
    /* SQuAD v2 layout: articles -> paragraphs -> qas; the impossible question is skipped */
    const char *squad = "{\"data\": [{\"title\": \"T\", \"paragraphs\": ["
                        "{\"context\": \"The Broncos won Super Bowl 50 in Santa Clara.\", \"qas\": ["
                        "{\"question\": \"Who won Super Bowl 50?\", \"is_impossible\": false, \"answers\": [{\"text\": \"Broncos\"}, {\"text\": \"Denver Broncos\"}]},"
                        "{\"question\": \"Who lost Super Bowl 51?\", \"is_impossible\": true, \"answers\": []}]},"
                        "{\"context\": \"Levi's Stadium is in Santa Clara, California.\", \"qas\": []}]},"
                        "{\"title\": \"U\", \"paragraphs\": [{\"context\": \"Paris is the capital of France.\", \"qas\": ["
                        "{\"question\": \"What is the capital of France?\", \"is_impossible\": false, \"answers\": [{\"text\": \"Paris\"}]}]}]}]}";
    char sp[256];
    snprintf(sp, sizeof sp, "%s", write_tmp("squad.json", squad));
    kvb_samples a = {0};
    ruler_opts o = opts("qa_1", 1024, 3, 1);
    o.qa_path = sp;
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    CU_ASSERT(a.n == 3);
    CU_ASSERT_STRING_EQUAL(a.v[0].question, "\n\nAnswer the question based on the given documents. Only give me the answer "
                                            "and do not output any other words.\n\nQuestion: Who won Super Bowl 50?");
    CU_ASSERT(a.v[0].n_answers == 2 && !strcmp(a.v[0].answers[1], "Denver Broncos"));
    CU_ASSERT_STRING_EQUAL(a.v[1].answers[0], "Paris");
    CU_ASSERT_STRING_EQUAL(a.v[2].answers[0], "Broncos"); /* wraps around the questions */
    CU_ASSERT(starts_with(a.v[0].prompt, "Answer the question based on the given documents. Only give me the answer and do "
                                         "not output any other words.\n\nThe following are given documents.\n\nDocument 1:\n"));
    CU_ASSERT_STRING_EQUAL(a.v[0].prefill, " Answer:");
    CU_ASSERT(a.v[0].max_new_tokens == 32);
    CU_ASSERT(a.v[0].length <= 1024 && a.v[0].length >= 1024 * 0.97);
    CU_ASSERT(strstr(a.v[0].context, "\n\nDocument 2:\n") != NULL);
    kvb_samples_free(&a);
    /* HotpotQA layout: [{"question", "answer", "context": [[title, [sentences]]]}] */
    const char *hotpot = "[{\"_id\": \"a\", \"question\": \"Which city?\", \"answer\": \"Oslo\", \"context\": "
                         "[[\"Oslo\", [\"Oslo is a city.\", \" It is in Norway.\"]], [\"Bergen\", [\"Bergen is wet.\"]]]}]";
    char hp[256];
    snprintf(hp, sizeof hp, "%s", write_tmp("hotpot.json", hotpot));
    o = opts("qa_2", 512, 1, 1);
    o.qa_path = hp;
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    CU_ASSERT(strstr(a.v[0].context, "Oslo\nOslo is a city. It is in Norway.") != NULL);
    CU_ASSERT(strstr(a.v[0].context, "Bergen\nBergen is wet.") != NULL);
    kvb_samples_free(&a);
    /* a file of the wrong layout names itself */
    o = opts("qa_1", 1024, 1, 1);
    o.qa_path = hp;
    CU_ASSERT(ruler_generate(&o, &a, err, sizeof err) == -1 && strstr(err, hp) && a.n == 0);
    remove(sp);
    remove(hp);
}

static void test_missing_inputs_and_bad_arguments_are_one_line_errors(void) {
    kvb_samples a = {0};
    ruler_opts o = opts("niah_single_2", 4096, 1, 1);
    o.words_dir = "/nonexistent/words";
    CU_ASSERT(ruler_generate(&o, &a, err, sizeof err) == -1 && strstr(err, "/nonexistent/words") && !strchr(err, '\n'));
    o = opts("niah_single_2", 4096, 1, 1);
    o.essay_dir = NULL;
    CU_ASSERT(ruler_generate(&o, &a, err, sizeof err) == -1 && strstr(err, "essays"));
    o = opts("qa_1", 4096, 1, 1);
    CU_ASSERT(ruler_generate(&o, &a, err, sizeof err) == -1 && strstr(err, "SQuAD"));
    o = opts("niah_sideways", 4096, 1, 1);
    CU_ASSERT(ruler_generate(&o, &a, err, sizeof err) == -1 && strstr(err, "unknown task"));
    o = opts("niah_single_1", 100, 1, 1); /* a template and 128 tokens to generate cannot fit in 100 */
    CU_ASSERT(ruler_generate(&o, &a, err, sizeof err) == -1 && strstr(err, "too short"));
    /* cwe needs more distinct words than a 20-word list holds */
    char dir[128];
    snprintf(dir, sizeof dir, "%s/words", tmp_dir);
    mkdir(dir, 0700);
    const char *files[3] = {"nounlist.txt", "adjectivelist.txt", "verblist.txt"};
    for (int i = 0; i < 3; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        FILE *f = fopen(p, "w");
        CU_ASSERT_FATAL(f != NULL);
        for (int k = 0; k < 7; k++) fprintf(f, "w%c%d\n", 'a' + i, k);
        fclose(f);
    }
    o = opts("cwe", 4096, 1, 1);
    o.words_dir = dir;
    CU_ASSERT(ruler_generate(&o, &a, err, sizeof err) == -1 && strstr(err, "distinct words"));
    for (int i = 0; i < 3; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        remove(p);
    }
    rmdir(dir);
    CU_ASSERT(a.n == 0);
    CU_ASSERT(ruler_task_needs("qa_2") == RULER_NEEDS_QA && ruler_task_needs("niah_single_1") == RULER_NEEDS_WORDS &&
              ruler_task_needs("fwe") == 0 && ruler_task_needs("x") == -1);
    CU_ASSERT(ruler_task_name(12) && !strcmp(ruler_task_name(12), "qa_2") && !ruler_task_name(13));
}

/* niah_multiquery with its queries posed one at a time: the official sample's haystack and answers, split into one
 * sample per query with the singular template, all of one context group. */
static void test_niah_multiquery_per_query_splits_one_haystack_into_single_questions(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_samples a = {0}, b = {0};
    ruler_opts o = opts("niah_single_1", 2048, 1, 3);
    o.per_query = 1;
    if (!RUNNABLE("niah_multiquery")) { /* without the essays, the refusal */
        CU_ASSERT(ruler_generate(&o, &b, err, sizeof err) == -1 && strstr(err, "niah_multiquery") && b.n == 0);
        return;
    }
    o = opts("niah_multiquery", 2048, 1, 3);
    CU_ASSERT_FATAL(ruler_generate(&o, &a, err, sizeof err) == 0);
    o.per_query = 1;
    CU_ASSERT_FATAL(ruler_generate(&o, &b, err, sizeof err) == 0);
    CU_ASSERT_FATAL(a.n == 1 && b.n == 4);
    for (int q = 0; q < 4; q++) {
        const kvb_sample *s = &b.v[q];
        char id[64];
        snprintf(id, sizeof id, "niah_multiquery_2048_0_q%d", q);
        CU_ASSERT(!strcmp(s->id, id) && s->group && !strcmp(s->group, "niah_multiquery_2048_0"));
        CU_ASSERT(!strcmp(s->context, a.v[0].context));
        CU_ASSERT(s->n_answers == 1 && !strcmp(s->answers[0], a.v[0].answers[q]));
        CU_ASSERT(starts_with(s->prompt, "A special magic number is hidden within the following text."));
        CU_ASSERT(starts_with(s->question, "\nWhat is the special magic number for ") && !strchr(s->question, ','));
        CU_ASSERT(strstr(s->prefill, "mentioned in the provided text is") != NULL);
    }
    CU_ASSERT(strcmp(b.v[0].question, b.v[1].question) != 0);
    o = opts("niah_single_1", 2048, 1, 3);
    o.per_query = 1;
    CU_ASSERT(ruler_generate(&o, &b, err, sizeof err) == -1 && strstr(err, "niah_multiquery") && b.n == 4);
    kvb_samples_free(&a);
    kvb_samples_free(&b);
}

int main(void) {
    char path[1024];
    if (util_default_model(path, sizeof path)) model = kvb_model_load(path, err, sizeof err);
    if (!model) fprintf(stderr, "test_ruler: the default model is missing (scripts/fetch-model.sh): generator tests fail\n");
    if (!mkdtemp(tmp_dir)) {
        perror("test_ruler: scratch folder");
        return 1;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("ruler", NULL, NULL);
    CU_add_test(s, "scorers equal official python", test_scorers_equal_official_python);
    CU_add_test(s, "every synthetic task is seeded and within 1% of 4096 tokens", test_every_synthetic_task_is_seeded_and_within_1_percent_of_4096_tokens);
    CU_add_test(s, "niah single templates and needle equal RULER's", test_niah_single_templates_and_needle_equal_rulers);
    CU_add_test(s, "niah multi variants follow synthetic.yaml", test_niah_multi_variants_follow_synthetic_yaml);
    CU_add_test(s, "niah multiquery per query splits one haystack into single questions",
                test_niah_multiquery_per_query_splits_one_haystack_into_single_questions);
    CU_add_test(s, "vt, cwe, fwe templates equal RULER's", test_vt_cwe_fwe_templates_equal_rulers);
    CU_add_test(s, "qa tasks read SQuAD and HotpotQA layouts", test_qa_tasks_read_squad_and_hotpotqa_layouts);
    CU_add_test(s, "missing inputs and bad arguments are one-line errors", test_missing_inputs_and_bad_arguments_are_one_line_errors);
    int rc = util_run_suites();
    kvb_model_free(model);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp_dir);
    if (system(rm) != 0) fprintf(stderr, "test_ruler: could not remove %s\n", tmp_dir);
    return rc;
}
