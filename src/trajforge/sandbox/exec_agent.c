/* The exec agent: a small program that runs inside each sandbox and executes commands. It is
 * trajforge's only exec agent, in every backend (bwrap, local, docker); trajforge.sandbox.native_agent
 * compiles it with the host's cc at a factory's first sandbox (statically for docker).
 *
 * Why a resident agent instead of one ``bash -c`` per call: the model expects a *shell session*,
 * background jobs must outlive the call that started them, and the output of a runaway command must
 * be capped *where it is produced* so 50 MB never crosses into the host's memory. One agent per
 * sandbox, started once, talking JSON lines over stdin/stdout.
 *
 * Why C (docs/architecture.md, "One exec agent"): the agent lives as long as its sandbox, and at a
 * thousand live sandboxes its memory is most of the machine's: this program holds ~0.2 MiB of private
 * memory where the CPython agent it replaced held ~3.7 MiB, and makes its system calls directly
 * (docs/benchmarks.md); linked statically it runs in images without python. What keeps C safe to
 * keep: tests/test_native_agent.py states its answers, and tests/test_agent_sanitized.py builds it
 * with AddressSanitizer and UBSan, runs those scenarios, and fuzzes its request parser and output
 * paths with generated lines (no sanitizer report allowed); -Werror -Wshadow -Wformat=2 in the tests.
 *
 * Protocol (one JSON object per line; the first line out is ``{"ready": true, "pid": N}``):
 *   request  ``{"id": n, "op": "exec", "command": str, "timeout": float, "cwd": str|null, "cap": int}``
 *            (``"fresh": true``: a bash of its own, outside the session: a verifier's command;
 *            timeout 0 or absent: 60 s; cap 0 or absent: 16384 bytes, a negative cap keeps nothing)
 *   answer   ``{"id": n, "exit_code": int|null, "output": str, "notes": [str], "timed_out": bool,
 *              "truncated": bool, "output_bytes": int, "duration_s": float}``; ``exit_code`` is null
 *            at a timeout and -N when a signal N ended the command; ``output`` is what the command
 *            printed, stdout and stderr interleaved, nothing of the agent's in it but the cap's
 *            elision: the first cap/2 bytes and the last cap - cap/2 around the line
 *            ``[... K bytes of output omitted (T total) ...]``, each part decoded as UTF-8 with one
 *            U+FFFD per maximal invalid subpart (what Python's ``decode("utf-8", "replace")`` gives);
 *            ``output_bytes`` counts what it printed. ``notes``: the agent's own sentences about the
 *            command (agent_scripts.py: the shell ended or was restarted, the process limit was
 *            reached and everything killed, a missing cwd, a forged status line), never inside
 *            ``output`` and never counted by the cap; at most 8 of at most 1024 bytes each
 *   answer   ``{"id": n, "error": "Kind: text"}`` when the exec cannot run (no ``command``, a
 *            command with a lone surrogate other than U+DC80..U+DCFF, its file not writable): the
 *            host's reason to discard the sandbox, never shown to the model
 *   request  ``{"id": n, "op": "close"}`` -> kills every process group it started, answers
 *            ``{"id": n, "closed": true}``, exits 0.
 *   request  ``{"id": n, "op": "stop"}`` -> kills every process the commands started, files kept;
 *            ``{"id": n, "stopped": true}``.
 *   request  ``{"id": n, "op": "reset"}`` -> ``{"id": n, "reset": bool, "reason": str}``: puts a
 *            reusable sandbox back into its starting state (do_reset), or says why not.
 *   Any other op is an exec. The id is echoed as it came (a JSON value of at most 63 characters,
 *   else null). A blank line is skipped. A line that is not one JSON object (a syntax error, a
 *   string field that is not a string or null, values nested over 64 deep, anything after the
 *   closing brace) ends the agent: ``exec agent: unreadable request: ...`` on stderr, every process
 *   killed, exit 1 (the host speaks the protocol; anything else means the channel is not the
 *   host's); so does a line over 64 MiB (``exec agent: a request line over ...``). End of stdin:
 *   the same kill, exit 0.
 *
 * The session is one resident ``bash`` (TF_LOOP, agent_scripts.py), started at the first command as
 * the commands' uid in a session of its own, that runs each command in itself as ``bash -c`` would:
 * functions, aliases, plain and exported variables, options, traps, the cwd and a ``source``d
 * virtualenv all stay, as in a terminal, and nothing of the loop shows to the command. Each
 * command's output goes to a FIFO of its own (capped here); its end is the shell's ``NONCE RC`` line
 * on the shell's channel, a socket pair apart from the output, the nonce fresh per command, so no
 * output can end a command early, and only the shell's own process (the kernel says which process
 * sent each line: SO_PASSCRED) can end it at all. At its timeout the command's processes and the
 * shell are killed and the next command gets a new shell sourced from the snapshot the loop writes
 * after every command; the same when a command ends the shell (``exit``, ``set -e``, ``set -u``,
 * ``exec``, a signal: the note says the session is the one from before the command). A reset kills
 * the shell with everything else: each rollout starts with a new ``bash`` from the start environment.
 *
 * Who can reach the agent: with ``--run-as UID:GID`` (bwrap started as root) the agent itself is uid
 * 0 with a handful of capabilities (setuid/setgid to start commands, kill, fowner/dac_override/chown
 * to reset what commands leave) and ``no_new_privs``; every command runs as UID, which the kernel
 * strips of all capabilities on the switch. A command can then neither signal, trace, ``prlimit``,
 * renice nor re-pin the agent. Without ``--run-as`` (a user namespace: one uid for all) commands
 * *can* do those things to the agent; the reset then verifies the agent's own attributes and refuses
 * (the host discards the sandbox) when any changed.
 *
 * How it works:
 * - one thread: pipes that background jobs still hold are drained by the same poll() that waits
 *   for the next request or command;
 * - input is bounded: a request line of at most 64 MiB, paths read from the sandbox of at most
 *   PATH_MAX, a tree walk with an explicit stack (no recursion a deep tree could exhaust).
 *
 * The Python agent this program was first written against (exec_agent.py, removed in issue 40; its
 * docstrings hold the longer reasons behind each step) is in git: ``git show
 * 6034645:src/trajforge/sandbox/exec_agent.py``. The names in parentheses below are its functions.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/fs.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "agent_scripts.h" /* TF_LOOP, TF_WRAPPER and the notes: generated from agent_scripts.py */

#define RESTORE_S 10.0
#define GRACE_S 0.2
#define PROCS_HEADROOM 0.8
#define PROCS_LOOK 0.4
#define KILL_ONE_BY_ONE 16 /* at most this many processes left: a kill each, not kill(-1) */
#define LINE_LIMIT (64u * 1024 * 1024)
#define MAX_DRAINS 1024
#define KEYCTL_GET_KEYRING_ID_ 0
#define KEYCTL_JOIN_SESSION_KEYRING_ 1
#define KEYCTL_READ_ 11
#define KEY_SPEC_USER_ (-4)
#define KEY_SPEC_USER_SESSION_ (-5)

extern char **environ;

/* ------------------------------------------------------------------ buffers and errors */

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

static void die(const char *what) {
    fprintf(stderr, "exec agent: %s\n", what);
    _exit(70);
}

static void buf_reserve(buf_t *b, size_t more) {
    if (b->n + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more + 1) {
        if (cap > SIZE_MAX / 2)
            die("out of memory");
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        die("out of memory");
    b->p = p;
    b->cap = cap;
}

static void buf_add(buf_t *b, const void *data, size_t n) {
    buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void buf_adds(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }

static void buf_printf(buf_t *b, const char *fmt, ...) {
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        die("vsnprintf failed");
    buf_reserve(b, (size_t)n);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, again);
    va_end(again);
    b->n += (size_t)n;
}

static void buf_clear(buf_t *b) {
    b->n = 0;
    if (b->p)
        b->p[0] = 0;
}

static void buf_free(buf_t *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d)
        die("out of memory");
    return d;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die("out of memory");
    return p;
}

/* `items` (an array of `*cap` elements of `size` bytes holding `n`) with room for one more:
 * its capacity doubled when it is full. */
static void *make_room(void *items, size_t n, size_t *cap, size_t size) {
    if (n < *cap)
        return items;
    *cap *= 2;
    void *more = realloc(items, *cap * size);
    if (!more)
        die("out of memory");
    return more;
}

static char *path_join(const char *dir, const char *name) {
    buf_t b = {0};
    buf_adds(&b, dir);
    if (b.n == 0 || b.p[b.n - 1] != '/')
        buf_adds(&b, "/");
    buf_adds(&b, name);
    return b.p;
}

static size_t utf8_sequence(const unsigned char *s, size_t n, size_t *bad);

/* The backslash escape that repr() and JSON both write for `c` (a control character of the three,
 * the backslash, the string's quote), as the letter after the backslash; 0 when there is none. */
static char short_escape(unsigned char c, char quote) {
    switch (c) {
    case '\n':
        return 'n';
    case '\r':
        return 'r';
    case '\t':
        return 't';
    case '\\':
        return '\\';
    default:
        return c == (unsigned char)quote ? quote : 0;
    }
}

static void add_escape(buf_t *out, char letter) {
    char pair[2] = {'\\', letter};
    buf_add(out, pair, 2);
}

/* Python's repr() of a str, as the agent's messages quote paths (`cwd does not exist: '...'`). */
static void py_repr(buf_t *out, const char *s, size_t n) {
    int has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    buf_add(out, &quote, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char letter = short_escape(c, quote);
        if (letter)
            add_escape(out, letter);
        else if (c < 0x20 || c == 0x7f)
            buf_printf(out, "\\x%02x", c);
        else if (c >= 0x80) {
            size_t bad = 0, len = utf8_sequence((const unsigned char *)s + i, n - i, &bad);
            if (len) { /* a character: shown as it is */
                buf_add(out, s + i, len);
                i += len - 1;
            } else {
                buf_printf(out, "\\udc%02x", c); /* as surrogateescape shows an undecodable byte */
            }
        } else
            buf_add(out, &c, 1);
    }
    buf_add(out, &quote, 1);
}

/* An OSError's text as Python writes it: "[Errno 2] No such file or directory: '/x'". */
static void os_error(buf_t *out, int err, const char *path) {
    buf_clear(out);
    buf_printf(out, "[Errno %d] %s", err, strerror(err));
    if (path) {
        buf_adds(out, ": ");
        py_repr(out, path, strlen(path));
    }
}

/* After a failed call: close both ends of `pair`, say why in `why`; -1 with errno kept. */
static int fail_closing(int pair[2], buf_t *why) {
    int e = errno;
    close(pair[0]);
    close(pair[1]);
    os_error(why, e, NULL);
    errno = e;
    return -1;
}

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int write_all(int fd, const char *data, size_t n) {
    while (n) {
        ssize_t w = write(fd, data, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A small kernel-generated file's text ('' when it cannot be read). */
static void read_text(const char *path, buf_t *out) {
    buf_clear(out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char chunk[65536];
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r < 0)
                buf_clear(out);
            break;
        }
        buf_add(out, chunk, (size_t)r);
    }
    close(fd);
}

/* ASCII whitespace as str.strip() sees it (strchr would count the NUL byte as one). */
static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

static void strip(buf_t *b) {
    if (!b->p)
        return;
    size_t start = 0;
    while (start < b->n && is_space(b->p[start]))
        start++;
    size_t end = b->n;
    while (end > start && is_space(b->p[end - 1]))
        end--;
    memmove(b->p, b->p + start, end - start);
    b->n = end - start;
    b->p[b->n] = 0;
}

/* "-123" or "123": Python's int() of what the loop writes (a number), else 0. */
static int parse_int(const char *s, long long *value) {
    const char *p = s;
    if (*p == '-')
        p++;
    if (!*p)
        return 0;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return 0;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return 0;
    *value = v;
    return 1;
}

/* ------------------------------------------------------------------ UTF-8 and JSON out */

/* Length of the valid UTF-8 sequence at s (1-4), or 0 with *bad = the maximal invalid subpart. */
static size_t utf8_sequence(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        unsigned char min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
        if (i >= n || s[i] < min || s[i] > max) {
            *bad = i;
            return 0;
        }
    }
    return need + 1;
}

/* bytes -> a JSON string of their text decoded as Python's decode("utf-8", "replace") does. */
static void json_text(buf_t *out, const char *data, size_t n) {
    const unsigned char *s = (const unsigned char *)data;
    buf_reserve(out, n + n / 8 + 2);
    buf_adds(out, "\"");
    size_t i = 0;
    while (i < n) {
        size_t bad = 0, len = utf8_sequence(s + i, n - i, &bad);
        if (!len) {
            buf_adds(out, "\xEF\xBF\xBD");
            i += bad;
            continue;
        }
        unsigned char c = s[i];
        char letter = 0;
        if (len > 1)
            buf_add(out, s + i, len);
        else if ((letter = short_escape(c, '"')))
            add_escape(out, letter);
        else if (c < 0x20)
            buf_printf(out, "\\u%04x", c);
        else
            buf_add(out, &c, 1);
        i += len;
    }
    buf_adds(out, "\"");
}

/* ------------------------------------------------------------------ JSON in: one flat request */

typedef struct {
    char id[64]; /* the id's JSON token, echoed back as sent ("null" when absent) */
    buf_t op, command, cwd;
    int has_op, has_command, has_cwd, fresh;
    double timeout;
    long long cap;
    buf_t error; /* why the request cannot be run (Python's exception text) */
} request_t;

typedef struct {
    const char *p, *end;
} scan_t;

