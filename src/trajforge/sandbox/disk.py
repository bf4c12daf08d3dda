"""A total disk cap per sandbox: its workdir and scratch dir live on one size-limited tmpfs.

Per-file limits (RLIMIT_FSIZE) stop one huge file, not a thousand 1 GiB ones; a rollout could fill
the host's disk. So where we may mount (root with CAP_SYS_ADMIN, as in most containers and CI) each
sandbox's ``work`` and ``tmp`` directories sit on their own tmpfs of ``disk_mb`` megabytes and a
bounded number of inodes: a command that exceeds it gets ENOSPC, the host disk never fills. Pages of
a tmpfs are charged to the memory cgroup of the process that writes them, so a sandbox's files and
its memory share the sandbox's memory limit as well. Without the privilege to mount, the cap cannot
be enforced; the factory says so once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from pathlib import Path

DISK_DIR = "disk"
_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_MNT_DETACH = 0x2
_libc = ctypes.CDLL(None, use_errno=True)


def mount_disk(root: Path, size_mb: int, inodes: int) -> Path | None:
    """Mount a tmpfs of ``size_mb`` MiB at ``root/disk``; None when this process may not mount."""
    target = root / DISK_DIR
    target.mkdir(mode=0o711)
    options = f"size={size_mb}m,nr_inodes={inodes},mode=0711".encode()
    if _libc.mount(b"tmpfs", bytes(target), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        target.rmdir()
        return None
    return target


def unmount_disk(root: Path) -> None:
    target = root / DISK_DIR
    if os.path.ismount(target):
        _libc.umount2(bytes(target), _MNT_DETACH)


def unmount_overlay(root: Path) -> None:
    """A forked sandbox's workdir is an overlay mount (``sandbox.templates``), on its tmpfs or not."""
    for work in (root / DISK_DIR / "work", root / "work"):
        if os.path.ismount(work):
            _libc.umount2(bytes(work), _MNT_DETACH)


def remove_tree(root: Path) -> None:
    """Remove a sandbox directory, its mounts first (never a recursive delete across a mount:
    a forked sandbox's overlay would reach into its template)."""
    with contextlib.suppress(OSError):
        unmount_overlay(root)
        unmount_disk(root)
    shutil.rmtree(root, True)
