/* test_hidden.c — query-agnostic evaluation (benchmarks/hidden.h) on the default model, through the steps the
 * runner takes (benchmarks/runner.c run_prefill / run_cell): build the prompt, prefill (the context only when
 * the question is hidden) with a shared-prefill recorder, fork, let SnapKV adopt the share and compress, then
 * read the positions it kept. With the question hidden the kept set cannot depend on the question; with it
 * visible SnapKV's observation window holds the question and the kept set follows it. Several questions of one
 * context group (benchmarks/shared_prefill.h) share one prefill of the context and one kept set, and `kvbench run`
 * records each question, the first with the context's prefill, the others marked reused. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util_common.h"
#include "benchmarks/hidden.h"
#include "benchmarks/loaders.h"
#include "benchmarks/shared_prefill.h"
#include "engine/kvcache.h"
#include "methods/method.h"

static char err[1024];
static kvb_model *model;
static const char *bin; /* KVB_BIN: the kvbench executable */

/* multifieldqa_en's entries of LongBench's dataset2prompt.json / dataset2maxlen.json (THUDM/LongBench
 * LongBench/config), spelled out: the records are written here, and so is their config. */
#define LB_PROMPTS \
    "{\"multifieldqa_en\": \"Read the following text and answer briefly.\\n\\n{context}\\n\\nNow, answer the " \
    "following question based on the above text, only give me the answer and do not output any other " \
    "words.\\n\\nQuestion: {input}\\nAnswer:\"}\n"
#define LB_MAXLEN "{\"multifieldqa_en\": 64}\n"

static void make_sample(kvb_sample *s, const char *question) {
    kvb_sample_init(s);
    char *filler = niah_filler_text(300);
    kvb_sb c = {0};
    kvb_sb_adds(&c, filler);
    kvb_sb_adds(&c, " The secret code of the blue box is 4821. The secret code of the red box is 9377. ");
    kvb_sb_adds(&c, filler);
    free(filler);
    s->context = kvb_sb_take(&c);
    s->question = strdup(question);
    kvb_sb p = {0};
    kvb_sb_addf(&p, "Read the text and answer.\n%s\n%s", s->context, question);
    s->prompt = kvb_sb_take(&p);
    s->id = strdup("t");
    s->use_chat = 1;
    s->prefill = strdup(" The code is");
}

/* The positions c's cache keeps: per (layer, head) the sorted positions, concatenated; *n_out = total. */
static int32_t *kept_of(const kvb_ctx *c, int64_t *n_out) {
    const kvb_config *cfg = &model->cfg;
    int64_t total = 0, cap = 0;
    int32_t *v = NULL;
    for (int l = 0; l < cfg->n_layer; l++)
        for (int h = 0; h < cfg->n_head_kv; h++) {
            kvc_view w = kvc_head_view(c->kv, l, h);
            if (total + w.n > cap) {
                cap = (total + w.n) * 2;
                v = realloc(v, (size_t)cap * sizeof *v);
            }
            int32_t *dst = v + total;
            memcpy(dst, w.pos, (size_t)w.n * sizeof *dst);
            kvb_sort_i32(dst, w.n);
            total += w.n;
        }
    *n_out = total;
    return v;
}