static void skip_ws(scan_t *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        *v <<= 4;
        if (c >= '0' && c <= '9')
            *v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            *v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            *v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    return 1;
}

static void put_utf8(buf_t *out, unsigned cp) {
    unsigned char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | cp >> 6);
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | cp >> 12);
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | cp >> 18);
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    buf_add(out, b, n);
}

/* A JSON string at s->p into `out` as the bytes the host's text stands for: UTF-8, with a lone
 * surrogate U+DC80..U+DCFF written as the byte it escapes (``surrogateescape``). Returns 0 on a
 * syntax error, -1 on another lone surrogate (Python cannot encode it), 1 when done. */
static int scan_string(scan_t *s, buf_t *out) {
    if (s->p >= s->end || *s->p != '"')
        return 0;
    s->p++;
    int result = 1;
    while (s->p < s->end) {
        char c = *s->p++;
        if (c == '"')
            return result;
        if ((unsigned char)c < 0x20)
            return 0;
        if (c != '\\') {
            buf_add(out, &c, 1);
            continue;
        }
        if (s->p >= s->end)
            return 0;
        c = *s->p++;
        switch (c) {
        case '"': case '\\': case '/': buf_add(out, &c, 1); break;
        case 'b': buf_adds(out, "\b"); break;
        case 'f': buf_adds(out, "\f"); break;
        case 'n': buf_adds(out, "\n"); break;
        case 'r': buf_adds(out, "\r"); break;
        case 't': buf_adds(out, "\t"); break;
        case 'u': {
            unsigned cp;
            if (s->end - s->p < 4 || !hex4(s->p, &cp))
                return 0;
            s->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u') {
                unsigned low;
                if (hex4(s->p + 2, &low) && low >= 0xDC00 && low <= 0xDFFF) {
                    s->p += 6;
                    put_utf8(out, 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00));
                    break;
                }
            }
            if (cp >= 0xDC80 && cp <= 0xDCFF) {
                unsigned char byte = (unsigned char)(cp - 0xDC00);
                buf_add(out, &byte, 1);
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                result = -1;
            } else {
                put_utf8(out, cp);
            }
            break;
        }
        default:
            return 0;
        }
    }
    return 0;
}

/* A JSON number at s->p (RFC 8259's grammar: no leading zeros, no '+', no bare '.'); 0 if none. */
static int skip_number(scan_t *s) {
    const char *p = s->p, *end = s->end;
#define DIGITS_AT(q) ((q) < end && *(q) >= '0' && *(q) <= '9')
    if (p < end && *p == '-')
        p++;
    if (!DIGITS_AT(p))
        return 0;
    if (*p == '0')
        p++;
    else
        while (DIGITS_AT(p))
            p++;
    if (p < end && *p == '.') {
        if (!DIGITS_AT(p + 1))
            return 0;
        for (p++; DIGITS_AT(p); p++) {
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (!DIGITS_AT(p))
            return 0;
        while (DIGITS_AT(p))
            p++;
    }
#undef DIGITS_AT
    s->p = p;
    return 1;
}

#define MAX_DEPTH 64 /* nesting of a value the request does not read: deeper is refused, not recursed */

/* Skips one JSON value, checking its syntax (objects and arrays of the request are not read, but
 * a value echoed back -- the id -- must be JSON); 0 on a syntax error. */
static int skip_value_at(scan_t *s, int depth) {
    skip_ws(s);
    if (s->p >= s->end)
        return 0;
    char c = *s->p;
    if (c == '"') {
        buf_t junk = {0};
        int ok = scan_string(s, &junk) != 0;
        buf_free(&junk);
        return ok;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (depth >= MAX_DEPTH)
            return 0;
        s->p++;
        skip_ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                skip_ws(s);
                if (s->p >= s->end || *s->p != '"' || !skip_value_at(s, depth + 1))
                    return 0;
                skip_ws(s);
                if (s->p >= s->end || *s->p != ':')
                    return 0;
                s->p++;
            }
            if (!skip_value_at(s, depth + 1))
                return 0;
            skip_ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            if (s->p < s->end && *s->p == close) {
                s->p++;
                return 1;
            }
            return 0;
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(s->end - s->p) >= n && !strncmp(s->p, words[i], n)) {
            s->p += n;
            return 1;
        }
    }
    return skip_number(s);
}

static int skip_value(scan_t *s) { return skip_value_at(s, 0); }

static void request_free(request_t *r) {
    buf_free(&r->op);
    buf_free(&r->command);
    buf_free(&r->cwd);
    buf_free(&r->error);
}

/* The closing brace at s->p ends the line: nothing but whitespace after it. */
static int object_ends_line(scan_t *s) {
    s->p++;
    skip_ws(s);
    return s->p >= s->end;
}

/* Parses one request line; 0 when it is not one JSON object (the caller ends the agent). */
static int parse_request(const char *line, size_t n, request_t *r) {
    memset(r, 0, sizeof *r);
    strcpy(r->id, "null");
    scan_t s = {line, line + n};
    skip_ws(&s);
    if (s.p >= s.end || *s.p != '{')
        return 0;
    s.p++;
    skip_ws(&s);
    if (s.p < s.end && *s.p == '}')
        return object_ends_line(&s);
    for (;;) {
        buf_t key = {0};
        skip_ws(&s);
        if (scan_string(&s, &key) != 1) {
            buf_free(&key);
            return 0;
        }
        skip_ws(&s);
        if (s.p >= s.end || *s.p != ':') {
            buf_free(&key);
            return 0;
        }
        s.p++;
        skip_ws(&s);
        const char *value = s.p;
        const char *k = key.p ? key.p : "";
        int ok = 1;
        if (!strcmp(k, "op") || !strcmp(k, "command") || !strcmp(k, "cwd")) {
            buf_t *into = !strcmp(k, "op") ? &r->op : !strcmp(k, "command") ? &r->command : &r->cwd;
            int *has = !strcmp(k, "op") ? &r->has_op : !strcmp(k, "command") ? &r->has_command : &r->has_cwd;
            buf_clear(into);
            if (s.end - s.p >= 4 && !strncmp(s.p, "null", 4)) {
                s.p += 4;
                *has = 0;
            } else {
                int got = scan_string(&s, into);
                if (got == 0)
                    ok = 0;
                else {
                    *has = 1;
                    if (got < 0) {
                        buf_clear(&r->error);
                        buf_printf(&r->error, "UnicodeEncodeError: 'utf-8' codec can't encode a surrogate in the %s", k);
                    }
                }
            }
        } else {
            ok = skip_value(&s);
            if (ok) {
                size_t len = (size_t)(s.p - value);
                if (!strcmp(k, "id")) {
                    if (len < sizeof r->id) {
                        memcpy(r->id, value, len);
                        r->id[len] = 0;
                    }
                } else if (!strcmp(k, "timeout") || !strcmp(k, "cap")) {
                    char number[64] = {0};
                    if (len < sizeof number)
                        memcpy(number, value, len);
                    double v = strtod(number, NULL);
                    if (!strcmp(k, "timeout"))
                        r->timeout = v;
                    else
                        r->cap = v > 9e18 ? (long long)9e18 : v < -9e18 ? (long long)-9e18 : (long long)v;
                } else if (!strcmp(k, "fresh")) {
                    r->fresh = len == 4 && !strncmp(value, "true", 4);
                }
            }
        }
        buf_free(&key);
        if (!ok)
            return 0;
        skip_ws(&s);
        if (s.p < s.end && *s.p == ',') {
            s.p++;
            continue;
        }
        if (s.p < s.end && *s.p == '}')
            return object_ends_line(&s);
        return 0;
    }
}

/* ------------------------------------------------------------------ output cap */

typedef struct {
    size_t head_cap, tail_cap;
    buf_t head, tail;
    long long total;
} cap_t;

static void cap_init(cap_t *c, long long cap) {
    memset(c, 0, sizeof *c);
    if (cap < 0)
        cap = 0;
    c->head_cap = (size_t)(cap / 2);
    c->tail_cap = (size_t)cap - c->head_cap;
}

static void cap_feed(cap_t *c, const char *chunk, size_t n) {
    c->total += (long long)n;
    if (c->head.n < c->head_cap) {
        size_t room = c->head_cap - c->head.n, take = n < room ? n : room;
        buf_add(&c->head, chunk, take);
        chunk += take;
        n -= take;
    }
    if (n && c->tail_cap > 0) {
        buf_add(&c->tail, chunk, n);
        if (c->tail.n > 2 * c->tail_cap) { /* trim rarely: amortised O(1) */
            memmove(c->tail.p, c->tail.p + c->tail.n - c->tail_cap, c->tail_cap);
            c->tail.n = c->tail_cap;
        }
    }
}

/* Forget what was fed so far (it was not the command's). */
static void cap_clear(cap_t *c) {
    buf_clear(&c->head);
    buf_clear(&c->tail);
    c->total = 0;
}

/* The kept text into `out` as a JSON string; whether something was left out. */
static int cap_render(cap_t *c, buf_t *out) {
    size_t tail_len = c->tail.n < c->tail_cap ? c->tail.n : c->tail_cap;
    const char *tail = c->tail.p ? c->tail.p + c->tail.n - tail_len : "";
    buf_t all = {0};
    buf_add(&all, c->head.p ? c->head.p : "", c->head.n);
    int truncated = (long long)(c->head.n + tail_len) < c->total;
    if (truncated)
        buf_printf(&all, "\n\n[... %lld bytes of output omitted (%lld total) ...]\n\n",
                   c->total - (long long)(c->head.n + tail_len), c->total);
    buf_add(&all, tail, tail_len);
    json_text(out, all.p, all.n);
    buf_free(&all);
    return truncated;
}

static void cap_free(cap_t *c) {
    buf_free(&c->head);
    buf_free(&c->tail);
}

/* ------------------------------------------------------------------ notes

The agent's own words about a command (the shell ended, was restarted, the process limit was hit,
the cwd is missing): sent in the answer's "notes", never inside "output", so what a command printed
is exactly what it printed (a verifier reads it as such), and the output cap counts output alone.
Their own bound: at most NOTES_MAX notes of at most NOTE_MAX bytes each. */

#define NOTES_MAX 8
#define NOTE_MAX 1024

typedef struct {
    char *items[NOTES_MAX];
    size_t n;
} notes_t;

/* One note, cut at NOTE_MAX bytes (with "..."); dropped when NOTES_MAX are there already. */
static void notes_vadd(notes_t *ns, int front, const char *fmt, va_list ap) {
    if (ns->n >= NOTES_MAX)
        return;
    char *text = xcalloc(NOTE_MAX + 1, 1);
    int n = vsnprintf(text, NOTE_MAX + 1, fmt, ap);
    if (n < 0)
        die("vsnprintf failed");
    if (n > NOTE_MAX)
        memcpy(text + NOTE_MAX - 3, "...", 3);
    if (front) {
        memmove(ns->items + 1, ns->items, ns->n * sizeof *ns->items);
        ns->items[0] = text;
    } else
        ns->items[ns->n] = text;
    ns->n++;
}

__attribute__((format(printf, 2, 3))) static void notes_add(notes_t *ns, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    notes_vadd(ns, 0, fmt, ap);
    va_end(ap);
}

/* A note before the ones there (what happened first is said first, as the agent always has). */
__attribute__((format(printf, 2, 3))) static void notes_add_first(notes_t *ns, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    notes_vadd(ns, 1, fmt, ap);
    va_end(ap);
}

static void notes_clear(notes_t *ns) {
    for (size_t i = 0; i < ns->n; i++)
        free(ns->items[i]);
    ns->n = 0;
}

/* `from`'s notes after `to`'s, `from` emptied. */
static void notes_move(notes_t *to, notes_t *from) {
    for (size_t i = 0; i < from->n; i++) {
        if (to->n < NOTES_MAX)
            to->items[to->n++] = from->items[i];
        else
            free(from->items[i]);
    }
    from->n = 0;
}

/* The notes as a JSON array of strings. */
static void notes_render(const notes_t *ns, buf_t *out) {
    buf_adds(out, "[");
    for (size_t i = 0; i < ns->n; i++) {
        if (i)
            buf_adds(out, ", ");
        json_text(out, ns->items[i], strlen(ns->items[i]));
    }
    buf_adds(out, "]");
}

/* ------------------------------------------------------------------ drained pipes */

/* Pipes a background job still holds after its command ended: read and discarded whenever this
 * process waits, so the job never blocks on a full pipe nor gets SIGPIPE. */
static int drains[MAX_DRAINS];
static int n_drains;

static void drain_add(int fd) {
    if (n_drains == MAX_DRAINS) { /* no room left: stop reading (the job may then block) */
        close(fd);
        return;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    drains[n_drains++] = fd;
}

/* poll() on `fds` (events POLLIN) and every drained pipe; drains what is ready. */
static int wait_for(struct pollfd *fds, int n, double timeout_s) {
    struct pollfd all[MAX_DRAINS + 4];
    for (int i = 0; i < n; i++)
        all[i] = fds[i];
    for (int i = 0; i < n_drains; i++)
        all[n + i] = (struct pollfd){drains[i], POLLIN, 0};
    /* a day at most: a timeout of 1e300 s must not overflow the int (poll is called again) */
    int ms = timeout_s < 0 ? -1 : timeout_s > 86400.0 ? 86400000 : (int)(timeout_s * 1000.0 + 0.999);
    int got = poll(all, (nfds_t)(n + n_drains), ms);
    if (got < 0)
        return got;
    for (int i = 0; i < n; i++)
        fds[i].revents = all[i].revents;
    int kept = 0;
    for (int i = 0; i < n_drains; i++) {
        int fd = drains[i], open_ = 1;
        if (all[n + i].revents) {
            char junk[65536];
            ssize_t r = read(fd, junk, sizeof junk);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                close(fd);
                open_ = 0;
            }
        }
        if (open_)
            drains[kept++] = fd;
    }
    n_drains = kept;
    return got;
}

