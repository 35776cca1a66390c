/* judges.h — judge prompts and the parsing of their replies.
 *
 * LongMemEval (xiaowu0162/LongMemEval src/evaluation/evaluate_qa.py): one prompt per question type plus the
 * abstention prompt for `_abs` ids, filled positionally with (question, answer, response); verdict = "yes" in
 * the lowercased reply. The prompt texts are not compiled in: scripts/fetch-datasets.sh longmemeval writes
 * them (extracted by running the official get_anscheck_prompt) to longmemeval/judge_templates.json.
 * Round Attention's multi-dimension quality score (1-10, appendix A): a reply like
 * "{'factual accuracy': 9, ..., 'overall score': 7}" is parsed leniently for its overall score.
 * A generic rubric judge (NIAH): "Score: N" out of 10. */
#ifndef KVB_JUDGES_H
#define KVB_JUDGES_H

#include <stddef.h>

typedef struct kvb_lme_templates kvb_lme_templates;

/* Load {"default", "temporal-reasoning", "knowledge-update", "single-session-preference", "abstention"}
 * templates (each with three "{}" slots). NULL + err on failure. */
kvb_lme_templates *kvb_lme_templates_load(const char *path, char *err, size_t err_len);
void kvb_lme_templates_free(kvb_lme_templates *t);
/* The filled prompt (malloc'd). NULL + err for an unknown question type. */
char *kvb_lme_prompt(const kvb_lme_templates *t, const char *qtype, int abstention, const char *question,
                     const char *answer, const char *response, char *err, size_t err_len);
/* evaluate_qa.py's label: 1 if "yes" occurs in the lowercased reply. */
int kvb_lme_verdict(const char *reply);

/* Round Attention-style quality judge: prompt (malloc'd) and the overall score of a reply (0 / -1 = none). */
char *kvb_quality_prompt(const char *history, const char *question, const char *response);
int kvb_quality_parse(const char *reply, double *score);

/* Rubric judge for NIAH: prompt (malloc'd) and "Score: N" (1-10) parsed (0 / -1). */
char *kvb_rubric_prompt(const char *question, const char *reference, const char *response);
int kvb_rubric_parse(const char *reply, double *score);

/* "{}"-positional substitution as Python's str.format with positional fields ("{{" / "}}" are literal). */
char *kvb_format_positional(const char *tmpl, const char *const *args, int n_args);

#endif
