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
/* An exclusive lock on path (created if absent), waiting while another process holds it: a POSIX record lock
 * (fcntl), which NFS also honours across nodes. Returns the descriptor that holds it (kvb_unlock_file releases
 * it), or -1 + err. A process must not lock the same path twice: closing either descriptor drops both. */
int kvb_lock_file(const char *path, char *err, size_t err_len);
void kvb_unlock_file(int fd);

#endif