/* ------------------------------------------------------------------ processes */

static int wait_code(int status) { return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status); }

/* The exit code once `pid` has exited (negative: its signal), -1000 while it runs; 0 when it was
 * reaped elsewhere. */
#define RUNNING (-1000)
static int poll_pid(pid_t pid, int flags) {
    int status;
    pid_t got;
    do
        got = waitpid(pid, &status, flags);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return 0;
    if (got == 0)
        return RUNNING;
    return wait_code(status);
}

static void reap(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static int *proc_pids(size_t *n) {
    size_t cap = 64;
    int *pids = xcalloc(cap, sizeof *pids);
    *n = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return pids;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *c = e->d_name;
        if (!*c)
            continue;
        while (*c >= '0' && *c <= '9')
            c++;
        if (*c)
            continue;
        pids = make_room(pids, *n, &cap, sizeof *pids);
        pids[(*n)++] = atoi(e->d_name);
    }
    closedir(d);
    return pids;
}

static size_t count_tasks(const int *pids, size_t n) {
    size_t total = 0;
    char path[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/proc/%d/task", pids[i]);
        DIR *d = opendir(path);
        if (!d) {
            total++;
            continue;
        }
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.')
                total++;
        closedir(d);
    }
    return total;
}

static long long last_pid(void) {
    buf_t b = {0};
    read_text("/proc/sys/kernel/ns_last_pid", &b);
    strip(&b);
    long long v = 0;
    if (!b.p || !parse_int(b.p, &v) || v < 0)
        v = 0;
    buf_free(&b);
    return v;
}

/* (process group, session) of `pid` from /proc; 0 when it is gone. */
static int session_ids(int pid, long long *pgrp, long long *sid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    buf_t b = {0};
    read_text(path, &b);
    int ok = 0;
    char *close_paren = b.p ? strrchr(b.p, ')') : NULL;
    if (close_paren) {
        char state;
        long long ppid;
        ok = sscanf(close_paren + 1, " %c %lld %lld %lld", &state, &ppid, pgrp, sid) == 4;
    }
    buf_free(&b);
    return ok;
}

/* Clock ticks since boot, as /proc/PID/stat's starttime counts them. */
static long long boot_ticks(void) {
    struct timespec now;
    clock_gettime(CLOCK_BOOTTIME, &now);
    long tick = sysconf(_SC_CLK_TCK);
    return (long long)now.tv_sec * tick + (long long)now.tv_nsec / (1000000000LL / tick);
}

/* When `pid` started, in clock ticks since boot (-1 when it is gone). */
static long long start_ticks(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    buf_t b = {0};
    read_text(path, &b);
    long long ticks = -1;
    char *at = b.p ? strrchr(b.p, ')') : NULL;
    for (int field = 2; at && field < 22; field++) /* field 2 ends at ')'; starttime is field 22 */
        at = strchr(at + 1, ' ');
    if (at)
        ticks = strtoll(at + 1, NULL, 10);
    buf_free(&b);
    return ticks;
}

/* The processes of our pid namespace but us and bwrap (pid 1), at most `cap` of them in `out`;
 * how many there are. */
static size_t other_pids(int *out, size_t cap) {
    int me = getpid();
    size_t n, left = 0;
    int *pids = proc_pids(&n);
    for (size_t i = 0; i < n; i++)
        if (pids[i] != 1 && pids[i] != me) {
            if (left < cap)
                out[left] = pids[i];
            left++;
        }
    free(pids);
    return left;
}

/* SIGKILL every process of our pid namespace but us (and bwrap, pid 1), repeating while a fork
 * bomb keeps spawning; how many are left (exec_agent._kill_all_others). */
static size_t kill_all_others(void) {
    int few[KILL_ONE_BY_ONE];
    size_t left = other_pids(few, KILL_ONE_BY_ONE);
    for (int attempt = 0; attempt < 200 && left; attempt++) {
        if (left <= KILL_ONE_BY_ONE)
            for (size_t i = 0; i < left; i++)
                kill(few[i], SIGKILL);
        else
            kill(-1, SIGKILL);
        reap();
        left = other_pids(few, KILL_ONE_BY_ONE);
        if (!left)
            break;
        double wait = 0.0002 * (double)(1ull << (attempt < 30 ? attempt : 30));
        sleep_s(wait < 0.005 ? wait : 0.005);
    }
    return left;
}

typedef struct {
    char **items;
    size_t n;
} env_t;

static const char *env_get(const env_t *env, const char *name) {
    size_t len = strlen(name);
    for (size_t i = 0; i < env->n; i++)
        if (!strncmp(env->items[i], name, len) && env->items[i][len] == '=')
            return env->items[i] + len + 1;
    return NULL;
}

static void env_add(env_t *env, const char *item) {
    char **more = realloc(env->items, (env->n + 2) * sizeof *more);
    if (!more)
        die("out of memory");
    env->items = more;
    env->items[env->n++] = xstrdup(item);
    env->items[env->n] = NULL;
}

static void env_free(env_t *env) {
    for (size_t i = 0; i < env->n; i++)
        free(env->items[i]);
    free(env->items);
    env->items = NULL;
    env->n = 0;
}

static void close_fds_above(int low, int keep) {
    if (keep > low + 1 && syscall(SYS_close_range, low + 1, keep - 1, 0) == 0 &&
        syscall(SYS_close_range, keep + 1, ~0u, 0) == 0)
        return;
    if (keep == low + 1 && syscall(SYS_close_range, keep + 1, ~0u, 0) == 0)
        return;
    long max = sysconf(_SC_OPEN_MAX);
    for (int fd = low + 1; fd < (max > 0 ? max : 1024); fd++)
        if (fd != keep)
            close(fd);
}

static void report_and_exit(int report, int err, const char *what) {
    char text[256];
    int n = snprintf(text, sizeof text, "OSError:%x:%s", err, what);
    if (n > 0)
        write_all(report, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
    _exit(127);
}

static struct {
    int uid, gid, set;
} run_as;

/* Fork and exec `argv` (found on `env`'s PATH) in `cwd`, in a session of its own, stdin from
 * /dev/null (or `in`), stdout into `out`, stderr into `err` (-1: `out`), no other fd of ours, as the
 * commands' uid and gid without supplementary groups when --run-as was given. Returns its pid, or
 * -1 with errno set (EAGAIN: no process left) and `why` saying what. As exec_agent._start. */
static pid_t start_process(char *const argv[], const char *cwd, const env_t *env, int out, int in, int err,
                           buf_t *why) {
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) {
        os_error(why, errno, NULL);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0)
        return fail_closing(report, why);
    if (pid == 0) {
        close(report[0]);
        if (setsid() < 0)
            report_and_exit(report[1], errno, "setsid");
        signal(SIGPIPE, SIG_DFL);
        signal(SIGXFSZ, SIG_DFL);
        int stdin_fd = in;
        if (stdin_fd < 0 && (stdin_fd = open("/dev/null", O_RDONLY)) < 0)
            report_and_exit(report[1], errno, "/dev/null");
        if (dup2(stdin_fd, 0) < 0 || dup2(out, 1) < 0 || dup2(err < 0 ? out : err, 2) < 0)
            report_and_exit(report[1], errno, "dup2");
        if (chdir(cwd) != 0)
            report_and_exit(report[1], errno, "noexec:chdir");
        if (run_as.set) {
            uid_t r, e, s;
            if (setgroups(0, NULL) != 0 || setresgid((gid_t)run_as.gid, (gid_t)run_as.gid, (gid_t)run_as.gid) != 0 ||
                setresuid((uid_t)run_as.uid, (uid_t)run_as.uid, (uid_t)run_as.uid) != 0)
                report_and_exit(report[1], errno, "the uid switch failed");
            if (getresuid(&r, &e, &s) != 0 || r != (uid_t)run_as.uid || e != r || s != r)
                report_and_exit(report[1], EPERM, "the uid switch did not take");
        }
        close_fds_above(2, report[1]);
        char **envp = env->items;
        if (strchr(argv[0], '/')) {
            execve(argv[0], argv, envp);
            report_and_exit(report[1], errno, "noexec");
        }
        const char *path = env_get(env, "PATH");
        if (!path)
            path = "/bin:/usr/bin";
        int saved = ENOENT;
        char candidate[PATH_MAX];
        while (1) {
            const char *colon = strchr(path, ':');
            size_t len = colon ? (size_t)(colon - path) : strlen(path);
            int n = len ? snprintf(candidate, sizeof candidate, "%.*s/%s", (int)len, path, argv[0])
                        : snprintf(candidate, sizeof candidate, "%s", argv[0]);
            if (n > 0 && (size_t)n < sizeof candidate) {
                execve(candidate, argv, envp);
                if (errno != ENOENT && errno != ENOTDIR && saved == ENOENT)
                    saved = errno;
            }
            if (!colon)
                break;
            path = colon + 1;
        }
        report_and_exit(report[1], saved, "noexec");
    }
    close(report[1]);
    char text[4096];
    size_t got = 0;
    while (got < sizeof text - 1) {
        ssize_t r = read(report[0], text + got, sizeof text - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(report[0]);
    if (!got)
        return pid;
    text[got] = 0;
    poll_pid(pid, 0);
    int number = 0;
    char *colon = strchr(text, ':');
    if (colon)
        number = (int)strtol(colon + 1, NULL, 16);
    buf_clear(why);
    buf_printf(why, "cannot start %s: %s", argv[0], text);
    errno = number ? number : EIO;
    return -1;
}

static void kill_group(pid_t pgid) {
    /* A fork bomb keeps spawning while we kill: repeat until the group is empty. */
    for (int i = 0; i < 50; i++) {
        if (killpg(pgid, SIGKILL) != 0)
            return; /* ESRCH: empty; EPERM: not ours */
        sleep_s(0.01);
    }
}

/* ------------------------------------------------------------------ the agent's state */

typedef struct {
    int pid, channel; /* channel: our end of the shell's socket pair, SO_PASSCRED, non-blocking */
    int restored, eof, exit_code; /* exit_code: RUNNING until it exited */
    int exited;                   /* seen exited, not yet reaped: its pid is still its own */
    buf_t pending;                /* the shell's bytes read past its last full line */
    int *intruders;               /* pids of every other sender on the channel */
    size_t n_intruders, cap_intruders;
} shell_t;

static struct {
    const char *workdir;
    int reusable, max_procs, own_pid_namespace, kernel, keyctl;
    env_t initial_env, limits; /* limits: TF_LIMIT_* given a value */
    int *groups;
    size_t n_groups;
    long long counter;
    long long tasks_counted, tasks_at; /* see near_process_limit */
    long long command_ticks;           /* when the current command was sent: boot_ticks() */
    char *cmd_dir, *out_dir, *snapshot;
    shell_t *shell;
    char previous_nonce[33];
    int restorable;
} agent;

static void groups_add(int pid) {
    for (size_t i = 0; i < agent.n_groups; i++)
        if (agent.groups[i] == pid)
            return;
    int *more = realloc(agent.groups, (agent.n_groups + 1) * sizeof *more);
    if (!more)
        die("out of memory");
    agent.groups = more;
    agent.groups[agent.n_groups++] = pid;
}

static void groups_discard(int pid) {
    for (size_t i = 0; i < agent.n_groups; i++)
        if (agent.groups[i] == pid) {
            agent.groups[i] = agent.groups[--agent.n_groups];
            return;
        }
}

static void new_nonce(char out[33]) {
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno != EINTR)
            die("getrandom failed");
        if (r > 0)
            got += (size_t)r;
    }
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

/* The start environment (or none), plus the limits that have a value when `with_limits`: a fresh
 * command's bash reads them from its environment, a resident shell from its script. */
static void command_env(env_t *env, int with_initial, int with_limits) {
    memset(env, 0, sizeof *env);
    env->items = xcalloc(1, sizeof *env->items);
    if (with_initial)
        for (size_t i = 0; i < agent.initial_env.n; i++)
            env_add(env, agent.initial_env.items[i]);
    if (with_limits)
        for (size_t i = 0; i < agent.limits.n; i++)
            env_add(env, agent.limits.items[i]);
}

/* ------------------------------------------------------------------ files */

static int write_new(const char *path, const char *data, size_t n, buf_t *why) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        os_error(why, errno, path);
        return -1;
    }
    int rc = write_all(fd, data, n);
    if (rc)
        os_error(why, errno, path);
    close(fd);
    return rc;
}

/* A command's output FIFO in our directory: our read end, and a write end we hold until the
 * command is over (until then the reader never sees EOF). With --run-as it stays ours and only
 * writable for others: its shell opens it for writing, no process of the commands' uid can read. */
static int open_fifo(const char *path, int *reader, int *holder, buf_t *why) {
    if (mkfifo(path, 0600) != 0) {
        if (errno != EEXIST || (unlink(path), mkfifo(path, 0600) != 0)) {
            os_error(why, errno, path);
            return -1;
        }
    }
    if (run_as.set && chmod(path, 0602) != 0) {
        os_error(why, errno, path);
        return -1;
    }
    *reader = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (*reader < 0) {
        os_error(why, errno, path);
        return -1;
    }
    *holder = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (*holder < 0) {
        os_error(why, errno, path);
        close(*reader);
        return -1;
    }
    return 0;
}

