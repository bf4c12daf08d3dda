"""The ``docker`` backend: one container per sandbox, driven through the ``docker`` CLI.

Each sandbox is ``docker run -d`` of its image with a minimal shell init as pid 1 (it reaps
orphans and outlives a ``kill(-1)``; no ``--rm``: ``close`` removes the container and returns when
it is gone), with the sandbox's host directories bind-mounted at ``/workspace`` and
``/tmp`` (so file access stays host-side, binary-safe and confined exactly as in the other
backends), the exec agent bind-mounted read-only, and then the agent started in it by ``docker exec
-i``. Which engine: the ``docker`` CLI's own (``DOCKER_HOST``, ``DOCKER_CONTEXT``); it must be a
*local* engine, since the bind mounts are host paths.

What holds, as under bwrap (docs/security.md, "The docker backend"): no network unless
``config.network`` (``--network none``: only ``lo``); the container's own pid, mount, IPC and UTS
namespaces; ``--pids-limit`` and ``--memory`` (with no swap beyond it) on the container's cgroup,
which is also the sandbox's cgroup on the host side (so the kernel's refused forks are seen and the
fork-bomb recovery runs); the per-command rlimits (file size, CPU time) and timeouts that kill the
command's process group; the output cap; the disk cap on ``/workspace``, ``/tmp`` and ``/dev/shm``
(one tmpfs, when trajforge runs as root). Each container is labelled with its owner process (boot, pid namespace,
pid, start time): a factory's first ``create`` removes the containers whose owner died (``kill
-9``), as the bwrap sweep removes directories and cgroups.

What differs: commands run as root *in the container* (Harbor tasks expect it), with a reduced
capability set and ``no-new-privileges``, not as a uid of their own; the exec agent shares that
uid; a sandbox is never reused (each rollout gets a new container); the disk cap does not cover
the image's own paths (``/app`` of a Harbor task lives in the container's writable layer). The exec
agent is ``exec_agent.c`` linked statically and mounted read-only: the image needs no python, only
``sh`` and ``bash``. Checked once per image, with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import uuid
from pathlib import Path

from trajforge.sandbox.cgroup import CGROUP_ROOT, SandboxCgroup
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.sandbox.factory import ProcessSandboxFactory
from trajforge.sandbox.launch import Launch, command_env, limit_env
from trajforge.sandbox.layout import Layout
from trajforge.sandbox.sweep import process_start
from trajforge.sandbox.types import SandboxConfig
from trajforge.spawn import spawn

INSIDE_WORKDIR = "/workspace"
INSIDE_SCRATCH = "/tmp"
INSIDE_SHM = "/dev/shm"
INSIDE_AGENT = "/run/trajforge/agent"  # the exec agent, a static binary
INSIDE_SESSION = "/run/trajforge/session"  # the agent's command files: not in the scratch dir
OWNER_LABEL = "trajforge.owner"  # "<boot id>/<pid namespace>/<pid>/<start>" of the process that made it
# Docker's default capabilities, less what no sandbox needs: raw sockets (NET_RAW), device nodes
# (MKNOD), file capabilities (SETFCAP), changing capability sets (SETPCAP), the audit log.
_CAPS = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
)
# What the docker CLI itself reads from its environment: passed on to every ``docker`` we start.
_CLIENT_VARS = (
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "DOCKER_API_VERSION",
)
# The container's pid 1: reaps every orphan (``wait`` collects any child) and cannot be killed
# from inside (the kernel drops the signals a namespace's init has no handler for: it needs no
# trap, which ``ps`` would show the commands), so the agent's ``kill(-1)`` (stop, before a verifier
# looks) ends every process but it and the agent. Docker's ``--init`` would not do: tini exits,
# and the container with it, when its child dies.
_INIT = "while :; do sleep 2147483647 & wait; done"
# The agent's needs, in sh (the image may have no python): the engine sees the marker the host
# wrote, and commands have a bash.
_SHELL_CHECK = 'test -e "$1" && echo seen; command -v bash >/dev/null 2>&1 && echo bash; :'

log = logging.getLogger(__name__)


def client_env() -> dict[str, str]:
    """The environment of a ``docker`` client process: which engine (``DOCKER_*``), where its
    config lives, PATH for its plugins. Nothing else of ours (no API keys)."""
    env = {k: os.environ[k] for k in _CLIENT_VARS if k in os.environ}
    env.setdefault("DOCKER_CONFIG", os.path.join(os.path.expanduser("~"), ".docker"))
    env["PATH"] = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


async def _docker(*args: str, limit_s: float = 120) -> tuple[int, str]:
    proc = await spawn(
        "docker",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=client_env(),
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"docker {args[0]} timed out after {limit_s}s"
    except BaseException:  # cancelled: the client must not run on unowned
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    return proc.returncode or 0, out.decode(errors="replace")


def _host_identity() -> str:
    """'<boot id>/<pid namespace>': where a pid in an owner label means what it says."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"


