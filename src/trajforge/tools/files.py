"""The file toolset: ``read_file``, ``write_file``, ``patch`` and ``search_files``.

All of them go through the rollout's sandbox (``read_bytes``/``write_bytes`` are confined to the
sandbox working directory; ``search_files`` runs grep inside the sandbox), so a model can never
touch a file outside its own task directory.
"""

from __future__ import annotations

import shlex
from typing import Any

import orjson

from trajforge.tools._args import ArgumentError, bounded_int, opt_bool, opt_str, req_str
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput

MAX_READ_CHARS = 100_000
# The most the host loads for one model-facing read (read_file, patch): the model chooses the file,
# and a sandbox may hold a 1 GiB one; 64 concurrent rollouts must not make the host load 64 GiB.
MAX_LOAD_BYTES = 32 * 1024 * 1024


def _file_error(path: str, exc: Exception) -> ToolOutput:
    if isinstance(exc, FileNotFoundError):
        return ToolOutput.failure(f"file not found: {path}")
    if isinstance(exc, IsADirectoryError):
        return ToolOutput.failure(f"{path} is a directory; use terminal `ls` to list it")
    if isinstance(exc, PermissionError):
        return ToolOutput.failure(f"permission denied: {path} (only your working directory is accessible)")
    return ToolOutput.failure(f"{type(exc).__name__} on {path}: {exc}")