/* SnapKV at 30% created on c and adopted from share (the runner's order). */
static kvb_method *snapkv30_adopted(kvb_ctx *c, kvb_share *share) {
    kvb_budget b;
    CU_ASSERT_FATAL(kvb_budget_parse("30%", &b, err, sizeof err) == 0);
    kvb_opts o = {0};
    kvb_method *m = kvb_method_create("snapkv", c, &b, &o, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT_FATAL(kvb_method_adopt(m, c, share, err, sizeof err) == 0);
    return m;
}

/* Positions SnapKV keeps at 30% after a shared prefill of ids[0, n_prefill) (the rest prefilled after
 * compression, as run_cell does when the question is hidden); per (layer, head) the sorted positions,
 * concatenated. *n_out = total. */
static int32_t *kept_positions(const kvb_prompt *p, int64_t n_prefill, int64_t *n_out) {
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = (int)p->n + 8;
    cp.n_threads = 1;
    kvb_ctx *base = kvb_ctx_create(model, &cp, err, sizeof err);
    CU_ASSERT_FATAL(base != NULL);
    kvb_share *share = kvb_share_create(base, 32, 0, err, sizeof err);
    CU_ASSERT_FATAL(share != NULL);
    CU_ASSERT_FATAL(kvb_forward(base, p->ids, n_prefill, err, sizeof err) == 0);
    kvb_ctx *c = kvb_ctx_fork(base, 32, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_method *m = snapkv30_adopted(c, share);
    int64_t total;
    int32_t *v = kept_of(c, &total);
    /* the question after compression, as run_cell prefills it: the cache grows by exactly its tokens */
    if (n_prefill < p->n) {
        int64_t before = kvc_n(c->kv, 0, 0);
        CU_ASSERT(kvb_forward(c, p->ids + n_prefill, p->n - n_prefill, err, sizeof err) == 0);
        CU_ASSERT(kvc_n(c->kv, 0, 0) == before + (p->n - n_prefill));
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_share_free(share, base);
    kvb_ctx_free(base);
    *n_out = total;
    return v;
}

static void test_hidden_question_leaves_snapkv_kept_set_unchanged_visible_does_not(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_sample a, b;
    make_sample(&a, "What is the secret code of the blue box?");
    make_sample(&b, "Which number is the secret code of the red box? Answer with the number only.");
    kvb_prompt pa, pb;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &a, 8000, 512, &pa, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_prompt_build(model, &b, 8000, 512, &pb, err, sizeof err) == 0);
    int64_t sa, sb;
    CU_ASSERT_FATAL(kvb_hidden_split(model, &a, &pa, &sa, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_hidden_split(model, &b, &pb, &sb, err, sizeof err) == 0);
    /* the split is the same place in both prompts, the context ids agree, and the question follows it */
    CU_ASSERT_FATAL(sa == sb && sa > 100 && sa < pa.n - 10);
    CU_ASSERT(memcmp(pa.ids, pb.ids, (size_t)sa * sizeof *pa.ids) == 0);
    char *qa = NULL;
    CU_ASSERT_FATAL(tok_decode(model->tok, pa.ids + sa, (int)(pa.n - sa), &qa) == 0);
    CU_ASSERT(strstr(qa, "What is the secret code of the blue box?") != NULL);
    CU_ASSERT(strstr(qa, "The code is") != NULL);
    CU_ASSERT(strstr(qa, "9377") == NULL); /* the context stays before the split */
    free(qa);

    int64_t nha, nhb, nva, nvb;
    int32_t *ha = kept_positions(&pa, sa, &nha), *hb = kept_positions(&pb, sb, &nhb);
    int32_t *va = kept_positions(&pa, pa.n, &nva), *vb = kept_positions(&pb, pb.n, &nvb);
    CU_ASSERT(nha == nhb && memcmp(ha, hb, (size_t)nha * sizeof *ha) == 0); /* hidden: one kept set */
    /* visible: the budget follows each prompt's length and the selection its question */
    int differ = nva != nvb || memcmp(va, vb, (size_t)nva * sizeof *va) != 0;
    CU_ASSERT(differ);
    /* and the visible kept set is not the hidden one (the window saw the question) */
    CU_ASSERT(nva != nha || memcmp(va, ha, (size_t)nva * sizeof *va) != 0);
    free(ha), free(hb), free(va), free(vb);
    kvb_prompt_free(&pa);
    kvb_prompt_free(&pb);
    kvb_sample_free(&a);
    kvb_sample_free(&b);
}

static void test_hidden_split_refuses_samples_without_a_separate_context(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_sample s;
    make_sample(&s, "What is the secret code of the blue box?");
    kvb_prompt p;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 8000, 512, &p, err, sizeof err) == 0);
    int64_t k;
    char *ctx = s.context;
    s.context = NULL; /* LongBench-style sample: one prompt, no context field */
    CU_ASSERT(kvb_hidden_split(model, &s, &p, &k, err, sizeof err) == -1 && strstr(err, "context"));
    s.context = strdup("text that is not in the prompt");
    CU_ASSERT(kvb_hidden_split(model, &s, &p, &k, err, sizeof err) == -1 && strstr(err, "not part of its prompt"));
    free(s.context);
    s.context = ctx;
    kvb_prompt_free(&p);
    kvb_sample_free(&s);
}

/* A prompt cut in the middle to fit (LongBench's truncation) splits from its end: the question gets the same
 * tokens as in the whole prompt, and the context's kept head and tail come before it. A cut that reaches the
 * question is refused. */
static void test_truncated_prompt_splits_from_its_end_and_refuses_a_cut_question(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_sample s;
    make_sample(&s, "What is the secret code of the blue box?");
    kvb_prompt whole, cut;
    int64_t kw, kc;
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 8000, 512, &whole, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 160, 512, &cut, err, sizeof err) == 0);
    CU_ASSERT_FATAL(!whole.truncated && cut.truncated && cut.n < whole.n - 60);
    CU_ASSERT_FATAL(kvb_hidden_split(model, &s, &whole, &kw, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_hidden_split(model, &s, &cut, &kc, err, sizeof err) == 0);
    int64_t qn = whole.n - kw;
    CU_ASSERT(qn > 10 && cut.n - kc == qn && memcmp(whole.ids + kw, cut.ids + kc, (size_t)qn * sizeof *cut.ids) == 0);
    CU_ASSERT(kc > 40 && memcmp(whole.ids, cut.ids, 30 * sizeof *cut.ids) == 0); /* the context's head is first */
    kvb_prompt_free(&cut);
    /* a question longer than the half the cut keeps at the end */
    free(s.question), free(s.prompt);
    kvb_sb q = {0}, pr = {0};
    kvb_sb_adds(&q, "Which of these is the code:");
    for (int i = 0; i < 120; i++) kvb_sb_addf(&q, " %d", 1000 + 7 * i);
    s.question = kvb_sb_take(&q);
    kvb_sb_addf(&pr, "Read the text and answer.\n%s\n%s", s.context, s.question);
    s.prompt = kvb_sb_take(&pr);
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s, 300, 512, &cut, err, sizeof err) == 0 && cut.truncated);
    CU_ASSERT(kvb_hidden_split(model, &s, &cut, &kc, err, sizeof err) == -1 && strstr(err, "truncated into its question"));
    kvb_prompt_free(&cut);
    kvb_prompt_free(&whole);
    kvb_sample_free(&s);
}

