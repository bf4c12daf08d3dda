"""What an episode keeps of its sandbox for ``env rescore``: the final workdir files.

``snapshot`` (taken by the verifier before the sandbox goes away) stores regular files,
base64-encoded, up to a size budget; ``KeptFiles`` reads them back with the ``read_bytes`` of a
sandbox, so a checker written against a sandbox rescores a stored episode unchanged.

The budget holds whatever the rollout does: the sizes ``find`` lists only choose what to try, and
each file is then read with what is left of the budget as its limit (checked on the opened file),
so a file that grows, or is swapped for a larger one, after the listing is left out (``omitted``),
never read whole.
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajforge.envs.verifier import VerifierContext

KEPT_FILES = "files_b64"


async def snapshot(ctx: VerifierContext, *, max_bytes: int = 1 << 20, max_files: int = 256) -> dict[str, Any]:
    """The workdir's regular files (largest last dropped first when over budget), and what was
    left out: ``{"files_b64": {path: data}, "omitted": [paths]}``."""
    res = await ctx.exec(["find", ".", "-type", "f", "-printf", "%s %P\\0"])
    entries: list[tuple[int, str]] = []
    for raw in filter(None, res.stdout.split(b"\0")):
        size_text, _, raw_name = raw.partition(b" ")
        entries.append((int(size_text), os.fsdecode(raw_name)))
    entries.sort()
    files: dict[str, str] = {}
    omitted: list[str] = []
    budget = max_bytes
    for size, name in entries:
        if len(files) >= max_files or size > budget:
            omitted.append(name)
            continue
        try:
            data = await ctx.read_file(name, max_bytes=budget)
        except OSError:  # gone, not a file, or over what is left of the budget (FileTooLargeError)
            omitted.append(name)
            continue
        budget -= len(data)
        files[name] = base64.b64encode(data).decode()
    return {KEPT_FILES: files, "omitted": omitted}


class KeptFiles:
    """A read-only stand-in for the finished sandbox, serving the snapshot's files."""

    def __init__(self, kept: dict[str, Any], workdir: str = "/work") -> None:
        self._files = {k: base64.b64decode(v) for k, v in (kept.get(KEPT_FILES) or {}).items()}
        self._omitted = set(kept.get("omitted") or ())
        self.workdir = workdir
        self.task_id = "rescore"

    async def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        rel = path[len(self.workdir) + 1 :] if path.startswith(self.workdir + "/") else path
        rel = rel.removeprefix("./")
        if rel in self._omitted:
            raise LookupError(f"{rel} was too large to keep: this episode cannot be rescored offline")
        try:
            data = self._files[rel]
        except KeyError:
            raise FileNotFoundError(rel) from None
        return data if limit is None else data[:limit]
