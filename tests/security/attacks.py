"""Attacks on the bwrap sandbox, runnable in-process (as root) or as a script under another uid.

An attacker controls the model's output, so every command below is something a model could run.
Each scenario returns plain JSON-able data; the tests in ``test_sandbox_attacks.py`` run them as
root (how trajforge runs in most containers and CI: the sandbox drops to a uid of its own) and as
an unprivileged user (bubblewrap in a user namespace: one uid for the exec agent and the commands)
and assert on what the attacker got.

Usage as a script: ``python attacks.py SCENARIO ROOT_DIR [ARG]`` prints one JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from trajforge.sandbox import SandboxConfig, SandboxLimits, create_sandbox_factory

# -- 1. the file tools raced out of the sandbox ----------------------------------------------------

# Swaps the directory ``d`` and the symlink ``l`` (pointing at the host directory) as fast as it
# can with renameat2(RENAME_EXCHANGE), counting its swaps in ``/tmp/swaps``.
RACER = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace")
n = 0
while True:
    libc.renameat2(-100, b"d", -100, b"l", 2)
    n += 1
    if n % 256 == 0:  # atomically: a reader never sees a truncated count
        with open("/tmp/swaps.new", "w") as f:
            f.write(str(n))
        os.replace("/tmp/swaps.new", "/tmp/swaps")
"""


def _naive_read(host_work: str, path: str) -> bytes:
    """The old check-then-use: look for symlinks by name, then open by name (as the host)."""
    full = os.path.join(host_work, path)
    parent = os.path.dirname(full)
    if os.path.islink(parent) or os.path.islink(full):
        raise PermissionError(path)
    with open(full, "rb") as f:
        return f.read()


async def race(root: str, calls: int = 10_000, naive_calls: int = 50_000) -> dict[str, Any]:
    """``calls`` file-tool reads and writes through ``d/`` while a racer swaps ``d`` with a symlink
    to a host directory holding a secret. Counts escapes (host content read, host file created)."""
    host = Path(tempfile.mkdtemp(prefix="tf-race-host-"))
    os.chmod(host, 0o700)
    (host / "secret").write_bytes(b"HOST-SECRET")
    os.chmod(host / "secret", 0o600)
    config = SandboxConfig(kind="bwrap", root_dir=root, command_timeout_s=30)
    out: dict[str, Any] = {"reads_inside": 0, "refused": 0, "read_escapes": 0, "write_escapes": 0}
    factory = create_sandbox_factory(config)
    sb = await factory.create("race")
    try:
        await sb.exec(f"mkdir d && echo -n INSIDE > d/secret && ln -s {host} l")
        await sb.exec("nohup python3 -c " + _quote(RACER) + " >/dev/null 2>&1 &")
        for i in range(calls):
            try:
                if i % 2:
                    await sb.write_bytes(f"d/w{i}", b"x")
                else:
                    data = await sb.read_bytes("d/secret")
                    out["read_escapes"] += data == b"HOST-SECRET"
                    out["reads_inside"] += data == b"INSIDE"
            except OSError:
                out["refused"] += 1
        out["write_escapes"] = await asyncio.to_thread(_count_written, host)
        out["naive_tries_to_escape"] = await asyncio.to_thread(
            _naive_escapes, str(sb.layout.work), naive_calls
        )
        swaps = await sb.exec("cat /tmp/swaps")
        out["swaps"] = int(swaps.output.strip()) if swaps.output.strip().isdigit() else swaps.output
    finally:
        await sb.close()
        await asyncio.to_thread(shutil.rmtree, host)
    return out


def _count_written(host: Path) -> int:
    return sum(1 for p in host.iterdir() if p.name.startswith("w"))


def _naive_escapes(work: str, calls: int) -> int:
    """The control: the same racer does win against check-then-use. How many tries it took to
    read the host secret once (0: never within ``calls``); the first win ends the control."""
    for tries in range(1, calls + 1):
        with contextlib.suppress(OSError):
            if _naive_read(work, "d/secret") == b"HOST-SECRET":
                return tries
    return 0


def _host_disk_bytes(root: Path) -> int:
    """Bytes under a sandbox directory that are on the host's disk (not in its tmpfs)."""
    dev = os.stat(root).st_dev
    return sum(p.lstat().st_size for p in root.rglob("*") if p.lstat().st_dev == dev)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


