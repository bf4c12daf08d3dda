"""How long ``trajforge --help`` and ``trajforge --version`` take, against the old eager import.

Each figure is the median wall time of fresh interpreters (``python -c ...``: start-up, imports,
the help text), interleaved so load changes hit both sides alike. The baseline, measured in the
same invocation, is what the entry point did before the commands were loaded lazily: import every
command module (``trajforge.cli.<name>`` for each of ``cli.main.COMMANDS``) before answering. The
ratio is baseline / now; the interpreter's bare start-up is printed for scale.

    PYTHONPATH=src python benchmarks/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from trajforge.cli.main import COMMANDS

_RUN = "import sys\nfrom trajforge.cli.main import main\nsys.argv = ['trajforge', {flag!r}]\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
_EAGER = "".join(f"import {module}\n" for module, _ in COMMANDS.values())
CASES = {
    "bare python": "pass",
    "--help (old: eager imports)": _EAGER + _RUN.format(flag="--help"),
    "--help (now)": _RUN.format(flag="--help"),
    "--version (old: eager imports)": _EAGER + _RUN.format(flag="--version"),
    "--version (now)": _RUN.format(flag="--version"),
}


def wall(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=os.environ.copy())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    for code in CASES.values():  # warm the page cache and bytecode once
        wall(code)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, code in CASES.items():
            times[name].append(wall(code))
    median = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"load: {os.getloadavg()[0]:.1f} (1 min), runs: {args.runs}, python {sys.version.split()[0]}")
    for name, value in median.items():
        print(f"{name:32s} {value * 1000:7.0f} ms median  (min {min(times[name]) * 1000:.0f})")
    for flag in ("--help", "--version"):
        old, now = median[f"{flag} (old: eager imports)"], median[f"{flag} (now)"]
        print(
            f"{flag}: {old / now:.1f}x faster than the eager import ({old * 1000:.0f} -> {now * 1000:.0f} ms)"
        )


if __name__ == "__main__":
    main()
