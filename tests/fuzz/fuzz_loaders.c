/* fuzz_loaders.c — every dataset loader on arbitrary file contents. The first byte picks the loader:
 * LongBench JSONL (with a fixed task config), LongMemEval JSON and "nl" format, ShareGPT JSON, OmniKV's
 * 2stage.jsonl, and a NIAH haystack file (byte % 6, so the seeds start with an ASCII digit '0'-'5' and stay
 * text); the rest is the file. Each must load or fail with an error. */
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "benchmarks/loaders.h"
#include "fuzz_common.h"

static char cfg_dir[128];

static void make_config(void) {
    if (cfg_dir[0]) return;
    snprintf(cfg_dir, sizeof cfg_dir, "%s/config", fuzz_scratch());
    if (mkdir(cfg_dir, 0755)) abort();
    const char *prompt = "{\"hotpotqa\": \"Answer: {context}\\n\\nQuestion: {input}\\nAnswer:\", \"trec\": \"{context}{input}\"}";
    const char *maxlen = "{\"hotpotqa\": 32, \"trec\": 64}";
    char p[256];
    fuzz_write("config/dataset2prompt.json", (const uint8_t *)prompt, strlen(prompt), p, sizeof p);
    fuzz_write("config/dataset2maxlen.json", (const uint8_t *)maxlen, strlen(maxlen), p, sizeof p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    make_config();
    int which = data[0] % 6;
    char path[256], err[512];
    kvb_samples out = {0};
    if (which == 5) { /* a haystack directory with one text file */
        char dir[256];
        snprintf(dir, sizeof dir, "%s/hay", fuzz_scratch());
        mkdir(dir, 0755); /* exists after the first time */
        fuzz_write("hay/a.txt", data + 1, size - 1, path, sizeof path);
        int lengths[1] = {240};
        double depths[1] = {50};
        niah_generate(dir, lengths, 1, depths, 1, NULL, NULL, NULL, niah_count_words, NULL, &out, err, sizeof err);
    } else {
        fuzz_write("data", data + 1, size - 1, path, sizeof path);
        if (which == 0) lb_load(path, "hotpotqa", cfg_dir, 0, &out, err, sizeof err);
        else if (which == 1) lme_load(path, "json", 0, 0, &out, err, sizeof err);
        else if (which == 2) lme_load(path, "nl", 1, 3, &out, err, sizeof err);
        else if (which == 3) sharegpt_load(path, 0, &out, err, sizeof err);
        else twostage_load(path, 0, &out, err, sizeof err);
    }
    kvb_samples_free(&out);
    return 0;
}
