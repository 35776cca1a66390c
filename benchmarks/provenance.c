/* provenance.c — a run's provenance (provenance.h). The commit is read from KVB_SOURCE_DIR (the source tree
 * the binary was built from, else the one it was configured in), not the working directory, so a run
 * started elsewhere (a Slurm job's spool directory) still names its code. */
#include "benchmarks/provenance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "kernels/backend.h"
#include "kvb_build_info.h"

#ifndef KVB_BUILT_SOURCE_DIR
#define KVB_BUILT_SOURCE_DIR "."
#endif
#ifndef KVB_BUILD_FLAGS
#define KVB_BUILD_FLAGS "unknown"
#endif

/* First line of a shell command's output, or -1. */
static int first_line(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int ok = fgets(out, (int)cap, p) != NULL;
    pclose(p);
    if (!ok) return -1;
    out[strcspn(out, "\n")] = 0;
    return out[0] ? 0 : -1;
}

static void cpu_name(char *out, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) continue;
        for (v++; *v == ' ' || *v == '\t'; v++) {}
        snprintf(out, cap, "%s", v);
        out[strcspn(out, "\n")] = 0;
        break;
    }
    if (f) fclose(f);
}

const char *kvb_provenance_version(void) {
    static char line[400];
    snprintf(line, sizeof line, "kvbench, commit %s%s, built %s", KVB_BUILT_COMMIT,
             KVB_BUILT_DIRTY == 1 ? " with uncommitted changes" : "", KVB_BUILD_FLAGS);
    return line;
}

void kvb_provenance_add(cJSON *j, const char *backend) {
    /* the commit the binary was built from (cmake/build_info.cmake); the checkout's, when a run's KVB_SOURCE_DIR
     * (or the build's source folder) is now at another commit, beside it */
    const char *src = getenv("KVB_SOURCE_DIR");
    if (!src || !*src) src = KVB_BUILT_SOURCE_DIR;
    char cmd[1400], commit[64] = "unknown", host[300] = "unknown", device[256] = "unknown";
    cJSON_AddStringToObject(j, "git_commit", KVB_BUILT_COMMIT);
    if (KVB_BUILT_DIRTY >= 0) cJSON_AddBoolToObject(j, "git_dirty", KVB_BUILT_DIRTY);
    else cJSON_AddNullToObject(j, "git_dirty");
    snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse --short=12 HEAD 2>/dev/null", src);
    if (!strchr(src, '\'') && first_line(cmd, commit, sizeof commit) == 0 && strcmp(commit, KVB_BUILT_COMMIT))
        cJSON_AddStringToObject(j, "checkout_commit", commit);
    cJSON_AddStringToObject(j, "build_flags", KVB_BUILD_FLAGS);
    cJSON_AddStringToObject(j, "backend", backend ? backend : "cpu");
    if (backend && !strcmp(backend, "cuda"))
        first_line("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null", device, sizeof device);
    else cpu_name(device, sizeof device);
    cJSON_AddStringToObject(j, "device", device);
#ifdef KVB_HAVE_CUDA
    if (backend && !strcmp(backend, "cuda")) cJSON_AddStringToObject(j, "cuda_kernels", kvb_cuda_kernels());
#endif
    struct utsname u;
    if (uname(&u) == 0) snprintf(host, sizeof host, "%s %s %s", u.nodename, u.sysname, u.machine);
    cJSON_AddStringToObject(j, "host", host);
}
