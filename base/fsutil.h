/* fsutil.h — small file helpers shared by the layers above the engine: whole-file reads, directory
 * creation, crash-safe whole-file writes (write to a temporary name of this writer's own, fsync, rename),
 * opens that refuse what is not a regular file, and locks. */
#ifndef KVB_FSUTIL_H
#define KVB_FSUTIL_H

#include <stddef.h>
#include <stdio.h>

/* "dir/name", malloc'd (NULL when out of memory): no fixed buffer cuts a long folder into another path. */
char *kvb_path_join(const char *dir, const char *name);
/* mkdir -p; 0 or -1 (errno set). */
int kvb_mkdirs(const char *dir);
/* open(2) that refuses anything but a regular file (a FIFO would block open() and read() forever, a device
 * read without end): opened O_NONBLOCK, checked with fstat, then made blocking again; O_CLOEXEC always.
 * Returns the descriptor, or -1 + one line: "PATH: cannot open: why" or "PATH: is a FIFO, not a regular file". */
int kvb_open_regular(const char *path, int flags, int mode, char *err, size_t err_len);
/* kvb_open_regular as a stdio stream for reading ("rb"); NULL + the same one line. */
FILE *kvb_fopen_regular(const char *path, char *err, size_t err_len);
/* The whole regular file, NUL-terminated (malloc'd; len may be NULL). NULL + "PATH: cannot open: why" (or
 * kvb_open_regular's line for a FIFO, device or directory) on failure. */
char *kvb_read_file(const char *path, size_t *len, char *err, size_t err_len);
/* Write text to path atomically: a temporary file of this writer's own beside it (PATH.tmp.PID.N, created
 * exclusively, so two writers never share one), fsync, rename. 0 or -1 + err (the temporary is removed). */
int kvb_write_file_atomic(const char *path, const char *text, char *err, size_t err_len);
/* An exclusive lock on path (created if absent), waiting while another process holds it: a POSIX record lock
 * (fcntl), which NFS also honours across nodes. Returns the descriptor that holds it (kvb_unlock_file releases
 * it), or -1 + err. A process must not lock the same path twice: closing either descriptor drops both. */
int kvb_lock_file(const char *path, char *err, size_t err_len);
void kvb_unlock_file(int fd);

/* The file inside a directory that kvb_lock_dir locks. */
#define KVB_DIR_LOCK_NAME "kvbench.lock"
/* Hold directory dir for this process alone, without waiting: flock(LOCK_EX | LOCK_NB) on dir/kvbench.lock
 * (created if absent, left in place), which then holds the holder's pid. Returns the descriptor that holds it
 * (kvb_unlock_dir releases it; so does the process's exit, however it ends), or -1 + one line; when another
 * process holds it: "DIR is in use by another kvbench (pid N holds DIR/kvbench.lock)", or "DIR is in use by
 * another process (it holds DIR/kvbench.lock)" when the file names no live process (a holder that is not kvbench,
 * a pid left by a killed one). */
int kvb_lock_dir(const char *dir, char *err, size_t err_len);
/* Release kvb_lock_dir's lock (the pid in the file is cleared first). */
void kvb_unlock_dir(int fd);

#endif
