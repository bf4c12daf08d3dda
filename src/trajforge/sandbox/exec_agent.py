"""The exec agent: a tiny stdlib-only program that runs inside a sandbox and executes commands.

Why a resident agent instead of one ``bash -c`` per call: the model expects a *shell session*,
background jobs must outlive the call that started them, and the output of a runaway command must
be capped *where it is produced* so 50 MB never crosses into the host's memory. One agent per
sandbox, started once, talking JSON lines over stdin/stdout.

Protocol (one JSON object per line):
  request  ``{"id": n, "op": "exec", "command": str, "timeout": float, "cwd": str|null, "cap": int}``
           (``"fresh": true``: outside the session, see :meth:`Agent._exec_fresh`)
  answer   ``{"id": n, "exit_code": int|null, "output": str, "timed_out": bool, "truncated": bool,
             "output_bytes": int, "duration_s": float}``
  request  ``{"id": n, "op": "close"}`` -> kills every process group it started, answers, exits.
  request  ``{"id": n, "op": "stop"}`` -> kills every process the commands started, files kept.
  request  ``{"id": n, "op": "reset"}`` -> ``{"id": n, "reset": bool, "reason": str}``: puts a
           reusable sandbox back into its starting state (see :meth:`Agent.reset`), or says why not.

The session is one resident ``bash`` (:data:`LOOP`), started at the first command as the commands'
uid in a session of its own, that runs each command in itself as ``bash -c`` would: functions,
aliases, plain and exported variables, options, traps, the cwd and a ``source``d virtualenv all
stay, as in a terminal, and nothing of the loop shows to the command (no variable, function, trap,
file name in a message or command line of the harness's). Each command's output goes to a FIFO of
its own (capped here); its end is the shell's ``NONCE RC`` line on the shell's channel, a socket
pair apart from the output, the nonce fresh per command, so no output can end a command early,
and only the shell's own process (the kernel says which process sent each line) can end it at
all. At its timeout the command's processes and the shell are killed and the next command gets a
new shell sourced from the snapshot the loop writes after every command; the same when a command
ends the shell (``exit``, ``set -e``, ``set -u``, ``exec``, a signal: the note says the session is
the one from before the command). A reset kills the shell with everything else: each rollout
starts with a new ``bash`` from the start environment.

Who can reach the agent: with ``--run-as UID:GID`` (bwrap started as root) the agent itself is uid 0
with a handful of capabilities (setuid/setgid to start commands, kill, fowner/dac_override/chown to
reset what commands leave) and ``no_new_privs``; every command runs as UID, which the kernel strips
of all capabilities on the switch. A command can then neither signal, trace, ``prlimit``, renice nor
re-pin the agent, so every later shell (one per rollout) starts from the agent's pristine limits. Without
``--run-as`` (a user namespace: one uid for all) commands *can* do those things to the agent; the
reset then verifies the agent's own attributes and refuses (the host discards the sandbox) when
any changed.

This file must stay importable by any python3 >= 3.8 with nothing but the standard library.
``exec_agent.c`` is this agent compiled (``native_agent.py`` builds it, with ``LOOP``, ``WRAPPER``
and ``_OVERRAN`` taken from here): a change to what this agent does is made there too, and
``tests/test_native_agent.py`` compares the two agents' answers byte for byte.
"""

from __future__ import annotations

import _signal as signal  # the C module: ``signal`` itself imports enum and with it collections
import _socket  # the C module (~80 KiB): ``socket`` imports enum, selectors and more
import _thread
import os
import resource
import select
import stat
import sys
import time

# What the agent imports is what every sandbox keeps in memory for its whole life: no typing (1.6
# MiB), json's Python layer with its re (1.1 MiB), subprocess/threading (1.4 MiB), contextlib or
# enum (measured by importing each into ``python3 -I -S``). Type checkers still see the annotations.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# A fresh command (``"fresh": true``: a verifier's) runs in a bash of its own, outside the session:
# the limits set first, then the command file sourced (no ARG_MAX limit, exact bytes).
WRAPPER = r"""
ulimit -f "$TF_LIMIT_FSIZE_KB" 2>/dev/null
ulimit -t "$TF_LIMIT_CPU_S" 2>/dev/null
[ -n "$TF_LIMIT_AS_KB" ] && ulimit -v "$TF_LIMIT_AS_KB" 2>/dev/null
[ -n "$TF_LIMIT_NPROC" ] && ulimit -u "$TF_LIMIT_NPROC" 2>/dev/null
unset TF_LIMIT_FSIZE_KB TF_LIMIT_CPU_S TF_LIMIT_AS_KB TF_LIMIT_NPROC
. "$1"
"""

# The resident shell of a session: ``bash`` with no arguments (``ps`` shows a plain ``bash``),
# reading this script from fd 0 (a memory file the agent wrote it into, see :func:`loop_script`),
# fd 1 its end of a Unix socket pair whose other end only the agent holds, fd 2 /dev/null. The
# script is one line, one brace group: its redirections move the socket to fd 10, a copy bash
# itself makes close-on-exec, and put /dev/null on fd 0 and fd 1: no program a command runs
# inherits the channel. Over it the agent sends one line per command (its number, a fresh nonce,
# and "c" when a cwd file comes with it) and the loop answers ``NONCE go`` when it took the line,
# ``NONCE RC`` after the command. A subshell a command forks keeps fd 10 (a fork is the loop's
# copy): so the agent takes a line only from the loop's own process, as the kernel attests it
# (SO_PASSCRED: every message arrives with its sender's pid, and a stream never merges two
# senders' data), and treats anything else as an impostor.
#
# A command runs in this very shell -- so its functions, aliases, plain variables, options, cwd,
# traps and ``source``d environments stay -- as ``bash -c`` would run it, and nothing of the loop
# shows (issue 39: the model must see a shell, not the harness): its text is read into
# ``BASH_EXECUTION_STRING`` (where ``bash -c`` keeps its command) and ``eval``'d on line 1 of the
# script, so errors read ``bash: line N: ...`` with N the command's own line, ``$0`` is ``bash``,
# ``$BASH_SOURCE`` and ``$FUNCNAME`` are empty and ``return`` is the error it is in a terminal.
# The loop's own variables (``__tf_*``) exist only between commands: a function that unsets itself
# and them returns the previous command's exit code, so ``$?`` is what a terminal shows, and the
# nonce comes back after the command from a here-string fd (closed for the command; bash keeps its
# copy close-on-exec). No trap of the loop's: an ``exit``, a ``set -e`` failure or a ``set -u``
# error ends the shell as it ends ``bash -c``, and the next command gets a new shell from the
# snapshot of the session taken after the last command that finished.
#
# The command's stdin is /dev/null and its output goes into a FIFO of its own, named by its nonce
# (in a directory commands cannot list); ``go`` is said once the FIFO is open (at fd 95 of the
# braces around the command, which the command itself does not see), and the agent then removes
# its name, so a process that learns it later cannot open it. Until the command's own
# redirections, stdout and stderr are /dev/null: an xtrace of the loop's lines, or a DEBUG trap the
# session keeps, write nothing into the output. bash saves the loop's fds for the duration
# (close-on-exec) and puts them back whatever ``exec`` redirection the command made. Around each
# command the loop turns off (and then restores) the options that would break its own statements
# (errexit, nounset, allexport, xtrace, verbose), writes a snapshot of the session that a
# restarted shell sources, and only then reports the status. Every loop statement is a
# ``builtin``: a command's ``cd``/``read``/``printf`` functions do not reach it. Options are saved
# as $SHELLOPTS/$BASHOPTS, two strings: ``set +o``/``shopt -p`` would write ~80 lines, each a
# system call, after every command.
#
# ``@TF_...@`` are filled in per shell by :func:`loop_script` (the native agent does the same):
# the command directory and the snapshot (quoted), ``new`` or ``restore``, the nonce of the
# ``ready`` line, and the ``ulimit`` statements of the sandbox's limits.
_LOOP_LINES = r"""
{
__tf_u=$_;
@TF_LIMITS@
builtin shopt -s expand_aliases;
if [ @TF_MODE@ = restore ]; then
  builtin . @TF_SNAP@ </dev/null >/dev/null 2>&1;
  builtin trap - DEBUG ERR RETURN;
  builtin mapfile -t __tf_all < <(builtin compgen -A shopt);
  for __tf_o in "${__tf_all[@]}"; do
    [[ :$__tf_bo: == *:"$__tf_o":* ]] && builtin shopt -s "$__tf_o" || builtin shopt -u "$__tf_o";
  done 2>/dev/null;
  builtin mapfile -t __tf_all < <(builtin compgen -A setopt);
  for __tf_o in "${__tf_all[@]}"; do
    [[ $__tf_o == @(history|monitor|noexec|onecmd|emacs|vi|privileged) ]] && builtin continue;
    [[ :$__tf_so: == *:"$__tf_o":* ]] && builtin set -o "$__tf_o" || builtin set +o "$__tf_o";
  done 2>/dev/null;
fi;
__tf_rc=${__tf_rc:-0} __tf_f=$-;
builtin set +euavx --;
builtin unset -v __tf_all __tf_o __tf_so __tf_bo BASH_EXECUTION_STRING;
builtin export -n __tf_rc __tf_f __tf_u 2>/dev/null;
builtin printf '%s ready\n' @TF_NONCE@ >&10;
while IFS=' ' builtin read -r -u 10 __tf_n __tf_nonce __tf_cwd; do
  if [[ $__tf_cwd == c ]]; then
    IFS= builtin read -r -d '' __tf_cwd <@TF_DIR@/c$__tf_n.cwd;
    if ! builtin cd -- "$__tf_cwd" 2>/dev/null; then
      builtin printf '%s cwd\n' "$__tf_nonce" >&10;
      builtin continue;
    fi;
  fi;
  {
    builtin printf '%s go\n' "$__tf_nonce" >&10;
    if builtin unset -n BASH_EXECUTION_STRING 2>/dev/null; then
      IFS= builtin read -r -d '' BASH_EXECUTION_STRING <@TF_DIR@/c$__tf_n.sh;
    else
      IFS= builtin read -r -d '' __tf_cmd <@TF_DIR@/c$__tf_n.sh;
    fi;
    __tf_r() { builtin unset -f __tf_r; builtin unset -v __tf_n __tf_nonce __tf_cwd __tf_rc __tf_f __tf_u; builtin return "$1"; };
    [[ -n ${__tf_f//[!euavx]/} ]] && builtin set -"${__tf_f//[!euavx]/}";
    if (( __tf_rc )); then
      __tf_r "$__tf_rc" "$__tf_u" || builtin eval "${__tf_cmd-$BASH_EXECUTION_STRING}" >&95 2>&1 95>&- 96<&-;
    else
      __tf_r 0 "$__tf_u";
      builtin eval "${__tf_cmd-$BASH_EXECUTION_STRING}" >&95 2>&1 95>&- 96<&-;
    fi;
    __tf_rc=$? __tf_f=$-;
    builtin unset -v __tf_cmd;
    builtin unset -n BASH_EXECUTION_STRING 2>/dev/null || builtin :;
    builtin export -n __tf_rc __tf_f 2>/dev/null || builtin :;
    {
      builtin declare -p; builtin declare -f; builtin declare -F; builtin alias -p; builtin trap -p; builtin umask -p;
      builtin printf 'builtin cd -- %q\n__tf_so=%q __tf_bo=%q\n' "$PWD" "$SHELLOPTS" "$BASHOPTS";
    } >|@TF_SNAP@ 2>/dev/null || builtin :;
    builtin set +euavx;
    IFS=' ' builtin read -r -u 96 __tf_nonce __tf_u;
  } 95>@TF_DIR@/o$__tf_nonce 96<<<"$__tf_nonce $__tf_u" </dev/null >/dev/null;
  builtin export -n __tf_nonce __tf_u 2>/dev/null;
  builtin printf '%s %s\n' "$__tf_nonce" "$__tf_rc" >&10;
done;
} 1>/dev/null 0</dev/null
"""
# One line: ``eval`` numbers a command's lines from the line it is called on, and on line 1 the
# command's first line is ``line 1`` in bash's messages, as under ``bash -c``.
LOOP = " ".join(line.strip() for line in _LOOP_LINES.strip().splitlines()) + "\n"
# ``ulimit`` flags of the limits the host sets (the agent's environment): the loop's statements.
_LIMIT_FLAGS = (
    ("TF_LIMIT_FSIZE_KB", "-f"),
    ("TF_LIMIT_CPU_S", "-t"),
    ("TF_LIMIT_AS_KB", "-v"),
    ("TF_LIMIT_NPROC", "-u"),
)