# -- 2. plant-then-look across a reused sandbox ----------------------------------------------------

_PY = "python3 -c "
_KEYCTL = "import ctypes; l = ctypes.CDLL(None, use_errno=True); "
_ACL = (  # a default ACL (user::rwx, group::---, other::---) as the kernel stores it
    "import struct, os; b = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', t, p, 0xFFFFFFFF) "
    "for t, p in ((1, 7), (4, 0), (0x20, 0))); os.setxattr('/workspace', 'system.posix_acl_default', b)"
)
_FLAGS = (
    "import fcntl, array, os; fd = os.open('/workspace', os.O_RDONLY); "
    "fcntl.ioctl(fd, 0x40086602, array.array('l', [0x4000]))"  # FS_IOC_SETFLAGS: FS_NODUMP_FL
)

# name -> a command that leaves that kind of state behind (errors ignored: a plant that the sandbox
# refuses outright is as good as one that is removed).
PLANTS: dict[str, str] = {
    "workdir file": "echo x > /workspace/planted; echo y > /workspace/.hidden",
    "unreadable dir": "mkdir -p /workspace/locked/in && chmod 000 /workspace/locked",
    "scratch file": "echo x > /tmp/planted; mkfifo /tmp/fifo",
    "exported variable": "export PLANTED=1",
    "working directory": "mkdir -p /workspace/sub && cd /workspace/sub",
    "umask": "umask 077",
    "background process": "nohup sleep 1999 >/dev/null 2>&1 &",
    "double-forked setsid process": "(setsid sleep 1999 >/dev/null 2>&1 &) ; true",
    "abstract socket listener": 'nohup python3 -c "import socket,time; s=socket.socket(socket.AF_UNIX); '
    "s.bind('\\0tf-planted'); s.listen(); time.sleep(1999)\" >/dev/null 2>&1 &",
    "System V shared memory": "ipcmk -M 4096",
    "POSIX message queue": _PY
    + _quote(
        "import ctypes; r = ctypes.CDLL('librt.so.1'); print(r.mq_open(b'/tfplanted', 0o100, 0o600, None))"
    ),
    "session keyring key": _PY + _quote(_KEYCTL + "print(l.syscall(248, b'user', b'k', b'secret', 6, -3))"),
    "user keyring key": _PY + _quote(_KEYCTL + "print(l.syscall(248, b'user', b'k', b'secret', 6, -4))"),
    "workdir mode": "chmod 1777 /workspace",
    "scratch dir mode": "chmod 700 /tmp",
    "workdir setgid bit": "chmod g+s /workspace",
    "workdir mtime and atime": "touch -d 2001-01-01 /workspace",
    "workdir xattr": _PY + _quote("import os; os.setxattr('/workspace', 'user.planted', b'1')"),
    "scratch dir xattr": _PY + _quote("import os; os.setxattr('/tmp', 'user.planted', b'1')"),
    "workdir default ACL": _PY + _quote(_ACL),
    "workdir chattr flag": _PY + _quote(_FLAGS),
    "agent rlimits (prlimit)": "prlimit --pid $PPID --nofile=16:16 --fsize=0:0 --nproc=1:1",
    "agent niceness": "renice -n 19 -p $PPID",
    "agent CPU affinity": "taskset -p 1 $PPID",
    "agent scheduler": "chrt -i -p 0 $PPID",
    "agent OOM score": "echo 1000 > /proc/$PPID/oom_score_adj",
    "agent I/O priority": "ionice -c 3 -p $PPID",
    "agent signalled to stop": "kill -STOP $PPID; sleep 0.2; kill -CONT $PPID",
    "files in /dev/shm and /run": "echo x > /dev/shm/planted; mkdir /run/planted",
    "POSIX semaphore and shared memory left in /dev/shm": _PY
    + _quote(
        "import os, _posixshmem, _multiprocessing as m; "
        "os.ftruncate(_posixshmem.shm_open('/planted-shm', os.O_CREAT | os.O_RDWR, 0o600), 4096); "
        "m.SemLock(1, 1, 1, '/planted-sem', False)"
    ),
    "/dev/shm mode and times": "chmod 0700 /dev/shm; touch -d 2001-01-01 /dev/shm",
}

