/* sha256.h — SHA-256 digests (OpenSSL's libcrypto) for names and keys that must be the same on every machine
 * and in Python's hashlib: model files (profiles, run provenance), judge cache keys, shard assignment. */
#ifndef KVB_SHA256_H
#define KVB_SHA256_H

#include <stddef.h>

/* sha256 of the concatenation of n byte strings parts[i] of lens[i] bytes (lens NULL: NUL-terminated strings,
 * without the NUL) into md (32 bytes; may be NULL) and hex (64 lowercase hex digits + NUL; may be NULL).
 * 0, or -1 when libcrypto fails. */
int kvb_sha256(const void *const *parts, const size_t *lens, int n, unsigned char *md, char *hex);
/* sha256 of a file's contents as 64 hex digits. 0, or -1 + "cannot read PATH for its sha256: why". */
int kvb_sha256_file(const char *path, char hex[65], char *err, size_t err_len);

#endif