/* SnapKV at 30% on a fork of the shared prefill sp, as run_cell does with the question hidden: adopt, then the
 * question; the kept positions of the context (before the question). */
static int32_t *cell_kept(const kvb_shared_prefill *sp, int64_t *n_out) {
    kvb_ctx *c = kvb_ctx_fork(sp->base, sp->obs_window, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_method *m = snapkv30_adopted(c, sp->share);
    int32_t *v = kept_of(c, n_out);
    CU_ASSERT(kvb_forward(c, sp->p.ids + sp->split, sp->p.n - sp->split, err, sizeof err) == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    return v;
}

static void test_questions_of_a_context_group_share_one_context_prefill_and_one_kept_set(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_sample a, b, other;
    make_sample(&a, "What is the secret code of the blue box?");
    make_sample(&b, "Which number is the secret code of the red box? Answer with the number only.");
    make_sample(&other, "What is the secret code of the blue box?");
    a.group = strdup("g0"), b.group = strdup("g0"), other.group = strdup("g1");
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_threads = 1;
    kvb_prefill_env e = {model, cp, model->cfg.n_ctx_train, 512, {0}, NULL}; /* NULL: the prompt by the sample's shape */
    kvb_opts o = {0};
    kvb_method_needs u;
    CU_ASSERT_FATAL(kvb_method_needs_of("snapkv", &o, &u, err, sizeof err) == 0);
    kvb_shared_prefill sp = {0};
    CU_ASSERT_FATAL(kvb_shared_prefill_run(&e, &a, 1, &u, 16, &sp, err, sizeof err) == 0);
    CU_ASSERT(!sp.reused && sp.split > 100 && kvb_shared_prefill_tokens(&sp) == sp.p.n);
    const kvb_ctx *base = sp.base;
    int64_t split = sp.split, na, nb;
    CU_ASSERT(base->n_past == split); /* the context only */
    int32_t *ka = cell_kept(&sp, &na);
    /* the second question: the context's prefill is the first's, untouched; only the question is new */
    CU_ASSERT_FATAL(kvb_shared_prefill_run(&e, &b, 1, &u, 16, &sp, err, sizeof err) == 0);
    CU_ASSERT(sp.reused && sp.base == base && base->n_past == split && sp.split == split);
    CU_ASSERT(kvb_shared_prefill_tokens(&sp) == sp.p.n - split && sp.p.n - split > 10);
    int32_t *kb = cell_kept(&sp, &nb);
    CU_ASSERT(na == nb && memcmp(ka, kb, (size_t)na * sizeof *ka) == 0); /* one kept set for both questions */
    /* and the one the second question gets from a prefill of its own */
    kvb_shared_prefill own = {0};
    int64_t no;
    CU_ASSERT_FATAL(kvb_shared_prefill_run(&e, &b, 1, &u, 16, &own, err, sizeof err) == 0);
    int32_t *ko = cell_kept(&own, &no);
    CU_ASSERT(!own.reused && no == nb && memcmp(ko, kb, (size_t)nb * sizeof *kb) == 0);
    free(ko);
    kvb_shared_prefill_free(&own);
    /* another group, though the same text: prefilled anew */
    CU_ASSERT_FATAL(kvb_shared_prefill_run(&e, &other, 1, &u, 16, &sp, err, sizeof err) == 0);
    CU_ASSERT(!sp.reused && sp.base->n_past == split);
    free(ka), free(kb);
    kvb_shared_prefill_free(&sp);
    kvb_sample_free(&a), kvb_sample_free(&b), kvb_sample_free(&other);
}

/* `kvbench run` of one benchmark (its JSON, every "%s" = a scratch directory holding data/<name> = text for each
 * {name, text} pair of files, NULL-terminated; files may be NULL), question hidden, two questions over one context: a
 * record per question, each scored, the first carrying the context's prefill and the second marked reused. */
static void check_group_run(const char *benchmark, const char *const *files) {
    CU_ASSERT_FATAL(bin != NULL);
    char dir[] = "/tmp/kvb_hidden_XXXXXX", path[128], cmd[512], bench[768];
    CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
    if (files) {
        snprintf(path, sizeof path, "%s/data", dir);
        CU_ASSERT_FATAL(mkdir(path, 0700) == 0);
    }
    for (int i = 0; files && files[i]; i += 2) {
        snprintf(path, sizeof path, "%s/data/%s", dir, files[i]);
        FILE *d = fopen(path, "w");
        CU_ASSERT_FATAL(d != NULL && fputs(files[i + 1], d) >= 0 && fclose(d) == 0);
    }
    snprintf(bench, sizeof bench, benchmark, dir, dir);
    snprintf(path, sizeof path, "%s/suite.json", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"hidden-group\", \"model\": \"default\", \"seed\": 3, \"methods\": [{\"name\": \"snapkv\"}],\n"
               " \"budgets\": [\"30%%\"], \"benchmarks\": [%s]}\n", bench);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' run %s --out %s/out --quiet --threads 2 > /dev/null 2>&1", bin, path, dir);
    CU_ASSERT_FATAL(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/out/results.jsonl", dir);
    char *text = util_read_file(path, NULL);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *r[3] = {0};
    int n = 0;
    for (char *save, *line = strtok_r(text, "\n", &save); line && n < 3; line = strtok_r(NULL, "\n", &save)) r[n++] = cJSON_Parse(line);
    CU_ASSERT_FATAL(n == 2 && r[0] && r[1]);
    const char *g0 = cJSON_GetStringValue(cJSON_GetObjectItem(r[0], "context_group"));
    const char *g1 = cJSON_GetStringValue(cJSON_GetObjectItem(r[1], "context_group"));
    CU_ASSERT(g0 && g1 && !strcmp(g0, g1));
    CU_ASSERT(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r[0], "shared_prefill")), "first"));
    CU_ASSERT(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r[1], "shared_prefill")), "reused"));
    for (int i = 0; i < 2; i++) {
        CU_ASSERT(cJSON_IsNumber(cJSON_GetObjectItem(r[i], "score")));
        CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(r[i], "error")));
    }
    /* the first question's record counts the whole prompt, the second's only its question */
    double p0 = cJSON_GetNumberValue(cJSON_GetObjectItem(r[0], "prompt_tokens"));
    double f0 = cJSON_GetNumberValue(cJSON_GetObjectItem(r[0], "prefill_tokens"));
    double p1 = cJSON_GetNumberValue(cJSON_GetObjectItem(r[1], "prompt_tokens"));
    double f1 = cJSON_GetNumberValue(cJSON_GetObjectItem(r[1], "prefill_tokens"));
    CU_ASSERT(f0 == p0 && f1 > 0 && f1 < p1 / 4);
    cJSON_Delete(r[0]), cJSON_Delete(r[1]);
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CU_ASSERT(system(cmd) == 0);
}

