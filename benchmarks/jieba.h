/* jieba.h — jieba's default ("accurate") word segmentation, jieba.cut(s, cut_all=False), in C: the one LongBench's
 * Chinese metrics call (LongBench/metrics.py: qa_f1_zh_score and rouge_zh_score; HMM is jieba.cut's default, on).
 *
 * Written from jieba 0.42.1's behaviour (jieba/__init__.py, jieba/finalseg/__init__.py), over its own data: the
 * prefix dictionary built from dict.txt (each word with its count, every prefix of a word present with count 0,
 * the total of the counts), and the HMM of finalseg (prob_start.py, prob_trans.py, prob_emit.py). None of it is
 * committed: scripts/fetch-datasets.sh jieba extracts the four files from the pinned PyPI package into
 * $KVB_DATA/jieba (default ~/.cache/kvbench/datasets/jieba); $KVB_JIEBA_DIR points elsewhere.
 *
 * The text is cut into blocks: maximal runs of [\u4E00-\u9FD5a-zA-Z0-9+#&._%-] are segmented, every other code
 * point is a token of its own ("\r\n" one token). A block is segmented by the route of highest log-probability
 * through its DAG of dictionary words (log(count or 1) - log(total), summed right to left; ties to the longer
 * word). HMM off: consecutive single ASCII letters and digits of the route join into one token. HMM on: a run of
 * single-character route pieces that is not itself a dictionary word goes to finalseg: Chinese runs by Viterbi
 * over the B/M/E/S states (ties to the later state letter, as Python's max over (prob, state) tuples), the rest as
 * [a-zA-Z0-9]+(\.\d+)?%? matches and the gaps between them. Ties and sums follow the Python expressions' order,
 * so the doubles are the same. tests/test_jieba.c checks both modes against the Python package on a committed
 * corpus (tests/fixtures/jieba/, scripts/jieba_fixtures.py). */
#ifndef KVB_JIEBA_H
#define KVB_JIEBA_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvb_jieba kvb_jieba;

/* One token: bytes [off, off + len) of the text that was cut. */
typedef struct {
    int64_t off, len;
} kvb_jieba_tok;

/* The command that fetches the data, for messages. */
#define KVB_JIEBA_FETCH "scripts/fetch-datasets.sh jieba"

/* The data directory: $KVB_JIEBA_DIR, else $KVB_DATA/jieba, else ~/.cache/kvbench/datasets/jieba. 0, or -1 when
 * it does not fit cap. */
int kvb_jieba_dir(char *buf, size_t cap);
/* 1 when dir holds the four data files (readable), else 0. */
int kvb_jieba_present(const char *dir);
/* Load dict.txt and finalseg's prob_start.py, prob_trans.py, prob_emit.py from dir. NULL + one line on a missing
 * file (naming KVB_JIEBA_FETCH), a malformed line (file:line), or out of memory. */
kvb_jieba *kvb_jieba_load(const char *dir, char *err, size_t err_len);
void kvb_jieba_free(kvb_jieba *j);
/* The process's instance from kvb_jieba_dir(), loaded on first use (thread-safe) and kept until exit. NULL + the
 * load's message (the same every call) when it cannot be loaded. */
const kvb_jieba *kvb_jieba_shared(char *err, size_t err_len);
/* The dictionary's lines, its entries with their prefixes (len(jieba.dt.FREQ)), the sum of the counts (jieba's
 * total). */
int64_t kvb_jieba_words(const kvb_jieba *j);
int64_t kvb_jieba_entries(const kvb_jieba *j);
int64_t kvb_jieba_total(const kvb_jieba *j);

/* jieba.cut(text, cut_all=False, HMM=hmm): the tokens in order (*toks malloc'd, NULL when there are none). Text is
 * UTF-8; an invalid byte is one code point of its own that no block contains. 0, or -1 when out of memory. */
int kvb_jieba_cut(const kvb_jieba *j, const char *text, int hmm, kvb_jieba_tok **toks, int64_t *n_toks);

#endif
