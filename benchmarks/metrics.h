/* metrics.h — LongBench's official metrics (THUDM/LongBench LongBench/metrics.py and eval.py) in C, English,
 * Chinese and code tasks. Each returns what the Python function returns for one (prediction, ground truth) pair;
 * tests/test_metrics.c checks them against values the official code computed (scripts/metrics_ref.py), and
 * tests/test_metrics_zh.c the Chinese ones (scripts/metrics_zh_ref.py).
 *
 *   qa_f1           SQuAD normalisation (lower, strip string.punctuation, drop a/an/the, collapse spaces),
 *                   token-multiset F1;
 *   rouge           Rouge-L F of the `rouge` package (1.0.1): text split into sentences at '.', words at ' ',
 *                   summary-level union LCS over distinct words; 0 where the package raises (an empty
 *                   prediction or reference, or a sentence pair deep enough to exhaust Python's recursion
 *                   limit in its LCS reconstruction);
 *   classification  the classes found in the prediction, minus those inside the gold class, as the official
 *                   loop removes them (it skips the element after each removal);
 *   retrieval       share of the numbers in the prediction equal to the gold "Paragraph N";
 *   count           share of the numbers in the prediction equal to the gold count;
 *   code_sim        fuzzywuzzy's fuzz.ratio of the first code line (no `, #, //) and the gold, / 100, with
 *                   difflib's SequenceMatcher (autojunk on): LongBench's requirements.txt installs fuzzywuzzy
 *                   without python-Levenshtein.
 * Text is UTF-8 and handled as code points where Python would. str.lower() is Python 3.11's (Unicode 14.0)
 * mapping, U+0130 and final sigma included (Final_Sigma's cased / case-ignorable classes approximated);
 * \d is every Unicode decimal digit, as in Python 3 str regexes; \w (for \b around a/an/the) is exact for
 * ASCII and Latin-1 and elsewhere approximated as "not in a punctuation, symbol, combining-mark or emoji
 * block".
 *
 * Chinese (multifieldqa_zh, dureader, vcsum: jieba.cut(s, cut_all=False), HMM on as jieba's default; jieba.h):
 *   qa_f1_zh        jieba tokens, each normalize_zh_answer'ed (lower, string.punctuation and metrics.py's
 *                   cn_punctuation removed, all whitespace removed), empty ones dropped, token-multiset F1;
 *   rouge_zh        rouge of " ".join(jieba tokens) of each side (one more Python frame above the package: its
 *                   recursion limit comes one word earlier);
 *   retrieval_zh    share of the numbers in the prediction equal to the gold's first "段落N";
 *   lsht            classification, with the first-line cut. */
#ifndef KVB_METRICS_H
#define KVB_METRICS_H

typedef struct kvb_jieba kvb_jieba;

/* Each scores one prediction against one ground truth, in [0, 1], as metrics.py's function of the same name. */
double kvb_metric_qa_f1(const char *pred, const char *gold);           /* qa_f1_score */
double kvb_metric_rouge(const char *pred, const char *gold);           /* rouge_score */
double kvb_metric_classification(const char *pred, const char *gold, const char *const *all_classes,
                                 int n_classes);                       /* classification_score */
double kvb_metric_retrieval(const char *pred, const char *gold);       /* retrieval_score (English) */
double kvb_metric_count(const char *pred, const char *gold);           /* count_score */
double kvb_metric_code_sim(const char *pred, const char *gold);        /* code_sim_score */
double kvb_metric_qa_f1_zh(const kvb_jieba *j, const char *pred, const char *gold);  /* qa_f1_zh_score */
double kvb_metric_rouge_zh(const kvb_jieba *j, const char *pred, const char *gold);  /* rouge_zh_score */
double kvb_metric_retrieval_zh(const char *pred, const char *gold);    /* retrieval_zh_score */
/* fuzzywuzzy fuzz.ratio (difflib backend): 0..100. */
int kvb_fuzz_ratio(const char *a, const char *b);

/* The metric eval.py uses for a task ("hotpotqa", LongBench-E "hotpotqa_e" too): "qa_f1", "rouge",
 * "classification", "retrieval", "count", "code_sim", "qa_f1_zh", "rouge_zh", "retrieval_zh"; NULL for unknown
 * tasks. */
const char *kvb_longbench_metric_name(const char *task);
/* 1 for the metrics that tokenise with jieba (qa_f1_zh, rouge_zh), which need its data (kvb_jieba_shared). */
int kvb_longbench_metric_needs_jieba(const char *metric);
/* eval.py's score of one sample: the first-line cut for trec, triviaqa, samsum, lsht, then the max of the
 * metric over the answers (0 when there are none). 0, or -1 for a task without a metric, or one whose metric
 * needs jieba's data when it cannot be loaded. */
int kvb_longbench_score(const char *task, const char *pred, const char *const *answers, int n_answers,
                        const char *const *all_classes, int n_classes, double *score);

#endif
