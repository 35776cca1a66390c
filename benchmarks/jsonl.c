/* jsonl.c — JSONL and big-array readers over cJSON, and Python json.dumps emulation.
 * The json.dumps rules follow CPython's json.encoder (py_encode_basestring_ascii: escape '"', '\\',
 * \b \f \n \r \t by name, every other byte outside ' '..'~' as \uXXXX with lowercase hex, code points
 * above U+FFFF as a UTF-16 surrogate pair; item separator ", ", key separator ": "). */
#include "benchmarks/jsonl.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvb_jsonl_open(kvb_jsonl *r, const char *path, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = kvb_fopen_regular(path, err, err_len); /* a FIFO would block open() forever */
    return r->f ? 0 : -1;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

int kvb_jsonl_next(kvb_jsonl *r, cJSON **out, char *err, size_t err_len) {
    *out = NULL;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&r->line, &r->cap, r->f);
        if (n < 0) {
            if (ferror(r->f)) {
                kvb_seterr(err, err_len, "%s:%ld: read error: %s", r->path, r->lineno + 1, strerror(errno));
                return -1;
            }
            return 0;
        }
        r->lineno++;
        size_t len = (size_t)n;
        while (len && (r->line[len - 1] == '\n' || r->line[len - 1] == '\r')) len--;
        if (is_blank(r->line, len)) continue;
        *out = kvb_json_parse(r->path, r->lineno, r->line, len, err, err_len);
        return *out ? 1 : -1;
    }
}

void kvb_jsonl_close(kvb_jsonl *r) {
    if (r->f) fclose(r->f);
    free(r->line);
    memset(r, 0, sizeof *r);
}

static long count_lines(const char *s, size_t n) {
    long k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Where text holds a NUL character, as a raw byte (invalid JSON) or the escape \u0000: cJSON would end the C string
 * of its value there and lose the rest of it without a word. Its byte offset, or -1. */
static long nul_at(const char *text, size_t len) {
    const char *z = memchr(text, 0, len);
    if (z) return (long)(z - text);
    for (size_t i = 0; i + 1 < len; i++)
        if (text[i] == '\\') { /* (a backslash is only ever inside a string) */
            if (text[i + 1] == 'u' && i + 6 <= len && !memcmp(text + i + 2, "0000", 4)) return (long)i;
            i++; /* the escaped character: "\\\\u0000" is a backslash and the text u0000 */
        }
    return -1;
}

int kvb_json_check_keys(const cJSON *o, const char *const *keys, const char *prefix, char *err, size_t err_len) {
    for (const cJSON *c = o ? o->child : NULL; c; c = c->next) {
        const char *k = c->string ? c->string : "";
        const char *const *x = keys;
        while (*x && strcmp(k, *x)) x++;
        if (*x) continue;
        char accepted[768];
        size_t at = 0;
        accepted[0] = 0;
        for (x = keys; *x && at < sizeof accepted; x++)
            at += (size_t)snprintf(accepted + at, sizeof accepted - at, "%s%s", at ? ", " : "", *x);
        kvb_seterr(err, err_len, "%sunknown key \"%.60s\" (accepted: %s)", prefix, k, accepted);
        return -1;
    }
    return 0;
}

cJSON *kvb_json_parse(const char *path, long first_line, const char *text, size_t len, char *err, size_t err_len) {
    long nul = nul_at(text, len);
    if (nul >= 0) {
        kvb_seterr(err, err_len, "%s:%ld: a NUL character (\\u0000) near byte %ld of the record: a string cannot hold it",
                   path, first_line + count_lines(text, (size_t)nul), nul);
        return NULL;
    }
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (v) {
        size_t used = (size_t)(end - text);
        if (used >= len || is_blank(end, len - used)) return v;
        cJSON_Delete(v);
        kvb_seterr(err, err_len, "%s:%ld: invalid JSON: unexpected content after the value", path,
                   first_line + count_lines(text, used));
        return NULL;
    }
    size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
    kvb_seterr(err, err_len, "%s:%ld: invalid JSON near byte %zu of the record", path,
               first_line + count_lines(text, at), at);
    return NULL;
}

/* ---- the big-array walk ---- */

static void skip_ws(kvb_jarray *a) {
    while (a->pos < a->len) {
        char c = a->buf[a->pos];
        if (c == '\n') a->line++;
        else if (c != ' ' && c != '\t' && c != '\r') break;
        a->pos++;
    }
}

int kvb_jarray_begin(kvb_jarray *a, const char *path, const char *buf, size_t len, char *err, size_t err_len) {
    memset(a, 0, sizeof *a);
    a->path = path;
    a->buf = buf;
    a->len = len;
    a->line = 1;
    if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3)) a->pos = 3; /* UTF-8 BOM */
    skip_ws(a);
    if (a->pos >= len || buf[a->pos] != '[') {
        kvb_seterr(err, err_len, "%s:%ld: expected a JSON array", path, a->line);
        return -1;
    }
    a->pos++;
    return 0;
}

/* End of the value starting at buf[pos]: matching bracket for objects/arrays (strings skipped),
 * the next delimiter for scalars. Returns 0 and sets *end, or -1 when the input ends first. */
static int value_end(const char *buf, size_t len, size_t pos, size_t *end) {
    int depth = 0;
    size_t i = pos;
    if (buf[i] != '{' && buf[i] != '[' && buf[i] != '"') {
        while (i < len && !strchr(",]} \t\r\n", buf[i])) i++;
        *end = i;
        return 0;
    }
    for (; i < len; i++) {
        char c = buf[i];
        if (c == '"') {
            for (i++; i < len && buf[i] != '"'; i++)
                if (buf[i] == '\\') i++;
            if (i >= len) return -1;
            if (depth == 0) break;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) break;
        }
    }
    if (i >= len) return -1;
    *end = i + 1;
    return 0;
}