def owner_label() -> str:
    pid = os.getpid()
    return f"{_host_identity()}/{pid}/{process_start(pid)}"


def owner_dead(label: str, here: str) -> bool:
    """True only when ``label`` names a process of this boot and pid namespace that is gone (or
    whose pid now belongs to a process that started at another time)."""
    boot_ns, _, rest = label.rpartition("/")  # rest: start
    where, _, pid = boot_ns.rpartition("/")
    if where != here or not pid.isdigit():
        return False  # another machine's, another boot's or unreadable: not ours to judge
    return str(process_start(int(pid))) != rest


def _container_cgroup(host_pid: int) -> dict[str, Path]:
    """The container's own v1 ``pids`` and ``memory`` cgroups on the host (from its init's
    /proc/PID/cgroup); empty where the host has no such controller mounted."""
    dirs: dict[str, Path] = {}
    try:
        lines = Path(f"/proc/{host_pid}/cgroup").read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in ("pids", "memory"):
            if controller in controllers.split(","):
                where = CGROUP_ROOT / controller / path.lstrip("/")
                if (where / "cgroup.procs").exists():
                    dirs[controller] = where
    return dirs


class DockerSandboxFactory(ProcessSandboxFactory):
    """Sandboxes in Docker containers; ``image`` per create overrides ``config.docker_image``.

    Never reused (``supports_reuse`` stays False): a rollout's container is removed at close and
    the next rollout gets a new one, so nothing a rollout did to the image's file system survives.
    """

    kind = "docker"
    static_agent = True  # the image's C library (if it has one) is not the host's

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config)
        self._images_checked: set[str] = set()

    async def _probe(self) -> str:
        if shutil.which("docker") is None:
            return "the docker CLI is not installed; install Docker or choose `--sandbox bwrap`"
        code, out = await _docker("info", "--format", "{{.ServerVersion}}", limit_s=30)
        if code != 0:
            return (
                f"no Docker engine is reachable (`docker info` failed: {out.strip()[-300:]}); "
                "start the engine (DOCKER_HOST names which) or choose `--sandbox bwrap`"
            )
        await self.sweep()
        return ""

    async def sweep(self) -> int:
        """Remove the containers whose owner process is dead (a run killed with ``kill -9``
        cannot remove its own); returns how many. Containers of live processes, of another
        machine or boot, or without our label are never touched."""
        code, out = await _docker(
            "ps", "-a", "--filter", f"label={OWNER_LABEL}",
            "--format", f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}',
            limit_s=60,
        )  # fmt: skip
        if code != 0:
            log.warning("cannot list leftover sandbox containers: %s", out.strip()[-300:])
            return 0
        here = _host_identity()
        stale = [
            cid
            for cid, _, label in (line.partition(" ") for line in out.splitlines())
            if owner_dead(label, here)
        ]
        if stale:
            await _docker("rm", "-f", *stale, limit_s=120)
            log.info("removed %d sandbox containers left by dead trajforge processes", len(stale))
        return len(stale)

    def _disk(self) -> tuple[int, int] | None:
        """As under bwrap: /workspace and /tmp on one size-limited tmpfs when we may mount one."""
        limits = self.config.limits
        if limits.disk_mb is None:
            return None
        if os.geteuid() != 0:
            self._disk_not_enforced("trajforge does not run as root")
            return None
        return limits.disk_mb, limits.disk_inodes

    async def _launch(self, task_id: str, layout: Layout, cgroup: SandboxCgroup, image: str | None) -> Launch:
        image = image or self.config.docker_image
        name = f"trajforge-{uuid.uuid4().hex[:16]}"
        limits = self.config.limits
        # The container's cgroup is the sandbox's: the one the factory made would stay empty.
        await asyncio.to_thread(cgroup.remove)
        run = _docker(
            "run", "-d", "--pull", "never",
            "--name", name, "--label", f"{OWNER_LABEL}={owner_label()}",
            "--hostname", "sandbox",
            *([] if self.config.network else ["--network", "none"]),
            "--pids-limit", str(limits.max_processes),
            "--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m",
            "--cap-drop", "ALL", *(arg for cap in _CAPS for arg in ("--cap-add", cap)),
            "--security-opt", "no-new-privileges",
            "--log-driver", "none",
            "-v", f"{layout.work}:{INSIDE_WORKDIR}",
            "-v", f"{layout.tmp}:{INSIDE_SCRATCH}",
            "-v", f"{layout.shm}:{INSIDE_SHM}",  # in the disk cap with /tmp, not the engine's own shm
            "-v", f"{layout.agent}:{INSIDE_AGENT}:ro",
            *(arg for path in self.config.ro_binds for arg in ("-v", f"{path}:{path}:ro")),
            "-w", INSIDE_WORKDIR,
            "--entrypoint", "/bin/sh",
            image,
            "-c", _INIT,
        )  # fmt: skip
        try:
            code, out = await run
        except BaseException:  # cancelled: the engine may still create it
            with contextlib.suppress(Exception):
                await _docker("rm", "-f", name, limit_s=60)
            raise
        if code != 0:  # a container created but not started (or timed out) is removed too
            await _docker("rm", "-f", name, limit_s=60)
            hint = (
                " (the image is not on this engine: build it, or `docker pull` it where a registry is "
                "reachable; trajforge never pulls)"
                if "No such image" in out
                else ""
            )
            raise SandboxUnavailableError(f"docker run {image} failed: {out.strip()[-500:]}{hint}")

        async def teardown() -> None:
            if os.geteuid() != 0:  # the commands' files are root's: give them back before removal
                await _docker(
                    "exec", name, "chown", "-R", f"{os.getuid()}:{os.getgid()}", INSIDE_WORKDIR, INSIDE_SCRATCH, INSIDE_SHM,
                    limit_s=60,
                )  # fmt: skip
            await _docker("rm", "-f", name, limit_s=60)

        try:
            code, out = await _docker("inspect", "--format", "{{.State.Pid}}", name, limit_s=30)
            # Adopted only as root: the host side kills through it at close (as it does under bwrap),
            # which another uid may not do to the container's root-owned processes.
            if code == 0 and out.strip().isdigit() and os.geteuid() == 0:
                cgroup.dirs.update(_container_cgroup(int(out.strip())))
            if image not in self._images_checked:
                await self._check_image(image, name, layout)
                self._images_checked.add(image)
        except BaseException:
            cgroup.dirs.clear()  # the container's: docker removes them with it
            with contextlib.suppress(Exception):
                await teardown()
            raise

        env = command_env(self.config, INSIDE_WORKDIR, INSIDE_SCRATCH)
        env |= limit_env(self.config, cgroup, nproc_effective=False)  # all commands are root here
        client = client_env()
        # The commands' variables reach the container by name (``-e NAME``): the client reads the
        # values from its own environment, so no value is ever on a command line. A name the
        # client itself reads (DOCKER_*) is passed with its value instead.
        env_args = [arg for k, v in env.items() for arg in ("-e", f"{k}={v}" if k in client else k)]
        argv = [
            "docker", "exec", "-i", "-w", INSIDE_WORKDIR, *env_args, name,
            INSIDE_AGENT, INSIDE_WORKDIR, INSIDE_SCRATCH,
            "--state-dir", INSIDE_SESSION, "--max-procs", str(limits.max_processes),
        ]  # fmt: skip
        return Launch(
            argv=argv,
            workdir=INSIDE_WORKDIR,
            scratch_dir=INSIDE_SCRATCH,
            env={**env, **client},
            teardown=teardown,
        )

    async def _check_image(self, image: str, name: str, layout: Layout) -> None:
        """Once per image: it has the bash the agent runs commands with, and the engine sees the
        sandbox's host directories (a remote engine, or one in another mount namespace, would
        bind-mount different, empty ones)."""
        marker = f".trajforge-probe-{secrets.token_hex(8)}"
        await asyncio.to_thread((layout.tmp / marker).write_bytes, b"")
        check = ["/bin/sh", "-c", _SHELL_CHECK, "sh"]
        try:
            code, out = await _docker("exec", name, *check, f"{INSIDE_SCRATCH}/{marker}", limit_s=60)
        finally:
            await asyncio.to_thread((layout.tmp / marker).unlink, True)
        if "bash" not in out.split():
            raise SandboxUnavailableError(
                f"image {image} has no bash, which the exec agent runs commands with "
                f"({out.strip()[-300:] or f'exit {code}'}): install bash in the image"
            )
        if "seen" not in out.split():
            raise SandboxUnavailableError(
                "the Docker engine does not see this machine's sandbox directories (a remote engine, "
                "or one in another mount namespace): the docker backend needs a local engine"
            )
