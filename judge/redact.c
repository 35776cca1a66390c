/* redact.c — secrets replaced in texts, userinfo removed from URLs (see redact.h). */
#define _GNU_SOURCE /* memmem */
#include "judge/redact.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MASK "[REDACTED]"

static int add_one(kvb_secrets *s, const char *v) {
    if (strlen(v) < 4) return 0;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->s[i], v)) return 0;
    if (s->n == KVB_REDACT_MAX) return -1;
    return (s->s[s->n] = strdup(v)) ? (s->n++, 0) : -1;
}

int kvb_secrets_add(kvb_secrets *s, const char *secret) {
    if (!secret || strlen(secret) < 4) return 0;
    if (add_one(s, secret)) return -1;
    /* the form a Basic Authorization header carries, which an echoing server may send back */
    size_t n = strlen(secret);
    unsigned char *b64 = malloc(4 * ((n + 2) / 3) + 1);
    if (!b64) return -1;
    EVP_EncodeBlock(b64, (const unsigned char *)secret, (int)n);
    int rc = add_one(s, (const char *)b64);
    free(b64);
    return rc;
}

void kvb_secrets_free(kvb_secrets *s) {
    for (int i = 0; i < s->n; i++) {
        memset(s->s[i], 0, strlen(s->s[i]));
        free(s->s[i]);
    }
    s->n = 0;
}

char *kvb_redact(const kvb_secrets *s, char *text) {
    if (!text) return NULL;
    for (int i = 0; s && i < s->n; i++) {
        size_t sl = strlen(s->s[i]), ml = strlen(MASK);
        char *hit;
        size_t from = 0;
        while ((hit = strstr(text + from, s->s[i]))) {
            size_t at = (size_t)(hit - text), n = strlen(text);
            if (ml > sl) {
                char *t = realloc(text, n + ml - sl + 1);
                if (!t) {
                    memset(text, 0, n);
                    free(text);
                    return NULL;
                }
                text = t;
            }
            memmove(text + at + ml, text + at + sl, n - at - sl + 1);
            memcpy(text + at, MASK, ml);
            from = at + ml;
        }
    }
    return text;
}

/* The userinfo of the URL starting at p (after "scheme://"): [p, at) when there is an '@' before the first
 * '/', '?' or '#'; NULL otherwise. */
static const char *userinfo_end(const char *p) {
    size_t auth = strcspn(p, "/?# \t\r\n\"'");
    const char *at = NULL;
    for (size_t i = 0; i < auth; i++)
        if (p[i] == '@') at = p + i; /* the last '@' of the authority ends the userinfo */
    return at;
}

void kvb_url_strip_userinfo(const char *url, char *out, size_t cap, char *userinfo, size_t ui_cap, char *password,
                            size_t pw_cap) {
    if (userinfo && ui_cap) userinfo[0] = 0;
    if (password && pw_cap) password[0] = 0;
    if (!cap) return;
    const char *sep = strstr(url, "://");
    const char *p = sep ? sep + 3 : url;
    const char *at = userinfo_end(p);
    if (!at) {
        snprintf(out, cap, "%s", url);
        return;
    }
    snprintf(out, cap, "%.*s%s", (int)(p - url), url, at + 1);
    if (userinfo && ui_cap) snprintf(userinfo, ui_cap, "%.*s", (int)(at - p), p);
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (colon && password && pw_cap) snprintf(password, pw_cap, "%.*s", (int)(at - colon - 1), colon + 1);
}

void kvb_redact_url_userinfo(char *text) {
    for (char *p = text ? strstr(text, "://") : NULL; p; p = strstr(p, "://")) {
        p += 3;
        const char *at = userinfo_end(p);
        if (at) memmove(p, at + 1, strlen(at + 1) + 1);
    }
}
