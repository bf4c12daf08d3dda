"""A real Docker engine for the docker backend's tests: Debian's ``dockerd``, started privately.

Why a private daemon: the tests must run against a real engine on any machine where one *can* run
(CI included), without touching a system Docker. So the daemon gets its own data-root, exec-root,
socket and pid file under one state directory (``/var/lib/trajforge-docker``, or
``$TRAJFORGE_DOCKER_STATE``), no bridge and no iptables/ip6tables rules (``--bridge=none
--iptables=false --ip6tables=false``: the host's network is never changed; containers have only
``lo``), its own empty daemon config, and the storage driver dockerd picks for that directory
(overlay2 where the backing file system allows it, else fuse-overlayfs or vfs;
``$TRAJFORGE_DOCKER_STORAGE_DRIVER`` forces one).

No image registry is reachable, so the base image is built here from Debian packages:
``debootstrap --variant=minbase`` (plus python3, which the exec agent needs, and the tools of the
fidelity suite's workloads: ``BASE_INCLUDE``) from the mirror apt
itself uses, imported with ``docker import`` and tagged ``trajforge-base:<hash of the recipe>``. It
lives in the daemon's data-root, so only the first run on a machine pays for it.

Who starts and stops the daemon: :func:`acquire` (the ``docker_engine`` session fixture; with
pytest-xdist each worker is a user) starts it when none answers and registers the caller; the last
:func:`release` stops it -- only if a test session started it. A daemon that was already running
(``make docker-engine``, a developer's) is used and left alone. Stdlib only: ``make test`` runs
``python3 tests/docker_engine.py prepare`` before pytest, so the base image is built outside any
test's timeout.

    python3 tests/docker_engine.py start|stop|status|prepare|base-image|env
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STATE = Path(os.environ.get("TRAJFORGE_DOCKER_STATE", "/var/lib/trajforge-docker"))
SOCKET = STATE / "docker.sock"
HOST = f"unix://{SOCKET}"
PIDFILE = STATE / "dockerd.pid"
LOG = STATE / "dockerd.log"
USERS = STATE / "users"  # one file per process using a daemon that a test session started
STARTED_BY_TESTS = STATE / "started-by-tests"
TIMINGS = STATE / "timings.json"  # what the last set-up steps took, for the README

BASE_REPO = "trajforge-base"
# The base image's recipe: its hash is the image's tag, so changing any of it builds a new one.
BASE_VARIANT = "minbase"
# python3: the exec agent is a python3 program, and Harbor tasks' tests use it too. The rest is what
# the fidelity suite's workloads run (tests/fidelity.py: multiprocessing, pytest -n 2, make -j2,
# sqlite, git, a virtualenv and pip, curl, tmux, ps/top), installed on the host by `make
# system-deps` as well: the docker backend is the suite's reference for a Linux box.
BASE_INCLUDE = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python3-pytest",
    "python3-pytest-xdist",
    "make",
    "sqlite3",
    "git",
    "curl",
    "tmux",
    "procps",
)
BASE_REMOVE = ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "etc/resolv.conf", "etc/hostname")
BASE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)
BASE_RECIPE_VERSION = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SUITE = "bookworm"


@dataclass(frozen=True)
class Engine:
    """What the ``docker_engine`` fixture hands a test: the daemon's DOCKER_HOST, the base tag."""

    host: str
    base: str


def _env() -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": HOST}


def _docker(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], env=_env(), capture_output=True, text=True, timeout=timeout, **kw
    )  # type: ignore[call-overload]


def why_not() -> str:
    """'' when a private dockerd can run here; else exactly why not (the tests skip with it)."""
    if sys.platform != "linux":
        return f"dockerd runs on Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return (
            "the private dockerd of the tests needs root (it mounts overlays and makes cgroups and "
            "namespaces); run the docker tests as root"
        )
    missing = [
        b for b in ("dockerd", "containerd", "runc", "docker", "debootstrap") if shutil.which(b) is None
    ]
    if missing:
        return (
            f"{', '.join(missing)} not installed: `make system-deps` installs them "
            "(apt-get install docker.io debootstrap)"
        )
    if not Path("/sys/fs/cgroup").is_dir():
        return "no cgroup file system at /sys/fs/cgroup: dockerd cannot limit containers here"
    return ""


