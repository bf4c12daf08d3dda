"""The ``swe`` env's test runner: copied into the finished rollout's sandbox and run there.

Why not pytest: the sandbox runs the system ``python3`` (bwrap shows the host's /usr, not our
virtualenv), which need not have pytest. This runner is stdlib only and runs pytest-style test
files (module-level ``test_*`` functions with plain ``assert``, and ``unittest.TestCase``
classes); the shipped hidden tests also pass under real pytest.

Why it is hard to fool: it is started as ``python3 -I -S`` from a fresh environment (no
``PYTHONPATH``, no ``sitecustomize``/``usercustomize``/``.pth``, no script directory on
``sys.path``), it never loads ``conftest.py``, the repository is *appended* to ``sys.path`` after
the stdlib modules it needs are imported (a planted ``json.py`` shadows nothing), only the test
files it is given run, and its result line carries a nonce read from a file that is deleted before
any repository code runs, so code under test that prints a forged result or exits early scores
nothing. (Code under test runs in this process, as under pytest: a solution that digs through the
runner's frames could still cheat; the hidden tests are the line of defence there.)

Usage: ``python3 -I -S swe_runner.py ROOT NONCE_FILE TEST_FILE...``; prints one line
``TRAJFORGE-SWE-RESULT <nonce> <json>`` with ``{"results": {id: outcome}, "errors": {id: text}}``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import signal
import sys
import traceback
import unittest
from types import FrameType, ModuleType
from typing import Any

MARKER = "TRAJFORGE-SWE-RESULT"
PER_TEST_TIMEOUT_S = 20


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Timeout(f"test ran longer than {PER_TEST_TIMEOUT_S}s")


def _load(path: str, index: int) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_trajforge_hidden_{index}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _cases(module: ModuleType) -> list[tuple[str, Any]]:
    """(name, callable) of the module's tests, in source order."""
    out: list[tuple[str, Any]] = []
    for name, obj in vars(module).items():
        if name.startswith("test") and inspect.isfunction(obj) and obj.__module__ == module.__name__:
            out.append((name, obj))
        elif (
            inspect.isclass(obj) and issubclass(obj, unittest.TestCase) and obj.__module__ == module.__name__
        ):
            for method in unittest.defaultTestLoader.getTestCaseNames(obj):
                out.append((f"{name}::{method}", obj(method)))
    return out


def _run_one(case: Any) -> str | None:
    """None when the test passed, else the failure text."""
    signal.alarm(PER_TEST_TIMEOUT_S)
    try:
        if isinstance(case, unittest.TestCase):
            result = unittest.TestResult()
            case.run(result)
            problems = result.errors + result.failures
            if problems:
                return problems[0][1][-2000:]
            if result.skipped or result.unexpectedSuccesses:
                return "skipped"
            return None
        case()
        return None
    except BaseException:  # a test that raises SystemExit or KeyboardInterrupt failed, too
        return traceback.format_exc()[-2000:]
    finally:
        signal.alarm(0)


def main(argv: list[str]) -> int:
    root, nonce_file, *tests = argv
    with open(nonce_file) as fh:
        nonce = fh.read().strip()
    os.unlink(nonce_file)
    signal.signal(signal.SIGALRM, _alarm)
    stdout = sys.stdout  # the code under test may replace sys.stdout
    sys.path.append(root)
    os.chdir(root)
    results: dict[str, str] = {}
    errors: dict[str, str] = {}
    for index, path in enumerate(tests):
        rel = os.path.relpath(path, root)
        try:
            module = _load(path, index)
            cases = _cases(module)
        except BaseException:
            results[rel] = "error"
            errors[rel] = traceback.format_exc()[-2000:]
            continue
        for name, case in cases:
            test_id = f"{rel}::{name}"
            failure = _run_one(case)
            results[test_id] = "passed" if failure is None else "failed"
            if failure is not None:
                errors[test_id] = failure
    stdout.write(f"\n{MARKER} {nonce} {json.dumps({'results': results, 'errors': errors})}\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