/* Remove a file or a whole tree, whatever modes a command left on it; -1 with `why` on failure.
 * Depth-first with an explicit stack of open directories (no recursion on the tree's depth). */
static int remove_path(const char *path, buf_t *why);

static int empty_dir(const char *path, buf_t *why) {
    DIR *d = opendir(path);
    if (!d) {
        os_error(why, errno, path);
        return -1;
    }
    size_t n = 0, cap = 16;
    char **names = xcalloc(cap, sizeof *names);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        names = make_room(names, n, &cap, sizeof *names);
        names[n++] = path_join(path, e->d_name);
    }
    closedir(d);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (!rc && remove_path(names[i], why) != 0)
            rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

typedef struct {
    char *path;
    int emptied;
} frame_t;

static int remove_path(const char *path, buf_t *why) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        os_error(why, errno, path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0) {
            os_error(why, errno, path);
            return -1;
        }
        return 0;
    }
    /* A directory: make it ours to list, then remove its entries (files now, directories pushed). */
    size_t depth = 0, cap = 16;
    frame_t *stack = xcalloc(cap, sizeof *stack);
    stack[depth++] = (frame_t){xstrdup(path), 0};
    int rc = 0;
    while (depth && !rc) {
        frame_t *top = &stack[depth - 1];
        if (top->emptied) {
            if (rmdir(top->path) != 0) {
                os_error(why, errno, top->path);
                rc = -1;
            }
            free(top->path);
            depth--;
            continue;
        }
        top->emptied = 1;
        if (chmod(top->path, 0700) != 0) {
            os_error(why, errno, top->path);
            rc = -1;
            break;
        }
        DIR *d = opendir(top->path);
        if (!d) {
            os_error(why, errno, top->path);
            rc = -1;
            break;
        }
        char *dir = xstrdup(top->path);
        struct dirent *e;
        while ((e = readdir(d)) && !rc) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char *child = path_join(dir, e->d_name);
            struct stat cst;
            if (lstat(child, &cst) != 0) {
                os_error(why, errno, child);
                rc = -1;
            } else if (S_ISDIR(cst.st_mode)) {
                stack = make_room(stack, depth, &cap, sizeof *stack);
                stack[depth++] = (frame_t){child, 0};
                child = NULL;
            } else if (unlink(child) != 0) {
                os_error(why, errno, child);
                rc = -1;
            }
            free(child);
        }
        closedir(d);
        free(dir);
    }
    while (depth)
        free(stack[--depth].path);
    free(stack);
    return rc;
}

/* ------------------------------------------------------------------ the reset's baseline */

typedef struct {
    char *path;
    mode_t mode;
    uid_t uid;
    gid_t gid;
    int kind; /* 0: other, 1: link (target), 2: regular file (size, mtime) */
    char *target;
    long long size, mtime_ns;
} entry_t;

typedef struct {
    entry_t *items;
    size_t n;
} tree_t;

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const entry_t *)a)->path, ((const entry_t *)b)->path);
}

static int entry_equal(const entry_t *a, const entry_t *b) {
    if (a->mode != b->mode || a->uid != b->uid || a->gid != b->gid || a->kind != b->kind)
        return 0;
    if (a->kind == 1)
        return !strcmp(a->target, b->target);
    if (a->kind == 2)
        return a->size == b->size && a->mtime_ns == b->mtime_ns;
    return 1;
}

static void tree_free(tree_t *t) {
    for (size_t i = 0; i < t->n; i++) {
        free(t->items[i].path);
        free(t->items[i].target);
    }
    free(t->items);
    t->items = NULL;
    t->n = 0;
}

static void entry_of(entry_t *e, const char *path, const struct stat *st) {
    memset(e, 0, sizeof *e);
    e->path = xstrdup(path);
    e->mode = st->st_mode;
    e->uid = st->st_uid;
    e->gid = st->st_gid;
    if (S_ISLNK(st->st_mode)) {
        char target[PATH_MAX + 1];
        ssize_t n = readlink(path, target, PATH_MAX);
        target[n < 0 ? 0 : n] = 0;
        e->kind = 1;
        e->target = xstrdup(target);
    } else if (S_ISREG(st->st_mode)) {
        e->kind = 2;
        e->size = st->st_size;
        e->mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    }
}

/* Every entry of one mount, not descending into other mounts (exec_agent._tree), sorted by path. */
static int tree_of(const char *root, tree_t *t, buf_t *why) {
    memset(t, 0, sizeof *t);
    struct stat top;
    if (lstat(root, &top) != 0) {
        os_error(why, errno, root);
        return -1;
    }
    size_t cap = 64;
    t->items = xcalloc(cap, sizeof *t->items);
    entry_of(&t->items[t->n++], root, &top);
    t->items[0].kind = 0;
    size_t depth = 0, scap = 16;
    char **stack = xcalloc(scap, sizeof *stack);
    stack[depth++] = xstrdup(root);
    int rc = 0;
    while (depth) {
        char *dir = stack[--depth];
        DIR *d = rc ? NULL : opendir(dir);
        if (!d && !rc) {
            os_error(why, errno, dir);
            rc = -1;
        }
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char *path = path_join(dir, e->d_name);
            struct stat st;
            if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
                os_error(why, errno, path);
                rc = -1;
                free(path);
                break;
            }
            t->items = make_room(t->items, t->n, &cap, sizeof *t->items);
            entry_of(&t->items[t->n++], path, &st);
            if (S_ISDIR(st.st_mode) && st.st_dev == top.st_dev) {
                stack = make_room(stack, depth, &scap, sizeof *stack);
                stack[depth++] = path;
            } else {
                free(path);
            }
        }
        if (d)
            closedir(d);
        free(dir);
    }
    free(stack);
    if (rc) {
        tree_free(t);
        return -1;
    }
    qsort(t->items, t->n, sizeof *t->items, entry_cmp);
    return 0;
}

static const entry_t *tree_find(const tree_t *t, const char *path) {
    entry_t key = {.path = (char *)path};
    return bsearch(&key, t->items, t->n, sizeof *t->items, entry_cmp);
}

typedef struct {
    char *name;
    buf_t value;
} xattr_t;

typedef struct {
    xattr_t *items;
    size_t n;
} xattrs_t;

static void xattrs_free(xattrs_t *x) {
    for (size_t i = 0; i < x->n; i++) {
        free(x->items[i].name);
        buf_free(&x->items[i].value);
    }
    free(x->items);
    x->items = NULL;
    x->n = 0;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(((const xattr_t *)a)->name, ((const xattr_t *)b)->name);
}

static void xattrs_of(const char *path, xattrs_t *x) {
    memset(x, 0, sizeof *x);
    ssize_t size = llistxattr(path, NULL, 0);
    if (size <= 0)
        return; /* none, or not supported by this file system */
    char *names = xcalloc((size_t)size + 1, 1);
    size = llistxattr(path, names, (size_t)size);
    for (ssize_t i = 0; size > 0 && i < size; i += (ssize_t)strlen(names + i) + 1) {
        const char *name = names + i;
        ssize_t len = lgetxattr(path, name, NULL, 0);
        if (len < 0)
            continue;
        char *value = xcalloc((size_t)len + 1, 1);
        len = lgetxattr(path, name, value, (size_t)len);
        if (len >= 0) {
            xattr_t *more = realloc(x->items, (x->n + 1) * sizeof *more);
            if (!more)
                die("out of memory");
            x->items = more;
            x->items[x->n] = (xattr_t){xstrdup(name), {0}};
            buf_add(&x->items[x->n].value, value, (size_t)len);
            x->n++;
        }
        free(value);
    }
    free(names);
    if (x->n > 1) /* (overlayfs sizes the list with its own private names, then lists none) */
        qsort(x->items, x->n, sizeof *x->items, name_cmp);
}

static const xattr_t *xattr_find(const xattrs_t *x, const char *name) {
    for (size_t i = 0; i < x->n; i++)
        if (!strcmp(x->items[i].name, name))
            return &x->items[i];
    return NULL;
}

static int xattrs_equal(const xattrs_t *a, const xattrs_t *b) {
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->items[i].name, b->items[i].name) || a->items[i].value.n != b->items[i].value.n ||
            (a->items[i].value.n && memcmp(a->items[i].value.p, b->items[i].value.p, a->items[i].value.n)))
            return 0;
    return 1;
}

/* chattr flags of a directory (FS_IOC_GETFLAGS, or SETFLAGS with `set`); 0 when it has none. */
static int fs_flags(const char *path, long *value, int set) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    long flags = set ? *value : 0;
    int ok = ioctl(fd, set ? FS_IOC_SETFLAGS : FS_IOC_GETFLAGS, &flags) == 0;
    close(fd);
    if (ok && !set)
        *value = flags;
    return ok;
}

typedef struct {
    char *path;
    mode_t mode;
    uid_t uid;
    gid_t gid;
    long long mtime_ns;
    xattrs_t xattrs;
    int has_flags;
    long flags;
} dir_attrs_t;

static int dir_attrs_of(const char *path, dir_attrs_t *a, buf_t *why) {
    memset(a, 0, sizeof *a);
    struct stat st;
    if (lstat(path, &st) != 0) {
        os_error(why, errno, path);
        return -1;
    }
    a->path = xstrdup(path);
    a->mode = st.st_mode;
    a->uid = st.st_uid;
    a->gid = st.st_gid;
    a->mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    xattrs_of(path, &a->xattrs);
    a->has_flags = fs_flags(path, &a->flags, 0);
    return 0;
}

static void dir_attrs_free(dir_attrs_t *a) {
    free(a->path);
    xattrs_free(&a->xattrs);
}

static const int rlimit_numbers[] = {RLIMIT_AS,      RLIMIT_CORE,   RLIMIT_CPU,    RLIMIT_DATA,      RLIMIT_FSIZE,
                                     RLIMIT_MEMLOCK, RLIMIT_MSGQUEUE, RLIMIT_NICE, RLIMIT_NOFILE,    RLIMIT_NPROC,
                                     RLIMIT_RSS,     RLIMIT_RTPRIO, RLIMIT_RTTIME, RLIMIT_SIGPENDING, RLIMIT_STACK};
static const char *const rlimit_names[] = {"RLIMIT_AS",      "RLIMIT_CORE",     "RLIMIT_CPU",    "RLIMIT_DATA",
                                           "RLIMIT_FSIZE",   "RLIMIT_MEMLOCK",  "RLIMIT_MSGQUEUE", "RLIMIT_NICE",
                                           "RLIMIT_NOFILE",  "RLIMIT_NPROC",    "RLIMIT_RSS",    "RLIMIT_RTPRIO",
                                           "RLIMIT_RTTIME",  "RLIMIT_SIGPENDING", "RLIMIT_STACK"};
#define N_RLIMITS (sizeof rlimit_numbers / sizeof rlimit_numbers[0])

/* What a process of our uid could change about the agent from outside (exec_agent._own_attributes). */
typedef struct {
    int nice, scheduler;
    cpu_set_t affinity;
    char oom_score_adj[32], timerslack_ns[32];
    struct rlimit rlimits[N_RLIMITS];
    int has_ioprio;
    long ioprio;
} own_attrs_t;

static void read_small(const char *path, char *out, size_t size) {
    buf_t b = {0};
    read_text(path, &b);
    strip(&b);
    snprintf(out, size, "%s", b.p ? b.p : "");
    buf_free(&b);
}

static void own_attrs_of(own_attrs_t *a) {
    memset(a, 0, sizeof *a);
    errno = 0;
    a->nice = getpriority(PRIO_PROCESS, 0);
    CPU_ZERO(&a->affinity);
    sched_getaffinity(0, sizeof a->affinity, &a->affinity);
    a->scheduler = sched_getscheduler(0);
    read_small("/proc/self/oom_score_adj", a->oom_score_adj, sizeof a->oom_score_adj);
    read_small("/proc/self/timerslack_ns", a->timerslack_ns, sizeof a->timerslack_ns);
    for (size_t i = 0; i < N_RLIMITS; i++)
        getrlimit(rlimit_numbers[i], &a->rlimits[i]);
    if (agent.kernel) {
        a->has_ioprio = 1;
        a->ioprio = syscall(SYS_ioprio_get, 1, 0); /* IOPRIO_WHO_PROCESS, this process */
    }
}

static struct {
    int set, n_roots;
    dir_attrs_t roots[3];        /* the workdir, the scratch dir and, when given, /dev/shm */
    struct timespec times[3][2]; /* atime, mtime of each root */
    char **mounts;
    tree_t *trees;
    size_t n_mounts;
    own_attrs_t attrs;
} baseline;

