/* test_fsutil.c — the shared file helpers (base/fsutil.h): mkdir -p, whole-file reads of any size and of
 * binary content, the atomic write that either replaces a file whole or leaves the old one untouched (with a
 * temporary of its own), opens that refuse a FIFO, a device or a directory, the lock another process waits on and
 * the folder lock it is refused. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "base/fsutil.h"

static char dir[64] = "/tmp/kvb_fsutil_XXXXXX";
static char err[512];

static const char *path_in(const char *name) {
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* Files in the test folder whose names start with prefix. */
static int count_prefixed(const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Every missing level is made; existing ones and a trailing slash are fine; a file in the way, or a path longer
 * than the helper's buffer, is -1 with errno. */
static void test_mkdirs_makes_every_level_and_reports_a_file_in_the_way(void) {
    CU_ASSERT(kvb_mkdirs(path_in("a/b/c")) == 0 && is_dir(path_in("a/b/c")));
    CU_ASSERT(kvb_mkdirs(path_in("a/b/c")) == 0);
    CU_ASSERT(kvb_mkdirs(path_in("a/b/d/")) == 0 && is_dir(path_in("a/b/d")));
    FILE *f = fopen(path_in("a/file"), "w");
    CU_ASSERT_FATAL(f != NULL);
    fclose(f);
    errno = 0;
    CU_ASSERT(kvb_mkdirs(path_in("a/file/x")) == -1 && errno == ENOTDIR);
    char long_path[1200];
    memset(long_path, 'x', sizeof long_path - 1);
    long_path[0] = '/', long_path[sizeof long_path - 1] = 0;
    errno = 0;
    CU_ASSERT(kvb_mkdirs(long_path) == -1 && errno == ENAMETOOLONG);
}

/* The whole file whatever its size (past the 64 KiB read steps) and content (NUL bytes), NUL-terminated; an
 * empty file is "" of length 0. */
static void test_read_file_returns_every_byte(void) {
    size_t n = 300000;
    unsigned char *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (unsigned char)(i * 131 + (i >> 9));
    FILE *f = fopen(path_in("big.bin"), "wb");
    CU_ASSERT_FATAL(f && fwrite(data, 1, n, f) == n);
    fclose(f);
    size_t len = 0;
    char *got = kvb_read_file(path_in("big.bin"), &len, err, sizeof err);
    CU_ASSERT_FATAL(got != NULL);
    CU_ASSERT(len == n && !memcmp(got, data, n) && got[n] == 0);
    free(got);
    free(data);
    f = fopen(path_in("empty"), "w");
    fclose(f);
    got = kvb_read_file(path_in("empty"), &len, err, sizeof err);
    CU_ASSERT(got && got[0] == 0 && len == 0);
    free(got);
    got = kvb_read_file(path_in("empty"), NULL, err, sizeof err); /* len may be NULL */
    CU_ASSERT(got != NULL);
    free(got);
}

/* A missing file and a directory are NULL with one line naming the path. */
static void test_read_file_failures_name_the_path(void) {
    CU_ASSERT(kvb_read_file(path_in("missing.txt"), NULL, err, sizeof err) == NULL);
    char want[300];
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path_in("missing.txt"));
    CU_ASSERT_STRING_EQUAL(err, want);
    CU_ASSERT_FATAL(kvb_mkdirs(path_in("adir")) == 0);
    err[0] = 0;
    CU_ASSERT(kvb_read_file(path_in("adir"), NULL, err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, path_in("adir")) != NULL && !strchr(err, '\n'));
}

