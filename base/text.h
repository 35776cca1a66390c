/* text.h — strings from files and users made fit for a one-line message on a terminal. */
#ifndef KVB_TEXT_H
#define KVB_TEXT_H

#include <stddef.h>

/* The n bytes at s as a terminal may show them: control bytes (C0, DEL, and C1 as UTF-8) written as \xNN, so a
 * name from a file cannot move the cursor or clear the screen; cut with "..." to fit cap. NUL-terminated;
 * returns out. */
char *kvb_str_shown_n(const char *s, size_t n, char *out, size_t cap);
/* The same for a NUL-terminated s (NULL: ""). */
char *kvb_str_shown(const char *s, char *out, size_t cap);
/* s as bytes.decode("utf-8", "replace") gives it (Rust's from_utf8_lossy: what a Hugging Face tokenizer's decode
 * makes of ids cut inside a character, so what the official scripts read): each maximal invalid subpart becomes one
 * U+FFFD. malloc'd; NULL when out of memory. */
char *kvb_utf8_lossy(const char *s);

#endif