/* Writable tmpfs mounts (bwrap's /, /dev, /run) from mountinfo (exec_agent._tmpfs_mounts). */
static char **tmpfs_mounts(size_t *n) {
    buf_t text = {0};
    read_text("/proc/self/mountinfo", &text);
    char **mounts = NULL;
    *n = 0;
    char *save = NULL;
    for (char *line = text.p ? strtok_r(text.p, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        char *sep = strstr(line, " - ");
        if (!sep)
            continue;
        *sep = 0;
        char *right = sep + 3;
        if (strncmp(right, "tmpfs", 5) || (right[5] != ' ' && right[5] != 0))
            continue;
        char *fields[6] = {0}, *fsave = NULL;
        int count = 0;
        for (char *f = strtok_r(line, " ", &fsave); f && count < 6; f = strtok_r(NULL, " ", &fsave))
            fields[count++] = f;
        if (count < 6)
            continue;
        int rw = 0;
        char *osave = NULL;
        for (char *o = strtok_r(fields[5], ",", &osave); o; o = strtok_r(NULL, ",", &osave))
            if (!strcmp(o, "rw"))
                rw = 1;
        if (!rw)
            continue;
        buf_t point = {0};
        for (char *p = fields[4]; *p; p++) {
            if (!strncmp(p, "\\040", 4)) {
                buf_adds(&point, " ");
                p += 3;
            } else
                buf_add(&point, p, 1);
        }
        char **more = realloc(mounts, (*n + 1) * sizeof *more);
        if (!more)
            die("out of memory");
        mounts = more;
        mounts[(*n)++] = point.p;
    }
    buf_free(&text);
    return mounts;
}

/* ------------------------------------------------------------------ kernel keys */

static void new_session_keyring(buf_t *why) {
    if (!agent.keyctl)
        return;
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING_, NULL) >= 0)
        return;
    if (errno == EPERM || errno == ENOSYS) { /* keyrings are blocked here (a seccomp policy) */
        agent.keyctl = 0;
        return;
    }
    buf_clear(why);
    buf_adds(why, "could not join a new session keyring");
}

static size_t keyring(long spec, int32_t *keys, size_t max) {
    long size = syscall(SYS_keyctl, KEYCTL_READ_, spec, keys, (long)(max * sizeof *keys));
    if (size < 0) {
        keys[0] = -1; /* unreadable: count it as something left */
        return 1;
    }
    size_t n = (size_t)size / sizeof *keys;
    return n < max ? n : max;
}

static int user_keys_left(void) {
    if (!agent.keyctl)
        return 0;
    long user = syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID_, (long)KEY_SPEC_USER_, 1L);
    long specs[2] = {KEY_SPEC_USER_, KEY_SPEC_USER_SESSION_};
    for (int s = 0; s < 2; s++) {
        int32_t keys[256];
        size_t n = keyring(specs[s], keys, 256);
        for (size_t i = 0; i < n; i++)
            if (keys[i] != user)
                return 1;
    }
    return 0;
}

static int key_users_line(int uid) {
    buf_t text = {0};
    read_text("/proc/key-users", &text);
    int found = 0;
    char *save = NULL;
    for (char *line = text.p ? strtok_r(text.p, "\n", &save) : NULL; line && !found; line = strtok_r(NULL, "\n", &save)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = 0;
        buf_t who = {0};
        buf_adds(&who, line);
        strip(&who);
        char mine[32];
        snprintf(mine, sizeof mine, "%d", uid);
        found = who.p && !strcmp(who.p, mine);
        buf_free(&who);
    }
    buf_free(&text);
    return found;
}

static size_t ipc_objects(void) {
    const char *kinds[3] = {"/proc/sysvipc/shm", "/proc/sysvipc/sem", "/proc/sysvipc/msg"};
    size_t count = 0;
    for (int i = 0; i < 3; i++) {
        buf_t text = {0};
        read_text(kinds[i], &text);
        size_t lines = 0;
        for (size_t j = 0; j < text.n; j++)
            if (text.p[j] == '\n')
                lines++;
        if (text.n && text.p[text.n - 1] != '\n')
            lines++;
        count += lines > 1 ? lines - 1 : 0;
        buf_free(&text);
    }
    return count;
}

static size_t mqueues(int remove) {
    DIR *d = opendir("/dev/mqueue");
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        n++;
        if (remove) {
            char *path = path_join("/dev/mqueue", e->d_name);
            unlink(path);
            free(path);
        }
    }
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------ baseline: take, restore */

static int baseline_take(const char *workdir, const char *scratch, const char *shm, buf_t *why) {
    const char *roots[3] = {workdir, scratch, shm};
    baseline.n_roots = shm ? 3 : 2;
    for (int i = 0; i < baseline.n_roots; i++) {
        if (dir_attrs_of(roots[i], &baseline.roots[i], why) != 0)
            return -1;
        struct stat st;
        if (lstat(roots[i], &st) != 0) {
            os_error(why, errno, roots[i]);
            return -1;
        }
        baseline.times[i][0] = st.st_atim;
        baseline.times[i][1] = st.st_mtim;
    }
    baseline.mounts = tmpfs_mounts(&baseline.n_mounts);
    baseline.trees = xcalloc(baseline.n_mounts, sizeof *baseline.trees);
    for (size_t i = 0; i < baseline.n_mounts; i++)
        if (tree_of(baseline.mounts[i], &baseline.trees[i], why) != 0)
            return -1;
    own_attrs_of(&baseline.attrs);
    baseline.set = 1;
    return 0;
}

static int empty_roots(buf_t *why) {
    for (int i = 0; i < baseline.n_roots; i++) {
        dir_attrs_t *start = &baseline.roots[i];
        if (chmod(start->path, start->mode & 07777) != 0) {
            os_error(why, errno, start->path);
            return -1;
        }
        if (empty_dir(start->path, why) != 0)
            return -1;
    }
    return 0;
}

static int restore_roots(buf_t *why) {
    for (int i = 0; i < baseline.n_roots; i++) {
        dir_attrs_t *start = &baseline.roots[i];
        const char *path = start->path;
        if (lchown(path, start->uid, start->gid) != 0) {
            /* best effort: verified below */
        }
        if (chmod(path, start->mode & 07777) != 0) {
            os_error(why, errno, path);
            return -1;
        }
        xattrs_t now;
        xattrs_of(path, &now);
        for (size_t j = 0; j < now.n; j++)
            if (!xattr_find(&start->xattrs, now.items[j].name))
                lremovexattr(path, now.items[j].name);
        for (size_t j = 0; j < start->xattrs.n; j++) {
            const xattr_t *want = &start->xattrs.items[j], *have = xattr_find(&now, want->name);
            if (!have || have->value.n != want->value.n ||
                (want->value.n && memcmp(have->value.p, want->value.p, want->value.n)))
                lsetxattr(path, want->name, want->value.p ? want->value.p : "", want->value.n, 0);
        }
        xattrs_free(&now);
        if (start->has_flags) {
            long flags = 0;
            if (!fs_flags(path, &flags, 0) || flags != start->flags) {
                flags = start->flags;
                fs_flags(path, &flags, 1);
            }
        }
        if (utimensat(AT_FDCWD, path, baseline.times[i], AT_SYMLINK_NOFOLLOW) != 0) {
            os_error(why, errno, path);
            return -1;
        }
        dir_attrs_t after;
        if (dir_attrs_of(path, &after, why) != 0)
            return -1;
        buf_t changed = {0};
        const char *names[5] = {"mode", "owner", "mtime_ns", "xattrs", "flags"};
        int differs[5] = {after.mode != start->mode, after.uid != start->uid || after.gid != start->gid,
                          after.mtime_ns != start->mtime_ns, !xattrs_equal(&after.xattrs, &start->xattrs),
                          after.has_flags != start->has_flags || (start->has_flags && after.flags != start->flags)};
        for (int k = 0; k < 5; k++)
            if (differs[k]) {
                if (changed.n)
                    buf_adds(&changed, ", ");
                buf_adds(&changed, names[k]);
            }
        dir_attrs_free(&after);
        if (changed.n) {
            buf_clear(why);
            buf_printf(why, "cannot restore the %s of %s", changed.p, path);
            buf_free(&changed);
            return -1;
        }
    }
    return 0;
}

static int length_cmp(const void *a, const void *b) {
    size_t la = strlen(*(char *const *)a), lb = strlen(*(char *const *)b);
    return la < lb ? -1 : la > lb;
}

static int string_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int restore_mounts(buf_t *why) {
    for (size_t m = 0; m < baseline.n_mounts; m++) {
        const char *mount = baseline.mounts[m];
        const tree_t *before = &baseline.trees[m];
        tree_t now;
        if (tree_of(mount, &now, why) != 0)
            return -1;
        size_t n_added = 0;
        char **added = xcalloc(now.n, sizeof *added);
        for (size_t i = 0; i < now.n; i++)
            if (!tree_find(before, now.items[i].path))
                added[n_added++] = now.items[i].path;
        /* shortest first: a removed directory takes its contents along */
        qsort(added, n_added, sizeof *added, length_cmp);
        int rc = 0;
        for (size_t i = 0; i < n_added && !rc; i++) {
            struct stat st;
            if (lstat(added[i], &st) == 0)
                rc = remove_path(added[i], why);
        }
        free(added);
        if (!rc && n_added) {
            tree_free(&now);
            rc = tree_of(mount, &now, why);
        }
        if (rc) {
            tree_free(&now);
            return -1;
        }
        size_t n_changed = 0;
        char **changed = xcalloc(now.n + before->n, sizeof *changed);
        for (size_t i = 0; i < now.n; i++) {
            const entry_t *was = tree_find(before, now.items[i].path);
            if (!was || !entry_equal(was, &now.items[i]))
                changed[n_changed++] = now.items[i].path;
        }
        for (size_t i = 0; i < before->n; i++)
            if (!tree_find(&now, before->items[i].path))
                changed[n_changed++] = before->items[i].path;
        if (n_changed) {
            qsort(changed, n_changed, sizeof *changed, string_cmp);
            buf_clear(why);
            buf_printf(why, "cannot restore %s: ", mount);
            for (size_t i = 0; i < n_changed && i < 3; i++)
                buf_printf(why, "%s%s", i ? ", " : "", changed[i]);
            buf_adds(why, " changed");
        }
        free(changed);
        tree_free(&now);
        if (n_changed)
            return -1;
    }
    return 0;
}

static int check_agent(buf_t *why) {
    own_attrs_t now;
    own_attrs_of(&now);
    const own_attrs_t *was = &baseline.attrs;
    buf_t changed = {0};
#define CHANGED(name)                                                                                                  \
    do {                                                                                                               \
        if (changed.n)                                                                                                 \
            buf_adds(&changed, ", ");                                                                                  \
        buf_adds(&changed, name);                                                                                      \
    } while (0)
    if (now.nice != was->nice)
        CHANGED("nice");
    if (!CPU_EQUAL(&now.affinity, &was->affinity))
        CHANGED("affinity");
    if (now.scheduler != was->scheduler)
        CHANGED("scheduler");
    if (strcmp(now.oom_score_adj, was->oom_score_adj))
        CHANGED("oom_score_adj");
    if (strcmp(now.timerslack_ns, was->timerslack_ns))
        CHANGED("timerslack_ns");
    for (size_t i = 0; i < N_RLIMITS; i++)
        if (now.rlimits[i].rlim_cur != was->rlimits[i].rlim_cur || now.rlimits[i].rlim_max != was->rlimits[i].rlim_max)
            CHANGED(rlimit_names[i]);
    if (now.has_ioprio != was->has_ioprio || now.ioprio != was->ioprio)
        CHANGED("ioprio");
#undef CHANGED
    if (!changed.n)
        return 0;
    buf_clear(why);
    buf_printf(why, "a command changed the exec agent's %s", changed.p);
    buf_free(&changed);
    return -1;
}

/* ------------------------------------------------------------------ the resident shell */

/* The limits the host sets, in exec_agent._LIMIT_FLAGS's order, and their ulimit flags. */
static const char *const limit_vars[] = {"TF_LIMIT_FSIZE_KB", "TF_LIMIT_CPU_S", "TF_LIMIT_AS_KB", "TF_LIMIT_NPROC"};
static const char *const limit_flags[] = {"-f", "-t", "-v", "-u"};
static const char *limit_values[4];

/* `text` as one single-quoted shell word (exec_agent._quoted). */
static void add_quoted(buf_t *out, const char *text) {
    buf_adds(out, "'");
    for (const char *c = text; *c; c++) {
        if (*c == '\'')
            buf_adds(out, "'\\''");
        else
            buf_add(out, c, 1);
    }
    buf_adds(out, "'");
}