async def _read_file(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    try:
        path = req_str(args, "path")
        # 0 is read as 1 (models often count from 0); an offset past the end reads nothing.
        first = bounded_int(args, "offset", default=1, minimum=0, maximum=None)
        bound = bounded_int(args, "limit", default=None, maximum=ctx.limits.max_read_lines)
    except ArgumentError as exc:
        return ToolOutput.failure(str(exc))
    assert first is not None
    offset = int(first.value)
    limit = None if bound is None else int(bound.value)
    try:
        data = await ctx.ready_sandbox.read_bytes(path, MAX_LOAD_BYTES + 1)
    except OSError as exc:
        return _file_error(path, exc)
    if b"\x00" in data[:8192]:
        return ToolOutput(content=f"{path} is a binary file ({len(data)} bytes); not shown")
    cut = len(data) > MAX_LOAD_BYTES
    if cut:  # the lines shown come from the first MAX_LOAD_BYTES; the model is told
        data = data[:MAX_LOAD_BYTES]
    lines = data.decode("utf-8", errors="replace").splitlines()
    start = max(offset, 1) - 1
    end = len(lines) if limit is None else start + limit
    shown = lines[start:end]
    text = "\n".join(shown)
    note = f"\n[{bound.clamped}]" if bound is not None and bound.clamped else ""
    if len(text) > MAX_READ_CHARS:
        text = text[:MAX_READ_CHARS]
        note += f"\n[truncated at {MAX_READ_CHARS} characters; use offset/limit to read further]"
    elif end < len(lines):
        note += f"\n[{len(lines) - end} more lines; use offset={end + 1} to continue]"
    if cut and end >= len(lines):
        note += f"\n[only the first {MAX_LOAD_BYTES} bytes of this file can be read; use terminal tools]"
    return ToolOutput(content=text + note)


async def _write_bytes(ctx: ToolContext, path: str, data: bytes) -> None:
    try:
        await ctx.ready_sandbox.write_bytes(path, data)
    except FileNotFoundError:
        parent = path.rsplit("/", 1)[0] if "/" in path else "."
        await ctx.ready_sandbox.exec(f"mkdir -p -- {shlex.quote(parent)}", timeout=10)
        await ctx.ready_sandbox.write_bytes(path, data)


async def _write_file(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    try:
        path = req_str(args, "path")
        content = req_str(args, "content")
    except ArgumentError as exc:
        return ToolOutput.failure(str(exc))
    data = content.encode()
    try:
        await _write_bytes(ctx, path, data)
    except OSError as exc:
        return _file_error(path, exc)
    return ToolOutput(content=orjson.dumps({"path": path, "bytes_written": len(data)}).decode())


async def _patch(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    try:
        path = req_str(args, "path")
        old = req_str(args, "old_string")
        new = req_str(args, "new_string")
        replace_all = opt_bool(args, "replace_all")
    except ArgumentError as exc:
        return ToolOutput.failure(str(exc))
    if not old:
        return ToolOutput.failure("old_string is empty; give the exact text to replace")
    try:
        raw = await ctx.ready_sandbox.read_bytes(path, MAX_LOAD_BYTES + 1)
        if len(raw) > MAX_LOAD_BYTES:
            return ToolOutput.failure(
                f"{path} is larger than {MAX_LOAD_BYTES} bytes; edit it with terminal tools"
            )
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ToolOutput.failure(f"{path} is not UTF-8 text; patch works on text files only")
    except OSError as exc:
        return _file_error(path, exc)
    count = text.count(old)
    if count == 0:
        return ToolOutput.failure(
            f"old_string not found in {path}; read the file and copy the exact text (whitespace included)"
        )
    if count > 1 and not replace_all:
        return ToolOutput.failure(
            f"old_string occurs {count} times in {path}; add surrounding lines to make it unique "
            "or set replace_all=true"
        )
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    try:
        await ctx.ready_sandbox.write_bytes(path, updated.encode())
    except OSError as exc:
        return _file_error(path, exc)
    return ToolOutput(
        content=orjson.dumps({"path": path, "replacements": count if replace_all else 1}).decode()
    )


async def _search_files(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    try:
        pattern = req_str(args, "pattern")
        path = opt_str(args, "path", ".") or "."
        glob = opt_str(args, "file_glob")
        regex = opt_bool(args, "regex", False)
        most = bounded_int(args, "max_results", default=50, maximum=ctx.limits.max_search_results)
    except ArgumentError as exc:
        return ToolOutput.failure(str(exc))
    assert most is not None
    max_results = int(most.value)
    flags = "-rnI -E" if regex else "-rnI -F"
    include = f" --include={shlex.quote(glob)}" if glob else ""
    # In a subshell: the command runs in the rollout's resident shell, where an ``exit`` ends the
    # shell (as in ``bash -c``), and with it the model's background jobs.
    cmd = (
        f"( grep {flags}{include} -e {shlex.quote(pattern)} -- {shlex.quote(path)} 2>&1 "
        f"| head -n {max_results}; exit ${{PIPESTATUS[0]}} )"
    )
    res = await ctx.ready_sandbox.exec(cmd, timeout=60)
    if res.exit_code == 1:
        return ToolOutput(content=orjson.dumps({"matches": [], "note": "no matches"}).decode())
    if res.exit_code not in (0, None) or res.timed_out:
        return ToolOutput.failure(f"search failed: {res.shown.strip()[:1000]}")
    matches = [line for line in res.output.splitlines() if line]
    body: dict[str, Any] = {"matches": matches, "count": len(matches)}
    if most.clamped:
        body["clamped"] = most.clamped
    return ToolOutput(content=orjson.dumps(body).decode())


def file_tools() -> list[FunctionTool]:
    path = {"type": "string", "description": "Path relative to your working directory."}
    return [
        FunctionTool(
            "read_file",
            "file",
            "Read a text file from your working directory (optionally a range of lines).",
            {
                "type": "object",
                "properties": {
                    "path": path,
                    "offset": {"type": "integer", "description": "First line to read (1-based)."},
                    "limit": {"type": "integer", "description": "Number of lines to read."},
                },
                "required": ["path"],
            },
            _read_file,
        ),
        FunctionTool(
            "write_file",
            "file",
            "Create or overwrite a file with the given content (parent directories are created).",
            {
                "type": "object",
                "properties": {"path": path, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
            _write_file,
            parallel_safe=False,
        ),
        FunctionTool(
            "patch",
            "file",
            "Replace an exact, unique piece of text in a file with new text.",
            {
                "type": "object",
                "properties": {
                    "path": path,
                    "old_string": {"type": "string", "description": "Exact text to find (must be unique)."},
                    "new_string": {"type": "string", "description": "Replacement text."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence."},
                },
                "required": ["path", "old_string", "new_string"],
            },
            _patch,
            parallel_safe=False,
        ),
        FunctionTool(
            "search_files",
            "file",
            "Search file contents under a directory (grep); returns path:line:text matches.",
            {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Text (or regex if regex=true) to find."},
                    "path": {"type": "string", "description": "Directory or file to search (default .)."},
                    "file_glob": {"type": "string", "description": "Only files matching, e.g. *.py"},
                    "regex": {"type": "boolean", "description": "Treat pattern as an extended regex."},
                    "max_results": {"type": "integer", "description": "Cap on matches (default 50)."},
                },
                "required": ["pattern"],
            },
            _search_files,
        ),
    ]