/* InfiniteBench kv_retrieval with two queries per haystack */
static void test_run_records_each_question_and_counts_the_shared_prefill_once(void) {
    check_group_run("{\"type\": \"infinitebench\", \"tasks\": [\"kv_retrieval\"], \"lengths\": [600], \"samples\": 2,"
                    " \"queries_per_context\": 2, \"question\": \"hidden\", \"max_new_tokens\": 8}", NULL);
}

/* LongBench records that share their context (qasper's papers, narrativeqa's books): the loader groups them */
static void test_longbench_questions_over_one_document_share_its_prefill(void) {
    char *filler = niah_filler_text(1500);
    kvb_sb doc = {0}, d = {0};
    kvb_sb_addf(&doc, "%s The secret code of the blue box is 4821.", filler);
    free(filler);
    static const char *const q[2][2] = {{"a", "What is the secret code of the blue box?"},
                                        {"b", "Which number is the secret code of the blue box? Answer with the number only."}};
    for (int i = 0; i < 2; i++) { /* two official-schema records over one document */
        cJSON *r = cJSON_CreateObject(), *ans = cJSON_AddArrayToObject(r, "answers");
        cJSON_AddStringToObject(r, "input", q[i][1]);
        cJSON_AddStringToObject(r, "context", doc.p);
        cJSON_AddItemToArray(ans, cJSON_CreateString("4821"));
        cJSON_AddStringToObject(r, "_id", q[i][0]);
        char *line = cJSON_PrintUnformatted(r);
        kvb_sb_addf(&d, "%s\n", line);
        free(line);
        cJSON_Delete(r);
    }
    kvb_sb_free(&doc);
    char *data = kvb_sb_take(&d);
    const char *const files[] = {"multifieldqa_en.jsonl", data, "dataset2prompt.json", LB_PROMPTS,
                                 "dataset2maxlen.json", LB_MAXLEN, NULL};
    check_group_run("{\"type\": \"longbench\", \"tasks\": [\"multifieldqa_en\"], \"data_dir\": \"%s/data\","
                    " \"config_dir\": \"%s/data\", \"question\": \"hidden\", \"max_new_tokens\": 8}", files);
    free(data);
}