static int all_digits(const char *s) {
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* TF_LOOP for one shell, its placeholders filled in in one pass (exec_agent.loop_script). */
static void loop_script(buf_t *out, int restore, const char *nonce) {
    const char *t = TF_LOOP;
    for (;;) {
        const char *at = strstr(t, "@TF_");
        if (!at) {
            buf_adds(out, t);
            return;
        }
        buf_add(out, t, (size_t)(at - t));
        const char *name = at + 4, *end = strchr(name, '@');
        size_t len = end ? (size_t)(end - name) : 0;
        if (end && len == 6 && !strncmp(name, "LIMITS", 6)) {
            for (size_t i = 0; i < 4; i++)
                if (all_digits(limit_values[i]))
                    buf_printf(out, "builtin ulimit %s %s 2>/dev/null; ", limit_flags[i], limit_values[i]);
        } else if (end && len == 4 && !strncmp(name, "MODE", 4))
            buf_adds(out, restore ? "restore" : "new");
        else if (end && len == 4 && !strncmp(name, "SNAP", 4))
            add_quoted(out, agent.snapshot);
        else if (end && len == 3 && !strncmp(name, "DIR", 3))
            add_quoted(out, agent.cmd_dir);
        else if (end && len == 5 && !strncmp(name, "NONCE", 5))
            buf_adds(out, nonce);
        else {
            buf_adds(out, "@TF_");
            t = name;
            continue;
        }
        t = end + 1;
    }
}

/* A fd at the start of `script`, for a new shell's stdin (exec_agent._script_fd): a memory file,
 * or where the kernel has none a file of ours in the command directory, unlinked once open. */
static int script_fd(const buf_t *script, buf_t *why) {
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 1U
#endif
    int fd = (int)syscall(SYS_memfd_create, "bash", MFD_CLOEXEC);
    if (fd < 0) {
        char nonce[33];
        new_nonce(nonce);
        nonce[16] = 0;
        buf_t name = {0};
        buf_printf(&name, "loop-%s", nonce);
        char *path = path_join(agent.cmd_dir, name.p);
        buf_free(&name);
        if (write_new(path, script->p, script->n, why) != 0) {
            free(path);
            return -1;
        }
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            os_error(why, errno, path);
        unlink(path);
        free(path);
        return fd;
    }
    if (write_all(fd, script->p, script->n) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
        os_error(why, errno, NULL);
        close(fd);
        return -1;
    }
    return fd;
}

static void shell_close(shell_t *s) {
    close(s->channel);
    buf_free(&s->pending);
    free(s->intruders);
    free(s);
}

static int shell_poll(shell_t *s, int block) {
    if (s->exit_code == RUNNING)
        s->exit_code = poll_pid(s->pid, block ? 0 : WNOHANG);
    return s->exit_code;
}

/* Whether the shell has exited, without reaping it (exec_agent.Shell.ended). */
static int shell_ended(shell_t *s) {
    if (s->exited || s->exit_code != RUNNING)
        return 1;
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid(P_PID, (id_t)s->pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0)
        s->exited = errno == ECHILD; /* reaped elsewhere */
    else
        s->exited = info.si_pid != 0;
    return s->exited;
}

static void intruder_add(shell_t *s, int pid) {
    for (size_t i = 0; i < s->n_intruders; i++)
        if (s->intruders[i] == pid)
            return;
    if (!s->cap_intruders) {
        s->cap_intruders = 4;
        s->intruders = xcalloc(s->cap_intruders, sizeof *s->intruders);
    }
    s->intruders = make_room(s->intruders, s->n_intruders, &s->cap_intruders, sizeof *s->intruders);
    s->intruders[s->n_intruders++] = pid;
}

/* Lines the shell has written since the last call (non-blocking); NULL-terminated, the caller
 * frees. Only what the kernel says the shell's own process sent counts: data from any other
 * sender is dropped and its pid noted (exec_agent.Shell.lines). */
static char **shell_lines(shell_t *s) {
    char chunk[65536];
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred))];
        struct cmsghdr align;
    } control;
    for (;;) {
        struct iovec iov = {chunk, sizeof chunk};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        ssize_t r = recvmsg(s->channel, &msg, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break; /* nothing more now */
        if (r <= 0) { /* every holder of the shell's end is gone */
            s->eof = 1;
            break;
        }
        int sender = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
                c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
                struct ucred cred;
                memcpy(&cred, CMSG_DATA(c), sizeof cred);
                sender = cred.pid;
            }
        if (sender != s->pid) {
            intruder_add(s, sender);
            continue;
        }
        buf_add(&s->pending, chunk, (size_t)r);
    }
    size_t n = 0;
    char **lines = xcalloc(1, sizeof *lines);
    size_t start = 0;
    for (size_t i = 0; i < s->pending.n; i++)
        if (s->pending.p[i] == '\n') {
            char **more = realloc(lines, (n + 2) * sizeof *more);
            if (!more)
                die("out of memory");
            lines = more;
            lines[n] = xcalloc(i - start + 1, 1);
            memcpy(lines[n], s->pending.p + start, i - start);
            lines[++n] = NULL;
            start = i + 1;
        }
    size_t rest = s->pending.n - start, keep = rest > 4096 ? 4096 : rest;
    if (s->pending.p) {
        memmove(s->pending.p, s->pending.p + s->pending.n - keep, keep);
        s->pending.n = keep;
        s->pending.p[keep] = 0;
    }
    return lines;
}

static void lines_free(char **lines) {
    for (char **l = lines; *l; l++)
        free(*l);
    free(lines);
}

static void forget_shell(void) {
    shell_t *s = agent.shell;
    agent.shell = NULL;
    agent.previous_nonce[0] = 0;
    if (s) {
        kill(s->pid, SIGKILL);
        shell_poll(s, 1);
        shell_close(s);
    }
}

/* Kill every process that wrote on the shell's channel but the shell; the first one's pid. */
static int kill_intruders(shell_t *s) {
    int me = getpid();
    for (size_t i = 0; i < s->n_intruders; i++) {
        int pid = s->intruders[i];
        if (pid > 1 && pid != me && pid != s->pid)
            kill(pid, SIGKILL);
    }
    return s->n_intruders ? s->intruders[0] : 0;
}

static int await_line(shell_t *s, const char *line, double deadline) {
    for (double now = monotonic(); now < deadline; now = monotonic()) {
        char **lines = shell_lines(s);
        int found = 0;
        for (char **l = lines; *l; l++)
            found |= !strcmp(*l, line);
        lines_free(lines);
        if (found)
            return 1;
        if (s->eof || shell_poll(s, 0) != RUNNING)
            return 0;
        struct pollfd p = {s->channel, POLLIN, 0};
        double left = deadline - monotonic();
        wait_for(&p, 1, left < 0.05 ? (left > 0 ? left : 0) : 0.05);
    }
    return 0;
}

#define SHELL_FAILED (-2)

/* A new resident shell (exec_agent.Agent._spawn_shell): 0, -1 with errno (EAGAIN: no process
 * left), or SHELL_FAILED when a restored one did not say its loop runs. */
static int spawn_shell(int restore, buf_t *why) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        os_error(why, errno, NULL);
        return -1;
    }
    int on = 1; /* before the shell exists: every message on our end then carries its sender's pid */
    if (setsockopt(pair[0], SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0)
        return fail_closing(pair, why);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    char nonce[33];
    new_nonce(nonce);
    buf_t script = {0};
    loop_script(&script, restore, nonce);
    int in = script_fd(&script, why);
    buf_free(&script);
    if (in < 0) {
        int e = errno;
        close(pair[0]);
        close(pair[1]);
        if (null >= 0)
            close(null);
        errno = e;
        return -1;
    }
    env_t env;
    command_env(&env, !restore, 0);
    char *argv[] = {"bash", NULL};
    pid_t pid = start_process(argv, agent.workdir, &env, pair[1], in, null, why);
    int e = errno;
    env_free(&env);
    close(pair[1]);
    close(in);
    if (null >= 0)
        close(null);
    if (pid < 0) {
        close(pair[0]);
        errno = e;
        return -1;
    }
    fcntl(pair[0], F_SETFL, fcntl(pair[0], F_GETFL) | O_NONBLOCK);
    shell_t *s = xcalloc(1, sizeof *s);
    s->pid = pid;
    s->channel = pair[0];
    s->restored = restore;
    s->exit_code = RUNNING;
    groups_add(pid);
    if (restore) {
        char ready[64];
        snprintf(ready, sizeof ready, "%s ready", nonce);
        if (!await_line(s, ready, monotonic() + RESTORE_S)) {
            kill(pid, SIGKILL);
            shell_poll(s, 1);
            shell_close(s);
            return SHELL_FAILED;
        }
    }
    agent.shell = s;
    return 0;
}

static int start_shell(notes_t *notes, buf_t *why) {
    if (agent.restorable) {
        int rc = spawn_shell(1, why);
        if (rc != SHELL_FAILED)
            return rc;
        agent.restorable = 0;
        notes_add_first(notes, TF_RESTORE_FAILED);
    }
    return spawn_shell(0, why);
}

/* ------------------------------------------------------------------ limits and stopping */

static void stop_all(void) {
    if (agent.own_pid_namespace)
        kill_all_others();
    else
        for (size_t i = 0; i < agent.n_groups; i++)
            kill_group(agent.groups[i]);
    forget_shell();
    agent.n_groups = 0;
}

static void kill_everything(notes_t *notes) {
    stop_all();
    notes_add(notes, TF_PROCESS_LIMIT, agent.max_procs);
}

/* Whether a fork of ours is refused for want of processes (exec_agent._cannot_fork). */
static int cannot_fork(void) {
    pid_t pid = fork();
    if (pid < 0)
        return errno == EAGAIN;
    if (pid == 0)
        _exit(0);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    return 0;
}

/* Whether the sandbox's tasks are near its limit (exec_agent.Agent._near_process_limit). */
static int near_process_limit(void) {
    if (agent.max_procs <= 0)
        return 0;
    long long last = last_pid();
    if (0 < agent.tasks_at && agent.tasks_at <= last &&
        (double)(agent.tasks_counted + (last - agent.tasks_at)) < agent.max_procs * PROCS_LOOK)
        return 0;
    size_t n;
    int *pids = proc_pids(&n);
    free(pids);
    agent.tasks_counted = (long long)n;
    agent.tasks_at = last; /* read first: later pids are above it */
    if ((double)n < agent.max_procs * PROCS_LOOK)
        return 0;
    for (int i = 0; i < 3; i++) {
        pids = proc_pids(&n);
        size_t tasks = count_tasks(pids, n);
        free(pids);
        if ((double)tasks >= agent.max_procs * PROCS_HEADROOM || cannot_fork())
            return 1;
        sleep_s(0.01);
    }
    return 0;
}

static void close_agent(void) {
    for (size_t i = 0; i < agent.n_groups; i++)
        kill_group(agent.groups[i]);
    forget_shell();
}

/* ------------------------------------------------------------------ commands */

typedef struct {
    int kind; /* -1: none to report, 0: exit code, 1: "cwd", 2: another word (a forged status line) */
    long long code;
    char word[64];
    int timed_out, foreign; /* foreign: what reached the FIFO is not the command's (dropped) */
} status_t;

/* The answer to an exec: the output (capped) and the agent's notes apart from it. */
static void answer_exec(const request_t *r, int has_code, long long code, const notes_t *notes, double started,
                        cap_t *cap, int timed_out, buf_t *out) {
    buf_printf(out, "{\"id\": %s, \"exit_code\": ", r->id);
    if (has_code)
        buf_printf(out, "%lld", code);
    else
        buf_adds(out, "null");
    buf_adds(out, ", \"output\": ");
    int truncated = cap_render(cap, out);
    buf_adds(out, ", \"notes\": ");
    notes_render(notes, out);
    buf_printf(out, ", \"timed_out\": %s, \"truncated\": %s, \"output_bytes\": %lld, \"duration_s\": %.6f}\n",
               timed_out ? "true" : "false", truncated ? "true" : "false", cap->total, monotonic() - started);
}

static void answer_error(const request_t *r, const char *text, buf_t *out) {
    buf_printf(out, "{\"id\": %s, \"error\": ", r->id);
    json_text(out, text, strlen(text));
    buf_adds(out, "}\n");
}

/* The note of a command that did not run: its cwd is not a directory. */
static void cwd_missing(const char *cwd, size_t n, notes_t *notes) {
    buf_t quoted = {0};
    py_repr(&quoted, cwd, n);
    notes_add(notes, TF_CWD_MISSING, quoted.p);
    buf_free(&quoted);
}

/* A fresh command's output until it exits (or its deadline kills it): exec_agent.Agent._collect. */
static int collect(pid_t pid, int fd, cap_t *cap, double deadline, int *timed_out) {
    *timed_out = 0;
    double exited_at = -1;
    int code = RUNNING, eof = 0;
    char chunk[65536];
    for (;;) {
        double now = monotonic();
        if (code == RUNNING) {
            code = poll_pid(pid, WNOHANG);
            if (code != RUNNING)
                exited_at = now;
        }
        if (exited_at >= 0 && now - exited_at > GRACE_S)
            break;
        if (exited_at < 0 && now >= deadline) {
            *timed_out = 1;
            kill_group(pid);
            code = poll_pid(pid, 0);
            exited_at = monotonic();
            continue;
        }
        double wait = exited_at >= 0 ? 0.05 : deadline - now;
        struct pollfd p = {fd, POLLIN, 0};
        wait_for(&p, 1, wait < 0.05 ? (wait > 0 ? wait : 0) : 0.05);
        if (p.revents) {
            ssize_t r = read(fd, chunk, sizeof chunk);
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (r <= 0) {
                eof = 1;
                break;
            }
            cap_feed(cap, chunk, (size_t)r);
        }
    }
    if (code == RUNNING)
        code = poll_pid(pid, 0);
    if (eof)
        close(fd);
    else
        drain_add(fd); /* a background job still holds the pipe */
    return code;
}

