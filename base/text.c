/* text.c — strings made fit for one-line messages (text.h). */
#include "base/text.h"

#include <stdio.h>
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