int main(void) {
    char path[1024];
    if (util_default_model(path, sizeof path)) model = kvb_model_load(path, err, sizeof err);
    if (!model) fprintf(stderr, "test_hidden: the default model is missing (scripts/fetch-model.sh): the tests fail\n");
    bin = getenv("KVB_BIN");
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("hidden", NULL, NULL);
    CU_add_test(s, "hidden question leaves snapkv kept set unchanged, visible does not",
                test_hidden_question_leaves_snapkv_kept_set_unchanged_visible_does_not);
    CU_add_test(s, "hidden split refuses samples without a separate context", test_hidden_split_refuses_samples_without_a_separate_context);
    CU_add_test(s, "truncated prompt splits from its end and refuses a cut question",
                test_truncated_prompt_splits_from_its_end_and_refuses_a_cut_question);
    CU_add_test(s, "questions of a context group share one context prefill and one kept set",
                test_questions_of_a_context_group_share_one_context_prefill_and_one_kept_set);
    CU_add_test(s, "run records each question and counts the shared prefill once",
                test_run_records_each_question_and_counts_the_shared_prefill_once);
    CU_add_test(s, "longbench questions over one document share its prefill",
                test_longbench_questions_over_one_document_share_its_prefill);
    int rc = util_run_suites();
    kvb_model_free(model);
    return rc;
}
