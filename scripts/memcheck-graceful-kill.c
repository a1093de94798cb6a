// Preloaded (LD_PRELOAD) into the test binaries by scripts/memcheck.sh only.
//
// The test harness stops a server when its `Server` is dropped with SIGKILL
// (std's Child::kill), and valgrind writes no leak report for a process that
// is SIGKILLed. This kill() turns a SIGKILL aimed at a process running under
// valgrind memcheck (/proc/<pid>/exe is valgrind's memcheck-* tool) into a
// SIGTERM (the server runs with --shutdown-on-sigterm now force, so it shuts
// down and exits normally and valgrind does its leak check), waits until the
// process has exited (a zombie, which the caller then reaps as usual), and
// sends the SIGKILL after all when that takes more than
// MEMCHECK_STOP_TIMEOUT seconds (default 120). Every other kill() is untouched.
//
// Build: cc -shared -fPIC -O2 -o graceful-kill.so memcheck-graceful-kill.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

typedef int (*kill_fn)(pid_t, int);

static kill_fn real_kill(void) {
    static kill_fn fn;
    if (!fn) fn = (kill_fn)dlsym(RTLD_NEXT, "kill");
    return fn;
}

static int under_memcheck(pid_t pid) {
    char path[64], exe[4096];
    snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(path, exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = '\0';
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    return strncmp(base, "memcheck-", 9) == 0;
}

// The state letter of /proc/<pid>/stat ('Z' for a zombie), 0 when gone.
static char state_of(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' ? paren[2] : 0;
}

int kill(pid_t pid, int sig) {
    if (sig != SIGKILL || pid <= 0 || !under_memcheck(pid)) return real_kill()(pid, sig);
    if (real_kill()(pid, SIGTERM) != 0) return real_kill()(pid, sig);
    const char *env = getenv("MEMCHECK_STOP_TIMEOUT");
    double timeout = env && *env ? atof(env) : 120.0;
    struct timespec start, now, pause = {0, 20 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        char state = state_of(pid);
        if (state == 0 || state == 'Z' || state == 'X') return 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 > timeout) break;
        nanosleep(&pause, NULL);
    }
    fprintf(stderr, "memcheck: pid %d still running %.0f s after SIGTERM, sending SIGKILL\n",
            (int)pid, timeout);
    return real_kill()(pid, SIGKILL);
}
