/* text.c — strings made fit for one-line messages (text.h). */
#include "base/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *kvb_str_shown_n(const char *s, size_t len, char *out, size_t cap) {
    size_t n = 0, room = 0; /* room: the end of the last whole piece that leaves space for "..." */
    if (!cap) return out;
    const unsigned char *p = (const unsigned char *)(s ? s : ""), *end = p + (s ? len : 0);
    for (; p < end; p++) {
        char piece[12];
        if (*p < 0x20 || *p == 0x7f) snprintf(piece, sizeof piece, "\\x%02x", *p);
        else if (p[0] == 0xc2 && p + 1 < end && p[1] >= 0x80 && p[1] <= 0x9f)
            snprintf(piece, sizeof piece, "\\xc2\\x%02x", p[1]), p++;
        else piece[0] = (char)*p, piece[1] = 0;
        size_t l = strlen(piece);
        if (n + 4 <= cap) room = n;
        if (n + l + 1 > cap) { /* cut: back to a whole piece, then "..." */
            n = room;
            if (n + 4 <= cap) memcpy(out + n, "...", 3), n += 3;
            break;
        }
        memcpy(out + n, piece, l), n += l;
    }
    out[n] = 0;
    return out;
}

char *kvb_str_shown(const char *s, char *out, size_t cap) { return kvb_str_shown_n(s, s ? strlen(s) : 0, out, cap); }

char *kvb_utf8_lossy(const char *s) {
    size_t n = strlen(s), o = 0;
    unsigned char *out = malloc(3 * n + 1);
    const unsigned char *u = (const unsigned char *)s;
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        size_t j = i + 1;
        for (int q = 1; k > 1 && q < k && j < n; q++, j++) {
            unsigned lo = 0x80, hi = 0xBF; /* the second byte's range excludes overlongs, surrogates, > U+10FFFF */
            if (q == 1) lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (u[j] < lo || u[j] > hi) break;
        }
        if (k && j - i == (size_t)k) memcpy(out + o, u + i, (size_t)k), o += (size_t)k;
        else out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
        i = j;
    }
    out[o] = 0;
    return (char *)out;
}