static void exec_fresh(const request_t *r, const char *cmd_file, double started, double timeout, cap_t *cap,
                       notes_t *notes, buf_t *out) {
    buf_t cwd = {0}, why = {0};
    if (r->has_cwd && r->cwd.n)
        buf_add(&cwd, r->cwd.p, r->cwd.n);
    else
        buf_adds(&cwd, agent.workdir);
    if (cwd.p[0] != '/') {
        char *joined = path_join(agent.workdir, cwd.p);
        buf_clear(&cwd);
        buf_adds(&cwd, joined);
        free(joined);
    }
    struct stat st;
    if (memchr(cwd.p, 0, cwd.n) || stat(cwd.p, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cwd_missing(cwd.p, cwd.n, notes);
        answer_exec(r, 1, 1, notes, started, cap, 0, out);
        goto done;
    }
    env_t env;
    command_env(&env, 1, 1);
    int pipefd[2] = {-1, -1};
    pid_t pid = -1;
    for (int attempt = 0; attempt < 2 && pid < 0; attempt++) {
        if (pipe2(pipefd, O_CLOEXEC) != 0) {
            os_error(&why, errno, NULL);
            break;
        }
        char *argv[] = {"bash", "-c", TF_WRAPPER, "bash", (char *)cmd_file, NULL};
        pid = start_process(argv, cwd.p, &env, pipefd[1], -1, -1, &why);
        int e = errno;
        close(pipefd[1]);
        if (pid < 0) {
            close(pipefd[0]);
            if (e == EAGAIN && attempt == 0) { /* no process left: recover the sandbox, try once more */
                kill_everything(notes);
                continue;
            }
            break;
        }
    }
    env_free(&env);
    if (pid < 0) {
        buf_t text = {0};
        buf_printf(&text, "OSError: %s", why.p ? why.p : "cannot start the command");
        answer_error(r, text.p, out);
        buf_free(&text);
        goto done;
    }
    groups_add(pid);
    int timed_out;
    int code = collect(pid, pipefd[0], cap, started + timeout, &timed_out);
    groups_discard(pid);
    if (near_process_limit())
        kill_everything(notes);
    answer_exec(r, !timed_out, code, notes, started, cap, timed_out, out);
done:
    buf_free(&cwd);
    buf_free(&why);
}

static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* The shell died (or was killed) during a command (exec_agent.Agent._after_shell_died). */
static void after_shell_died(void) {
    if (agent.shell && agent.shell->restored)
        agent.restorable = 0;
    forget_shell();
}

/* The shell ended during the command without reporting it (exec_agent.Agent._shell_exited): its
 * status, and the note. */
static long long shell_exited(shell_t *s, int overran, int unstarted, notes_t *ended) {
    shell_poll(s, 1); /* everything it said has been read: its pid may go now */
    int code = s->exit_code != RUNNING ? s->exit_code : 0;
    after_shell_died();
    if (overran) {
        agent.restorable = 1;
        notes_add(ended, TF_OVERRAN);
        notes_add(ended, TF_OVERRAN_ENDED);
        return code;
    }
    if (unstarted) {
        notes_add(ended, TF_ENDED_UNSTARTED, code);
        return code;
    }
    notes_add(ended, TF_ENDED, code);
    return code;
}

/* Kill the shell and every process the command started after `last` (exec_agent._kill_command). */
static void kill_command(shell_t *s, long long last) {
    kill(s->pid, SIGKILL);
    int me = getpid();
    for (int round = 0; round < 50; round++) {
        int wrapped = last_pid() < last; /* pid numbers wrapped around: every one of the session */
        size_t n, victims = 0;
        int *pids = proc_pids(&n);
        for (size_t i = 0; i < n; i++) {
            int pid = pids[i];
            if (pid == 1 || pid == me || (!wrapped && pid <= last && pid != s->pid))
                continue;
            if (wrapped && pid != s->pid && start_ticks(pid) < agent.command_ticks)
                continue; /* wrapped: an earlier command's job by its start time */
            long long pgrp, sid;
            if (session_ids(pid, &pgrp, &sid) && (pgrp == s->pid || sid == s->pid)) {
                kill(pid, SIGKILL);
                victims++;
            }
        }
        free(pids);
        if (!victims)
            break;
        reap();
        sleep_s(0.005);
    }
}

/* One status line of the shell (exec_agent.Agent._collect_session): "NONCE go", "NONCE RC",
 * "NONCE exit RC" (a shell that says it is going: no loop says it since issue 39), "NONCE cwd" or another word, or the previous command's late
 * end. */
static void take_line(const char *line, const char *prefix, const char *before, const char *fifo, status_t *status,
                      int *started, int *overran, int *exiting, notes_t *note) {
    if (starts_with(line, prefix)) {
        const char *word = line + strlen(prefix);
        long long code;
        if (!strcmp(word, "go")) { /* the shell has its FIFO open: no one else may open it now */
            if (!*started)
                unlink(fifo);
            *started = 1;
            return;
        }
        if (starts_with(word, "exit ")) { /* the shell says it is going (a command can write it) */
            word += 5;
            *exiting = 1;
        }
        if (parse_int(word, &code))
            *status = (status_t){0, code, "", 0, 0};
        else {
            *status = (status_t){strcmp(word, "cwd") ? 2 : 1, 0, "", 0, 0};
            snprintf(status->word, sizeof status->word, "%s", word);
        }
    } else if (before[0] && starts_with(line, before)) {
        notes_clear(note);
        notes_add(note, TF_OVERRAN); /* its real end: that one's status line was forged */
        *overran = 1;
    }
}

/* A command's output from its FIFO until the shell reports NONCE RC (exec_agent._collect_session). */
static status_t collect_session(shell_t *s, const char *nonce, const char *fifo, int reader, int holder, cap_t *cap,
                                double deadline, long long last, notes_t *note) {
    char prefix[40], before[40];
    snprintf(prefix, sizeof prefix, "%s ", nonce);
    before[0] = 0;
    if (agent.previous_nonce[0])
        snprintf(before, sizeof before, "%s ", agent.previous_nonce);
    snprintf(agent.previous_nonce, sizeof agent.previous_nonce, "%s", nonce);
    status_t status = {-1, 0, "", 0, 0};
    int done = 0, started = 0, overran = 0, exiting = 0, eof = 0;
    double done_at = -1;
    char chunk[65536];
    for (;;) {
        double now = monotonic();
        if (done_at < 0) {
            char **lines = shell_lines(s);
            for (char **l = lines; *l; l++)
                take_line(*l, prefix, before, fifo, &status, &started, &overran, &exiting, note);
            lines_free(lines);
            if (status.kind < 0 && !s->n_intruders && shell_ended(s)) {
                lines = shell_lines(s); /* what it said before it died is all there now */
                for (char **l = lines; *l; l++)
                    take_line(*l, prefix, before, fifo, &status, &started, &overran, &exiting, note);
                lines_free(lines);
                if (status.kind < 0 && !s->n_intruders) {
                    notes_t ended = {0};
                    long long code = shell_exited(s, overran && !started, !started, &ended);
                    s = NULL; /* forgotten */
                    if (ended.n && !strcmp(ended.items[0], TF_OVERRAN))
                        notes_clear(note);
                    notes_move(note, &ended);
                    status = (status_t){0, code, "", 0, 0};
                    done = 1;
                }
            }
            if (s && s->n_intruders) {
                int pid = kill_intruders(s);
                kill_command(s, last);
                after_shell_died();
                s = NULL;
                notes_clear(note);
                notes_add(note, TF_INTERFERED, pid);
                status = (status_t){-1, 0, "", 0, 1};
                done = 1;
            } else if (status.kind < 0 && !done && now >= deadline) {
                kill_command(s, last);
                after_shell_died();
                s = NULL;
                notes_clear(note);
                notes_add(note, "%s", started ? TF_RESTARTED : TF_NOT_STARTED);
                status = (status_t){-1, 0, "", 1, !started};
                done = 1;
            }
            if (status.kind >= 0 || done) {
                done_at = monotonic();
                if (holder >= 0) { /* from now on EOF means every writer is done */
                    close(holder);
                    holder = -1;
                }
                continue;
            }
        } else if (now - done_at > GRACE_S) {
            break;
        }
        double wait = done_at >= 0 ? 0.05 : deadline - now;
        wait = wait < 0.05 ? (wait > 0 ? wait : 0) : 0.05;
        /* Once the channel is at EOF it is always "readable": watch the output alone then. */
        struct pollfd p[2] = {{reader, POLLIN, 0}, {s ? s->channel : -1, POLLIN, 0}};
        int watch_channel = done_at < 0 && s && !s->eof;
        wait_for(p, watch_channel ? 2 : 1, wait);
        if (p[0].revents) {
            ssize_t r = read(reader, chunk, sizeof chunk);
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (r <= 0) {
                if (done_at >= 0) {
                    eof = 1;
                    break;
                }
                continue;
            }
            cap_feed(cap, chunk, (size_t)r);
        }
    }
    if (holder >= 0)
        close(holder);
    if (eof)
        close(reader);
    else
        drain_add(reader); /* a background job still holds the FIFO */
    if (status.kind >= 0 && s && agent.shell == s && s->exit_code == RUNNING) {
        agent.restorable = 1; /* the loop wrote the snapshot before it answered */
        s->restored = 0;      /* a restored shell that got through a command works */
        if (exiting)          /* it said it is going: the next command gets a new shell */
            forget_shell();
    }
    return status;
}

static void exec_session(const request_t *r, double started, double timeout, cap_t *cap, notes_t *note,
                         buf_t *out) {
    buf_t why = {0}, cwd_file = {0}, fifo = {0};
    int has_cwd = r->has_cwd;
    if (has_cwd) {
        struct stat st;
        if (memchr(r->cwd.p ? r->cwd.p : "", 0, r->cwd.n) ||
            (r->cwd.n && r->cwd.p[0] == '/' && (stat(r->cwd.p, &st) != 0 || !S_ISDIR(st.st_mode)))) {
            cwd_missing(r->cwd.p ? r->cwd.p : "", r->cwd.n, note);
            answer_exec(r, 1, 1, note, started, cap, 0, out);
            goto done;
        }
        buf_printf(&cwd_file, "%s/c%lld.cwd", agent.cmd_dir, agent.counter);
        buf_t data = {0};
        buf_add(&data, r->cwd.p ? r->cwd.p : "", r->cwd.n);
        buf_add(&data, "", 1);
        int rc = write_new(cwd_file.p, data.p, data.n, &why);
        buf_free(&data);
        if (rc) {
            buf_t text = {0};
            buf_printf(&text, "OSError: %s", why.p);
            answer_error(r, text.p, out);
            buf_free(&text);
            goto done;
        }
    }
    if (agent.shell && shell_poll(agent.shell, 0) == RUNNING) {
        char **stale = shell_lines(agent.shell); /* what the shell said between commands is not this command's */
        lines_free(stale);
        if (agent.shell->n_intruders) { /* someone else wrote on its channel: a new shell */
            notes_add_first(note, TF_INTRUDED, kill_intruders(agent.shell));
            forget_shell();
        }
    }
    if (!agent.shell || shell_poll(agent.shell, 0) != RUNNING) {
        if (agent.shell)
            forget_shell();
        int rc = start_shell(note, &why); /* its note, if any, comes first */
        if (rc < 0 && errno == EAGAIN) {
            kill_everything(note);
            rc = start_shell(note, &why);
        }
        if (rc < 0) {
            buf_t text = {0};
            buf_printf(&text, "OSError: %s", why.p ? why.p : "cannot start the shell");
            answer_error(r, text.p, out);
            buf_free(&text);
            goto done;
        }
    }
    shell_t *s = agent.shell;
    char nonce[33];
    new_nonce(nonce);
    buf_printf(&fifo, "%s/o%s", agent.cmd_dir, nonce);
    int reader, holder;
    if (open_fifo(fifo.p, &reader, &holder, &why) != 0) {
        buf_t text = {0};
        buf_printf(&text, "OSError: %s", why.p);
        answer_error(r, text.p, out);
        buf_free(&text);
        unlink(fifo.p);
        if (has_cwd)
            unlink(cwd_file.p);
        goto done;
    }
    char **fresh = shell_lines(s); /* a fresh shell's "ready" */
    lines_free(fresh);
    long long last = last_pid();
    agent.command_ticks = boot_ticks();
    char line[128];
    int n = snprintf(line, sizeof line, "%lld %s %s\n", agent.counter, nonce, has_cwd ? "c" : "-");
    write_all(s->channel, line, (size_t)n); /* the shell is gone already: its exit is read below */
    notes_t said = {0};
    status_t status = collect_session(s, nonce, fifo.p, reader, holder, cap, started + timeout, last, &said);
    unlink(fifo.p);
    if (has_cwd)
        unlink(cwd_file.p);
    if (status.kind == 1) {
        notes_clear(&said);
        cwd_missing(r->cwd.p ? r->cwd.p : "", r->cwd.n, note);
        answer_exec(r, 1, 1, note, started, cap, 0, out);
        goto done;
    }
    if (status.kind == 2) {
        notes_clear(&said);
        buf_t text = {0};
        buf_adds(&text, "ValueError: invalid literal for int() with base 10: ");
        py_repr(&text, status.word, strlen(status.word));
        answer_error(r, text.p, out);
        buf_free(&text);
        goto done;
    }
    if (status.foreign) /* what reached the FIFO is not the command's */
        cap_clear(cap);
    notes_move(note, &said);
    if (near_process_limit())
        kill_everything(note);
    answer_exec(r, status.kind >= 0, status.code, note, started, cap, status.timed_out, out);
done:
    buf_free(&why);
    buf_free(&cwd_file);
    buf_free(&fifo);
}

static void do_exec(request_t *r, buf_t *out) {
    double started = monotonic();
    double timeout = r->timeout != 0 ? r->timeout : 60.0;
    cap_t cap;
    cap_init(&cap, r->cap ? r->cap : 16384);
    notes_t note = {0};
    buf_t why = {0}, cmd_file = {0};
    if (near_process_limit())
        kill_everything(&note);
    agent.counter++;
    if (!r->has_command) {
        answer_error(r, "KeyError: 'command'", out);
        goto done;
    }
    if (r->error.n) {
        answer_error(r, r->error.p, out);
        goto done;
    }
    buf_printf(&cmd_file, "%s/c%lld.sh", agent.cmd_dir, agent.counter);
    if (write_new(cmd_file.p, r->command.p ? r->command.p : "", r->command.n, &why) != 0) {
        buf_t text = {0};
        buf_printf(&text, "OSError: %s", why.p);
        answer_error(r, text.p, out);
        buf_free(&text);
        goto done;
    }
    if (r->fresh)
        exec_fresh(r, cmd_file.p, started, timeout, &cap, &note, out);
    else
        exec_session(r, started, timeout, &cap, &note, out);
    unlink(cmd_file.p);
done:
    cap_free(&cap);
    notes_clear(&note);
    buf_free(&why);
    buf_free(&cmd_file);
}

/* ------------------------------------------------------------------ reset */

static int reset_ipc_and_keys(buf_t *why) {
    if (ipc_objects()) { /* only their owner may remove them: run ipcrm as the commands' uid */
        int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
        char *argv[] = {"ipcrm", "--all", NULL};
        buf_t ignored = {0};
        pid_t pid = start_process(argv, "/", &agent.initial_env, null, -1, -1, &ignored);
        if (pid > 0)
            poll_pid(pid, 0);
        buf_free(&ignored);
        if (null >= 0)
            close(null);
        if (ipc_objects()) {
            buf_clear(why);
            buf_adds(why, "System V IPC objects could not be removed");
            return -1;
        }
    }
    mqueues(1);
    if (mqueues(0)) {
        buf_clear(why);
        buf_adds(why, "POSIX message queues could not be removed");
        return -1;
    }
    buf_clear(why);
    new_session_keyring(why);
    if (why->n)
        return -1;
    if (run_as.set) { /* the commands' own uid: keys it holds live on in the kernel */
        if (key_users_line(run_as.uid)) {
            buf_adds(why, "the commands' uid holds kernel keys");
            return -1;
        }
        return 0;
    }
    if (user_keys_left()) { /* one uid for all: its own keyrings must hold nothing */
        buf_adds(why, "keys were left in the user keyrings");
        return -1;
    }
    return 0;
}

/* Put the sandbox back into the state it started in; verify it (exec_agent.Agent.reset). */
static int do_reset(buf_t *why) {
    if (!baseline.set || !agent.own_pid_namespace) {
        buf_clear(why);
        buf_adds(why, "not started as a reusable sandbox in its own pid namespace");
        return -1;
    }
    size_t left = kill_all_others();
    if (left) {
        buf_clear(why);
        buf_printf(why, "%zu processes survived SIGKILL", left);
        return -1;
    }
    forget_shell();
    agent.restorable = 0;
    if (empty_roots(why) || empty_dir(agent.cmd_dir, why) || empty_dir(agent.out_dir, why) || restore_roots(why) ||
        reset_ipc_and_keys(why) || restore_mounts(why) || check_agent(why))
        return -1;
    agent.n_groups = 0;
    agent.counter = 0;
    return 0;
}

/* ------------------------------------------------------------------ start-up and the request loop */


static int is_limit_var(const char *item) {
    for (size_t i = 0; i < 4; i++) {
        size_t len = strlen(limit_vars[i]);
        if (!strncmp(item, limit_vars[i], len) && item[len] == '=')
            return 1;
    }
    return 0;
}

static void make_dirs(const char *path, mode_t mode) {
    char *copy = xstrdup(path);
    for (char *p = copy + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(copy, 0777);
            *p = '/';
        }
    if (mkdir(copy, mode) != 0 && errno != EEXIST) {
        fprintf(stderr, "exec agent: cannot make %s: %s\n", copy, strerror(errno));
        _exit(1);
    }
    if (chmod(copy, mode) != 0) {
        fprintf(stderr, "exec agent: cannot chmod %s: %s\n", copy, strerror(errno));
        _exit(1);
    }
    free(copy);
}

static int in_own_pid_namespace(void) {
    pid_t ppid = getppid();
    if (ppid == 1) {
        char comm[32];
        read_small("/proc/1/comm", comm, sizeof comm);
        return !strcmp(comm, "bwrap");
    }
    return ppid == 0 && getpid() != 1;
}

/* Show as AGENT_NAME to ps and top inside the sandbox (exec_agent.Kernel.rename): the name (comm)
 * and the command line, whose memory is our argv strings, overwritten in place with the name and
 * zeros and a last byte that is not NUL (the kernel then reads up to the first NUL: the name).
 * Every string main() keeps from argv is a copy by then. */
#define AGENT_NAME "exec-agent"
static void rename_self(int argc, char **argv) {
    prctl(PR_SET_NAME, AGENT_NAME, 0, 0, 0);
    char *start = argv[0], *end = argv[argc - 1] + strlen(argv[argc - 1]) + 1;
    if ((size_t)(end - start) > strlen(AGENT_NAME) + 1) {
        memset(start, 0, (size_t)(end - start));
        memcpy(start, AGENT_NAME, strlen(AGENT_NAME));
        end[-1] = ' ';
    }
}

static void usage(const char *why) {
    fprintf(stderr, "exec agent: %s\nusage: exec_agent WORKDIR SCRATCH [--reusable] [--run-as UID:GID] "
                    "[--state-dir DIR] [--max-procs N] [--shm DIR]\n", why);
    exit(2);
}

static void send_answer(buf_t *out) {
    if (write_all(1, out->p, out->n) != 0)
        _exit(0); /* the host is gone */
    buf_clear(out);
}

/* What the agent's launcher ignored or blocked (nohup, a script's background job: SIGHUP, SIGINT,
   SIGQUIT) every command would inherit, and bash can neither trap nor reset a signal ignored at its
   start: a command in a terminal starts with none ignored and none blocked. */
static void default_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int number = 1; number < NSIG; number++) {
        struct sigaction was;
        if (sigaction(number, NULL, &was) == 0) {
            if (was.sa_handler == SIG_IGN)
                signal(number, SIG_DFL);
        } else if (errno == EINVAL) {
            /* glibc keeps two real-time signals for itself (32 and 33: thread cancellation and
               set*id across threads) and refuses them to sigaction, yet an ignored one is
               inherited like any other (a launcher that ignored it: seen under pytest-xdist):
               the kernel's own call reads it and sets an ignored one back to the default. The handler
               is a kernel sigaction's first field, and an all-zero one is SIG_DFL, no flags, an
               empty mask, whatever the architecture's order of the others. */
            unsigned long was_k[8] = {0}, action[8] = {0};
            if (syscall(SYS_rt_sigaction, number, NULL, was_k, (size_t)(NSIG / 8)) == 0 &&
                was_k[0] == (unsigned long)SIG_IGN)
                syscall(SYS_rt_sigaction, number, action, NULL, (size_t)(NSIG / 8));
        }
    }
}

