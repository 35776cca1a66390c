/* recall.c — multi-round recall: kvbench's own synthetic dialogues for round-level methods (no
 * official code: the design follows the facts-in-history idea of LongMemEval's information-extraction
 * questions, at the granularity Round Attention selects: whole rounds). A dialogue has n_rounds
 * (user, assistant) rounds of everyday small talk; min(n_rounds, 4) personal facts of distinct kinds,
 * each with its own value, are stated by the user in distinct rounds; the final question asks for one
 * of them, so the answer lives in exactly one round (qtype "round=<r>", 1-based). Values are drawn so
 * that neither the filler nor another fact's value can contain them (4-digit codes, 2 letters + 3 digits
 * flights, "C-27" spots, names absent from the filler vocabulary). Deterministic per seed (splitmix64);
 * max_new_tokens 32. */
#include "benchmarks/loaders.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECALL_MAX_FACTS 4
#define RECALL_MAX_ROUNDS 100000
#define RECALL_MAX_NEW_TOKENS 32
#define PICK(rng, arr) (arr[kvb_rng_below(rng, sizeof arr / sizeof *arr)])

static const char *const NAMES[] = {"Margarethe", "Oswin", "Thaddeus", "Rosalind", "Ignatius", "Philippa",
                                    "Leopold", "Henrietta", "Cornelius", "Wilhelmina", "Bartholomew", "Ottilie"};
static const char *const PETS[] = {"Biscuit", "Pumpernickel", "Waffles", "Noodle", "Pickles", "Marzipan",
                                   "Crumpet", "Dumpling"};
static const char *const TEAS[] = {"lapsang souchong", "genmaicha", "rooibos with vanilla", "white peony",
                                   "hojicha", "masala chai"};
static const char *const WORDS[] = {"maple", "harbor", "copper", "falcon", "meadow", "cinder", "juniper", "sparrow"};
static const char *const DAYS[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};

typedef struct {
    const char *statement; /* printf format with one %s: the value */
    const char *question;
} fact_kind;

static const fact_kind KINDS[] = {
    {"By the way, my locker code at the gym is %s.", "What is my locker code at the gym?"},
    {"My cousin who lives abroad is called %s.", "What is the name of my cousin who lives abroad?"},
    {"My flight next month is %s.", "What is my flight number for next month?"},
    {"I parked the car in spot %s this morning.", "In which parking spot did I leave the car?"},
    {"The wifi password at my cabin is %s.", "What is the wifi password at my cabin?"},
    {"My neighbour's dog is named %s.", "What is the name of my neighbour's dog?"},
    {"My favourite tea at the moment is %s.", "Which tea did I say is my favourite at the moment?"},
    {"My dentist appointment is on %s.", "When is my dentist appointment?"},
};
#define N_KINDS ((int)(sizeof KINDS / sizeof *KINDS))

static void fact_value(int kind, uint64_t *rng, char *buf, size_t cap) {
    switch (kind) {
    case 0: snprintf(buf, cap, "%d", 1000 + (int)kvb_rng_below(rng, 9000)); break;
    case 1: snprintf(buf, cap, "%s", PICK(rng, NAMES)); break;
    case 2: snprintf(buf, cap, "%c%c%d", 'A' + (int)kvb_rng_below(rng, 26), 'A' + (int)kvb_rng_below(rng, 26),
                     100 + (int)kvb_rng_below(rng, 900)); break;
    case 3: snprintf(buf, cap, "%c-%d", 'B' + (int)kvb_rng_below(rng, 8), 10 + (int)kvb_rng_below(rng, 90)); break;
    case 4: snprintf(buf, cap, "%s-%s-%d", PICK(rng, WORDS), PICK(rng, WORDS), 10 + (int)kvb_rng_below(rng, 90)); break;
    case 5: snprintf(buf, cap, "%s", PICK(rng, PETS)); break;
    case 6: snprintf(buf, cap, "%s", PICK(rng, TEAS)); break;
    default: snprintf(buf, cap, "%s at %d:%02d", PICK(rng, DAYS), 8 + (int)kvb_rng_below(rng, 9),
                      5 * (int)kvb_rng_below(rng, 12)); break;
    }
}

/* ---- small talk ---- */

static const char *const ASKS[] = {
    "How do I keep fresh herbs from wilting so quickly?", "What is a good way to start learning to draw?",
    "Can you suggest a simple stretching routine for the evening?", "How should I plan a weekend hike for beginners?",
    "What are some tips for writing clearer emails?", "How can I make my small balcony feel greener?",
    "Any advice for sleeping better when it is hot?", "What should I pack for a rainy day trip?",
    "How do I get better at remembering what I read?", "What is an easy soup to cook on a weeknight?",
    "How can I stay focused when working from home?", "What are good habits for looking after a bicycle?",
    "How do I start a small vegetable patch?", "What is a relaxing hobby I could pick up this winter?",
    "How do I organise a cluttered kitchen drawer?", "What makes a good board game night?"};
static const char *const OPENERS[] = {"Good question.", "Happy to help.", "Sure.", "That is a common one.",
                                      "Here is what usually works."};
