"""The supervisor each run process is started under: it waits for its one child and writes how
the child ended to a file.

Why: the run manager is not a long-lived parent (``trajforge rl start`` returns once the run is
ready; the next ``trajforge rl status`` is another process), so nobody could ``waitpid`` the
trainer and an exit code or a fatal signal would be lost. The supervisor stays in the child's
process group (the manager signals the group), never handles the stop itself (the group's
SIGTERM reaches the child directly), and records the outcome atomically::

    python -m trajforge.rl.runs.supervise EXIT_FILE -- argv...

``EXIT_FILE`` gets ``{"exit_code": N}`` or ``{"signal": N, "signal_name": "SIGKILL"}``. Stdlib only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def _record(path: str, returncode: int) -> None:
    if returncode < 0:
        num = -returncode
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        outcome: dict[str, object] = {"signal": num, "signal_name": name}
    else:
        outcome = {"exit_code": returncode}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(outcome, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m trajforge.rl.runs.supervise EXIT_FILE -- argv...", file=sys.stderr)
        return 2
    exit_file, command = argv[0], argv[2:]
    # The group's SIGTERM/SIGINT is for the child; the supervisor outlives it to record the end.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda _s, _f: None)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"trajforge supervisor: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        _record(exit_file, 127)
        return 127
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
            continue
    _record(exit_file, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
