/* fsutil.h — small file helpers shared by the layers above the engine: whole-file reads, directory
 * creation, and crash-safe whole-file writes (write to .tmp, fsync, rename). */
#ifndef KVB_FSUTIL_H
#define KVB_FSUTIL_H

#include <stddef.h>

/* mkdir -p; 0 or -1 (errno set). */
int kvb_mkdirs(const char *dir);
/* The whole file, NUL-terminated (malloc'd; len may be NULL). NULL + "PATH: cannot open: why" on failure. */
char *kvb_read_file(const char *path, size_t *len, char *err, size_t err_len);
/* Write text to path atomically: path.tmp, fsync, rename. 0 or -1 + err. */
int kvb_write_file_atomic(const char *path, const char *text, char *err, size_t err_len);

#endif