int main(int argc, char **argv) {
    default_signals();
    signal(SIGPIPE, SIG_IGN); /* as python: a closed pipe is an error to handle, not a death */
    signal(SIGXFSZ, SIG_IGN);
    int real_argc = argc;
    char **real_argv = argv;
    if (argc < 2 && getenv("TF_AGENT_ARGS")) { /* the options one a line (bwrap: argv is what ps shows) */
        static char *text; /* static: kept for the process's life (LeakSanitizer: reachable) */
        text = xstrdup(getenv("TF_AGENT_ARGS"));
        size_t n = 2;
        for (char *c = text; *c; c++)
            n += *c == '\n';
        static char **args;
        args = xcalloc(n + 1, sizeof *args);
        args[0] = argv[0];
        argc = 1;
        for (char *line = text;; argc++) {
            args[argc] = line;
            char *nl = strchr(line, '\n');
            if (!nl) {
                argc++;
                break;
            }
            *nl = 0;
            line = nl + 1;
        }
        argv = args;
    }
    if (argc < 3)
        usage("WORKDIR and SCRATCH are required");
    /* Run from the fd of our file (bwrap: /proc/self/fd/N): the kernel holds the program itself. */
    if (!strncmp(argv[0], "/proc/self/fd/", 14) && argv[0][14] >= '0' && argv[0][14] <= '9')
        close(atoi(argv[0] + 14));
    /* static: they live as long as the process (LeakSanitizer counts them reachable) */
    static const char *scratch, *state_dir, *shm;
    scratch = xstrdup(argv[2]);
    agent.workdir = xstrdup(argv[1]);
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--reusable"))
            agent.reusable = 1;
        else if (!strcmp(argv[i], "--run-as") && i + 1 < argc) {
            char *colon = strchr(argv[++i], ':');
            run_as.uid = atoi(argv[i]);
            run_as.gid = colon && colon[1] ? atoi(colon + 1) : run_as.uid;
            run_as.set = 1;
        } else if (!strcmp(argv[i], "--state-dir") && i + 1 < argc)
            state_dir = xstrdup(argv[++i]);
        else if (!strcmp(argv[i], "--max-procs") && i + 1 < argc)
            agent.max_procs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shm") && i + 1 < argc)
            shm = xstrdup(argv[++i]);
        else {
            buf_t why = {0};
            buf_adds(&why, "unknown option ");
            py_repr(&why, argv[i], strlen(argv[i]));
            usage(why.p);
        }
    }
    agent.initial_env.items = xcalloc(1, sizeof *agent.initial_env.items);
    agent.limits.items = xcalloc(1, sizeof *agent.limits.items);
    for (size_t i = 0; i < 4; i++) {
        const char *value = getenv(limit_vars[i]);
        limit_values[i] = value;
        if (value && *value) {
            buf_t item = {0};
            buf_printf(&item, "%s=%s", limit_vars[i], value);
            env_add(&agent.limits, item.p);
            buf_free(&item);
        }
    }
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "TF_AGENT_", 9) && !is_limit_var(*e))
            env_add(&agent.initial_env, *e);

    /* Command files and output FIFOs are made by us in a directory commands cannot write; the
     * shell's snapshot is written by the shell into a directory of its own (exec_agent docs). */
    char *base = state_dir ? xstrdup(state_dir) : path_join(scratch, ".trajforge-session");
    agent.cmd_dir = path_join(base, "cmd");
    agent.out_dir = path_join(base, "out");
    make_dirs(base, 0755);
    make_dirs(agent.cmd_dir, 0711); /* searchable, not listable: FIFOs are named by their nonce */
    make_dirs(agent.out_dir, 0700);
    if (run_as.set && chown(agent.out_dir, (uid_t)run_as.uid, (gid_t)run_as.gid) != 0) {
        fprintf(stderr, "exec agent: cannot chown %s: %s\n", agent.out_dir, strerror(errno));
        return 1;
    }
    agent.snapshot = path_join(agent.out_dir, "snapshot.sh");
    free(base);

    agent.own_pid_namespace = in_own_pid_namespace();
    if (agent.reusable || agent.own_pid_namespace) { /* a real sandbox: nothing of the host's keyring */
        agent.kernel = 1;
        agent.keyctl = 1;
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* commands of our uid cannot trace us */
        buf_t why = {0};
        new_session_keyring(&why);
        if (why.n) {
            fprintf(stderr, "exec agent: %s\n", why.p);
            return 1;
        }
        rename_self(real_argc, real_argv);
    }
    if (agent.reusable && agent.kernel) {
        buf_t why = {0};
        if (baseline_take(agent.workdir, scratch, shm, &why) != 0) {
            fprintf(stderr, "exec agent: cannot record the sandbox's starting state: %s\n", why.p);
            return 1;
        }
    }

    buf_t out = {0}, in = {0};
    buf_printf(&out, "{\"ready\": true, \"pid\": %d}\n", (int)getpid());
    send_answer(&out);
    size_t start = 0;
    for (;;) {
        char *nl = in.n > start ? memchr(in.p + start, '\n', in.n - start) : NULL;
        if (!nl) {
            if (start) {
                memmove(in.p, in.p + start, in.n - start);
                in.n -= start;
                start = 0;
            }
            if (in.n > LINE_LIMIT) {
                fprintf(stderr, "exec agent: a request line over %u bytes\n", LINE_LIMIT);
                close_agent();
                buf_free(&in);
                buf_free(&out);
                return 1;
            }
            struct pollfd p = {0, POLLIN, 0};
            wait_for(&p, 1, -1);
            if (!p.revents)
                continue;
            buf_reserve(&in, 1 << 16);
            ssize_t r = read(0, in.p + in.n, 1 << 16);
            if (r < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (r <= 0)
                break; /* the host closed our stdin */
            in.n += (size_t)r;
            in.p[in.n] = 0;
            continue;
        }
        size_t len = (size_t)(nl - (in.p + start));
        const char *line = in.p + start;
        start += len + 1;
        size_t k = 0;
        while (k < len && is_space(line[k]))
            k++;
        if (k == len)
            continue;
        request_t r;
        if (!parse_request(line, len, &r)) {
            fprintf(stderr, "exec agent: unreadable request: %.200s\n", line);
            request_free(&r);
            close_agent();
            buf_free(&in);
            buf_free(&out);
            return 1;
        }
        const char *op = r.has_op && r.op.p ? r.op.p : "";
        if (!strcmp(op, "close")) {
            close_agent();
            buf_printf(&out, "{\"id\": %s, \"closed\": true}\n", r.id);
            send_answer(&out);
            request_free(&r);
            buf_free(&in);
            buf_free(&out);
            return 0;
        }
        if (!strcmp(op, "stop")) { /* the rollout is over: nothing it started may run on */
            stop_all();
            buf_printf(&out, "{\"id\": %s, \"stopped\": true}\n", r.id);
        } else if (!strcmp(op, "reset")) {
            buf_t why = {0};
            if (do_reset(&why) == 0)
                buf_printf(&out, "{\"id\": %s, \"reset\": true}\n", r.id);
            else {
                buf_printf(&out, "{\"id\": %s, \"reset\": false, \"reason\": ", r.id);
                json_text(&out, why.p ? why.p : "reset failed", why.p ? why.n : 12);
                buf_adds(&out, "}\n");
            }
            buf_free(&why);
        } else {
            do_exec(&r, &out);
        }
        send_answer(&out);
        request_free(&r);
    }
    close_agent();
    buf_free(&in);
    buf_free(&out);
    return 0;
}
