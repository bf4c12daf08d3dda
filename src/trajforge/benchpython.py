"""The benchmark interpreter: a Python >= 3.12 virtualenv beside trajforge's own.

The published benchmark packages (``yc-bench`` 0.1.0, ``harbor`` 0.26.0) require Python >= 3.12,
and trajforge's interpreter is 3.11. Rather than move the whole project (torch, TRL, Atropos and
the trainers' converters are pinned and tested on 3.11), those packages live in their own
virtualenv, ``.venv-bench`` in the checkout (``make bench-venv``), and are run as programs: a
sandbox sees the virtualenv read-only at its own path (:attr:`BenchPython.ro_paths`), the host
runs it as a subprocess. Nothing of it is ever imported into trajforge's process.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

VENV_DIR = ".venv-bench"
MIN_VERSION = (3, 12)
SETUP_HINT = (
    "run `make bench-venv` in the trajforge checkout (it needs a Python >= 3.12: python3.12 on PATH, "
    "a pyenv version, or PY312=/path/to/python3.12), or point the env's `bench_venv` at a "
    "virtualenv of Python >= 3.12 with {packages} installed"
)


class BenchPythonError(ValueError):
    """No usable benchmark interpreter; the message says how to get one."""


@dataclass(frozen=True)
class BenchPython:
    """A checked benchmark virtualenv."""

    venv: Path  # the virtualenv's real path (links resolved): what a sandbox binds
    base_prefix: Path  # the interpreter it was made from (its stdlib and shared libraries)
    version: tuple[int, int]

    @property
    def python(self) -> str:
        """The interpreter to run, inside a sandbox or on the host: the venv's own ``bin/python``
        (not the link's target, which would lose the virtualenv)."""
        return str(self.venv / "bin" / "python")

    @property
    def ro_paths(self) -> list[str]:
        """Host paths a sandbox must see read-only, each at its own path: the virtualenv and the
        base interpreter's prefix, unless the sandbox's system directories have it already."""
        paths = []
        for p in (self.venv, self.base_prefix):
            if not any(p == Path(s) or p.is_relative_to(s) for s in ("/usr", "/bin", "/lib")):
                paths.append(str(p))
        return list(dict.fromkeys(paths))


def candidates(explicit: str | os.PathLike[str] | None) -> list[Path]:
    """Where to look, in order: ``explicit`` (a virtualenv or its python) alone when given; else
    ``.venv-bench`` in the current directory, then in the checkout trajforge runs from."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.name.startswith("python") and not path.is_dir():
            path = path.parent.parent
        return [path.absolute()]
    here = Path.cwd() / VENV_DIR
    checkout = Path(__file__).resolve().parents[2] / VENV_DIR  # src/trajforge/ -> the checkout
    return list(dict.fromkeys([here, checkout]))


def find_bench_python(explicit: str | os.PathLike[str] | None, packages: tuple[str, ...]) -> BenchPython:
    """The first candidate virtualenv that runs, is Python >= 3.12 and imports ``packages``."""
    want = ", ".join(packages)
    problems = []
    for venv in candidates(explicit):
        if not (venv / "bin" / "python").exists():
            problems.append(f"{venv}: no bin/python")
            continue
        try:
            return probe(venv, packages)
        except BenchPythonError as exc:
            problems.append(str(exc))
    raise BenchPythonError(
        f"no benchmark interpreter with {want} ({'; '.join(problems)}): " + SETUP_HINT.format(packages=want)
    )


_PROBE = (
    "import importlib.util, json, sys; "
    "print(json.dumps([sys.base_prefix, list(sys.version_info[:2]), "
    "[m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]]))"
)


def probe(venv: Path, packages: tuple[str, ...]) -> BenchPython:
    real = venv.resolve()
    python = real / "bin" / "python"
    modules = [p.replace("-", "_") for p in packages]
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _PROBE, *modules],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchPythonError(f"{python} does not run ({exc})") from None
    if done.returncode != 0:
        raise BenchPythonError(f"{python} failed: {done.stderr.strip()[-300:]}")
    base, version, missing = json.loads(done.stdout)
    got = (int(version[0]), int(version[1]))
    if got < MIN_VERSION:
        raise BenchPythonError(f"{python} is Python {got[0]}.{got[1]}, the benchmarks need >= 3.12")
    if missing:
        raise BenchPythonError(f"{python} lacks {', '.join(missing)}")
    return BenchPython(venv=real, base_prefix=Path(base).resolve(), version=got)
