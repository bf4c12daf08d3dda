"""What a backend decides: how the exec agent is launched (argv, inside paths, environment,
teardown) and the environment and limits every command starts with."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from trajforge.sandbox.cgroup import SandboxCgroup
from trajforge.sandbox.types import SandboxConfig


@dataclass
class Launch:
    """How a backend runs the agent: its argv and the inside paths of workdir and scratch dir."""

    argv: list[str]
    workdir: str
    scratch_dir: str
    env: dict[str, str] | None = None
    teardown: Callable[[], Awaitable[None]] | None = None
    owner: tuple[int, int] | None = None  # uid/gid that must own files the host writes
    pass_fds: tuple[int, ...] = ()  # fds the launcher refers to (kept open while it runs)
    started: Callable[[], None] | None = None  # called once the agent runs (fds no longer needed)


def command_env(config: SandboxConfig, workdir: str, scratch: str) -> dict[str, str]:
    """The environment commands start with: minimal and explicit, never the host's (no secrets)."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": workdir,
        # bash looks the user up (NSS: nscd sockets, nsswitch.conf, libnss_systemd for a uid not in
        # /etc/passwd) for every variable of these two that is unset: ~0.9 ms per shell start.
        "SHELL": "/bin/bash",
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(config.env)
    return env


def nproc_counted_per_namespace(release: str | None = None) -> bool:
    """Whether this kernel counts RLIMIT_NPROC per user namespace (Linux 5.14 and later: a uid's
    processes are counted in each namespace they live in, and a limit set inside one caps them
    there). An unprivileged sandbox is a user namespace of its own, so there the limit caps that
    sandbox alone; before 5.14 it would count every process of the user on the host."""
    found = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (5, 14)


def limit_env(config: SandboxConfig, cgroup: SandboxCgroup, *, nproc_effective: bool) -> dict[str, str]:
    """rlimits the agent applies (with ``ulimit``) before each command.

    The address-space cap is only a fallback for a missing memory cgroup: it breaks programs that
    reserve large virtual ranges (JVMs, Go), and the cgroup caps the real thing for all processes.
    """
    limits = config.limits
    env = {
        "TF_LIMIT_FSIZE_KB": str(limits.file_size_mb * 1024),
        "TF_LIMIT_CPU_S": str(limits.cpu_seconds),
    }
    if not cgroup.limits_memory:
        env["TF_LIMIT_AS_KB"] = str(limits.memory_mb * 1024)
    if not cgroup.limits_pids and nproc_effective:
        env["TF_LIMIT_NPROC"] = str(limits.max_processes)
    return env