/* The new text replaces the old one whole, and no .tmp file stays behind. */
static void test_atomic_write_replaces_the_file_whole(void) {
    const char *p = path_in("profile.json");
    CU_ASSERT_FATAL(kvb_write_file_atomic(p, "first version, longer than the second\n", err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_write_file_atomic(p, "second\n", err, sizeof err) == 0);
    char *got = util_read_file(p, NULL);
    CU_ASSERT(got && !strcmp(got, "second\n"));
    free(got);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CU_ASSERT(access(tmp, F_OK) != 0);
}

/* A write that cannot happen (here: the file size limit stops it half-way, in a child; or the directory is
 * missing) is -1 with one line naming the file, the old content is still there and no temporary stays behind. */
static void test_failed_atomic_write_leaves_the_old_file(void) {
    const char *p = path_in("keep.json");
    CU_ASSERT_FATAL(kvb_write_file_atomic(p, "old\n", err, sizeof err) == 0);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        struct rlimit lim = {4, 4};
        signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead of killing the writer */
        if (setrlimit(RLIMIT_FSIZE, &lim)) _exit(2);
        int rc = kvb_write_file_atomic(p, "new, longer than four bytes\n", err, sizeof err);
        _exit(rc == -1 && strstr(err, p) && !strchr(err, '\n') ? 0 : 1);
    }
    int st = 0;
    CU_ASSERT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *got = util_read_file(p, NULL);
    CU_ASSERT(got && !strcmp(got, "old\n"));
    free(got);
    CU_ASSERT(count_prefixed("keep.json.tmp") == 0);
    CU_ASSERT(kvb_write_file_atomic(path_in("no/such/dir/x.json"), "x", err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "no/such/dir/x.json") && strstr(err, "No such file or directory"));
}

/* Two writers of one file never share a temporary: one's PATH.tmp (the name every writer used before, so two
 * runs wrote run.json.tmp over each other) is left alone by the other, whose write still lands whole. */
static void test_atomic_writers_do_not_share_a_temporary(void) {
    const char *p = path_in("run.json"), *other = path_in("run.json.tmp");
    FILE *f = fopen(other, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("another writer's half-written text", f);
    fclose(f);
    CU_ASSERT_FATAL(kvb_write_file_atomic(p, "mine\n", err, sizeof err) == 0);
    char *got = util_read_file(p, NULL), *theirs = util_read_file(other, NULL);
    CU_ASSERT(got && !strcmp(got, "mine\n"));
    CU_ASSERT(theirs && !strcmp(theirs, "another writer's half-written text"));
    free(got), free(theirs);
    unlink(other);
    CU_ASSERT(count_prefixed("run.json.tmp") == 0);
}

/* A FIFO (or a directory, or a device) where a file is read is refused at once with one line naming it and its
 * kind; open() on a FIFO without a writer used to block forever (the child would be killed by its alarm). */
static void test_reads_refuse_what_is_not_a_regular_file(void) {
    const char *fifo = path_in("results.fifo");
    CU_ASSERT_FATAL(mkfifo(fifo, 0644) == 0);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        alarm(10);
        char *t = kvb_read_file(fifo, NULL, err, sizeof err);
        int ok = !t && strstr(err, fifo) && strstr(err, "is a FIFO, not a regular file") && !strchr(err, '\n');
        FILE *f = kvb_fopen_regular(fifo, err, sizeof err);
        ok = ok && !f && strstr(err, "is a FIFO");
        ok = ok && kvb_open_regular(fifo, O_WRONLY | O_APPEND | O_CREAT, 0644, err, sizeof err) < 0 && strstr(err, "is a FIFO");
        ok = ok && kvb_open_regular("/dev/zero", O_RDONLY, 0, err, sizeof err) < 0 && strstr(err, "is a character device");
        ok = ok && kvb_open_regular(dir, O_RDONLY, 0, err, sizeof err) < 0 && strstr(err, "is a directory");
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    CU_ASSERT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int fd = kvb_open_regular(path_in("plain"), O_WRONLY | O_CREAT | O_APPEND, 0644, err, sizeof err);
    CU_ASSERT(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK)); /* a regular file opens, blocking as usual */
    if (fd >= 0) close(fd);
}

/* A second process asking for a held lock waits until it is released (the profile lock of shards, methods/profile.h):
 * the child finds the marker the parent writes just before unlocking. A lock file it cannot create is an error. */
