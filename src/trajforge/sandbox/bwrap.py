"""The ``bwrap`` backend (default): each sandbox is a bubblewrap container around its directory.

What a command sees: the system directories (/usr, /etc and the /bin, /lib links) read-only; its
own working directory at ``/workspace`` and a private ``/tmp`` (both host directories, so nothing
lands in RAM and the host can read them); fresh /proc and /dev; no network unless
``config.network``; its own pid namespace (closing the sandbox, or the host process dying, kills
all of it: ``--die-with-parent``). Nothing else of the host -- no /root, /home, other sandboxes.

Limits: a per-sandbox cgroup (pids, memory) where the host allows one; rlimits for file size, CPU
time (and address space / process count when the cgroup is missing). When we run as root, bwrap
is started under ``setpriv`` as a dedicated unprivileged uid for this sandbox: root inside the
sandbox would ignore RLIMIT_NPROC, keep capabilities, and own every root-owned file on the host.
The exec agent itself stays uid 0 with six capabilities and ``no_new_privs``: a uid the commands do
not share, so they cannot signal, trace, ``prlimit``, renice or re-pin the process that starts all
later commands (in a user namespace there is only one uid; there the reset verifies the agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from trajforge.cleanup import finish
from trajforge.sandbox.cgroup import SandboxCgroup
from trajforge.sandbox.disk import remove_tree
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.sandbox.factory import ProcessSandboxFactory
from trajforge.sandbox.launch import Launch, command_env, limit_env, nproc_counted_per_namespace
from trajforge.sandbox.layout import Layout, chown_tree, make_layout
from trajforge.sandbox.templates import filter_fd, key_filter
from trajforge.spawn import kill_process, spawn

INSIDE_WORKDIR = "/workspace"
INSIDE_SCRATCH = "/tmp"
INSIDE_SHM = "/dev/shm"
INSIDE_SESSION = "/run/trajforge/session"  # the agent's command files: out of the commands' reach
HOSTNAME = "sandbox"
_IDENTITY_FILES = ("/etc/passwd", "/etc/group", "/etc/hostname", "/etc/hosts")
# What the agent (uid 0 when we are root) keeps: start commands as their uid, kill them, and remove
# or restore whatever they left, whatever its mode. Nothing else (no sys_admin, net, ptrace, ...).
_AGENT_CAPS = "+setuid,+setgid,+kill,+fowner,+dac_override,+chown"
_SYSTEM_DIRS = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_UID_BASE = 200_000
_UID_SPAN = 1_000_000_000

INSTALL_HINT = (
    "Install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install "
    "bubblewrap`) and make sure unprivileged user namespaces are allowed, or choose the unisolated "
    "backend explicitly with `--sandbox local` (SandboxConfig(kind='local'))."
)


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _ro_binds(paths: Sequence[str]) -> list[str]:
    """``--ro-bind P P`` for each path (one inside another: the outer one only), each missing
    parent made first as a 0755 directory: bwrap would make it with our umask (0700 as root), and
    the sandbox's uid could not reach the bind."""
    args: list[str] = []
    made: set[PurePosixPath] = set()
    bound: list[PurePosixPath] = []
    for path in sorted({PurePosixPath(p) for p in paths}, key=lambda p: len(p.parts)):
        if any(path.is_relative_to(b) for b in bound):
            continue
        for parent in reversed(path.parents[:-1]):  # outermost first, "/" left out
            if parent not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        args += ["--ro-bind", str(path), str(path)]
        bound.append(path)
    return args