def _quoted(text: str) -> str:
    """``text`` as one single-quoted shell word."""
    return "'" + text.replace("'", "'\\''") + "'"


def loop_script(limits: dict[str, str], cmd_dir: str, snapshot: str, restore: bool, nonce: str) -> bytes:
    """:data:`LOOP` for one shell: its placeholders filled in, in one pass (a value is never read
    again for placeholders). A limit is set only when its value is all ASCII digits."""
    values = {
        "LIMITS": "".join(
            f"builtin ulimit {flag} {limits[name]} 2>/dev/null; "
            for name, flag in _LIMIT_FLAGS
            if limits.get(name) and all("0" <= c <= "9" for c in limits[name])
        ),
        "MODE": "restore" if restore else "new",
        "SNAP": _quoted(snapshot),
        "DIR": _quoted(cmd_dir),
        "NONCE": nonce,
    }
    parts = LOOP.split("@TF_")
    out = [parts[0]]
    for part in parts[1:]:
        name, at, rest = part.partition("@")
        out.append(values[name] + rest if at and name in values else "@TF_" + part)
    return "".join(out).encode("utf-8", "surrogateescape")


# A command can read the loop's nonce (it runs in the loop's shell) and write the status line
# itself: its call then ends early. Its real end shows up later, while the next command waits.
_OVERRAN = (
    "\n[the command before this one reported its end early (it wrote the shell's status line "
    "itself) and went on running in the shell until now]\n"
)
# A process other than the shell wrote on the shell's channel (a job a command left, or a
# program given a copy of the channel): what this command reports cannot be trusted.
_INTERFERED = (
    "\n[a process other than the shell (pid %d) wrote on the shell's channel to the exec agent: it "
    "was killed, and so were the shell and what this command started; this command's exit code and "
    "output are not reported (it may have been interfered with); the next command runs in a new "
    "shell with the session as it was before this command]\n"
)
_INTRUDED = (
    "[a process other than the shell (pid %d) wrote on the shell's channel to the exec agent since "
    "the last command: it was killed, and this command runs in a new shell with the session as it "
    "was after the last command]\n"
)
# The shell never took the command (stopped, still running an earlier one, or its request was
# taken by another process): whatever reached the command's output was not the command's.
_NOT_STARTED = (
    "\n[the shell did not start this command within its timeout (a process stopped it or took its "
    "request, or the command before this one was still running in it): nothing that reached its "
    "output is reported; the shell was restarted: the next command runs with the session as it "
    "was before this command]\n"
)
_RESTARTED = (
    "\n[the shell was restarted: the next command runs with the session as it was before this command]\n"
)
_RESTORE_S = 10.0  # how long a restored shell may take to source its snapshot
_GRACE_S = 0.2  # how long to keep reading after the command exits while a background job holds the pipe
_PROCS_HEADROOM = 0.8  # at this share of the process limit, everything but the agent is killed
_PROCS_LOOK = 0.4  # below this share of processes, the limit is not looked at more closely
_KILL_ONE_BY_ONE = 16  # at most this many processes left: a kill each, not kill(-1)
_LIMIT_VARS = ("TF_LIMIT_FSIZE_KB", "TF_LIMIT_CPU_S", "TF_LIMIT_AS_KB", "TF_LIMIT_NPROC")
_KEYCTL = {"x86_64": 250, "aarch64": 219}  # syscall numbers the stdlib has no wrapper for
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
_KEYCTL_GET_KEYRING_ID, _KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_READ = 0, 1, 11
_KEY_SPEC_USER, _KEY_SPEC_USER_SESSION = -4, -5
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602
_CREDS_SPACE = _socket.CMSG_SPACE(12)  # struct ucred: pid, uid, gid
_NAME = b"exec-agent"  # what ps and top show of the agent inside a sandbox (Kernel.rename)


class suppress:  # noqa: N801 (contextlib's name: that module imports collections and functools)
    """``contextlib.suppress``: a ``with`` block that ignores the given exceptions."""

    def __init__(self, *kinds: type[BaseException]) -> None:
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: object, traceback: object) -> bool:
        return kind is not None and issubclass(kind, self.kinds)


