/* fsutil.c — see fsutil.h. */
#include "base/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

char *kvb_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int kvb_mkdirs(const char *dir) {
    char tmp[1024];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", dir) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

static const char *kind_of(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "something else";
}

int kvb_open_regular(const char *path, int flags, int mode, char *err, size_t err_len) {
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC, mode);
    struct stat sb;
    if (fd < 0) {
        int e = errno; /* a FIFO without a reader (ENXIO) or a directory opened for writing (EISDIR) */
        if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
            snprintf(err, err_len, "%s: is %s, not a regular file", path, kind_of(sb.st_mode));
        else snprintf(err, err_len, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        if (S_ISREG(sb.st_mode)) snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        else snprintf(err, err_len, "%s: is %s, not a regular file", path, kind_of(sb.st_mode));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

FILE *kvb_fopen_regular(const char *path, char *err, size_t err_len) {
    int fd = kvb_open_regular(path, O_RDONLY, 0, err, err_len);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

char *kvb_read_file(const char *path, size_t *len, char *err, size_t err_len) {
    FILE *f = kvb_fopen_regular(path, err, err_len);
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 65536 * 2;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                snprintf(err, err_len, "%s: out of memory", path);
                return NULL;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        snprintf(err, err_len, "%s: read error", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int kvb_write_file_atomic(const char *path, const char *text, char *err, size_t err_len) {
    static unsigned long seq; /* threads of one process get their own names too */
    size_t cap = strlen(path) + 64;
    char *tmp = malloc(cap);
    if (!tmp) {
        snprintf(err, err_len, "cannot write %s: out of memory", path);
        return -1;
    }
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) { /* a name left by a killed writer of a reused pid: the next */
        snprintf(tmp, cap, "%s.tmp.%ld.%lu", path, (long)getpid(), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    int ok = fd >= 0 && write_all(fd, text, strlen(text)) == 0 && fsync(fd) == 0;
    int e = errno;
    if (fd >= 0 && close(fd) && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path)) ok = 0, e = errno;
    if (!ok) {
        snprintf(err, err_len, "cannot write %s: %s", path, strerror(e));
        if (fd >= 0) unlink(tmp);
    }
    free(tmp);
    return ok ? 0 : -1;
}

int kvb_lock_file(const char *path, char *err, size_t err_len) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, err_len, "cannot open lock file %s: %s", path, strerror(errno));
        return -1;
    }
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    int rc;
    while ((rc = fcntl(fd, F_SETLKW, &lk)) != 0 && errno == EINTR) {}
    if (rc) {
        snprintf(err, err_len, "cannot lock %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

void kvb_unlock_file(int fd) {
    if (fd >= 0) close(fd); /* closing releases the process's record locks on the file, and its flock */
}

void kvb_unlock_dir(int fd) {
    if (fd >= 0 && ftruncate(fd, 0)) {} /* no pid left to name once released; the lock goes with the close */
    kvb_unlock_file(fd);
}

int kvb_lock_dir(const char *dir, char *err, size_t err_len) {
    size_t cap = strlen(dir) + sizeof "/" KVB_DIR_LOCK_NAME;
    char *path = malloc(cap);
    if (!path) {
        snprintf(err, err_len, "cannot lock %s: out of memory", dir);
        return -1;
    }
    snprintf(path, cap, "%s/" KVB_DIR_LOCK_NAME, dir);
    int fd = kvb_open_regular(path, O_RDWR | O_CREAT, 0644, err, err_len), rc = -1;
    while (fd >= 0 && (rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {}
    if (fd >= 0 && rc) {
        if (errno == EWOULDBLOCK) {
            long holder = 0;
            /* the holder writes its pid just after locking; a pid left by a holder that was killed, or a lock taken by
             * another program (flock(1)), names no live process: no pid then, rather than a wrong one */
            for (int tries = 0; tries < 100 && holder <= 0; tries++) {
                char pid[32] = "";
                ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
                pid[n > 0 ? n : 0] = 0;
                holder = strtol(pid, NULL, 10);
                if (holder > 0 && kill((pid_t)holder, 0) && errno != EPERM) holder = 0;
                if (holder <= 0) usleep(2000);
            }
            if (holder > 0) snprintf(err, err_len, "%s is in use by another kvbench (pid %ld holds %s)", dir, holder, path);
            else snprintf(err, err_len, "%s is in use by another process (it holds %s)", dir, path);
        } else snprintf(err, err_len, "cannot lock %s: %s", path, strerror(errno));
        close(fd);
        fd = -1;
    } else if (fd >= 0) { /* the holder's pid, for the message of whoever comes second */
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n) {} /* the lock holds without it */
    }
    free(path);
    return fd;
}