static void test_lock_waits_for_the_holder(void) {
    int fd = kvb_lock_file(path_in("x.lock"), err, sizeof err);
    CU_ASSERT_FATAL(fd >= 0);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        int cfd = kvb_lock_file(path_in("x.lock"), err, sizeof err);
        _exit(cfd >= 0 && access(path_in("released"), F_OK) == 0 ? 0 : 1);
    }
    usleep(300 * 1000); /* the child is waiting by now */
    CU_ASSERT(kvb_write_file_atomic(path_in("released"), "1", err, sizeof err) == 0);
    kvb_unlock_file(fd);
    int st = 0;
    CU_ASSERT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CU_ASSERT(kvb_lock_file(path_in("no/such/dir/x.lock"), err, sizeof err) == -1 && strstr(err, "no/such/dir/x.lock"));
}

/* A run's folder is held by one process at a time and nobody waits for it: a second process is refused at once,
 * with one line naming the folder, the holder's pid and the lock file; once released, the next one gets it. */
static void test_dir_lock_refuses_a_second_holder_naming_the_first(void) {
    CU_ASSERT_FATAL(kvb_mkdirs(path_in("run")) == 0);
    int fd = kvb_lock_dir(path_in("run"), err, sizeof err);
    CU_ASSERT_FATAL(fd >= 0);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        alarm(10);
        char want[64];
        snprintf(want, sizeof want, "pid %ld holds ", (long)getppid());
        int cfd = kvb_lock_dir(path_in("run"), err, sizeof err);
        _exit(cfd < 0 && strstr(err, "is in use by another kvbench") && strstr(err, want) &&
                      strstr(err, path_in("run/" KVB_DIR_LOCK_NAME)) && !strchr(err, '\n') ? 0 : 1);
    }
    int st = 0;
    CU_ASSERT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    kvb_unlock_dir(fd);
    char *left = util_read_file(path_in("run/" KVB_DIR_LOCK_NAME), NULL);
    CU_ASSERT(left && !left[0]); /* released: no pid to name */
    free(left);
    /* held by a program that is not kvbench (flock(1)), the file naming a pid no process has: no pid is named */
    FILE *f = fopen(path_in("run/" KVB_DIR_LOCK_NAME), "w");
    fputs("2147483646\n", f);
    fclose(f);
    int other = open(path_in("run/" KVB_DIR_LOCK_NAME), O_RDONLY);
    CU_ASSERT_FATAL(other >= 0 && flock(other, LOCK_EX) == 0);
    child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0)
        _exit(kvb_lock_dir(path_in("run"), err, sizeof err) < 0 && strstr(err, "is in use by another process (it holds ") &&
                      !strstr(err, "pid") ? 0 : 1);
    CU_ASSERT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(other);
    child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) _exit(kvb_lock_dir(path_in("run"), err, sizeof err) >= 0 ? 0 : 1);
    CU_ASSERT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CU_ASSERT(kvb_lock_dir(path_in("no/such/dir"), err, sizeof err) == -1 && strstr(err, "no/such/dir"));
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("fsutil", NULL, NULL);
    CU_add_test(s, "mkdirs makes every level, reports a file in the way", test_mkdirs_makes_every_level_and_reports_a_file_in_the_way);
    CU_add_test(s, "read_file returns every byte", test_read_file_returns_every_byte);
    CU_add_test(s, "read_file failures name the path", test_read_file_failures_name_the_path);
    CU_add_test(s, "atomic write replaces the file whole", test_atomic_write_replaces_the_file_whole);
    CU_add_test(s, "failed atomic write leaves the old file", test_failed_atomic_write_leaves_the_old_file);
    CU_add_test(s, "a lock waits for its holder", test_lock_waits_for_the_holder);
    CU_add_test(s, "atomic writers do not share a temporary", test_atomic_writers_do_not_share_a_temporary);
    CU_add_test(s, "reads refuse what is not a regular file", test_reads_refuse_what_is_not_a_regular_file);
    CU_add_test(s, "a folder lock refuses a second holder, naming the first", test_dir_lock_refuses_a_second_holder_naming_the_first);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
