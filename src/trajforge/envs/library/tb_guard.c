/* The guard of terminal_bench's verifier: preloaded (LD_PRELOAD) into test.sh's bash, and only
 * into it, by tb_verify.py. Built on the host by tb_guard.py with its C compiler.
 *
 * Why: test.sh and the programs it runs (the agent's among them) share a uid and a process
 * lineage, so no uid, Landlock domain or mount separates them; what does is exec. tb_verify.py
 * hands test.sh's bash the verdict files (anonymous memory files: no path reaches them) as two
 * file descriptors, and /logs/verifier/reward.txt and reward.json are links to /proc/self/fd/N.
 * Before bash runs a line of test.sh, this constructor
 *   - makes those descriptors close-on-exec: the shell and its subshells (forks that have not
 *     exec'd) keep them, so `echo 1 > /logs/verifier/reward.txt` in test.sh works, while a
 *     program it execs starts without them;
 *   - makes bash non-dumpable: no other process of the uid can open /proc/BASH/fd/N, read its
 *     memory or ptrace it (only CAP_SYS_PTRACE could, which nothing in the sandbox has); its
 *     forks inherit that, exec'd programs do not;
 *   - removes LD_PRELOAD and its own variable from the environment, so nothing test.sh starts
 *     loads it;
 *   - says so on the ready descriptor, then closes it: tb_verify.py trusts nothing of a run whose
 *     guard did not say it took (a preload the loader refused is only a warning on stderr); when
 *     one of these steps fails, bash exits (126) before test.sh starts.
 *
 * TF_VERDICT_GUARD="FD FD ... READY": the descriptors to keep, then the ready one.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define GUARD_VAR "TF_VERDICT_GUARD"

extern char **environ;

/* NAME's value in the environment; removed from it when `drop`. Not getenv/unsetenv: bash defines
 * its own (on its variable table, not built yet when this runs), and the executable's win. */
static const char *env_take(const char *name, int drop) {
    size_t len = strlen(name);
    const char *value = NULL;
    for (char **e = environ; e && *e;) {
        if (!strncmp(*e, name, len) && (*e)[len] == '=') {
            value = *e + len + 1;
            if (drop) {
                for (char **d = e; *d; d++)
                    d[0] = d[1];
                continue;
            }
        }
        e++;
    }
    return value;
}

__attribute__((constructor)) static void verdict_guard(void) {
    const char *spec = env_take(GUARD_VAR, 0);
    if (!spec)
        return;
    int fds[16], n = 0, ok = 1;
    for (const char *p = spec; *p && n < 16;) {
        char *end;
        long fd = strtol(p, &end, 10);
        if (end == p || fd < 0 || fd > 65535) {
            ok = 0;
            break;
        }
        fds[n++] = (int)fd;
        p = end;
        while (*p == ' ')
            p++;
    }
    if (n < 2)
        ok = 0;
    int ready = n ? fds[n - 1] : -1;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        ok = 0;
    for (int i = 0; ok && i < n - 1; i++)
        if (fcntl(fds[i], F_SETFD, FD_CLOEXEC) != 0 || !(fcntl(fds[i], F_GETFD) & FD_CLOEXEC))
            ok = 0;
    env_take("LD_PRELOAD", 1);
    env_take(GUARD_VAR, 1); /* `spec` is not read after this */
    if (!ok)
        _exit(126); /* nothing of test.sh runs unguarded */
    ssize_t w = write(ready, "ok\n", 3);
    (void)w;
    close(ready);
}