# What the next rollout sees, as JSON: everything a plant above could have left behind.
OBSERVE = r"""
import ctypes, json, os, socket, stat, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def sh(c):
    return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
def keys(spec):
    buf = (ctypes.c_int32 * 64)()
    n = libc.syscall(250, ctypes.c_long(11), ctypes.c_long(spec), buf, ctypes.c_long(256))
    return -1 if n < 0 else n // 4
def xattrs(p):
    try:
        return sorted(os.listxattr(p))
    except OSError:
        return []
def sock():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\0tf-planted")
        return "connected"
    except OSError:
        return "refused"
agent = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])  # bash's parent
st = {p: os.stat(p) for p in ("/workspace", "/tmp", "/dev/shm")}
open("/workspace/.umask-probe", "w").close()
obs = {
    "workspace": sorted(os.listdir("/workspace")),
    "tmp": sorted(os.listdir("/tmp")),
    "env": sorted(k for k in os.environ if k not in ("PWD", "OLDPWD", "SHLVL", "_")),
    "cwd": os.getcwd(),
    "new file mode": oct(stat.S_IMODE(os.stat("/workspace/.umask-probe").st_mode)),
    "processes": sorted(sh("ps -eo comm=").split()),
    "abstract socket": sock(),
    "sysv ipc": sh("ipcs -a | grep -c '^0x'"),
    "mqueues": sorted(os.listdir("/dev/mqueue")) if os.path.isdir("/dev/mqueue") else [],
    "session keys": keys(-3),
    # Reading our user keyring would create it: where the agent is another uid (we run as root) a
    # created keyring alone makes the sandbox be discarded, so look at /proc/key-users there.
    "user keys": keys(-4) if os.stat("/run/trajforge/session/cmd").st_uid == os.getuid()
    else [l for l in open("/proc/key-users") if l.split(":")[0].strip() == str(os.getuid())],
    "root modes": {p: oct(s.st_mode) for p, s in st.items()},
    "root owners and mtimes": {p: [s.st_uid, s.st_gid, s.st_mtime_ns] for p, s in st.items()},
    "root xattrs": {p: xattrs(p) for p in st},
    "root flags": sh("lsattr -d /workspace 2>/dev/null | cut -d' ' -f1"),
    "agent limits": sh(f"cat /proc/{agent}/limits"),
    "agent nice": sh(f"cut -d' ' -f19 /proc/{agent}/stat"),
    "agent affinity": sh(f"grep Cpus_allowed_list /proc/{agent}/status"),
    "agent scheduler": sh(f"chrt -p {agent}"),
    "agent oom": sh(f"cat /proc/{agent}/oom_score_adj"),
    "agent ioprio": sh(f"ionice -p {agent}"),
    "dev shm": sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else [],
    "run": sorted(os.listdir("/run")) if os.access("/run", os.R_OK) else "not listable",
}
os.unlink("/workspace/.umask-probe")
print(json.dumps(obs))
"""


async def _observe(sb: Any) -> dict[str, Any]:
    res = await sb.exec("python3 - <<'TF_EOF'\n" + OBSERVE + "\nTF_EOF", timeout=30)
    return json.loads(res.output.strip().splitlines()[-1])


async def plant_then_look(root: str) -> dict[str, Any]:
    """For each plant: rollout A plants it, rollout B (the next one on the same factory) looks.
    Returns the baseline observation, and per plant what B saw, whether B's sandbox was a reused
    one, and the factory's discard reasons that plant caused."""
    config = SandboxConfig(kind="bwrap", reuse=True, root_dir=root, command_timeout_s=20)
    results: dict[str, Any] = {}
    async with create_sandbox_factory(config) as factory:
        first = await factory.create("baseline")
        baseline = await _observe(first)
        await first.close()
        for name, command in PLANTS.items():
            a = await factory.create("a")
            pristine = await _observe(a)
            planted = await a.exec(command, timeout=10)
            agent_pid = a.agent.pid
            before = dict(factory.stats.discarded)
            await a.close()
            b = await factory.create("b")
            seen = await _observe(b)
            results[name] = {
                "planted_output": planted.output[-300:],
                "pristine": pristine,  # what A saw before planting (the same sandbox when reused)
                "seen": seen,
                "reused": b.agent.pid == agent_pid,
                "discarded": {
                    k: v - before.get(k, 0)
                    for k, v in factory.stats.discarded.items()
                    if v != before.get(k, 0)
                },
            }
            await b.close()
        results["_stats"] = factory.stats.counts()
    return {"baseline": baseline, "plants": results}


