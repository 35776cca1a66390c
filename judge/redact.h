/* redact.h — keeping secrets out of everything kvbench writes or prints.
 *
 * A judge's API key and the userinfo of a URL (http://user:pass@host/...) are secrets: a hostile or careless
 * server may echo them back (an error body quoting the Authorization header, a reply that repeats it), and a
 * URL given on the command line or in a suite would otherwise be copied into run.json, records, the report
 * and the judge cache. Secrets are replaced by "[REDACTED]" wherever they occur in a text, including the
 * base64 form a Basic Authorization header carries; URLs are stored with their userinfo removed.
 *
 * Redaction runs on decoded text: a JSON reply can spell a secret with escapes ("SEC\u0052ET", "\/"), which
 * a byte search of the raw body misses and a JSON reader turns back into the secret. kvb_redact_decoded
 * decodes first (the JSON tree, or the escapes of a text that is not JSON) and redacts what it decoded. */
#ifndef KVB_REDACT_H
#define KVB_REDACT_H

#include <stddef.h>

struct cJSON;

#define KVB_REDACT_MAX 12

typedef struct {
    char *s[KVB_REDACT_MAX]; /* the secrets (owned), longest first is not required */
    int n;
} kvb_secrets;

/* Add a secret (and its base64 form) to the set; secrets shorter than 4 bytes are ignored (they would
 * redact ordinary words). 0, or -1 on OOM / a full set. */
int kvb_secrets_add(kvb_secrets *s, const char *secret);
/* Add a part of a URL's userinfo as written and percent-decoded ("p%3Fss" and "p?ss": libcurl sends the
 * decoded form, base64'd in a Basic header), each with its base64 form. 0, or -1 on OOM / a full set. */
int kvb_secrets_add_url_part(kvb_secrets *s, const char *part);
/* Free the secrets (after wiping them). */
void kvb_secrets_free(kvb_secrets *s);
/* Replace every occurrence of every secret in text (malloc'd, NUL-terminated) by "[REDACTED]"; returns the
 * possibly reallocated text (NULL only when text was NULL or on OOM, in which case text is freed and wiped). */
char *kvb_redact(const kvb_secrets *s, char *text);
/* Redact every string of a parsed JSON value in place, object keys included. 0, or -1 on OOM. */
int kvb_redact_json(const kvb_secrets *s, struct cJSON *j);
/* Decode, then redact: a text (malloc'd) that parses as JSON comes back printed again (compact) from its
 * redacted tree; any other text has its JSON-style escapes (\uXXXX, \/, \n, ...) decoded and is redacted.
 * Returns the new text; NULL only when text was NULL or on OOM (text is then freed and wiped). */
char *kvb_redact_decoded(const kvb_secrets *s, char *text);
/* Copy url into out without its userinfo ("http://u:p@h/x" -> "http://h/x"); the userinfo ("u:p") goes to
 * userinfo (may be NULL) and its password ("p") to password (may be NULL), "" when none. */
void kvb_url_strip_userinfo(const char *url, char *out, size_t cap, char *userinfo, size_t ui_cap, char *password,
                            size_t pw_cap);
/* Remove the userinfo of every scheme://user@host URL inside a text, in place (run.json flags, suite copies). */
void kvb_redact_url_userinfo(char *text);

#endif
