"""Grading ``swe`` rollouts with the ``swebench`` package's own rules (the ``swe`` extra).

Every ``swe`` episode ends in a test log in SWE-bench's shape -- the test output between
``>>>>> Start Test Output`` and ``>>>>> End Test Output``, then ``>>>>> Test Exit Code: N`` after
it -- graded by swebench's ``get_eval_report``: its log parser (an instance's ``log_parser``,
``parse_log_pytest`` for the shipped tasks), its checks that the log describes a run that happened
(no parseable result and no sign of a run, or a non-zero exit with no failure listed, is no
result), its FAIL_TO_PASS / PASS_TO_PASS report (a skipped PASS_TO_PASS test is maintained, a
skipped FAIL_TO_PASS test is not) and its resolution status (FULL, PARTIAL, NO).

Where the log comes from differs (see :mod:`trajforge.envs.library.swe`): for the shipped tasks
it is rendered from the isolated runner's signed per-test results (:func:`runner_log`), in
pytest's ``-rA`` summary format, so the parser reads the ids the runner judged; for a SWE-bench
instance it is the instance's own test command's output.

What grading imports: ``swebench.harness.grading`` pulls in ``swebench.harness`` whole, whose
``__init__`` imports docker, modal, datasets and the rest of swebench's dependencies (about two
seconds and some 1,600 modules, once per process, in a worker thread): hence the extra installs
swebench with its dependencies.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from trajforge.envs.base import EnvDataError
from trajforge.envs.types import RewardBreakdown

INSTALL = "pip install 'trajforge[swe]'"
DEFAULT_PARSER = "parse_log_pytest"


class SwebenchMissingError(EnvDataError):
    """The swebench package is not installed here (the env cannot grade: it says so at setup)."""


def require_swebench() -> None:
    """Refuse early, without importing it (a look-up only), when swebench is not installed."""
    if importlib.util.find_spec("swebench") is None:
        raise SwebenchMissingError(
            f"the swe env grades with the swebench package, which is not installed; install it with `{INSTALL}`"
        )


@dataclass(frozen=True)
class Swebench:
    grading: ModuleType
    constants: ModuleType
    types: ModuleType
    parsers: dict[str, Any]


@cache
def swebench() -> Swebench:
    """swebench's grading modules (imported once; blocking: call from a thread)."""
    try:
        import swebench.types as sw_types
        from swebench.harness import constants, grading
        from swebench.harness.log_parsers import PARSER_REGISTRY
    except ImportError as exc:
        raise SwebenchMissingError(
            f"the swe env grades with the swebench package, which cannot be imported here ({exc}); "
            f"install it with `{INSTALL}`"
        ) from None
    return Swebench(grading, constants, sw_types, dict(PARSER_REGISTRY))


def markers() -> tuple[str, str, str]:
    """swebench's start, end and exit-code markers."""
    c = swebench().constants
    return c.START_TEST_OUTPUT, c.END_TEST_OUTPUT, c.TEST_EXIT_CODE


def runner_log(results: dict[str, str], errors: dict[str, str]) -> str:
    """The isolated runner's results as SWE-bench's eval log: pytest ``-rA`` summary lines
    (``PASSED id`` / ``FAILED id - message`` / ``ERROR file - message``) between the markers, the
    exit code (1 when anything failed, as pytest's) after them."""
    start, end, exit_marker = markers()
    lines = [start]
    failed = False
    for test_id, outcome in results.items():
        status = {"passed": "PASSED", "failed": "FAILED", "error": "ERROR"}.get(outcome, "FAILED")
        failed |= status != "PASSED"
        text = (errors.get(test_id) or "").strip().splitlines()
        lines.append(f"{status} {test_id}" + (f" - {text[-1][:300]}" if text and status != "PASSED" else ""))
    lines.append(end)
    lines.append(f"{exit_marker}: {1 if failed else 0}")
    return "\n".join(lines) + "\n"


def _grade_sync(spec: dict[str, Any], log: str) -> dict[str, Any]:
    sw = swebench()
    parser = spec.get("log_parser") or DEFAULT_PARSER
    if parser not in sw.parsers:
        raise ValueError(f"unknown log_parser {parser!r}; swebench knows {', '.join(sorted(sw.parsers))}")
    test_spec = sw.types.TestSpec(
        instance_id=spec["instance_id"],
        image=spec.get("image") or "",
        eval_script_list=[],
        repo=spec.get("repo") or "",
        version=str(spec.get("version") or ""),
        FAIL_TO_PASS=list(spec["fail_to_pass"]),
        PASS_TO_PASS=list(spec["pass_to_pass"]),
        log_parser=parser,
        eval_type=spec.get("eval_type") or sw.constants.EvalType.PASS_AND_FAIL.value,
    )
    fd, path = tempfile.mkstemp(prefix="trajforge-swe-", suffix=".log")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
            fh.write(log)
        report = sw.grading.get_eval_report(
            test_spec, {"instance_id": spec["instance_id"], "model_patch": ""}, path, True
        )[spec["instance_id"]]
    finally:
        os.unlink(path)
    tests = report.get("tests_status")
    if tests is None:
        return {"report": report, "status": "NO_RESULT"}
    return {
        "report": report,
        "tests": tests,
        "status": sw.grading.get_resolution_status(tests),
        "f2p": float(sw.grading.compute_fail_to_pass(tests)),
        "p2p": float(sw.grading.compute_pass_to_pass(tests)),
    }


async def grade(spec: dict[str, Any], log: str, *, partial_credit: bool, detail: str = "") -> RewardBreakdown:
    """The reward of a test log under swebench's rules. ``spec``: instance_id, fail_to_pass,
    pass_to_pass, and optionally repo, version, log_parser, eval_type. 1.0 when swebench says
    RESOLVED_FULL; with ``partial_credit`` the FAIL_TO_PASS fraction when it says RESOLVED_PARTIAL
    (which already requires every PASS_TO_PASS test maintained); else 0.0."""
    graded = await asyncio.to_thread(_grade_sync, spec, log)
    sw = swebench()
    if graded["status"] == "NO_RESULT":
        tail = log.strip().splitlines()[-3:]
        return RewardBreakdown(
            value=0.0,
            components={"fail_to_pass": 0.0, "pass_to_pass": 0.0},
            reason="swebench found no test result in the log (the tests did not run, or the log "
            f"contradicts its exit code){': ' + detail if detail else ''}; log ends: {' | '.join(tail)[-400:]}",
        )
    status, f2p, p2p = graded["status"], graded["f2p"], graded["p2p"]
    full, partial = sw.constants.ResolvedStatus.FULL.value, sw.constants.ResolvedStatus.PARTIAL.value
    tests = graded["tests"]
    failures = [*tests["FAIL_TO_PASS"]["failure"], *tests["PASS_TO_PASS"]["failure"]]
    if status == full:
        reward = 1.0
        reason = f"swebench: {status} ({len(spec['fail_to_pass'])} FAIL_TO_PASS, {len(spec['pass_to_pass'])} PASS_TO_PASS)"
    else:
        reward = f2p if partial_credit and status == partial else 0.0
        reason = f"swebench: {status}; failing: {', '.join(failures) or 'none listed'}"
        if detail:
            reason += f"; first: {detail}"
    return RewardBreakdown(value=reward, components={"fail_to_pass": f2p, "pass_to_pass": p2p}, reason=reason)
