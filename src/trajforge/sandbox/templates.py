"""Forkable sandboxes: prepare a starting state once, start many sandboxes from it cheaply.

A GRPO group runs G rollouts of one task from one starting state; a task whose start is expensive
(a repository with its dependencies installed, a database loaded) was built G times. A
:class:`SandboxTemplate` is that state prepared once -- a sandbox built, its setup run, its
processes stopped, its workdir frozen -- and every sandbox started from it (a *child*) gets the
template's files as its own:

- **overlay** (root, where the kernel mounts overlayfs): the child's workdir is an overlay mount
  whose lower layer is the template's frozen workdir, shared read-only by every child, and whose
  upper layer is the child's own (on its size-capped tmpfs when ``disk_mb`` is set). A write,
  ``chmod`` or delete copies up or whites out in the child's upper layer only: the template and
  the siblings never see it. A fork costs a mount, not a copy; the template's pages are shared.
- **copy** otherwise (no privilege to mount): the template's files are copied into the child's
  workdir (``cp -a --reflink=auto``: a reflink where the file system has them).

Children of a template run as the template's uid (as root, every other sandbox has a uid of its
own): the files must stay theirs. Siblings are otherwise apart (pid, IPC, network and mount
namespaces, their own layers and cgroups); what the kernel keeps per uid across namespaces is
closed or bounded: the key-management system calls are refused by a seccomp filter in every
sandbox of a template (the user keyring is per uid), processes are counted by each sandbox's own
pids cgroup. A child is never reused for another rollout: its upper layer is discarded with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import posixpath
import struct
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trajforge.sandbox.disk import remove_tree

_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_libc = ctypes.CDLL(None, use_errno=True)
UPPER, OVERLAY_WORK = "upper", "ovwork"


@dataclass
class SandboxTemplate:
    """A prepared starting state: ``lower`` is the frozen workdir, kept under ``root`` (the
    template sandbox's own directory) until the factory drops the template."""

    key: str
    root: Path
    lower: Path
    owner: tuple[int, int] | None
    overlay: bool
    children: int = 0  # sandboxes started from it and not yet destroyed
    removed: bool = False  # dropped by its factory (evicted, or the factory closed)


class TemplateGone(ValueError):
    """``create(template=...)`` with a template its factory has dropped: ask for it again."""


class TemplateSetup(Protocol):
    async def __call__(self, sandbox: Any) -> None: ...


# -- overlay --------------------------------------------------------------------------------------


def can_overlay() -> bool:
    """Whether this process may mount an overlay (root, overlayfs known to the kernel)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1:] == ["overlay"] for line in f)
    except OSError:
        return False


def _safe_option_path(path: Path) -> bool:
    return not any(c in str(path) for c in ",:\\\n")


def mount_overlay(lower: Path, work: Path, owner: tuple[int, int] | None) -> bool:
    """Mount ``lower`` + a fresh upper layer (next to ``work``, on the same file system) at ``work``;
    False when it cannot be mounted here (the caller copies instead)."""
    base = work.parent
    upper, ovwork = base / UPPER, base / OVERLAY_WORK
    if not all(_safe_option_path(p) for p in (lower, upper, ovwork)):
        return False
    upper.mkdir(mode=0o755)
    ovwork.mkdir(mode=0o700)
    st = os.lstat(lower)
    os.chmod(upper, st.st_mode & 0o7777)
    if owner is not None:
        os.chown(upper, *owner)
    options = f"lowerdir={lower},upperdir={upper},workdir={ovwork},redirect_dir=off,index=off,metacopy=off"
    if _libc.mount(b"overlay", bytes(work), b"overlay", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
        upper.rmdir()
        ovwork.rmdir()
        return False
    return True


def copy_tree(lower: Path, work: Path) -> None:
    """The fallback fork: the template's files copied into the child's workdir, at C speed."""
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", f"{lower}/.", f"{work}/"], capture_output=True, timeout=600, env={}
    )
    if done.returncode != 0:
        raise OSError(
            f"copying the template into the sandbox failed: {done.stderr[-300:].decode(errors='replace')}"
        )


# -- seccomp: no kernel keys where sandboxes share a uid -------------------------------------------

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_KEY_SYSCALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}  # add_key, request_key, keyctl
_X32_BIT = 0x40000000
_LD_ABS_W, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM = 1


def key_filter() -> bytes | None:
    """A classic-BPF seccomp program refusing add_key/request_key/keyctl with EPERM (and, on x86_64,
    any x32 system call and any foreign-architecture one, whose numbers differ); None on an
    architecture it does not know. Programs see what Docker's default profile gives them."""
    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    deny = _RET_ERRNO | _EPERM
    add_key, request_key, keyctl = _KEY_SYSCALLS[machine]
    prog = [
        (_LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),
        (_RET_K, 0, 0, deny),  # another ABI (i386 on x86_64): its own numbers, refused whole
        (_LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
        (_JGE_K, 3, 0, _X32_BIT) if machine == "x86_64" else (_JEQ_K, 3, 0, add_key),
        (_JEQ_K, 2, 0, add_key),
        (_JEQ_K, 1, 0, request_key),
        (_JEQ_K, 0, 1, keyctl),
        (_RET_K, 0, 0, deny),
        (_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def filter_fd(program: bytes) -> int:
    """An fd bwrap reads the seccomp program from (``--seccomp FD``); the caller closes it."""
    with tempfile.TemporaryFile() as f:
        f.write(program)
        f.flush()
        fd = os.dup(f.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# -- a factory that forks from a template per shared starting directory ---------------------------


class _Forking(Protocol):
    async def template(
        self, key: str, *, cwd: str | None = None, setup: Callable[[Any], Awaitable[None]] | None = None
    ) -> SandboxTemplate: ...

    async def create(
        self,
        task_id: str,
        *,
        image: str | None = None,
        cwd: str | None = None,
        template: SandboxTemplate | None = None,
    ) -> Any: ...


@dataclass
class ForkingFactory:
    """Wraps a factory so that sandboxes asked for with the same ``cwd`` (the samples of one
    prompt: ``batch --group-size``) fork from one template of that directory instead of
    copying it each time. Everything else goes to the inner factory unchanged."""

    inner: Any

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Any:
        if cwd is None or image is not None or not supports_templates(self.inner):
            return await self.inner.create(task_id, image=image, cwd=cwd)
        key = f"cwd:{posixpath.normpath(cwd)}"  # a string operation: no file system look-up
        while True:
            template = await self.inner.template(key, cwd=cwd)
            with contextlib.suppress(TemplateGone):  # evicted in between: made again
                return await self.inner.create(task_id, template=template)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def supports_templates(factory: object) -> bool:
    """Whether ``factory`` can fork sandboxes from templates (the process factories can)."""
    return callable(getattr(factory, "template", None)) and bool(getattr(factory, "forks", False))


def remove_template(template: SandboxTemplate) -> None:
    """Drop a template's files (its children are gone: their overlays no longer reference them)."""
    remove_tree(template.root)
