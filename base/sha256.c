/* sha256.c — see sha256.h. */
#include "base/sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

/* One digest over parts, or over a file's contents when f is set (parts then unused). */
static int digest(const void *const *parts, const size_t *lens, int n, FILE *f, unsigned char *md, char *hex) {
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char out[EVP_MAX_MD_SIZE], buf[1 << 16];
    unsigned int len = 0;
    size_t r;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    for (int i = 0; ok && !f && i < n; i++) ok = EVP_DigestUpdate(c, parts[i], lens ? lens[i] : strlen(parts[i]));
    while (ok && f && (r = fread(buf, 1, sizeof buf, f)) > 0) ok = EVP_DigestUpdate(c, buf, r);
    ok = ok && !(f && ferror(f)) && EVP_DigestFinal_ex(c, out, &len) && len == 32;
    EVP_MD_CTX_free(c);
    if (!ok) return -1;
    if (md) memcpy(md, out, 32);
    for (int i = 0; hex && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", out[i]);
    return 0;
}

int kvb_sha256(const void *const *parts, const size_t *lens, int n, unsigned char *md, char *hex) {
    return digest(parts, lens, n, NULL, md, hex);
}

int kvb_sha256_file(const char *path, char hex[65], char *err, size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(err, err_len, "cannot read %s for its sha256: %s", path, strerror(errno)), -1;
    int rc = digest(NULL, NULL, 0, f, NULL, hex);
    fclose(f);
    if (rc) snprintf(err, err_len, "sha256 of %s failed", path);
    return rc;
}