# -- 3. disk cap, fork bomb ---------------------------------------------------------------------


async def disk_cap(root: str) -> dict[str, Any]:
    limits = SandboxLimits(disk_mb=64, disk_inodes=2000, file_size_mb=1024)
    config = SandboxConfig(kind="bwrap", reuse=True, root_dir=root, limits=limits, command_timeout_s=60)
    async with create_sandbox_factory(config) as factory:
        sb = await factory.create("disk")
        big = await sb.exec("dd if=/dev/zero of=/workspace/big bs=1M count=500 2>&1; ls -l /workspace/big")
        scratch = await sb.exec("dd if=/dev/zero of=/tmp/more bs=1M count=100 2>&1")
        shm = await sb.exec("dd if=/dev/zero of=/dev/shm/more bs=1M count=100 2>&1")
        inodes = await sb.exec("for i in $(seq 3000); do : > /workspace/f$i || break; done 2>&1 | tail -1")
        host_bytes = await asyncio.to_thread(_host_disk_bytes, Path(sb.layout.root))
        capped = sb.layout.disk_capped
        await sb.close()
        again = await factory.create("after")
        after = await again.exec("df -m /workspace | tail -1; ls /workspace | wc -l")
        await again.close()
        stats = factory.stats.counts()
    return {
        "capped": capped,
        "big": big.output,
        "scratch": scratch.output,
        "shm": shm.output,
        "inodes": inodes.output,
        "host_bytes_under_root": host_bytes,
        "after": after.output,
        "stats": stats,
    }


async def fork_bomb(root: str) -> dict[str, Any]:
    config = SandboxConfig(
        kind="bwrap", reuse=True, root_dir=root, command_timeout_s=20, limits=SandboxLimits(max_processes=64)
    )
    async with create_sandbox_factory(config) as factory:
        sb = await factory.create("bomb")
        bomb = await sb.exec(":(){ :|:& };:", timeout=5)
        later = await sb.exec("echo alive; ps -e | wc -l")
        await sb.close()
        nxt = await factory.create("next")
        fresh = await nxt.exec("echo fine")
        await nxt.close()
        return {
            "bomb": bomb.output,
            "bomb_timed_out": bomb.timed_out,
            "later": later.output,
            "notes": [*bomb.notes, *later.notes],  # the sandbox's words, apart from the output
            "next": fresh.output,
            "stats": factory.stats.counts(),
        }


# Python forks (the system's python3 is in every bwrap sandbox): a refused fork ends the loop at
# once (bash would retry it for seconds, dash would give up the whole script), then counts /proc.
_SPAWN_PAST_THE_CAP = """python3 -c '
import os, time
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(77)
        os._exit(0)
print(sum(name.isdigit() for name in os.listdir("/proc")))
'"""


async def process_cap(root: str) -> dict[str, Any]:
    """How many processes a sandbox holds when its commands try to start 100: the total cap."""
    config = SandboxConfig(
        kind="bwrap", reuse=True, root_dir=root, command_timeout_s=20, limits=SandboxLimits(max_processes=40)
    )
    async with create_sandbox_factory(config) as factory:
        sb = await factory.create("cap")
        held = await sb.exec(_SPAWN_PAST_THE_CAP, timeout=15)
        await sb.close()
        return {"held": held.output, "limit": config.limits.max_processes}


# -- 5. the resident shell: what one rollout leaves in its shell, and forged command ends ----------

