/* redact.c — secrets replaced in texts, userinfo removed from URLs (see redact.h). */
#define _GNU_SOURCE /* memmem */
#include "judge/redact.h"

#include <cjson/cJSON.h>
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

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int kvb_secrets_add_url_part(kvb_secrets *s, const char *part) {
    if (!part) return 0;
    size_t n = strlen(part);
    char *dec = malloc(n + 1), *o = dec;
    if (!dec) return -1;
    for (const char *p = part; *p; p++) {
        int hi = p[0] == '%' ? hexval(p[1]) : -1, lo = hi >= 0 ? hexval(p[2]) : -1;
        if (lo >= 0 && (hi | lo)) { /* %00 stays as written */
            *o++ = (char)(hi * 16 + lo);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
    int rc = kvb_secrets_add(s, part) | kvb_secrets_add(s, dec);
    memset(dec, 0, n);
    free(dec);
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

/* 1 when text holds any of the secrets. */
static int holds_secret(const kvb_secrets *s, const char *text) {
    for (int i = 0; s && text && i < s->n; i++)
        if (strstr(text, s->s[i])) return 1;
    return 0;
}

/* *p (malloc'd by cJSON's allocator) redacted; 0 or -1 on OOM. */
static int redact_field(const kvb_secrets *s, char **p) {
    if (!holds_secret(s, *p)) return 0;
    char *t = kvb_redact(s, strdup(*p));
    char *copy = t ? cJSON_malloc(strlen(t) + 1) : NULL;
    if (copy) strcpy(copy, t);
    free(t);
    if (!copy) return -1;
    memset(*p, 0, strlen(*p));
    cJSON_free(*p);
    *p = copy;
    return 0;
}

int kvb_redact_json(const kvb_secrets *s, cJSON *j) {
    int rc = 0;
    for (; j && !rc; j = j->next) { /* siblings iteratively, children recursively (cJSON limits the depth) */
        if (j->string && !(j->type & cJSON_StringIsConst)) rc |= redact_field(s, &j->string);
        if (cJSON_IsString(j) && j->valuestring && !(j->type & cJSON_IsReference)) rc |= redact_field(s, &j->valuestring);
        if (j->child) rc |= kvb_redact_json(s, j->child);
    }
    return rc;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hexval(p[i]);
        if (d < 0) return -1;
        v = v * 16 + (unsigned)d;
    }
    *out = v;
    return 0;
}

/* JSON-style escapes of a text that is not JSON decoded in place, as a JSON reader would decode them (the
 * result is never longer). \u0000 and lone surrogates stay as they are. */
static void unescape_in_place(char *t) {
    char *o = t;
    for (const char *p = t; *p;) {
        char simple = 0;
        if (p[0] == '\\') switch (p[1]) {
            case '"': simple = '"'; break;
            case '\\': simple = '\\'; break;
            case '/': simple = '/'; break;
            case 'b': simple = '\b'; break;
            case 'f': simple = '\f'; break;
            case 'n': simple = '\n'; break;
            case 'r': simple = '\r'; break;
            case 't': simple = '\t'; break;
            default: break;
            }
        if (simple) {
            *o++ = simple;
            p += 2;
            continue;
        }
        unsigned cp, lo;
        size_t used = 6;
        if (p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &cp) || cp == 0 || (cp >= 0xDC00 && cp < 0xE000)) {
            *o++ = *p++;
            continue;
        }
        if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair, or left as it is */
            if (p[6] != '\\' || p[7] != 'u' || hex4(p + 8, &lo) || lo < 0xDC00 || lo >= 0xE000) {
                *o++ = *p++;
                continue;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            used = 12;
        }
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else if (cp < 0x800) {
            *o++ = (char)(0xC0 | cp >> 6);
            *o++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            *o++ = (char)(0xE0 | cp >> 12);
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (char)(0x80 | (cp & 0x3F));
        } else {
            *o++ = (char)(0xF0 | cp >> 18);
            *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (char)(0x80 | (cp & 0x3F));
        }
        p += used;
    }
    *o = 0;
}

char *kvb_redact_decoded(const kvb_secrets *s, char *text) {
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    if (j) {
        char *printed = kvb_redact_json(s, j) ? NULL : cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        char *out = printed ? strdup(printed) : NULL; /* text stays malloc'd whatever cJSON's allocator is */
        if (printed) cJSON_free(printed);
        memset(text, 0, strlen(text));
        free(text);
        return out;
    }
    unescape_in_place(text);
    return kvb_redact(s, text);
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