static int jarray_finish(kvb_jarray *a, char *err, size_t err_len) {
    a->pos++;
    skip_ws(a);
    a->done = 1;
    if (a->pos < a->len) {
        kvb_seterr(err, err_len, "%s:%ld: invalid JSON: unexpected content after the array", a->path, a->line);
        return -1;
    }
    return 0;
}

int kvb_jarray_next(kvb_jarray *a, cJSON **out, long *line, char *err, size_t err_len) {
    *out = NULL;
    if (a->done) return 0;
    skip_ws(a);
    if (a->pos < a->len && a->buf[a->pos] == ']') return jarray_finish(a, err, err_len);
    if (a->pos < a->len && a->buf[a->pos] == ',') {
        kvb_seterr(err, err_len, "%s:%ld: invalid JSON: unexpected ','", a->path, a->line);
        return -1;
    }
    size_t end;
    if (a->pos >= a->len || value_end(a->buf, a->len, a->pos, &end)) {
        kvb_seterr(err, err_len, "%s:%ld: invalid JSON: the array is not closed", a->path, a->line);
        return -1;
    }
    *line = a->line;
    *out = kvb_json_parse(a->path, a->line, a->buf + a->pos, end - a->pos, err, err_len);
    if (!*out) return -1;
    a->line += count_lines(a->buf + a->pos, end - a->pos);
    a->pos = end;
    skip_ws(a);
    if (a->pos < a->len && a->buf[a->pos] == ',') {
        a->pos++;
        skip_ws(a);
        if (a->pos < a->len && a->buf[a->pos] == ']') {
            kvb_seterr(err, err_len, "%s:%ld: invalid JSON: trailing ',' before ']'", a->path, a->line);
            goto fail;
        }
        return 1;
    }
    if (a->pos < a->len && a->buf[a->pos] == ']') return 1; /* the next call finishes */
    kvb_seterr(err, err_len, "%s:%ld: invalid JSON: %s", a->path, a->line,
               a->pos >= a->len ? "the array is not closed" : "expected ',' or ']' after an element");
fail:
    cJSON_Delete(*out);
    *out = NULL;
    return -1;
}

cJSON *kvb_json_get(const cJSON *obj, const char *key) {
    cJSON *found = NULL, *it;
    if (!cJSON_IsObject(obj)) return NULL;
    cJSON_ArrayForEach(it, obj)
        if (it->string && !strcmp(it->string, key)) found = it;
    return found;
}

/* ---- Python json.dumps ---- */

/* Decodes one UTF-8 sequence at s (n bytes left); returns its length and *cp, or 1 and U+FFFD when
 * the bytes are not valid UTF-8 (Python could not have loaded such a file; we never crash on it). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n) goto bad;
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_cp[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0xfffd;
    return 1;
}

static void dumps_string(kvb_sb *b, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    kvb_sb_add(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        const char *named = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (named) {
            kvb_sb_adds(b, named);
            i++;
        } else if (c >= 0x20 && c <= 0x7e) {
            size_t j = i;
            while (j < n && p[j] >= 0x20 && p[j] <= 0x7e && p[j] != '"' && p[j] != '\\') j++;
            kvb_sb_add(b, s + i, j - i);
            i = j;
        } else {
            uint32_t cp;
            i += utf8_decode(p + i, n - i, &cp);
            if (cp > 0xffff) {
                cp -= 0x10000;
                kvb_sb_addf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else {
                kvb_sb_addf(b, "\\u%04x", cp);
            }
        }
    }
    kvb_sb_add(b, "\"", 1);
}

static void dumps_number(kvb_sb *b, double x) {
    if (x == floor(x) && fabs(x) < 9007199254740992.0) {
        kvb_sb_addf(b, "%.0f", x); /* cJSON keeps no int/float flag: integral values print as Python ints */
        return;
    }
    char tmp[40];
    for (int prec = 15; prec <= 17; prec++) { /* shortest round-trip, like Python's float repr */
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x) break;
    }
    kvb_sb_adds(b, tmp);
}

void kvb_json_dumps_py(kvb_sb *b, const cJSON *v, const char *skip_key) {
    const cJSON *it;
    int first = 1;
    if (cJSON_IsString(v)) dumps_string(b, v->valuestring);
    else if (cJSON_IsNumber(v)) dumps_number(b, v->valuedouble);
    else if (cJSON_IsBool(v)) kvb_sb_adds(b, cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsArray(v)) {
        kvb_sb_add(b, "[", 1);
        cJSON_ArrayForEach(it, v) {
            if (!first) kvb_sb_add(b, ", ", 2);
            first = 0;
            kvb_json_dumps_py(b, it, skip_key);
        }
        kvb_sb_add(b, "]", 1);
    } else if (cJSON_IsObject(v)) {
        kvb_sb_add(b, "{", 1);
        cJSON_ArrayForEach(it, v) {
            if (skip_key && !strcmp(it->string, skip_key)) continue;
            if (!first) kvb_sb_add(b, ", ", 2);
            first = 0;
            dumps_string(b, it->string);
            kvb_sb_add(b, ": ", 2);
            kvb_json_dumps_py(b, it, skip_key);
        }
        kvb_sb_add(b, "}", 1);
    } else {
        kvb_sb_adds(b, "null");
    }
}

const char *kvb_json_str(const cJSON *obj, const char *key, const char *def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : def;
}

double kvb_json_num(const cJSON *obj, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}