static const char *const ADVICE[] = {
    "Start small and keep the routine easy to repeat.", "A little preparation the day before saves a lot of time.",
    "Try it for a week and adjust what does not feel right.", "Writing a short list helps you see what matters.",
    "Keep the things you use most within easy reach.", "Short, regular sessions beat one long session.",
    "Ask a friend to join you; it makes it easier to keep going.", "Pay attention to what you enjoy and do more of it.",
    "Choose simple tools first and upgrade later if needed.", "Take a few notes so you remember what worked."};
static const char *const ACKS[] = {"Thanks for telling me, I will keep that in mind.", "Noted.",
                                   "Got it, thanks for sharing.", "Good to know."};

static char *assistant_reply(uint64_t *rng, int acknowledge) {
    kvb_sb b = {0};
    if (acknowledge) kvb_sb_addf(&b, "%s ", PICK(rng, ACKS));
    kvb_sb_adds(&b, PICK(rng, OPENERS));
    int n = 2 + (int)kvb_rng_below(rng, 3);
    for (int i = 0; i < n; i++) kvb_sb_addf(&b, " %s", PICK(rng, ADVICE));
    return kvb_sb_take(&b);
}

static int add_round(kvb_sample *s, uint64_t *rng, const char *fact) {
    kvb_sb ub = {0};
    if (fact) kvb_sb_addf(&ub, "%s ", fact);
    kvb_sb_adds(&ub, PICK(rng, ASKS));
    char *user = kvb_sb_take(&ub), *reply = assistant_reply(rng, fact != NULL);
    int rc = !user || !reply || kvb_sample_add_turn(s, "user", user, NULL)
          || kvb_sample_add_turn(s, "assistant", reply, NULL);
    free(user);
    free(reply);
    return rc ? -1 : 0;
}

/* k distinct values of [0, n) in v (partial Fisher-Yates over a scratch permutation). */
static int pick_distinct(uint64_t *rng, int n, int k, int *v) {
    int *perm = malloc((size_t)n * sizeof *perm);
    if (!perm) return -1;
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = 0; i < k; i++) {
        int j = i + (int)kvb_rng_below(rng, (uint64_t)(n - i));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        v[i] = perm[i];
    }
    free(perm);
    return 0;
}

static int make_dialogue(uint64_t *rng, int index, int n_rounds, kvb_sample *s) {
    int n_facts = n_rounds < RECALL_MAX_FACTS ? n_rounds : RECALL_MAX_FACTS;
    int kinds[RECALL_MAX_FACTS], rounds[RECALL_MAX_FACTS];
    char facts[RECALL_MAX_FACTS][160], values[RECALL_MAX_FACTS][64];
    if (pick_distinct(rng, N_KINDS, n_facts, kinds) || pick_distinct(rng, n_rounds, n_facts, rounds)) return -1;
    for (int f = 0; f < n_facts; f++) {
        fact_value(kinds[f], rng, values[f], sizeof values[f]);
        snprintf(facts[f], sizeof facts[f], KINDS[kinds[f]].statement, values[f]);
    }
    int asked = (int)kvb_rng_below(rng, (uint64_t)n_facts);
    for (int r = 0; r < n_rounds; r++) {
        const char *fact = NULL;
        for (int f = 0; f < n_facts; f++)
            if (rounds[f] == r) fact = facts[f];
        if (add_round(s, rng, fact)) return -1;
    }
    char id[32], qtype[32];
    snprintf(id, sizeof id, "%d", index);
    snprintf(qtype, sizeof qtype, "round=%d", rounds[asked] + 1);
    s->id = kvb_strdup(id);
    s->task = kvb_strdup("recall");
    s->qtype = kvb_strdup(qtype);
    s->question = kvb_strdup(KINDS[kinds[asked]].question);
    s->max_new_tokens = RECALL_MAX_NEW_TOKENS;
    s->use_chat = 1;
    return !s->id || !s->task || !s->qtype || !s->question || kvb_sample_add_answer(s, values[asked]) ? -1 : 0;
}

int recall_generate(uint64_t seed, int n_dialogues, int n_rounds, kvb_samples *out, char *err, size_t err_len) {
    if (n_dialogues < 0 || n_rounds < 1 || n_rounds > RECALL_MAX_ROUNDS) {
        kvb_seterr(err, err_len, "recall: need n_dialogues >= 0 and 1 <= n_rounds <= %d (got %d, %d)",
                   RECALL_MAX_ROUNDS, n_dialogues, n_rounds);
        return -1;
    }
    uint64_t rng = seed;
    int n0 = out->n;
    for (int i = 0; i < n_dialogues; i++) {
        kvb_sample s;
        kvb_sample_init(&s);
        if (make_dialogue(&rng, i, n_rounds, &s)) {
            kvb_sample_free(&s);
            kvb_samples_truncate(out, n0);
            kvb_seterr(err, err_len, "recall: out of memory");
            return -1;
        }
        if (kvb_samples_push(out, &s)) {
            kvb_samples_truncate(out, n0);
            kvb_seterr(err, err_len, "recall: out of memory");
            return -1;
        }
    }
    return 0;
}