def _mounts(fds: dict[str, int], ro_binds: Sequence[str] = (), root: bool = False) -> list[str]:
    """The sandbox's file system: system dirs read-only, the config's ``ro_binds`` read-only at
    their own paths, fresh /proc, /dev and mqueue, the workdir, scratch dir and /dev/shm bound
    from the fds we opened, and, when ``fds`` has them, the identity files that make the sandbox's
    uid and hostname known (``/etc/passwd``, ``/etc/group``, ``/etc/hostname``, ``/etc/hosts``).
    The agent is not mounted: it runs from its fd (``/proc/self/fd/N``), so no mount or file of
    the sandbox names it. ``root``: the commands run as a uid of their own."""
    extra = _ro_binds(ro_binds)
    # As root /run, which holds the agent's session directory, is root's, searchable and not
    # listable for the commands (``ls /run`` and ``find /`` said ``trajforge``); unprivileged the
    # commands own it, and the agent, the same uid without capabilities, must list it to reset it.
    run = ["--perms", "0711"] if root else []
    identity = [
        arg
        for name in _IDENTITY_FILES
        if name in fds
        for arg in ("--perms", "0644", "--ro-bind-data", str(fds[name]), name)
    ]
    return [
        "--die-with-parent",
        "--new-session",
        "--hostname",
        HOSTNAME,
        *_system_binds(),
        *identity,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--mqueue",
        "/dev/mqueue",
        "--bind-fd",
        str(fds["shm"]),
        INSIDE_SHM,
        "--bind-fd",
        str(fds["tmp"]),
        INSIDE_SCRATCH,
        "--bind-fd",
        str(fds["work"]),
        INSIDE_WORKDIR,
        # after the scratch and work dirs: a path bound under /tmp (a venv in a clone there) is
        # then mounted on top of the scratch dir instead of hidden by it (such a sandbox is not
        # reused: its reset cannot empty a /tmp holding a mount point, so it is rebuilt)
        *extra,
        *run,
        "--tmpfs",
        "/run",
        "--chdir",
        INSIDE_WORKDIR,
    ]


def _identity_files(uid: int | None) -> dict[str, bytes]:
    """What the sandbox's ``/etc`` says about who and where it is, as a Linux box's does: its
    hostname in ``/etc/hostname`` and ``/etc/hosts``, and as root (commands run as a uid of their
    own that the host does not know) that uid in ``/etc/passwd`` and ``/etc/group``, home
    ``/workspace``: ``whoami``, ``getpass.getuser()`` and tools that look the user up work."""
    files = {
        "/etc/hostname": f"{HOSTNAME}\n".encode(),
        "/etc/hosts": (
            f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{HOSTNAME}\n"
        ).encode(),
    }
    if uid is not None:
        files.update(_passwd_entry(uid))
    # a file bwrap cannot bind over (none on this host) is left as the host has it
    return {name: data for name, data in files.items() if os.path.isfile(name)}


def _passwd_entry(uid: int) -> dict[str, bytes]:
    """``/etc/passwd`` and ``/etc/group`` with a line for ``uid`` (the host's lines kept)."""
    files: dict[str, bytes] = {}
    try:
        passwd, group = Path("/etc/passwd").read_bytes(), Path("/etc/group").read_bytes()
    except OSError:
        return files
    names = {line.split(b":", 1)[0] for line in passwd.splitlines()}
    name = next((n for n in (b"user", b"sandbox") if n not in names), b"sandbox-%d" % uid)
    end = b"" if passwd.endswith(b"\n") or not passwd else b"\n"
    files["/etc/passwd"] = (
        passwd + end + b"%s:x:%d:%d::%s:/bin/bash\n" % (name, uid, uid, INSIDE_WORKDIR.encode())
    )
    end = b"" if group.endswith(b"\n") or not group else b"\n"
    files["/etc/group"] = group + end + b"%s:x:%d:\n" % (name, uid)
    return files