# Everything a command can change about the shell it runs in, each read back in full.
SHELL_PROBE = r"""
builtin echo "functions: $(builtin declare -F | grep -v ' __tf' | tr '\n' ' ')"
builtin echo "aliases: $(builtin alias -p | tr '\n' ' ')"
builtin echo "traps: $(builtin trap -p | grep -v __tf_save | tr '\n' ' ')"
builtin echo "options: $- $SHELLOPTS $BASHOPTS"
builtin echo "limits: $(ulimit -a | tr -s ' ' | tr '\n' ' ')"
builtin echo "umask: $(builtin umask)"
builtin echo "fds: $(ls /proc/$$/fd | tr '\n' ' ')"
builtin echo "builtins: $(builtin enable | tr '\n' ' ')"
builtin echo "cwd: $PWD"
builtin echo "env: $(env | grep -v '^_=' | sort | tr '\n' ' ')"
builtin echo "variables: $(builtin compgen -v | grep -v -E '^(__tf_|BASH_|_$)' | sort | tr '\n' ' ')"
builtin echo "readonly: $(builtin readonly -p | cut -d= -f1 | tr '\n' ' ')"
builtin echo "PROMPT_COMMAND=${PROMPT_COMMAND-unset} BASH_ENV=${BASH_ENV-unset} ENV=${ENV-unset} IFS=$(printf %q "$IFS")"
bash -c 'echo child-ran' 2>&1
"""

# Plants a model could leave in its resident shell, hoping they run in (or change) the next
# rollout on the same sandbox. The last ones break the planting rollout's own shell on purpose.
SHELL_PLANTS = [
    "trap 'echo TRAP-EXIT >> /tmp/trap.log' EXIT; trap 'echo TRAP-USR1' USR1; trap ': DEBUG' DEBUG; "
    "trap ': ERR' ERR; trap ': RETURN' RETURN",
    "PROMPT_COMMAND='echo PC >> /tmp/pc.log'; alias ls='echo ALIASED'; alias bash='echo ALIASED'",
    "cd() { echo HIJACKED; }; env() { echo HIJACKED; }; f() { echo EXPORTED; }; export -f f",
    "printf 'echo BASH_ENV-RAN\\n' > /tmp/evil.sh; export BASH_ENV=/tmp/evil.sh ENV=/tmp/evil.sh",
    "ulimit -n 256; ulimit -S -c 0; ulimit -s 4096; umask 077; exec 7>/tmp/fd7 8</etc/hostname",
    "readonly RO=planted; IFS=x; set -o posix -o pipefail -o noclobber -o allexport; shopt -s nullglob failglob",
    "mkdir -p /tmp/deep && cd /tmp/deep; PLAIN=planted; export EXPORTED=planted; declare -A MAP=([k]=v)",
    "[ -d /usr/lib/bash ] && enable -f /usr/lib/bash/sleep sleep; :",
    # these end or wedge the planting rollout's own shell: the next rollout must not notice
    "enable -n echo kill; builtin() { :; }; read() { :; }; printf() { :; }",
    "set -n",
]


async def shell_plants(root: str) -> dict[str, Any]:
    """A rollout probes its shell, a second one (same sandbox) plants everything in SHELL_PLANTS
    and probes again (the control: the plants took), a third one (same sandbox again) probes."""
    config = SandboxConfig(kind="bwrap", reuse=True, root_dir=root, command_timeout_s=5)
    async with create_sandbox_factory(config) as factory:
        first = await factory.create("pristine")
        pristine = (await first.exec(SHELL_PROBE)).output
        await first.close()
        planter = await factory.create("planter")
        planted = []
        for plant in SHELL_PLANTS[:-2]:
            res = await planter.exec(plant)
            planted.append((plant, res.exit_code, res.output))
        tainted = (await planter.exec(SHELL_PROBE)).output
        for plant in SHELL_PLANTS[-2:]:
            res = await planter.exec(plant, timeout=3)
            planted.append((plant, res.exit_code, res.output))
        wedged = await planter.exec("echo still-here", timeout=3)
        await planter.close()
        after = await factory.create("after")
        seen = (await after.exec(SHELL_PROBE)).output
        await after.close()
        stats = factory.stats.counts()
    return {
        "pristine": pristine,
        "tainted": tainted,
        "seen": seen,
        "planted": planted,
        "wedged": wedged.output,
        "stats": stats,
    }


