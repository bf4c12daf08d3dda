"""Driving the exec agent (exec_agent.c) over its protocol outside any sandbox: the specification
tests (test_native_agent.py), the sanitized build's (test_agent_sanitized.py) and the spawn tests
(test_sandbox_spawn.py) share it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "TF_LIMIT_FSIZE_KB": "1048576",
    "TF_LIMIT_CPU_S": "60",
}
# The agent's notes (agent_scripts.py), as its answers carry them: apart from the output.
ENDED = "the shell ended (status {}); the next command runs in a new shell with the session as it was before this command"
RESTARTED = "the shell was restarted: the next command runs with the session as it was before this command"


def drive(
    argv: list[str],
    root: Path,
    requests: list[dict[str, Any] | str],
    env: dict[str, str] | None = None,
    owner: int | None = None,
) -> list[dict[str, Any]]:
    """Run one agent on fresh ``root/work`` and ``root/tmp`` (owned by ``owner`` when given); its
    answers (greeting first), without timings and pids, and errors cut to their kind. The agent
    must end with status 0 and write nothing on stderr (no sanitizer report either)."""
    if root.exists():
        shutil.rmtree(root)
    (root / "work").mkdir(parents=True)
    (root / "tmp").mkdir()
    if owner is not None:
        for path in (root / "work", root / "tmp"):
            os.chown(path, owner, owner)
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    done = subprocess.run(
        [*argv, str(root / "work"), str(root / "tmp")],
        input=lines.encode(),
        capture_output=True,
        env=env or ENV,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stderr == b"", done.stderr.decode(errors="replace")  # no sanitizer report either
    answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
    for answer in answers:
        answer.pop("duration_s", None)
        answer.pop("pid", None)
        if "error" in answer:  # the host's reason to discard the sandbox, never the model's text
            answer["error"] = answer["error"].split(":", 1)[0]
    return answers


def write_program(directory: Path, name: str, data: bytes) -> Path:
    """``data`` (a compiled program: the agent, a test's launcher) as an executable ``directory/name``."""
    path = directory / name
    path.write_bytes(data)
    path.chmod(0o755)
    return path


def ran(
    n: int, output: str, exit_code: int | None = 0, notes: tuple[str, ...] = (), **flags: Any
) -> dict[str, Any]:
    """The answer to exec ``n``: ``output_bytes`` is the output's length unless given; ``notes``
    the agent's own words about it, never in ``output``."""
    return {
        "id": n,
        "exit_code": exit_code,
        "output": output,
        "notes": list(notes),
        "timed_out": flags.get("timed_out", False),
        "truncated": flags.get("truncated", False),
        "output_bytes": flags.get("output_bytes", len(output.encode())),
    }


def exec_request(n: int, command: str, **extra: Any) -> dict[str, Any]:
    return {"id": n, "op": "exec", "command": command, "timeout": 10, "cwd": None, "cap": 1000, **extra}