def _data_fd(data: bytes) -> int:
    """A fd bwrap reads ``data`` from (``--args``, ``--ro-bind-data``): a memory file at offset 0
    (a pipe would block the writer past 64 KiB, before bwrap reads anything)."""
    fd = os.memfd_create("bwrap-data", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_paths(layout: Layout) -> dict[str, int]:
    """O_PATH fds of the sandbox's host paths, opened by us: bwrap binds them through the fd, so
    the unprivileged sandbox uid never needs to traverse the (possibly private) parent dirs."""
    fds: dict[str, int] = {}
    try:
        for key, path in (
            ("work", layout.work),
            ("tmp", layout.tmp),
            ("shm", layout.shm),
            ("agent", layout.agent),
        ):
            fds[key] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except BaseException:
        _close_fds(fds)
        raise
    return fds


def _close_fds(fds: dict[str, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


class BwrapSandboxFactory(ProcessSandboxFactory):
    """Sandboxes inside bubblewrap; ``workdir`` is ``/workspace`` and ``scratch_dir`` is ``/tmp``."""

    kind = "bwrap"
    supports_reuse = True  # its own pid namespace: the agent's reset can reach every process
    forks = True  # overlay children as root, copies otherwise (sandbox.templates)

    def _bwrap_argv(self, fds: dict[str, int], uid: int | None, program: Sequence[str] = ()) -> list[str]:
        """bwrap's argv for one sandbox running ``program`` (by default the exec agent)."""
        seccomp = ["--seccomp", str(fds["seccomp"])] if "seccomp" in fds else []
        return [
            "bwrap",
            *self._namespaces(uid),
            *seccomp,
            *_mounts(fds, self.config.ro_binds, root=uid is not None),
            *self._agent_privileges(uid),
            *(program or self._agent_program(uid, fds["agent"])),
        ]

    def _agent_program(self, uid: int | None, agent_fd: int) -> list[str]:
        """The agent, run from the fd of its file: ``/proc/self/fd/N`` (it closes the fd first).
        Its options come in ``TF_AGENT_ARGS`` (:meth:`_launch`): a command line is what ``ps``
        shows, and the sandbox's pid 1 (bwrap) has the agent's in its own."""
        return [f"/proc/self/fd/{agent_fd}"]

    def _namespaces(self, uid: int | None) -> list[str]:
        if uid is None:  # unprivileged: bwrap makes a user namespace and we keep our uid
            return ["--unshare-all", *(["--share-net"] if self.config.network else [])]
        # root: no user namespace, so the commands' uid is a real host uid of its own
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        return namespaces + ([] if self.config.network else ["--unshare-net"])

    @staticmethod
    def _agent_privileges(uid: int | None) -> list[str]:
        """As root, the agent stays uid 0 with only the capabilities it needs (see the module doc)
        and starts every command as ``uid``; no_new_privs: no setuid binary gains anything."""
        if uid is None:
            return []
        return [
            "/usr/bin/setpriv",
            "--no-new-privs",
            "--clear-groups",
            "--inh-caps=-all",
            f"--bounding-set=-all,{_AGENT_CAPS}",
            "--",
        ]

    def _agent_args(self, uid: int | None) -> list[str]:
        return [
            INSIDE_WORKDIR,
            INSIDE_SCRATCH,
            "--state-dir",
            INSIDE_SESSION,
            "--max-procs",
            str(self.config.limits.max_processes),
            "--shm",
            INSIDE_SHM,
            *(["--run-as", f"{uid}:{uid}"] if uid is not None else []),
            *(["--reusable"] if self.reuse else []),
        ]

    async def _probe(self) -> str:
        """Run a trivial command in a sandbox built exactly like the real ones; '' when it works."""
        if shutil.which("bwrap") is None:
            return f"bubblewrap (`bwrap`) is not installed. {INSTALL_HINT}"
        if os.geteuid() == 0 and shutil.which("setpriv") is None:
            return "running as root needs `setpriv` (util-linux) to drop to a sandbox uid. " + INSTALL_HINT
        if self.agent_file is None:  # _check builds it first
            return "the exec agent was not built"
        layout = await asyncio.to_thread(make_layout, self._root_dir(), "probe", self.agent_file)
        try:
            uid = self._new_uid()
            if uid is not None:
                await asyncio.to_thread(chown_tree, layout.root, (uid, uid))
            fds = _open_paths(layout)
            try:
                argv = self._bwrap_argv(fds, uid, program=["/bin/sh", "-c", "echo ok > /workspace/probe"])
                proc = await spawn(
                    *argv,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env={},
                    pass_fds=tuple(fds.values()),
                    start_new_session=True,  # killed as a group: see ExecAgent.start
                )
                try:
                    async with asyncio.timeout(30):  # not wait_for: it can swallow a cancel
                        out, _ = await proc.communicate()
                except BaseException:  # a timeout, or the first create cancelled: nothing left
                    kill_process(proc, group=True)
                    await finish(proc.wait())
                    raise
            finally:
                _close_fds(fds)
            if proc.returncode != 0 or not (layout.work / "probe").exists():
                text = out.decode(errors="replace").strip()[-500:]
                return f"bubblewrap cannot start a sandbox here ({text or f'exit {proc.returncode}'}). {INSTALL_HINT}"
        except SandboxUnavailableError as exc:
            return str(exc)
        except (OSError, TimeoutError) as exc:
            return f"bubblewrap cannot start a sandbox here ({exc}). {INSTALL_HINT}"
        finally:
            await asyncio.to_thread(remove_tree, layout.root)
        return ""

    @staticmethod
    def _new_uid() -> int | None:
        """A fresh unprivileged uid per sandbox when we are root (None: keep our own uid)."""
        if os.geteuid() != 0:
            return None
        return _UID_BASE + secrets.randbelow(_UID_SPAN)

    def _new_owner(self) -> tuple[int, int] | None:
        uid = self._new_uid()
        return (uid, uid) if uid is not None else None

    def _disk(self) -> tuple[int, int] | None:
        limits = self.config.limits
        if limits.disk_mb is None:
            return None
        if os.geteuid() != 0:
            self._disk_not_enforced("trajforge does not run as root")
            return None
        return limits.disk_mb, limits.disk_inodes

    async def _launch(self, task_id: str, layout: Layout, cgroup: SandboxCgroup, image: str | None) -> Launch:
        owner = layout.owner
        uid = owner[0] if owner is not None else None
        env = command_env(self.config, INSIDE_WORKDIR, INSIDE_SCRATCH)
        # RLIMIT_NPROC counts per real uid: meaningful for a uid of our own, and unprivileged
        # for the sandbox's own user namespace where the kernel counts per namespace. Without
        # it an unprivileged fork bomb had no total cap (it took the machine's pids).
        nproc = uid is not None or nproc_counted_per_namespace()
        env |= limit_env(self.config, cgroup, nproc_effective=nproc)
        fds = _open_paths(layout)
        try:
            # The sandboxes of a template share its uid, and the kernel keeps a user keyring per
            # uid: no key system calls for them (sandbox.templates).
            program = key_filter() if uid is not None and uid in self._template_uids else None
            if program is not None:
                fds["seccomp"] = filter_fd(program)
            for name, data in _identity_files(uid).items():
                fds[name] = _data_fd(data)
            # bwrap's options travel through a fd and the agent's in its environment: the
            # sandbox's pid 1 is bwrap, and its command line (``ps``) named the harness's paths.
            argv = self._bwrap_argv(fds, uid)
            agent_at = (
                len(argv) - len(self._agent_privileges(uid)) - len(self._agent_program(uid, fds["agent"]))
            )
            fds["args"] = _data_fd(b"".join(os.fsencode(a) + b"\0" for a in argv[1:agent_at]))
            argv = [*cgroup.join_command(), "bwrap", "--args", str(fds["args"]), *argv[agent_at:]]
            env["TF_AGENT_ARGS"] = "\n".join(self._agent_args(uid))
        except BaseException:
            _close_fds(fds)
            raise

        async def teardown() -> None:
            _close_fds(fds)

        def started() -> None:  # bwrap has read its arguments and the data files: not held
            for name in ("args", *_IDENTITY_FILES):
                fd = fds.pop(name, None)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)

        return Launch(
            argv=argv,
            workdir=INSIDE_WORKDIR,
            scratch_dir=INSIDE_SCRATCH,
            env=env,
            owner=owner,
            pass_fds=tuple(fds.values()),
            teardown=teardown,
            started=started,
        )