# Ways a command could try to end itself early or fake its exit code: the status line's format
# printed in its output, a nonce of an earlier command, every fd of the shell and of a child.
FORGERIES = {
    "in the output": 'for i in $(seq 50); do echo "$i 0"; echo "$i ready"; done; sleep 1; exit 7',
    "old nonces to every fd": (
        'for fd in /proc/$$/fd/*; do for n in $OLD; do echo "$n 0" > $fd; done; done 2>/dev/null; '
        "sleep 1; exit 7"
    ),
    "a child writes to the shell's fds": (
        'python3 -c \'import os,glob\nfor p in glob.glob("/proc/%d/fd/*" % os.getppid()):\n'
        '  try:\n    fd=os.open(p, os.O_WRONLY|os.O_NONBLOCK); os.write(fd, b"0 0\\n1 0\\n"); os.close(fd)\n'
        "  except OSError: pass'; sleep 1; exit 7"
    ),
    "a stdin reader": 'cat; read -r line; echo "read: $? [$line]"; sleep 1; exit 7',
}


async def forge(root: str) -> dict[str, Any]:
    """Each forgery runs after a few ordinary commands (whose nonces it cannot see either); the
    call must last its full second and report exit code 7, and the next command must work."""
    config = SandboxConfig(kind="bwrap", reuse=True, root_dir=root, command_timeout_s=10)
    out: dict[str, Any] = {}
    async with create_sandbox_factory(config) as factory:
        for name, command in FORGERIES.items():
            sb = await factory.create("forge")
            for _ in range(3):
                await sb.exec("echo warm")
            await sb.exec("OLD='0 1 2 3 4 5 6 7 8 9 10 ready'")
            started = asyncio.get_running_loop().time()
            res = await sb.exec(command)
            took = asyncio.get_running_loop().time() - started
            after = await sb.exec("echo next")
            out[name] = {
                "exit_code": res.exit_code,
                "took": took,
                "output": res.output[-300:],
                "notes": list(res.notes),
                "next": after.output,
            }
            await sb.close()
        out["insider"] = await _insider(factory)
    return out


# The loop keeps no variable while a command runs: it gets its nonce back after the command from a
# pipe it holds (a here-string, closed for the command, its copy at a close-on-exec fd of the
# shell). A command runs in that shell and can read it there -- and put it back, so the loop still
# reports: N is the nonce.
_READ_NONCE = (
    "for n in $(seq 10 99); do [[ $(readlink /proc/$$/fd/$n) == pipe:* ]] && IFS= read -r L <&$n && "
    'printf "%s\\n" "$L" > /proc/$$/fd/$n && break; done 2>/dev/null; N=${L%% *}; '
)


async def _insider(factory: Any) -> dict[str, Any]:
    """A command that reads the loop's own nonce (it runs *in* the shell, so it can) and writes
    the status line itself ends its call early: what it cannot do is make that count for more.
    Its later output lands in its own FIFO (drained, never in the next command's), the next
    command gets its own output and exit code, and the forger itself ends at the next
    command's timeout at the latest."""
    sb = await factory.create("insider")
    await sb.exec("echo warm")
    loop = asyncio.get_running_loop()
    started = loop.time()
    forged = await sb.exec(
        _READ_NONCE + 'for n in $(seq 3 40); do printf "%s 0\\n" "$N" >&$n; done 2>/dev/null; '
        "sleep 2; echo LATE; touch /tmp/forger-finished"
    )
    forged_took = loop.time() - started
    nxt = await sb.exec("echo next; exit 4")
    later = await sb.exec("ls /tmp/forger-finished; echo again")
    dies = await sb.exec(
        _READ_NONCE + 'for n in $(seq 3 40); do printf "%s 0\\n" "$N" >&$n; done 2>/dev/null; sleep 1; exit 9'
    )
    after_death = await sb.exec("echo after")
    await sb.close()
    return {
        "forged": (forged.exit_code, forged.output, forged_took),
        "next": (nxt.exit_code, nxt.output, list(nxt.notes)),
        "later": (later.exit_code, later.output),
        "dies": (dies.exit_code, dies.output),
        "after_death": (after_death.exit_code, after_death.output, list(after_death.notes)),
    }


SCENARIOS = {
    "race": race,
    "plant_then_look": plant_then_look,
    "disk_cap": disk_cap,
    "fork_bomb": fork_bomb,
    "process_cap": process_cap,
    "shell_plants": shell_plants,
    "forge": forge,
}


def main() -> None:
    name, root = sys.argv[1], sys.argv[2]
    result = asyncio.run(SCENARIOS[name](root))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
