/* fuzz_sse_stream.c — `bench-serve --url`'s reader of a server's replies (judge/loadgen.c) on arbitrary bytes: the
 * server-sent-events parser (events split on blank lines, "data:" lines joined, each event's JSON: content, usage,
 * an error object, [DONE]) and the status-line parser of the headers. The first byte picks a chunk size: the
 * stream fed in chunks of that size must read exactly as fed whole (the same end, token count and error), whatever
 * the network's cuts. loadgen.c is included for its static functions. */
#include "judge/loadgen.c"

static void read_stream(stream_state *s, const uint8_t *data, size_t size, size_t step) {
    memset(s, 0, sizeof *s);
    s->status = 200;
    s->n_gen = -1;
    for (size_t at = 0; at < size || at == 0; at += step) {
        size_t n = size - at < step ? size - at : step;
        if (sse_write((char *)data + at, 1, n, s) != n) break; /* a reply over the cap */
        if (size == 0) break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const size_t step = data[0] % 64 + 1;
    data++, size--;
    stream_state whole, cut;
    read_stream(&whole, data, size, size ? size : 1);
    read_stream(&cut, data, size, step);
    if (whole.done != cut.done || whole.n_gen != cut.n_gen || strcmp(whole.err, cut.err) ||
        (whole.t_first == 0) != (cut.t_first == 0))
        abort();
    free(whole.raw.p), free(whole.body.p), free(cut.raw.p), free(cut.body.p);
    /* the same bytes as a header line: a status is taken from "HTTP/x nnn" only */
    stream_state h;
    memset(&h, 0, sizeof h);
    h.status = -7;
    header_cb((char *)data, 1, size, &h);
    if (h.status != -7 && (size < 5 || memcmp(data, "HTTP/", 5))) abort();
    return 0;
}
