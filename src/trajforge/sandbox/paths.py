"""Confining host-side file access to a sandbox's working directory.

Reward code and file tools read and write through the host (no exec round trip, no output cap),
so the path a model names must never let them touch anything outside the sandbox. Symlinks are
resolved by hand *as the sandbox sees them*: an absolute link target is an inside path (e.g.
``/workspace/a``) and is mapped back to the host directory; anything leaving it is refused.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

_MAX_LINKS = 40


@dataclass(frozen=True)
class PathMap:
    """Maps the working directory between the sandbox's view (``inside``) and the host (``host``)."""

    inside: str
    host: str

    def resolve(self, path: str) -> str:
        """Host path for ``path`` (relative to the workdir, or absolute inside it).

        Raises ``PermissionError`` when the path, or any symlink on the way, leaves the workdir.
        The final component may not exist yet (for writes); its parents are resolved.
        """
        if "\0" in path:
            raise PermissionError(f"path contains a NUL byte: {path!r}")
        parts = self._relative_parts(path, path)
        resolved: list[str] = []
        links = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not resolved:
                    raise PermissionError(f"path escapes the sandbox working directory: {path!r}")
                resolved.pop()
                continue
            host = os.path.join(self.host, *resolved, part)
            if os.path.islink(host):
                links += 1
                if links > _MAX_LINKS:
                    raise PermissionError(f"too many symlinks resolving {path!r}")
                target = os.readlink(host)
                if posixpath.isabs(target):
                    resolved = []
                    parts = self._relative_parts(target, path) + parts
                else:
                    parts = target.split("/") + parts
                continue
            resolved.append(part)
        return os.path.join(self.host, *resolved)

    def _relative_parts(self, path: str, original: str) -> list[str]:
        if not posixpath.isabs(path):
            return path.split("/")
        norm = posixpath.normpath(path)
        inside = self.inside.rstrip("/") or "/"
        if norm == inside:
            return []
        if not norm.startswith(inside + "/"):
            raise PermissionError(
                f"path is outside the sandbox working directory {self.inside}: {original!r}"
            )
        # Keep the un-normalised remainder so '..' after a symlink is applied in order.
        return (
            path[len(inside) + 1 :].split("/")
            if path.startswith(inside + "/")
            else (norm[len(inside) + 1 :].split("/"))
        )