def reachable() -> bool:
    try:
        return _docker("version", "--format", "{{.Server.Version}}", timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def _locked(name: str = "lock") -> Iterator[None]:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / name, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _record(step: str, seconds: float) -> None:
    try:
        timings = json.loads(TIMINGS.read_text())
    except (OSError, ValueError):
        timings = {}
    timings[step] = round(seconds, 2)
    TIMINGS.write_text(json.dumps(timings, indent=2) + "\n")


def _daemon_pid() -> int | None:
    """The pid of *our* dockerd: the pid file's, only while that process is a dockerd started with
    our pid file (a stale file's pid may belong to anything by now)."""
    try:
        pid = int(PIDFILE.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if Path(cmdline[0].decode(errors="replace")).name != "dockerd" or str(PIDFILE).encode() not in cmdline:
        return None
    return pid


def _start_locked() -> bool:
    """Start dockerd unless one answers on our socket; True when this call started it."""
    if reachable():
        return False
    stale = _daemon_pid()
    if stale is not None:  # a daemon that does not answer: stop it before starting a new one
        _stop_pid(stale)
    for sub in ("data", "exec"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    config = STATE / "daemon.json"
    config.write_text("{}\n")  # never the system's /etc/docker/daemon.json
    SOCKET.unlink(missing_ok=True)
    argv = [
        "dockerd",
        "--config-file", str(config),
        "--data-root", str(STATE / "data"),
        "--exec-root", str(STATE / "exec"),
        "--pidfile", str(PIDFILE),
        "--host", HOST,
        "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
        "--userland-proxy=false",
        "--exec-opt", "native.cgroupdriver=cgroupfs",
    ]  # fmt: skip
    driver = os.environ.get("TRAJFORGE_DOCKER_STORAGE_DRIVER")
    if driver:
        argv += ["--storage-driver", driver]
    began = time.monotonic()
    with open(LOG, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not killed with the test session's process group
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")},
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dockerd exited with {proc.returncode}: {_log_tail()}")
        if reachable():
            _record("daemon_start_s", time.monotonic() - began)
            return True
        time.sleep(0.1)
    _stop_pid(proc.pid)
    raise RuntimeError(f"dockerd did not answer on {SOCKET} within 60 s: {_log_tail()}")


def _log_tail() -> str:
    try:
        return LOG.read_text(errors="replace")[-1500:]
    except OSError:
        return "(no log)"


def _stop_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30  # dockerd stops its containers and its containerd first
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def start() -> bool:
    """Start the private daemon unless it already runs (idempotent); True when this call did.
    A daemon started (or claimed) so is not the tests' to stop."""
    with _locked():
        started = _start_locked()
        STARTED_BY_TESTS.unlink(missing_ok=True)  # from now on the caller's, whoever started it
        return started


def stop() -> None:
    """Stop the private daemon (whoever started it)."""
    with _locked():
        pid = _daemon_pid()
        if pid is not None:
            _stop_pid(pid)
        STARTED_BY_TESTS.unlink(missing_ok=True)
        shutil.rmtree(USERS, ignore_errors=True)


def _process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _live_users() -> list[Path]:
    if not USERS.is_dir():
        return []
    live = []
    for entry in USERS.iterdir():
        pid, _, start_time = entry.name.partition("-")
        if pid.isdigit() and _process_start(int(pid)) == start_time:
            live.append(entry)
        else:  # a test session that was killed: it will not release
            entry.unlink(missing_ok=True)
    return live


def acquire() -> str:
    """Make sure the daemon runs, count this process as a user; returns DOCKER_HOST."""
    with _locked():
        if _start_locked():
            STARTED_BY_TESTS.touch()
        USERS.mkdir(exist_ok=True)
        (USERS / f"{os.getpid()}-{_process_start(os.getpid())}").touch()
    return HOST


def release() -> None:
    """This process is done; the last user stops a daemon that a test session started."""
    with _locked():
        (USERS / f"{os.getpid()}-{_process_start(os.getpid())}").unlink(missing_ok=True)
        if _live_users() or not STARTED_BY_TESTS.exists():
            return
        pid = _daemon_pid()
        if pid is not None:
            _stop_pid(pid)
        STARTED_BY_TESTS.unlink(missing_ok=True)


# ------------------------------------------------------------------------------ the base image


def apt_mirror() -> tuple[str, str]:
    """(mirror URL, suite) of the Debian archive apt uses here, so debootstrap goes where apt-get
    goes; Debian's default mirror and bookworm on a machine that is not Debian."""
    suite = DEFAULT_SUITE
    with contextlib.suppress(OSError):
        info = dict(
            line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line
        )
        if info.get("ID") == "debian" and info.get("VERSION_CODENAME"):
            suite = info["VERSION_CODENAME"].strip('"')
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in (".sources", ".list") and path.is_file():
            with contextlib.suppress(OSError):
                texts.append(path.read_text())
    for text in texts:  # deb822 (URIs: ...) and one-line (deb URL suite ...) formats
        for url in re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M
        ):
            if url.rstrip("/").endswith("/debian"):
                return url.rstrip("/"), suite
    return DEFAULT_MIRROR, suite


def base_tag() -> str:
    _, suite = apt_mirror()
    recipe = json.dumps(
        [suite, BASE_VARIANT, BASE_INCLUDE, BASE_REMOVE, BASE_CHANGES, BASE_RECIPE_VERSION]
    ).encode()
    return f"{BASE_REPO}:{suite}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def base_image() -> str:
    """The base image's tag; built (debootstrap + docker import) when the daemon lacks it."""
    tag = base_tag()
    if _docker("image", "inspect", tag).returncode == 0:
        return tag
    with _locked("base.lock"):
        if _docker("image", "inspect", tag).returncode == 0:  # another worker built it meanwhile
            return tag
        mirror, suite = apt_mirror()
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="rootfs-", dir=STATE) as tmp:
            rootfs = Path(tmp) / "rootfs"
            done = subprocess.run(
                [
                    "debootstrap", f"--variant={BASE_VARIANT}", f"--include={','.join(BASE_INCLUDE)}",
                    suite, str(rootfs), mirror,
                ],
                capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(
                    f"debootstrap {suite} from {mirror} failed: {done.stdout[-1500:]}{done.stderr[-1500:]}"
                )
            _record("debootstrap_s", time.monotonic() - began)
            for pattern in BASE_REMOVE:
                for path in rootfs.glob(pattern):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
            began = time.monotonic()
            changes = [arg for change in BASE_CHANGES for arg in ("--change", change)]
            tar = subprocess.Popen(
                ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
            )
            imported = _docker("import", *changes, "-", tag, stdin=tar.stdout, timeout=600)
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
            if imported.returncode != 0 or tar.returncode != 0:
                raise RuntimeError(f"docker import failed: {imported.stderr[-1500:]}")
            _record("import_s", time.monotonic() - began)
        # Images of older recipes are never used again: free their space (best effort; one still
        # used by a task image stays, docker refuses to remove it).
        listed = _docker("images", BASE_REPO, "--format", "{{.Repository}}:{{.Tag}}")
        old = [t for t in listed.stdout.split() if t != tag]
        if old:
            _docker("rmi", *old, timeout=120)
    return tag


def prepare() -> str:
    """For ``make test``: the base image exists afterwards; the daemon runs as before (started
    and stopped again here when none was running). '' when the engine cannot run here."""
    reason = why_not()
    if reason:
        print(f"docker engine: not prepared: {reason}", file=sys.stderr)
        return ""
    started = start()
    try:
        return base_image()
    finally:
        if started:
            stop()


def main(argv: list[str]) -> int:
    verb = argv[0] if argv else "status"
    if verb == "start":
        reason = why_not()
        if reason:
            print(reason, file=sys.stderr)
            return 1
        start()
        print(f"DOCKER_HOST={HOST}")
    elif verb == "stop":
        stop()
    elif verb == "prepare":
        print(prepare() or "not prepared")
    elif verb == "base-image":
        print(base_image())
    elif verb == "env":
        print(f"export DOCKER_HOST={HOST}")
    elif verb == "status":
        print(json.dumps({"reachable": reachable(), "why_not": why_not(), "host": HOST, "base": base_tag()}))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