class OutputCap:
    """Keeps the first ``head`` and the last ``tail`` bytes of a stream, counting the rest."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap > 0:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trim rarely, keep it amortised O(1)
                del self.tail[: len(self.tail) - self.tail_cap]

    def clear(self) -> None:
        """Forget what was fed so far (it was not the command's)."""
        self.head.clear()
        self.tail.clear()
        self.total = 0

    def render(self) -> tuple[str, bool]:
        tail = bytes(self.tail[-self.tail_cap :]) if self.tail_cap > 0 else b""
        kept = len(self.head) + len(tail)
        if kept >= self.total:
            return (bytes(self.head) + tail).decode("utf-8", "replace"), False
        omitted = self.total - kept
        marker = f"\n\n[... {omitted} bytes of output omitted ({self.total} total) ...]\n\n".encode()
        return (bytes(self.head) + marker + tail).decode("utf-8", "replace"), True


def _drain_forever(fd: int) -> None:
    """Read and discard what background jobs still write, so they never block or get SIGPIPE."""
    try:
        with suppress(OSError):
            while os.read(fd, 65536):
                pass
    finally:
        os.close(fd)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _tasks(pids: list[int]) -> int:
    """Processes and their threads (a process that exited meanwhile counts as one)."""
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            total += 1
    return total


def _tmpfs_mounts() -> list[str]:
    """Writable tmpfs mounts (bwrap's ``/``, ``/dev``, ``/run``): where a command could leave
    something outside the workdir and scratch dir. From mountinfo, so the check follows the
    layout bwrap actually built (as root they are not writable for the sandbox uid; in a user
    namespace they are)."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if right.split()[:1] == ["tmpfs"] and "rw" in fields[5].split(","):
                mounts.append(fields[4].replace("\\040", " "))
    return mounts


def _tree(root: str) -> dict[str, Any]:
    """Every entry of one mount (not descending into other mounts): type+mode, owner, and the
    size+mtime of files or the target of links. Directory times are left out on purpose: removing
    what a command added changes them, and that is not a difference the next rollout can see."""
    out: dict[str, Any] = {}
    top = os.lstat(root)
    out[root] = (top.st_mode, top.st_uid, top.st_gid, None)
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                extra: str | tuple[int, int] | None
                if stat.S_ISLNK(st.st_mode):
                    extra = os.readlink(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    extra = (st.st_size, st.st_mtime_ns)
                else:
                    extra = None
                out[entry.path] = (st.st_mode, st.st_uid, st.st_gid, extra)
                if stat.S_ISDIR(st.st_mode) and st.st_dev == top.st_dev:
                    stack.append(entry.path)
    return out


def _remove(path: str) -> None:
    """Remove a file or a whole tree the sandbox uid owns, whatever modes a command left on it."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    os.chmod(path, 0o700)
    _empty(path)
    os.rmdir(path)


def _empty(path: str) -> None:
    with os.scandir(path) as entries:
        names = [entry.path for entry in entries]
    for name in names:
        _remove(name)


def _ipc_objects() -> int:
    """System V shared memory segments, semaphores and message queues in our IPC namespace."""
    count = 0
    for kind in ("shm", "sem", "msg"):
        count += max(0, len(_read("/proc/sysvipc/" + kind).splitlines()) - 1)
    return count


class Kernel:
    """The few system calls the standard library has no wrapper for, through ctypes. Only for
    reusable sandboxes: importing ctypes costs ~9 ms of start-up, paid once per reused sandbox."""

    def __init__(self) -> None:
        import ctypes

        self._c = ctypes
        self._libc = ctypes.CDLL(None, use_errno=True)
        machine = os.uname().machine
        self._keyctl = _KEYCTL.get(machine)
        self._ioprio = _IOPRIO_GET.get(machine)

    def make_undumpable(self) -> None:
        """Commands that share our uid could otherwise ptrace this process (or read its memory) and
        make a reset lie about the sandbox's state. A non-dumpable process can only be traced with
        CAP_SYS_PTRACE, which nothing in the sandbox has."""
        self._libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0

    def rename(self, name: bytes) -> None:
        """Show as ``name`` to ``ps`` and ``top`` inside the sandbox: its command line and its
        name (comm) said where the harness keeps its files and how it runs (issue 39). The kernel
        reads /proc/PID/cmdline from the memory that holds our argv strings: overwritten in place
        with the name and zeros, and a last byte that is not NUL, which tells the kernel the
        title was set (setproctitle): it then reads up to the first NUL, the name alone."""
        self._libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME
        fields = _read("/proc/self/stat").rpartition(")")[2].split()
        if len(fields) < 47 or not fields[45].isdigit() or not fields[46].isdigit():
            return
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        if end - start > len(name) + 1:
            self._c.memmove(start, name + b"\0" * (end - start - len(name) - 1) + b" ", end - start)

    def new_session_keyring(self) -> None:
        """Join a fresh anonymous session keyring: commands inherit it, so keys a rollout added
        (or a keyring inherited from whoever started the host process) never reach the next one."""
        if self._keyctl is None:
            return
        if self._libc.syscall(self._keyctl, _KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
            return
        if self._c.get_errno() in (1, 38):  # EPERM/ENOSYS: keyrings are blocked here (a seccomp
            self._keyctl = None  # policy, e.g. Docker's default), for our commands as well
            return
        raise ResetRefused("could not join a new session keyring")

    def user_keys(self) -> list[int]:
        """Keys in our user keyring, and in our user session keyring other than the link to the
        user keyring that the kernel puts there itself. Empty when keyrings are blocked here."""
        if self._keyctl is None:
            return []
        user = self._libc.syscall(self._keyctl, _KEYCTL_GET_KEYRING_ID, self._c.c_long(_KEY_SPEC_USER), 1)
        found = []
        for spec in (_KEY_SPEC_USER, _KEY_SPEC_USER_SESSION):
            found += [k for k in self._keyring(spec) if k != user]
        return found

    def _keyring(self, spec: int) -> list[int]:
        c = self._c
        buf = (c.c_int32 * 256)()
        size = self._libc.syscall(self._keyctl, _KEYCTL_READ, c.c_long(spec), buf, c.c_long(c.sizeof(buf)))
        if size < 0:
            return [-1]  # unreadable: count it as something left
        return list(buf[: min(size, c.sizeof(buf)) // 4])

    def ioprio(self) -> int | None:
        if self._ioprio is None:
            return None
        return int(self._libc.syscall(self._ioprio, 1, 0))  # IOPRIO_WHO_PROCESS, this process


_RLIMITS = [(n, getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_")]


def _own_attributes(kernel: Kernel | None) -> dict[str, Any]:
    """What a process of our uid could change about the agent from outside (and so about every
    command it starts later): rlimits, niceness, CPU affinity, scheduling, OOM score, I/O priority."""
    attrs: dict[str, Any] = {
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "scheduler": os.sched_getscheduler(0),
        "oom_score_adj": _read("/proc/self/oom_score_adj").strip(),
        "timerslack_ns": _read("/proc/self/timerslack_ns").strip(),
    }
    for name, number in _RLIMITS:
        attrs[name] = resource.getrlimit(number)
    if kernel is not None:
        attrs["ioprio"] = kernel.ioprio()
    return attrs


def _xattrs(path: str) -> dict[str, Any]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:  # not supported by this file system
        return {}
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in sorted(names)}


def _fs_flags(path: str, value: int | None = None) -> int | None:
    """chattr flags of a directory (FS_IOC_GETFLAGS); sets them when ``value`` is given. None when
    the file system has none."""
    import array
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        buf = array.array("l", [value or 0])
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS if value is not None else _FS_IOC_GETFLAGS, buf, True)
        return buf[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def _dir_attributes(path: str) -> dict[str, Any]:
    """Everything about a writable root (workdir, scratch dir) that survives emptying it: mode,
    owner, modification time, extended attributes (ACLs included) and chattr flags. Its ctime
    cannot be set back by anyone and its atime moves when it is read, so neither is compared."""
    st = os.lstat(path)
    return {
        "mode": st.st_mode,
        "owner": (st.st_uid, st.st_gid),
        "mtime_ns": st.st_mtime_ns,
        "xattrs": _xattrs(path),
        "flags": _fs_flags(path),
    }


def _restore_dir(path: str, start: dict[str, Any], times: tuple[int, int]) -> None:
    """Put a writable root's attributes back as they were at start (best effort; verified after)."""
    with suppress(OSError):
        os.chown(path, *start["owner"], follow_symlinks=False)
    os.chmod(path, stat.S_IMODE(start["mode"]))
    now = _xattrs(path)
    for name in now:
        if name not in start["xattrs"]:
            with suppress(OSError):
                os.removexattr(path, name, follow_symlinks=False)
    for name, value in start["xattrs"].items():
        if now.get(name) != value:
            with suppress(OSError):
                os.setxattr(path, name, value, follow_symlinks=False)
    if start["flags"] is not None and _fs_flags(path) != start["flags"]:
        _fs_flags(path, start["flags"])
    os.utime(path, ns=times, follow_symlinks=False)


def _read_key_users(uid: int) -> str:
    """This uid's line in /proc/key-users (keys it owns anywhere in the kernel), or ''."""
    for line in _read("/proc/key-users").splitlines():
        if line.split(":", 1)[0].strip() == str(uid):
            return line.strip()
    return ""


def _mqueues() -> list[str]:
    """POSIX message queues of our IPC namespace (bwrap mounts an mqueue file system for them)."""
    try:
        return [os.path.join("/dev/mqueue", n) for n in os.listdir("/dev/mqueue")]
    except OSError:
        return []


class ResetRefused(Exception):
    """The sandbox cannot be put back into its starting state; the host must discard it."""


class Baseline:
    """What a reusable sandbox looked like when it started, and putting it back: the writable roots'
    attributes, the writable tmpfs mounts' trees, and the agent's own attributes."""

    def __init__(self, roots: tuple[str, ...], kernel: Kernel) -> None:
        self.kernel = kernel
        self.roots = {d: _dir_attributes(d) for d in roots}
        self.times = {d: (os.lstat(d).st_atime_ns, os.lstat(d).st_mtime_ns) for d in roots}
        self.mounts = {m: _tree(m) for m in _tmpfs_mounts()}
        self.attributes = _own_attributes(kernel)

    def empty_roots(self) -> None:
        for path, start in self.roots.items():
            os.chmod(path, stat.S_IMODE(start["mode"]))
            _empty(path)

    def restore_roots(self) -> None:
        for path, start in self.roots.items():
            _restore_dir(path, start, self.times[path])
            changed = [k for k, v in _dir_attributes(path).items() if v != start[k]]
            if changed:
                raise ResetRefused(f"cannot restore the {', '.join(changed)} of {path}")

    def restore_mounts(self) -> None:
        for mount, before in self.mounts.items():
            now = _tree(mount)
            added = sorted(set(now) - set(before), key=len)
            for path in added:  # shortest first: a removed directory takes its contents along
                if os.path.lexists(path):
                    _remove(path)
            if added:
                now = _tree(mount)
            if now != before:
                changed = sorted(p for p in set(now) | set(before) if now.get(p) != before.get(p))
                raise ResetRefused(f"cannot restore {mount}: {', '.join(changed[:3])} changed")

    def check_agent(self) -> None:
        now = _own_attributes(self.kernel)
        changed = [k for k, v in now.items() if v != self.attributes.get(k)]
        if changed:
            raise ResetRefused(f"a command changed the exec agent's {', '.join(changed)}")


class Shell:
    """The session's resident ``bash`` (see :data:`LOOP`): its pid, our end of its channel, and
    what it has said so far. Only what the kernel says the shell's own process sent counts; the
    pids of any other sender are kept in ``intruders``."""

    def __init__(self, pid: int, channel: Any, restored: bool) -> None:
        self.pid = pid
        self.channel = channel  # a _socket.socket with SO_PASSCRED, non-blocking
        self.fd = channel.fileno()
        self.restored = restored
        self.pending = b""  # the shell's bytes read past its last full line
        self.exit_code: int | None = None
        self.exited = False  # seen exited, not yet reaped: its pid cannot be anyone else's yet
        self.eof = False  # no holder of the shell's end is left
        self.intruders: list[int] = []

    def lines(self) -> list[str]:
        """Lines the shell has written since the last call (non-blocking). A command that writes
        junk on the channel from the shell itself only adds lines without the current nonce:
        ignored. Data from any other process is dropped and its sender noted."""
        lines: list[str] = []
        while True:
            try:
                data, ancillary, _, _ = self.channel.recvmsg(65536, _CREDS_SPACE)
            except BlockingIOError:
                break
            except OSError:
                self.eof = True
                break
            if not data:  # every holder of the shell's end is gone: the shell exited, was
                self.eof = True  # replaced (``exec``), or a command closed its copy
                break
            sender = _sender(ancillary)
            if sender != self.pid:
                if sender not in self.intruders:
                    self.intruders.append(sender)
                continue
            self.pending += data
        if b"\n" in self.pending:
            *done, self.pending = self.pending.split(b"\n")
            lines = [line.decode("ascii", "replace") for line in done]
        self.pending = self.pending[-4096:]
        return lines

    def send(self, data: bytes) -> None:
        _write_all(self.fd, data)

    def ended(self) -> bool:
        """Whether the shell has exited, without reaping it: while it is a zombie its pid stays
        its own, so what it said before it died can still be told from anyone else's."""
        if self.exited or self.exit_code is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped elsewhere (``_reap``)
            self.exited = True
            return True
        self.exited = info is not None and info.si_pid != 0
        return self.exited

    def poll(self, block: bool = False) -> int | None:
        """The shell's exit code once it has exited (negative: the signal), else None."""
        if self.exit_code is None:
            self.exit_code = _poll(self.pid, 0 if block else os.WNOHANG)
        return self.exit_code

    def close(self) -> None:
        with suppress(OSError):
            self.channel.close()


def _sender(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The pid the kernel attached to a message (SCM_CREDENTIALS), or 0."""
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_CREDENTIALS and len(data) >= 4:
            return int.from_bytes(data[:4], sys.byteorder, signed=True)
    return 0


class Agent:
    def __init__(
        self,
        workdir: str,
        scratch: str,
        reusable: bool = False,
        *,
        run_as: tuple[int, int] | None = None,
        state_dir: str | None = None,
        max_procs: int = 0,
        shm: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.run_as = run_as
        self.max_procs = max_procs
        self.limits = {k: os.environ.get(k, "") for k in _LIMIT_VARS}
        self.initial_env = {
            k: v for k, v in os.environ.items() if not k.startswith("TF_AGENT_") and k not in self.limits
        }
        self.groups: set[int] = set()
        self.counter = 0
        self._tasks_bound = (0, 0)  # (processes counted, ns_last_pid read just before): see below
        self.cmd_dir, self.out_dir = self._session_dirs(
            state_dir or os.path.join(scratch, ".trajforge-session")
        )
        self.snapshot = os.path.join(self.out_dir, "snapshot.sh")
        self.shell: Shell | None = None
        self.previous_nonce: str | None = None  # the last command's, in the current shell
        self.restorable = False  # whether the next shell starts from the snapshot
        self.kernel: Kernel | None = None
        # Asked once: a process never changes pid namespace (and a reset must not read /proc again).
        self.own_pid_namespace = _in_own_pid_namespace()
        if reusable or self.own_pid_namespace:  # a real sandbox: nothing of the host's keyring
            self.kernel = Kernel()
            self.kernel.make_undumpable()
            self.kernel.new_session_keyring()
            self.kernel.rename(_NAME)
        # The starting state that reset() must restore and verify (/dev/shm emptied like /tmp).
        roots = (workdir, scratch, shm) if shm else (workdir, scratch)
        self.baseline = Baseline(roots, self.kernel) if reusable and self.kernel else None

    def _session_dirs(self, base: str) -> tuple[str, str]:
        """Command files and output FIFOs are made by us in a directory commands cannot write
        or list (the FIFOs stay ours: their shell may write them, no one else of its uid may read
        them); the shell's snapshot is written by the shell into a directory of its own, and only
        a shell of the same uid ever reads it: we never parse what a command could have written."""
        cmd_dir, out_dir = os.path.join(base, "cmd"), os.path.join(base, "out")
        # cmd: searchable, not listable: a command's output FIFO is named by its nonce, which only
        # its shell is told (as root no process of the commands' uid can list the directory)
        for path, mode in ((base, 0o755), (cmd_dir, 0o711), (out_dir, 0o700)):
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)
        if self.run_as is not None:
            os.chown(out_dir, *self.run_as)
        return cmd_dir, out_dir

    def reset(self) -> None:
        """Put the sandbox back into the state it started in, for the next rollout; verify it.

        Kills every other process of the sandbox (we are in our own pid namespace: ``kill(-1)``
        reaches exactly the sandbox; the resident shell with them), empties the workdir and
        scratch dir and restores their attributes (mode, owner, times, xattrs and ACLs, chattr
        flags), removes System V IPC objects and POSIX message queues, joins a fresh session
        keyring, removes whatever was added to the writable tmpfs mounts, and forgets the shell
        session: its snapshot is deleted and the next command starts a new ``bash`` from the
        sandbox's start environment. Anything it cannot prove restored (a changed entry in a tmpfs,
        a process that will not die, keys left with the commands' uid, an rlimit/niceness/affinity
        of ours that a command changed) raises :class:`ResetRefused`: the host then discards the
        sandbox and builds a fresh one, so a reused sandbox is never subtly different.
        """
        if self.baseline is None or not self.own_pid_namespace:
            raise ResetRefused("not started as a reusable sandbox in its own pid namespace")
        left = _kill_all_others()
        if left:
            raise ResetRefused(f"{left} processes survived SIGKILL")
        self._forget_shell()
        self.restorable = False
        self.baseline.empty_roots()
        _empty(self.cmd_dir)
        _empty(self.out_dir)
        self.baseline.restore_roots()
        self._reset_ipc_and_keys()
        self.baseline.restore_mounts()
        self.baseline.check_agent()
        self.groups.clear()
        self.counter = 0

    def _reset_ipc_and_keys(self) -> None:
        if _ipc_objects():  # only their owner may remove them: run ipcrm as the commands' uid
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                with suppress(OSError):  # checked below
                    _wait(_start(["ipcrm", "--all"], "/", self.initial_env, self.run_as, null))
            finally:
                os.close(null)
            if _ipc_objects():
                raise ResetRefused("System V IPC objects could not be removed")
        for queue in _mqueues():
            _unlink(queue)
        if _mqueues():
            raise ResetRefused("POSIX message queues could not be removed")
        assert self.kernel is not None
        self.kernel.new_session_keyring()
        if self.run_as is not None:  # the commands' own uid: keys it holds live on in the kernel
            if _read_key_users(self.run_as[0]):
                raise ResetRefused("the commands' uid holds kernel keys")
            return
        if self.kernel.user_keys():  # one uid for all: its own keyrings must hold nothing
            raise ResetRefused("keys were left in the user keyrings")

    def _kill_group(self, pgid: int) -> None:
        # A fork bomb keeps spawning while we kill: repeat until the group is empty.
        for _ in range(50):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                return
            except PermissionError:
                return
            time.sleep(0.01)

    def _near_process_limit(self) -> bool:
        """Whether the sandbox's tasks (processes and threads: what ``pids.max`` counts) are near
        its limit. A fork bomb's count swings as its processes die and respawn, so it is sampled
        a few times; counting threads reads a directory per process, so all this only when the
        processes alone are already a good part of the way there."""
        if self.max_procs <= 0:
            return False
        # Between two counts the number of tasks can grow by at most the pids handed out in our
        # namespace, so while that bound stays low /proc is not listed at all (two reads of
        # ns_last_pid per command instead of a directory listing; a wrap or no value: list).
        # Commands cannot move the counter: writing ns_last_pid takes CAP_SYS_ADMIN or
        # CAP_CHECKPOINT_RESTORE, which they never have. And this is the recovery, not the limit:
        # the pids cgroup (or RLIMIT_NPROC) caps them whatever this check sees.
        last = _last_pid()
        counted, at = self._tasks_bound
        if 0 < at <= last and counted + (last - at) < self.max_procs * _PROCS_LOOK:
            return False
        pids = _pids()
        self._tasks_bound = (len(pids), last)  # ``last`` read first: later pids are above it
        if len(pids) < self.max_procs * _PROCS_LOOK:
            return False
        for _ in range(3):
            if _tasks(_pids()) >= self.max_procs * _PROCS_HEADROOM or _cannot_fork():
                return True
            time.sleep(0.01)
        return False

    def _kill_everything(self) -> str:
        """The sandbox is at its process limit (a fork bomb): kill every process but us, so the
        rollout's later commands can run again. Returns the note the model sees."""
        self.stop_all()
        return (
            f"\n[the sandbox reached its process limit ({self.max_procs}); every process in it, "
            "background jobs included, was killed]\n"
        )

    def stop_all(self) -> None:
        """Kill every process the commands started (background jobs and the shell included) and
        keep the files: what the verifier inspects can no longer change under it. A later
        command of the session gets a new shell with the session's last snapshot."""
        if self.own_pid_namespace:
            _kill_all_others()
        else:
            for pgid in list(self.groups):
                self._kill_group(pgid)
        self._forget_shell()
        self.groups.clear()

    # -- the resident shell ------------------------------------------------------------------

    def _forget_shell(self) -> None:
        """Drop our handle on the shell (killed already, or about to be by the caller)."""
        shell, self.shell = self.shell, None
        self.previous_nonce = None
        if shell is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(shell.pid, signal.SIGKILL)
            shell.poll(block=True)
            shell.close()

    def _start_shell(self) -> tuple[Shell, str]:
        """A new resident shell: from the session's snapshot when there is one, else from the
        sandbox's start environment in the workdir. A snapshot that does not give a working
        shell (it exits, or its loop does not answer) is dropped for a fresh start; the note
        (possibly empty) says so to the model."""
        if self.restorable:
            try:
                return self._spawn_shell(restore=True), ""
            except ShellFailed:
                self.restorable = False
                note = (
                    "[the shell's saved state could not be restored: this command runs in a fresh "
                    "shell (start environment, workdir)]\n"
                )
                return self._spawn_shell(restore=False), note
        return self._spawn_shell(restore=False), ""

    def _spawn_shell(self, restore: bool) -> Shell:
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        # Before the shell exists: every message on our end then carries its sender's pid.
        ours.setsockopt(_socket.SOL_SOCKET, _socket.SO_PASSCRED, 1)
        ours.setblocking(False)
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        nonce = os.urandom(16).hex()
        # A restored shell starts from nothing but the snapshot (it exports what was exported,
        # and a variable the session unset stays unset); a fresh one from the start environment.
        # The limits are in the script, not the environment (where /proc/PID/environ shows them).
        env = {} if restore else dict(self.initial_env)
        try:
            script = _script_fd(
                loop_script(self.limits, self.cmd_dir, self.snapshot, restore, nonce), self.cmd_dir
            )
        except BaseException:
            ours.close()
            theirs.close()
            os.close(null)
            raise
        try:
            pid = _start(["bash"], self.workdir, env, self.run_as, theirs.fileno(), stdin=script, errput=null)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(null)
            os.close(script)
        shell = Shell(pid, ours, restore)
        self.groups.add(pid)
        # A restored shell must say its loop runs: a snapshot may break it.
        if restore and not self._await_line(shell, f"{nonce} ready", time.monotonic() + _RESTORE_S):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            shell.poll(block=True)
            shell.close()
            raise ShellFailed("the restored shell did not start")
        return shell

    @staticmethod
    def _await_line(shell: Shell, line: str, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if line in shell.lines():
                return True
            if shell.eof or shell.poll() is not None:
                return False
            select.select([shell.fd], [], [], min(0.05, max(0.0, deadline - time.monotonic())))
        return False

    def exec(self, req: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        timeout = float(req.get("timeout") or 60.0)
        cap = OutputCap(int(req.get("cap") or 16384))
        note = self._kill_everything() if self._near_process_limit() else ""
        self.counter += 1
        cmd_file = os.path.join(self.cmd_dir, f"c{self.counter}.sh")
        _write_new(cmd_file, req["command"].encode("utf-8", "surrogateescape"))
        try:
            if req.get("fresh"):
                return self._exec_fresh(req, cmd_file, started, timeout, cap, note)
            return self._exec_session(req, cmd_file, started, timeout, cap, note)
        finally:
            _unlink(cmd_file)

    def _exec_fresh(
        self, req: dict[str, Any], cmd_file: str, started: float, timeout: float, cap: OutputCap, note: str
    ) -> dict[str, Any]:
        """A command outside the session (the verifier's): a bash of its own with the start
        environment, in the workdir (or ``cwd`` relative to it), and nothing it changes kept.
        A rollout's `export PATH=...` must not pick the programs its own reward is computed with."""
        cwd = req.get("cwd") or self.workdir
        if not os.path.isabs(cwd):
            cwd = os.path.join(self.workdir, cwd)
        if "\0" in cwd or not os.path.isdir(cwd):
            return self._answer(req, 1, f"cwd does not exist: {cwd!r}".encode(), started, cap)
        env = dict(self.initial_env)
        env.update({k: v for k, v in self.limits.items() if v})
        try:
            pid, out = self._spawn(cwd, cmd_file, env)
        except BlockingIOError:  # no process left to fork: recover the sandbox, then try once more
            note += self._kill_everything()
            pid, out = self._spawn(cwd, cmd_file, env)
        self.groups.add(pid)
        code, timed_out = self._collect(pid, out, cap, started + timeout)
        self.groups.discard(pid)
        if self._near_process_limit():
            note += self._kill_everything()
        if note:
            cap.feed(note.encode())
        return self._answer(req, None if timed_out else code, None, started, cap, timed_out)

    def _spawn(self, cwd: str, cmd_file: str, env: dict[str, str]) -> tuple[int, int]:
        """Start the wrapper for one fresh command: (its pid, the read end of its output pipe)."""
        read_end, write_end = os.pipe()
        try:
            pid = _start(["bash", "-c", WRAPPER, "bash", cmd_file], cwd, env, self.run_as, write_end)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        return pid, read_end

    def _exec_session(
        self, req: dict[str, Any], cmd_file: str, started: float, timeout: float, cap: OutputCap, note: str
    ) -> dict[str, Any]:
        """A command in the resident shell, started (or restarted from its snapshot) if needed."""
        cwd = req.get("cwd")
        if cwd is not None:
            if "\0" in cwd or (os.path.isabs(cwd) and not os.path.isdir(cwd)):
                return self._answer(req, 1, f"cwd does not exist: {cwd!r}".encode(), started, cap)
            _write_new(os.path.join(self.cmd_dir, f"c{self.counter}.cwd"), os.fsencode(cwd) + b"\0")
        if self.shell is not None and self.shell.poll() is None:
            self.shell.lines()  # whatever the shell said between commands is not this command's
            if self.shell.intruders:  # someone else wrote on its channel: a new shell
                note = _INTRUDED % self._kill_intruders(self.shell) + note
                self._forget_shell()
        if self.shell is None or self.shell.poll() is not None:
            if self.shell is not None:
                self._forget_shell()
            try:
                self.shell, said = self._start_shell()
            except BlockingIOError:
                note += self._kill_everything()
                self.shell, said = self._start_shell()
            note = said + note
        shell = self.shell
        nonce = os.urandom(16).hex()
        fifo = os.path.join(self.cmd_dir, f"o{nonce}")
        reader, holder = _open_fifo(fifo, self.run_as)
        shell.lines()  # a fresh shell's "ready"
        last_pid = _last_pid()
        self.command_ticks = _boot_ticks()
        with suppress(OSError):  # the shell is gone already: its exit is read below
            shell.send(f"{self.counter} {nonce} {'c' if cwd is not None else '-'}\n".encode())
        try:
            code, timed_out, said, foreign = self._collect_session(
                shell, nonce, fifo, reader, holder, cap, started + timeout, last_pid
            )
        finally:
            _unlink(fifo)
            if cwd is not None:
                _unlink(os.path.join(self.cmd_dir, f"c{self.counter}.cwd"))
        if code == "cwd":
            return self._answer(req, 1, f"cwd does not exist: {cwd!r}".encode(), started, cap)
        if foreign:  # what reached the FIFO is not the command's
            cap.clear()
        note += said
        if self._near_process_limit():
            note += self._kill_everything()
        if note:
            cap.feed(note.encode())
        return self._answer(req, None if code is None else int(code), None, started, cap, timed_out)

    def _collect_session(
        self,
        shell: Shell,
        nonce: str,
        fifo: str,
        reader: int,
        holder: int | None,
        cap: OutputCap,
        deadline: float,
        last_pid: int,
    ) -> tuple[int | str | None, bool, str, bool]:
        """Read the command's output from its FIFO until the shell reports ``NONCE RC`` (or exits,
        or the deadline passes: then the command and the shell are killed); then what is still in
        the FIFO, as :meth:`_collect` does for a pipe. Returns (the exit code, "cwd", or None
        when there is none to report; timed out; the note; whether what reached the FIFO is to be
        dropped: the shell never started the command, or another process wrote on its channel)."""
        prefix = nonce + " "
        previous, self.previous_nonce = self.previous_nonce, nonce
        code: int | str | None = None
        note = ""
        done = foreign = started = overran = timed_out = exiting = False
        done_at: float | None = None
        eof = False

        def take(lines: list[str]) -> None:
            nonlocal code, note, started, overran, exiting
            for line in lines:
                if line.startswith(prefix):
                    word = line[len(prefix) :]
                    if word == "go":  # the shell has its FIFO open: no one else may open it now
                        if not started:
                            _unlink(fifo)
                        started = True
                        continue
                    if word.startswith("exit "):  # the shell says it is going (no loop says it
                        # since issue 39 took the loop's EXIT trap away; a command can write it)
                        word, exiting = word[5:], True
                    code = int(word) if word.lstrip("-").isdigit() else word
                elif previous and line.startswith(previous + " "):
                    note, overran = _OVERRAN, True  # its real end: that one's line was forged

        while True:
            now = time.monotonic()
            if done_at is None:
                take(shell.lines())
                if code is None and not shell.intruders and shell.ended():
                    take(shell.lines())  # what it said before it died is all there now
                    if code is None and not shell.intruders:
                        code, ended = self._shell_exited(shell, overran and not started, not started)
                        note = ended if ended.startswith(_OVERRAN) else note + ended
                        done = True
                if shell.intruders:
                    note = _INTERFERED % self._kill_intruders(shell)
                    self._kill_command(shell, last_pid)
                    self._after_shell_died()
                    code, foreign, done = None, True, True
                elif code is None and not done and now >= deadline:
                    self._kill_command(shell, last_pid)
                    self._after_shell_died()
                    note = _RESTARTED if started else _NOT_STARTED
                    foreign, timed_out, done = not started, True, True
                if code is not None or done:
                    done_at = time.monotonic()
                    if holder is not None:  # from now on EOF means every writer is done
                        os.close(holder)
                        holder = None
                    continue
            elif now - done_at > _GRACE_S:
                break
            wait = 0.05 if done_at is not None else min(0.05, max(0.0, deadline - now))
            # Once the channel is at EOF it is always "readable": watch the output alone then.
            watch = [reader] if done_at is not None or shell.eof else [reader, shell.fd]
            ready, _, _ = select.select(watch, [], [], wait)
            if reader in ready:
                try:
                    chunk = os.read(reader, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    if done_at is not None:
                        eof = True
                        break
                    continue
                cap.feed(chunk)
        if holder is not None:
            os.close(holder)
        if eof:
            os.close(reader)
        else:
            os.set_blocking(reader, True)
            try:  # a background job still holds the FIFO: keep draining it off the main path
                _thread.start_new_thread(_drain_forever, (reader,))
            except RuntimeError:
                os.close(reader)
        if code is not None and self.shell is shell and shell.exit_code is None:
            self.restorable = True  # the loop wrote the snapshot before it answered
            shell.restored = False  # a restored shell that got through a command works
            if exiting:  # it said it is going: the next command gets a new shell
                self._forget_shell()
        return code, timed_out, note, foreign

    def _kill_intruders(self, shell: Shell) -> int:
        """Kill every process that wrote on the shell's channel but the shell; the first's pid."""
        for pid in shell.intruders:
            if pid > 1 and pid not in (os.getpid(), shell.pid):
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        return shell.intruders[0]

    def _shell_exited(self, shell: Shell, overran: bool, unstarted: bool = False) -> tuple[int, str]:
        """The shell ended during the command without reporting it: ``exit``, a ``set -e``
        failure, a ``set -u`` error (they end it as they end ``bash -c``), ``exec``, a signal. Its
        exit code, and what the model is told: when the command before this one ended the shell
        before this one started (``overran``: its late end was seen, or ``unstarted``: the shell
        never took this one), that this one did not run; otherwise that the next command runs in a
        new shell with the session as it was before this command (the snapshot the loop wrote
        after the last command that finished)."""
        shell.poll(block=True)  # everything it said has been read: its pid may go now
        code = shell.exit_code if shell.exit_code is not None else 0
        self._after_shell_died()
        if overran:
            self.restorable = True
            return code, _OVERRAN + "[... and then ended the shell: this command did not run]\n"
        if unstarted:
            return code, (
                f"\n[the shell ended (status {code}) before this command started: it did not run; the next "
                "command runs in a new shell with the session as it was after the last command that "
                "finished]\n"
            )
        return code, (
            f"\n[the shell ended (status {code}); the next command runs in a new shell with the session as "
            "it was before this command]\n"
        )

    def _after_shell_died(self) -> None:
        """The shell died (or was killed) during a command: the next one gets a new shell,
        from the snapshot unless the shell that died was itself just restored and did not get
        through one command (then its snapshot is what breaks it)."""
        shell = self.shell
        if shell is not None and shell.restored:
            self.restorable = False
        self._forget_shell()

    def _kill_command(self, shell: Shell, last_pid: int) -> None:
        """The command timed out: kill the shell and every process the command started (in the
        shell's session or process group, started after ``last_pid``), repeating while a fork
        bomb spawns. Background jobs of earlier commands (started before) live on."""
        with suppress(ProcessLookupError, PermissionError):
            os.kill(shell.pid, signal.SIGKILL)
        me = os.getpid()
        for _ in range(50):
            wrapped = _last_pid() < last_pid  # pid numbers wrapped around: every one of the session
            victims = []
            for pid in _pids():
                if pid in (1, me) or (not wrapped and pid <= last_pid and pid != shell.pid):
                    continue
                if wrapped and pid != shell.pid and _start_ticks(pid) < self.command_ticks:
                    continue  # wrapped: an earlier command's job, by its start time
                ids = _session_ids(pid)
                if ids is not None and shell.pid in ids:
                    victims.append(pid)
            if not victims:
                break
            for pid in victims:
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            _reap()
            time.sleep(0.005)

    def _collect(self, pid: int, fd: int, cap: OutputCap, deadline: float) -> tuple[int, bool]:
        """Read a fresh command's output (``fd``) into ``cap`` until it exits (or its deadline
        kills it); its exit code (negative: the signal that ended it) and whether it timed out."""
        timed_out = False
        exited_at = None
        code: int | None = None
        eof = False
        while True:
            now = time.monotonic()
            if code is None:
                code = _poll(pid)
                if code is not None:
                    exited_at = now
            if exited_at is not None and now - exited_at > _GRACE_S:
                break
            if exited_at is None and now >= deadline:
                timed_out = True
                self._kill_group(pid)
                code = _wait(pid)
                exited_at = time.monotonic()
                continue
            wait = min(0.05, max(0.0, deadline - now))
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    eof = True
                    break
                cap.feed(chunk)
        if code is None:
            code = _wait(pid)
        if eof:
            os.close(fd)
            return code, timed_out
        try:  # a background job still holds the pipe: keep draining it off the main path
            _thread.start_new_thread(_drain_forever, (fd,))
        except RuntimeError:  # no thread left to start (a fork bomb holds them all): stop reading;
            os.close(fd)  # writers get SIGPIPE, and the limit check that follows kills them anyway
        return code, timed_out

    def _answer(
        self,
        req: dict[str, Any],
        code: int | None,
        message: bytes | None,
        started: float,
        cap: OutputCap,
        timed_out: bool = False,
    ) -> dict[str, Any]:
        if message is not None:
            cap.feed(message)
        output, truncated = cap.render()
        return {
            "id": req.get("id"),
            "exit_code": code,
            "output": output,
            "timed_out": timed_out,
            "truncated": truncated,
            "output_bytes": cap.total,
            "duration_s": time.monotonic() - started,
        }

    def close(self) -> None:
        for pgid in list(self.groups):
            self._kill_group(pgid)
        self._forget_shell()


class ShellFailed(Exception):
    """A restored shell did not come up (its snapshot breaks it)."""


def _write_new(path: str, data: bytes) -> None:
    """Write a file of ours, never through a link (the directory is ours alone)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _script_fd(script: bytes, spare_dir: str) -> int:
    """A read-only-for-them fd at the start of ``script``: what a new shell reads its loop from.
    A memory file (``memfd_create``: nothing on disk, seekable, so bash reads it in blocks rather
    than a byte per system call as it does from a pipe); where the kernel or python lacks it, a
    file of ours in ``spare_dir``, unlinked once open."""
    try:
        fd = os.memfd_create("bash", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        path = os.path.join(spare_dir, "loop-" + os.urandom(8).hex())
        _write_new(path, script)
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        finally:
            _unlink(path)
    try:
        _write_all(fd, script)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_fifo(path: str, run_as: tuple[int, int] | None) -> tuple[int, int]:
    """A command's output FIFO, in our own directory: our read end, and a write end we hold until
    the command is over, so that until then the reader never sees EOF (the shell has not opened it
    yet, or reopened it). With ``run_as`` it stays ours and only writable for others: its shell
    opens it for writing, no process of the commands' uid can open it for reading."""
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:  # left by an agent that died mid-command (never by a command: our dir)
        _unlink(path)
        os.mkfifo(path, 0o600)
    if run_as is not None:
        os.chmod(path, 0o602)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    holder = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    return reader, holder


def _last_pid() -> int:
    """The last pid the kernel handed out in our pid namespace (0 when unknown)."""
    text = _read("/proc/sys/kernel/ns_last_pid").strip()
    return int(text) if text.isdigit() else 0


def _boot_ticks() -> int:
    """Clock ticks since boot, as /proc/PID/stat's starttime counts them."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _start_ticks(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (-1 when it is gone). The pid numbers of
    the local backend are the host's (32,768 of them here, a busy host cycles through in
    seconds): only the start time tells an earlier command's job from this one's after a wrap."""
    text = _read(f"/proc/{pid}/stat")
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else -1


def _session_ids(pid: int) -> tuple[int, int] | None:
    """(process group, session) of ``pid``, from /proc (None when it is gone)."""
    text = _read(f"/proc/{pid}/stat")
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 4:
        return None
    return int(fields[2]), int(fields[3])


def _fork_exec_311() -> Any:
    """``_posixsubprocess.fork_exec``, the C function behind ``subprocess.Popen``, where its
    signature is the one :func:`_start` was written and measured against (CPython 3.11); None
    elsewhere. It forks, sets the child up and execs without running any Python in the child: a
    fork in Python that then runs Python code costs ~1.2 ms more CPU per command (measured)."""
    if sys.version_info[:2] != (3, 11):
        return None
    try:
        from _posixsubprocess import fork_exec
    except ImportError:
        return None
    return fork_exec


_FORK_EXEC = _fork_exec_311()


def _start(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    run_as: tuple[int, int] | None,
    output: int,
    *,
    stdin: int | None = None,
    errput: int | None = None,
) -> int:
    """Fork and exec ``argv`` (found on ``env``'s PATH) in ``cwd``, in a session of its own (one
    process group to kill), stdin from /dev/null (or ``stdin``), stdout and stderr into ``output``
    (stderr into ``errput`` when given), with no other
    fd of ours, and as the commands' uid and gid without supplementary groups when ``run_as`` is
    given: from uid 0 to another uid the kernel clears every capability, so nothing the command
    runs keeps any of ours. Returns its pid; raises OSError (BlockingIOError: no process left)
    when it could not start, like ``subprocess`` did: this is its job without importing it."""
    report_r, report_w = os.pipe()  # close-on-exec: EOF says the exec happened
    try:
        if _FORK_EXEC is not None:
            pid = _fork_exec_c(argv, cwd, env, run_as, (stdin, output, errput), report_r, report_w)
        else:
            pid = os.fork()
            if pid == 0:  # pragma: no cover (the child execs or exits, never returns)
                _child(argv, cwd, env, run_as, (stdin, output, errput), report_w)
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)
    report = b""
    try:  # until EOF: the child may write its report in pieces
        while len(report) < 4096:
            piece = os.read(report_r, 4096)
            if not piece:
                break
            report += piece
    finally:
        os.close(report_r)
    if report:
        _wait(pid)
        _raise_report(argv[0], report)
    return pid


def _fork_exec_c(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    run_as: tuple[int, int] | None,
    fds: tuple[int | None, int, int | None],
    report_r: int,
    report_w: int,
) -> int:
    """``_start`` through ``_posixsubprocess.fork_exec`` (3.11), called as ``subprocess`` calls it."""
    executable = os.fsencode(argv[0])
    if os.path.dirname(executable):
        candidates: tuple[bytes, ...] = (executable,)
    else:
        candidates = tuple(os.path.join(os.fsencode(d), executable) for d in os.get_exec_path(env))
    env_list = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
    uid, gid = run_as if run_as is not None else (-1, -1)
    stdin, output, errput = fds
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(
            _FORK_EXEC(
                argv,
                candidates,
                True,  # close_fds: the command inherits none of ours
                (report_w,),
                cwd,
                env_list,
                null if stdin is None else stdin,  # stdin
                -1,
                -1,
                output,  # stdout
                -1,
                output if errput is None else errput,  # stderr
                report_r,
                report_w,
                True,  # restore_signals: SIGPIPE and SIGXFSZ back to their defaults
                True,  # call_setsid
                -1,  # process group: the new session's
                gid,
                [] if run_as is not None else None,  # supplementary groups: none
                uid,
                -1,  # umask
                None,  # preexec_fn
                False,  # vfork: never with a uid switch, and not needed without
            )
        )
    finally:
        os.close(null)


def _raise_report(program: str, report: bytes) -> None:
    """Raise what a child that could not exec reported, ``Name:hex errno:text`` (the format of
    ``_posixsubprocess``, which :func:`_child` writes too), as the OSError of that errno."""
    text = report.decode("ascii", "replace")
    number = 0
    with suppress(ValueError, IndexError):
        number = int(text.split(":", 2)[1], 16)
    raise OSError(number or None, f"cannot start {program!r}: {text}")


def _child(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    run_as: tuple[int, int] | None,
    fds: tuple[int | None, int, int | None],
    report: int,
) -> None:
    """In the forked child: set it up and exec; on any failure say why on ``report`` and exit."""
    try:
        os.setsid()
        for number in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by python, not by commands
            signal.signal(number, signal.SIG_DFL)
        stdin, output, errput = fds
        os.dup2(os.open(os.devnull, os.O_RDONLY) if stdin is None else stdin, 0)
        os.dup2(output, 1)
        os.dup2(output if errput is None else errput, 2)
        os.chdir(cwd)
        if run_as is not None:
            uid, gid = run_as
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() != (uid, uid, uid):
                raise PermissionError(1, "the uid switch did not take")
        _close_fds_above(2, keep=report)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:
        with suppress(BaseException):
            os.write(
                report,
                f"{type(exc).__name__}:{getattr(exc, 'errno', 0) or 0:x}:{exc}".encode("ascii", "replace"),
            )
    finally:
        os._exit(127)


def _close_fds_above(low: int, keep: int) -> None:
    """Close every fd above ``low`` but ``keep`` (a command must inherit none of ours)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every fd up to the limit
        fds = list(range(low + 1, os.sysconf("SC_OPEN_MAX")))
    for fd in fds:
        if fd > low and fd != keep:
            with suppress(OSError):
                os.close(fd)


def _wait(pid: int) -> int:
    """Reap ``pid`` once it exits: its exit code, negative for the signal that killed it."""
    code = _poll(pid, 0)
    assert code is not None
    return code


def _poll(pid: int, flags: int = os.WNOHANG) -> int | None:
    """``_wait`` if ``pid`` has exited, else None. 0 when it was reaped elsewhere (``_reap``)."""
    try:
        got, status = os.waitpid(pid, flags)
    except ChildProcessError:
        return 0
    if got == 0:
        return None
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unlink(path: str) -> None:
    with suppress(OSError):
        os.unlink(path)


def _kill_all_others() -> int:
    """SIGKILL every process of our pid namespace but us (and bwrap, pid 1), repeating while a
    fork bomb keeps spawning; how many are left.

    A few processes (a reset usually finds the shell alone) get a ``kill`` each: ``kill(-1)``
    walks every process of the host, not of the namespace (~1,000 with 256 sandboxes, 1.4% of
    the machine's CPU in a batch), and finds the few of ours among them."""
    me = os.getpid()
    left = [p for p in _pids() if p not in (1, me)]
    for attempt in range(200):
        if not left:
            break
        for pid in left if len(left) <= _KILL_ONE_BY_ONE else (-1,):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        left = [p for p in _pids() if p not in (1, me)]
        if not left:
            break
        # A killed shell is usually gone within a fraction of a millisecond: look again soon
        # (a reset waited 5 ms here every time), then at 5 ms while a fork bomb keeps spawning.
        time.sleep(min(0.005, 0.0002 * 2**attempt))
    return len(left)


def _read(path: str) -> str:
    """A small file's text ('' when it cannot be read). Raw ``os`` calls: ``open()`` builds a
    buffered text stack per call, and a reset reads a dozen /proc files."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        data = b""
        while True:
            piece = os.read(fd, 65536)
            if not piece:
                break
            data += piece
        return data.decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _in_own_pid_namespace() -> bool:
    """True only inside a sandbox's own pid namespace: bwrap's (bwrap is pid 1 and our parent), or
    a container's that we were entered into from outside (``docker exec``: our parent lives in
    another pid namespace, so our ppid reads 0 -- a process started inside any namespace has a
    visible parent). ``reset`` and ``stop`` kill with ``kill(-1)``: on a host that would reach
    every process of the user, so never there."""
    ppid = os.getppid()
    return (ppid == 1 and _read("/proc/1/comm").strip() == "bwrap") or (ppid == 0 and os.getpid() != 1)


def _cannot_fork() -> bool:
    """Whether a fork of ours is refused for want of processes (EAGAIN): the sandbox is at its
    limit whatever share of it we count. Unprivileged, RLIMIT_NPROC counts the user's tasks in
    every enclosing user namespace, some never visible here, so a fork bomb saturates it with
    fewer tasks in sight than the headroom (49 of 64 seen); the refused fork says so all the same."""
    try:
        pid = os.fork()
    except BlockingIOError:  # EAGAIN: no process to be had
        return True
    except OSError:
        return False
    if pid == 0:
        os._exit(0)
    with suppress(ChildProcessError):
        os.waitpid(pid, 0)  # retried on EINTR by python itself
    return False


def _reap() -> None:
    """Collect exited children (killed background shells), so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _options(argv: list[str]) -> dict[str, Any]:
    """``WORKDIR SCRATCH [--reusable] [--run-as UID:GID] [--state-dir DIR] [--max-procs N] [--shm DIR]``."""
    opts: dict[str, Any] = {"reusable": False}
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag == "--reusable":
            opts["reusable"] = True
        elif flag == "--run-as":
            uid, _, gid = rest.pop(0).partition(":")
            opts["run_as"] = (int(uid), int(gid or uid))
        elif flag == "--state-dir":
            opts["state_dir"] = rest.pop(0)
        elif flag == "--max-procs":
            opts["max_procs"] = int(rest.pop(0))
        elif flag == "--shm":
            opts["shm"] = rest.pop(0)
        else:
            raise SystemExit(f"exec agent: unknown option {flag!r}")
    return opts


class _JsonContext:
    """What ``_json``'s scanner reads from ``json.JSONDecoder`` (the defaults of ``json.loads``)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # 'NaN', 'Infinity', '-Infinity'


def _json_codec() -> tuple[Any, Any]:
    """(dumps, loads) as ``json.dumps``/``json.loads`` do them, from the C half of json (``_json``)
    without importing the json package, which imports ``re``: ~1.1 MiB of every sandbox's memory.
    Falls back to the json package on an interpreter whose ``_json`` differs."""
    try:
        import _json

        def refuse(obj: object) -> object:
            raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

        encode = _json.make_encoder(
            {}, refuse, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True
        )
        scan = _json.make_scanner(_JsonContext())  # type: ignore[arg-type]  # reads these attributes

        def dumps(obj: object) -> str:
            return "".join(encode(obj, 0))

        def loads(text: str) -> Any:
            text = text.strip()
            value, end = scan(text, 0)
            if end != len(text):
                raise ValueError(f"extra data after the JSON value at {end}")
            return value

        if loads(dumps({"a": [1, 2.5, None, True, "\u00e9\n"]})) != {"a": [1, 2.5, None, True, "\u00e9\n"]}:
            raise ValueError("_json does not round-trip here")
        return dumps, loads
    except (ImportError, TypeError, ValueError, AttributeError, StopIteration):
        import json

        return json.dumps, json.loads


def _default_signals() -> None:
    """What the agent's launcher ignored or blocked (nohup, a script's background job: SIGHUP,
    SIGINT, SIGQUIT) every command would inherit, and bash can neither trap nor reset a signal
    ignored at its start: a command in a terminal starts with none ignored and none blocked.
    (SIGPIPE and SIGXFSZ are python's own; a child gets them back at its start.)"""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for number in range(1, signal.NSIG):
        if number in (signal.SIGPIPE, signal.SIGXFSZ):
            continue
        with suppress(OSError, ValueError):
            if signal.getsignal(number) == signal.SIG_IGN:
                signal.signal(number, signal.SIG_DFL)


def main() -> None:
    _default_signals()
    if sys.argv[0].startswith("/proc/self/fd/"):  # run from the fd of our file (bwrap): read already
        with suppress(ValueError, OSError):
            os.close(int(sys.argv[0][len("/proc/self/fd/") :]))
    # The options in argv, or one a line in TF_AGENT_ARGS (bwrap: argv is what ps shows)
    args = sys.argv[1:] or os.environ.get("TF_AGENT_ARGS", "").split("\n")
    if len(args) < 2:
        raise SystemExit("exec agent: WORKDIR and SCRATCH are required")
    agent = Agent(args[0], args[1], **_options(args[2:]))
    dumps, loads = _json_codec()
    out = sys.stdout
    out.write(dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = loads(line)
        if req.get("op") == "close":
            agent.close()
            out.write(dumps({"id": req.get("id"), "closed": True}) + "\n")
            out.flush()
            return
        if req.get("op") == "stop":  # the rollout is over: nothing it started may run on
            agent.stop_all()
            out.write(dumps({"id": req.get("id"), "stopped": True}) + "\n")
            out.flush()
            continue
        if req.get("op") == "reset":
            try:
                agent.reset()
                answer = {"id": req.get("id"), "reset": True}
            except (ResetRefused, OSError, RecursionError) as exc:
                answer = {"id": req.get("id"), "reset": False, "reason": str(exc) or type(exc).__name__}
            out.write(dumps(answer) + "\n")
            out.flush()
            continue
        try:
            answer = agent.exec(req)
        except Exception as exc:  # report, never die: the session must survive a bad request
            answer = {"id": req.get("id"), "error": f"{type(exc).__name__}: {exc}"}
        out.write(dumps(answer) + "\n")
        out.flush()
    agent.close()


if __name__ == "__main__":
    main()
