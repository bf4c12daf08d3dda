"""The terminal toolset: ``terminal`` (foreground or background commands) and ``process``.

Commands run in the rollout's own sandbox session, one resident ``bash``, so everything a terminal
keeps carries over between calls: the cwd, variables, functions, aliases, options and a
``source``d virtualenv. Background commands are started in their own session (``setsid``) so the per-command
process-group kill of the sandbox does not reach them; their output and exit status go to files
in the sandbox's private scratch directory, and ``process`` reads those files back.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Any

import orjson

from trajforge.sandbox.types import ExecResult
from trajforge.tools._args import (
    ArgumentError,
    Bounded,
    bounded_int,
    bounded_seconds,
    opt_bool,
    opt_str,
    req_str,
)
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput

_STATE_KEY = "background_processes"


@dataclass
class BackgroundProcess:
    id: str
    pid: int
    command: str
    log: str
    rc_file: str
    started: float


def _processes(ctx: ToolContext) -> dict[str, BackgroundProcess]:
    procs: dict[str, BackgroundProcess] = ctx.state.setdefault(_STATE_KEY, {})
    return procs


def _result_text(res: ExecResult, **extra: Any) -> str:
    # The model reads the sandbox's notes (the shell ended, the process limit) after the output,
    # as it always has; they travel apart from it (``ExecResult.notes``).
    payload: dict[str, Any] = {"output": res.shown, "exit_code": res.exit_code}
    if res.timed_out:
        payload["error"] = "command timed out and was killed (with its child processes)"
    if res.truncated:
        payload["truncated"] = f"output was {res.output_bytes} bytes; head and tail kept"
    payload.update(extra)
    return orjson.dumps(payload).decode()


def _scratch(ctx: ToolContext) -> str:
    return getattr(ctx.ready_sandbox, "scratch_dir", "/tmp")


def _clamped(*bounds: Bounded | None) -> dict[str, str]:
    """The ``clamped`` note of a result: which model-set values were lowered to their maximum."""
    notes = [b.clamped for b in bounds if b is not None and b.clamped]
    return {"clamped": "; ".join(notes)} if notes else {}


async def _terminal(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    try:
        command = req_str(args, "command")
        # 1e9 s would outlive the rollout and NaN would time out at once: bounded, see ToolLimits.
        timeout = bounded_seconds(args, "timeout", maximum=ctx.limits.max_command_timeout_s)
        background = opt_bool(args, "background")
    except ArgumentError as exc:
        return ToolOutput.failure(str(exc))
    if not command.strip():
        return ToolOutput.failure("argument 'command' is empty")
    if background:
        return await _start_background(command, ctx)
    res = await ctx.ready_sandbox.exec(command, timeout=timeout.value if timeout is not None else None)
    if res.timed_out:
        return ToolOutput(content=_result_text(res, **_clamped(timeout)), ok=False, error="timeout")
    return ToolOutput(content=_result_text(res, **_clamped(timeout)))


async def _start_background(command: str, ctx: ToolContext) -> ToolOutput:
    procs = _processes(ctx)
    proc_id = f"bg{len(procs) + 1}"
    base = f"{_scratch(ctx)}/trajforge-bg"
    log, rc_file = f"{base}/{proc_id}.log", f"{base}/{proc_id}.rc"
    inner = f"( {command} ) > {shlex.quote(log)} 2>&1; echo $? > {shlex.quote(rc_file)}"
    launcher = (
        f"mkdir -p {shlex.quote(base)} && "
        f"nohup setsid sh -c {shlex.quote(inner)} > /dev/null 2>&1 < /dev/null & echo $!"
    )
    res = await ctx.ready_sandbox.exec(launcher, timeout=30)
    try:
        pid = int(res.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ToolOutput.failure(f"could not start background command: {res.shown.strip()[:500]}")
    procs[proc_id] = BackgroundProcess(proc_id, pid, command, log, rc_file, time.time())
    body = {
        "id": proc_id,
        "pid": pid,
        "status": "running",
        "hint": "use the process tool to poll/read/wait/kill",
    }
    return ToolOutput(content=orjson.dumps(body).decode())


async def _status(proc: BackgroundProcess, ctx: ToolContext) -> dict[str, Any]:
    res = await ctx.ready_sandbox.exec(f"cat {shlex.quote(proc.rc_file)} 2>/dev/null", timeout=10)
    text = res.output.strip()
    if text.lstrip("-").isdigit():
        return {"id": proc.id, "status": "exited", "exit_code": int(text), "command": proc.command}
    return {"id": proc.id, "status": "running", "pid": proc.pid, "command": proc.command}


async def _process(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    try:
        action = req_str(args, "action")
        proc_id = opt_str(args, "id")
        limits = ctx.limits
        wait = bounded_seconds(args, "timeout", maximum=limits.max_command_timeout_s)
        tail_bound = bounded_int(args, "tail_bytes", default=8000, maximum=limits.max_tail_bytes)
    except ArgumentError as exc:
        return ToolOutput.failure(str(exc))
    timeout = wait.value if wait is not None else min(30.0, limits.max_command_timeout_s)
    assert tail_bound is not None
    tail = int(tail_bound.value)
    clamped = _clamped(wait, tail_bound)
    procs = _processes(ctx)
    if action == "list":
        items = [await _status(p, ctx) for p in procs.values()]
        return ToolOutput(content=orjson.dumps({"processes": items}).decode())
    if action not in {"poll", "read", "wait", "kill"}:
        return ToolOutput.failure(f"unknown action {action!r}; use one of list, poll, read, wait, kill")
    if proc_id is None or proc_id not in procs:
        known = ", ".join(procs) or "none"
        return ToolOutput.failure(f"unknown process id {proc_id!r}; running/known ids: {known}")
    proc = procs[proc_id]
    if action == "poll":
        return ToolOutput(content=orjson.dumps(await _status(proc, ctx)).decode())
    if action == "read":
        res = await ctx.ready_sandbox.exec(f"tail -c {tail} {shlex.quote(proc.log)} 2>/dev/null", timeout=10)
        status = await _status(proc, ctx)
        return ToolOutput(content=_result_text(res, **status, **clamped))
    if action == "wait":
        script = (
            f"while [ ! -s {shlex.quote(proc.rc_file)} ]; do sleep 0.1; done; "
            f"tail -c {tail} {shlex.quote(proc.log)}"
        )
        res = await ctx.ready_sandbox.exec(script, timeout=timeout)
        status = await _status(proc, ctx)
        if res.timed_out:
            status["note"] = f"still running after waiting {timeout:g}s"
        return ToolOutput(content=_result_text(res, **status, **clamped))
    res = await ctx.ready_sandbox.exec(
        f"kill -TERM -- -{proc.pid} 2>/dev/null; sleep 0.2; kill -KILL -- -{proc.pid} 2>/dev/null; "
        f"[ -s {shlex.quote(proc.rc_file)} ] || echo 137 > {shlex.quote(proc.rc_file)}; echo killed",
        timeout=10,
    )
    return ToolOutput(content=orjson.dumps({"id": proc.id, "status": "killed"}).decode())


TERMINAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "Shell command to run (bash)."},
        "timeout": {"type": "number", "description": "Seconds before the command is killed."},
        "background": {
            "type": "boolean",
            "description": "Run in the background and return an id for the process tool.",
        },
    },
    "required": ["command"],
}

PROCESS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["list", "poll", "read", "wait", "kill"]},
        "id": {"type": "string", "description": "Background process id (from terminal)."},
        "timeout": {"type": "number", "description": "Seconds to wait (action=wait)."},
        "tail_bytes": {"type": "integer", "description": "How much of the output to return."},
    },
    "required": ["action"],
}


def terminal_tools() -> list[FunctionTool]:
    return [
        FunctionTool(
            name="terminal",
            toolset="terminal",
            description=(
                "Run a shell command in your sandboxed working directory and get its output and exit code. "
                "The session persists like a terminal's: cd, variables, functions, aliases and shell options "
                "carry over."
            ),
            parameters=TERMINAL_SCHEMA,
            handler=_terminal,
            parallel_safe=False,
        ),
        FunctionTool(
            name="process",
            toolset="terminal",
            description="Manage background commands started with terminal(background=true).",
            parameters=PROCESS_SCHEMA,
            handler=_process,
            parallel_safe=False,
        ),
    ]
