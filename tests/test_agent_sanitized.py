"""The exec agent built with AddressSanitizer and UBSan, run through its specification and fuzzed.

Why: the agent is C that reads what the host sends and, above all, what commands print (bytes a
model chose: invalid UTF-8, NULs, a character cut at the cap). A memory error there is a sandbox
escape's first step, so the build the suite runs here aborts at the first out-of-bounds access,
use after free, leak or undefined operation, with a report on stderr. The scenarios of
test_native_agent.py run against it with the same expected answers; then a fixed-seed generator
drives it with a few hundred protocol lines -- valid requests with odd values (huge and negative
ids, caps and timeouts, very long commands, NULs and invalid UTF-8 in commands and in the output,
output exactly at and around the cap, multibyte characters cut at it, unknown ops, resets and stops
between commands) and malformed ones (not JSON, wrong types, truncated objects, deep nesting).

What must hold (the protocol in exec_agent.c's header): no sanitizer report; every well-formed
request gets one answer that is valid JSON with its id, an exec's answer has the exec fields,
``output_bytes`` counts what the command printed (the agent's notes never: they are in ``notes``,
at most 8 of at most 1024 bytes, each one of agent_scripts.NOTES; a command that ends the session's
shell gets exactly its note, one that prints a note's words keeps them as output); a malformed line
ends the agent with ``exec agent: unreadable request`` on stderr and exit 1, after answering
everything before it.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from agent_driver import ENDED, ENV, drive, write_program
from test_native_agent import (
    ESCAPED_ANSWERS,
    ESCAPED_REQUESTS,
    notes_answers,
    notes_requests,
    read_answers,
    read_requests,
    recovery_answers,
    recovery_requests,
    session_answers,
    session_requests,
)
from trajforge.sandbox import agent_scripts, native_agent

SANITIZE = ("-fsanitize=address,undefined,float-cast-overflow", "-fno-omit-frame-pointer", "-g", "-O1")
# Any report aborts the agent (exit 99) and names itself on stderr.
SAN_ENV = {
    **ENV,
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99:detect_stack_use_after_return=1",
    "UBSAN_OPTIONS": "halt_on_error=1:exitcode=99:print_stacktrace=1",
    "LSAN_OPTIONS": "exitcode=99",
}
SEED = 40
CASES = 300


def _build() -> Path | str:
    """The sanitized agent's path, or why it cannot be built here."""
    if native_agent.compiler() is None:
        return "needs a C compiler"
    try:
        agent = native_agent.build_native_agent(extra_flags=SANITIZE)
    except Exception as exc:  # no libasan/libubsan: the toolchain lacks the runtime
        return (
            f"this toolchain cannot build with -fsanitize=address,undefined (install libasan/libubsan): {exc}"
        )
    return write_program(Path(tempfile.mkdtemp(prefix="tf-asan-")), agent.name, agent.data)


@pytest.fixture(scope="module")
def sanitized() -> Any:
    built = _build()
    if isinstance(built, str):
        pytest.skip(built)
    yield built
    shutil.rmtree(built.parent, ignore_errors=True)


def test_the_sanitized_build_reports_a_memory_error(tmp_path: Path) -> None:
    """The build is really instrumented: a program of the same flags that reads past a buffer is
    stopped with a report (so 'no report' below means something)."""
    cc = native_agent.compiler()
    if cc is None:
        pytest.skip("needs a C compiler")
    source = b"#include <stdlib.h>\nint main(int c, char **v) { char *p = malloc(4); int r = p[c + 4]; free(p); return r; }\n"
    try:
        binary = native_agent.compile_c(cc, "oob.c", source, "oob", SANITIZE)
    except native_agent.CompileError as exc:
        pytest.skip(f"this toolchain cannot build with sanitizers: {exc}")
    (tmp_path / "oob").write_bytes(binary)
    (tmp_path / "oob").chmod(0o755)
    done = subprocess.run([str(tmp_path / "oob")], capture_output=True, env=SAN_ENV, timeout=60)
    assert done.returncode == 99  # ASan's heap-buffer-overflow or UBSan's object-size check, first
    assert (
        b"AddressSanitizer: heap-buffer-overflow" in done.stderr
        or b"runtime error: load of address" in done.stderr
    )


def test_the_specification_holds_under_sanitizers(sanitized: Path, tmp_path: Path) -> None:
    argv = [str(sanitized)]
    root = tmp_path / "agent"
    assert drive(argv, root, session_requests(), env=SAN_ENV) == session_answers(root)
    assert drive(argv, root, recovery_requests(), env=SAN_ENV) == recovery_answers(root)
    assert drive(argv, root, ESCAPED_REQUESTS, env=SAN_ENV) == ESCAPED_ANSWERS
    assert drive(argv, root, notes_requests(), env=SAN_ENV) == notes_answers()
    for cap in (7, 64, 1000):
        assert drive(argv, root, read_requests(tmp_path, cap), env=SAN_ENV) == read_answers(cap)


# ---------------------------------------------------------------------------- the fuzzer

_BYTES_FILE = "fuzz.bin"  # random bytes a command prints, written per case


def _odd_number(rng: random.Random) -> Any:
    return rng.choice(
        [
            0,
            1,
            -1,
            7,
            2**31,
            -(2**31),
            2**63 - 1,
            -(2**63),
            2**64,
            10**30,
            -(10**30),
            1e308,
            -1e308,
            0.5,
            -0.001,
            1e-300,
        ]
    )


def _printing_command(rng: random.Random, data_dir: Path, case: int) -> tuple[str, bytes]:
    """A command whose output is known exactly: random bytes (NULs, invalid UTF-8, multibyte
    characters placed to be cut at the cap) from a file it cats or printf's."""
    kind = rng.randrange(4)
    if kind == 0:
        data = rng.randbytes(rng.randrange(0, 3000))
    elif kind == 1:  # multibyte characters, some cut, around the cap's edges
        chars = ["é", "€", "😀", "a", "\n"]
        data = "".join(rng.choice(chars) for _ in range(rng.randrange(0, 400))).encode()
        if data and rng.random() < 0.5:
            data = data[: rng.randrange(len(data))]
    elif kind == 2:
        data = bytes(
            rng.choice(b'\x00\xff\xc3\xe2\x82\xf0\x9f\x98\x80\\"\n\t') for _ in range(rng.randrange(0, 200))
        )
    else:
        data = b""
    path = data_dir / f"c{case}.bin"
    path.write_bytes(data)
    return f"cat {path}", data


class Expected:
    """What an exec's answer must say when the case knows it: ``printed`` the bytes its command
    prints (None: not known), ``exit_code`` and the agent's ``notes`` (None: not known)."""

    def __init__(self, printed: bytes | None, exit_code: int = 0, notes: list[str] | None = None) -> None:
        self.printed, self.exit_code, self.notes = printed, exit_code, notes


def _valid_request(rng: random.Random, n: int, data_dir: Path) -> tuple[dict[str, Any], Expected]:
    """A well-formed request and, for an exec, what its answer must say."""
    roll = rng.random()
    if roll < 0.08:
        return {"id": n, "op": rng.choice(["stop", "reset"])}, Expected(None)
    if roll < 0.12:
        return {
            "id": n,
            "op": rng.choice(["bogus", "", "EXEC", "exec\u0000"]),
            "command": "echo unknown-op",
            "timeout": 10,
        }, Expected(b"unknown-op\n", notes=[])
    command, printed = _printing_command(rng, data_dir, n)
    request: dict[str, Any] = {"id": n, "op": "exec", "command": command, "timeout": 10}
    cap_roll = rng.random()
    if cap_roll < 0.4 and printed:
        request["cap"] = len(printed) + rng.choice([-2, -1, 0, 1, 2])  # at and around the cap
    elif cap_roll < 0.7:
        request["cap"] = rng.choice([1, 2, 3, 4, 5, 8, 33, 1000, 2**62])
    elif cap_roll < 0.8:
        request["cap"] = rng.choice([-1, -(2**62), 0])
    if rng.random() < 0.3:
        request["fresh"] = True
    exit_code, notes = 0, []
    if rng.random() < 0.15:  # it ends its shell: the session's gets a note, never in the output
        exit_code = rng.choice([0, 1, 3, 255])
        request["command"] = f"{command}; exit {exit_code}"
        if not request.get("fresh"):
            notes = [ENDED.format(exit_code)]
    elif rng.random() < 0.05 and printed:  # it prints a note's own words: they stay output
        words = ("[" + ENDED.format(0) + "]\n").encode()
        (data_dir / f"c{n}.bin").write_bytes(words + printed)
        printed = words + printed
    if rng.random() < 0.15:
        request["timeout"] = rng.choice([1e308, 10**30, 2**63, 86401])
    if rng.random() < 0.1:
        request["cwd"] = rng.choice([None, ".", "/", "/does/not/exist", "x" * 5000])
        if request["cwd"] not in (None, ".", "/"):
            printed = None  # a missing cwd: the agent's note
    if rng.random() < 0.1:
        request["extra"] = rng.choice([[1, {"a": None}], {"x": [[]]}, "\udcff", -0.0, True])
    if rng.random() < 0.05:  # a very long command (spaces, then the real one)
        request["command"] = " " * rng.randrange(100_000, 1_000_000) + request["command"]
    if rng.random() < 0.06:  # raw bytes the host escapes (U+DC80..U+DCFF): written as the bytes
        request["command"] = "printf '%s' '\udcff\udc80'; " + request["command"]
        printed = None if printed is None else b"\xff\x80" + printed
    if rng.random() < 0.06:  # a NUL in the command: the file has it; what bash makes of it is bash's
        request["command"] = request["command"] + "\u0000; echo after-nul"
        printed = None
    if rng.random() < 0.05:  # a timeout already over: answered as timed out, never hung
        request["timeout"] = rng.choice([-1, -1e308, 1e-300])
        printed = None
    if rng.random() < 0.1:  # ids of any JSON shape are echoed as sent (over 63 characters: null)
        request["id"] = rng.choice([_odd_number(rng), "s" * 100, "\u00e9\udcff", [1, [2]], {"k": None}])
    return request, Expected(printed, exit_code, notes)


def _malformed_line(rng: random.Random, n: int) -> bytes:
    choices = [
        b"{",
        b"not json",
        b'{"id": 1, "op": "exec", "command": 5}',
        b'{"id": 1, "op": "exec", "command": ["ls"]}',
        b'{"id": -, "op": "stop"}',
        b'{"id": tru, "op": "stop"}',
        b'{"id": [1,}, "op": "stop"}',
        b'{"id": 1 "op": "stop"}',
        b'{"id": 01, "op": "stop"}',
        b'{"id": 1.e5, "op": "stop"}',
        b'{"id": 1, "op": "stop", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b'{"id": 1, "op": "ex\x01ec"}',
        b'{"id": 1, "op": "exec", "command": "echo \\uZZZZ"}',
        b'{"id": 1, "command": "\xff\xfe\x00"',
        b"[]",
        b"\x00\x00\x00",
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))).replace(b"\n", b" "),
        b'{"id": "' + b"\x80" * 10 + b'", "op": "stop"}x',
    ]
    return rng.choice(choices)


def _answers(stdout: bytes) -> list[dict[str, Any]]:
    """Every line the agent wrote, as JSON (a line that is not JSON fails the test here)."""
    return [json.loads(line.decode("utf-8", "surrogateescape")) for line in stdout.splitlines()]


def _run(agent: Path, root: Path, lines: list[bytes]) -> subprocess.CompletedProcess[bytes]:
    if root.exists():
        shutil.rmtree(root)
    (root / "work").mkdir(parents=True)
    (root / "tmp").mkdir()
    return subprocess.run(
        [str(agent), str(root / "work"), str(root / "tmp")],
        input=b"".join(line + b"\n" for line in lines),
        capture_output=True,
        env=SAN_ENV,
        timeout=300,
    )


# Every note the agent may say, as a pattern (agent_scripts.NOTES: %d a number, %s a quoted path).
NOTE_PATTERNS = [
    re.compile(re.escape(note).replace("%d", "-?[0-9]+").replace("%s", ".*") + r"\Z", re.S)
    for note in agent_scripts.NOTES
]


def _check_exec(answer: dict[str, Any], expected: Expected) -> None:
    assert set(answer) >= {
        "id",
        "exit_code",
        "output",
        "notes",
        "timed_out",
        "truncated",
        "output_bytes",
        "duration_s",
    }
    assert isinstance(answer["output"], str) and isinstance(answer["output_bytes"], int)
    notes = answer["notes"]
    assert isinstance(notes, list) and len(notes) <= 8, answer  # the notes' own bound
    for note in notes:  # each one of the agent's sentences, bounded, never a command's bytes
        assert isinstance(note, str) and len(note.encode()) <= 1024, answer
        assert any(p.match(note) for p in NOTE_PATTERNS) or note.endswith("..."), answer
    if expected.printed is not None:
        assert not answer["timed_out"] and answer["exit_code"] == expected.exit_code, answer
        assert answer["output_bytes"] == len(expected.printed), answer  # the output alone
        assert notes == expected.notes, answer


def test_fuzzed_protocol_lines_never_trip_a_sanitizer(sanitized: Path, tmp_path: Path) -> None:
    """A few hundred generated requests over a few agents, each batch ending in a malformed line
    or a close: answers are JSON, in order, with their ids; a malformed line is refused clearly."""
    rng = random.Random(SEED)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    done_cases = 0
    agents = 0
    while done_cases < CASES:
        size = rng.randrange(10, 40)
        requests = [_valid_request(rng, done_cases + i + 1, data_dir) for i in range(size)]
        done_cases += size
        lines = [json.dumps(r).encode() for r, _ in requests]  # ASCII: escapes for the rest
        ending = rng.random()
        malformed = _malformed_line(rng, 0) if ending < 0.6 else None
        lines.append(malformed if malformed is not None else b'{"id": "end", "op": "close"}')
        done = _run(sanitized, tmp_path / f"agent{agents}", lines)
        agents += 1
        stderr = done.stderr.decode(errors="replace")
        assert "Sanitizer" not in stderr and "runtime error" not in stderr, stderr[-3000:]
        answers = _answers(done.stdout)
        assert answers[0]["ready"] is True
        if malformed is None:
            assert done.returncode == 0 and answers[-1] == {"id": "end", "closed": True}, stderr[-2000:]
        elif done.returncode == 0:  # a blank line is skipped; a lenient read is answered
            assert not malformed.strip() or len(answers) == len(requests) + 2, (malformed[:200], stderr)
        else:
            assert done.returncode == 1, (malformed[:200], stderr[-2000:])
            assert stderr.startswith("exec agent: unreadable request"), stderr
        for (request, expected), answer in zip(requests, answers[1:], strict=False):
            expected_id = request["id"] if len(json.dumps(request["id"])) < 64 else None
            assert answer["id"] == expected_id, (request, answer)
            if "error" in answer:
                continue
            if request.get("op") == "stop":
                assert answer == {"id": request["id"], "stopped": True}
            elif request.get("op") == "reset":
                assert answer["reset"] is False and answer["reason"]
            else:
                _check_exec(answer, expected)
        assert len(answers) >= len(requests) + 1, stderr[-2000:]  # every well-formed one answered


# ---------------------------------------------------------------------------- resets in bwrap

_PLANTS = [
    "mkdir -p $(printf 'd/%.0s' $(seq 1 {depth})) && touch $(printf 'd/%.0s' $(seq 1 {depth}))f",
    "touch \"$(printf 'n\\377\\001e\\nline')\" \"$(head -c 255 /dev/zero | tr '\\0' L)\"",
    "ln -s loop loop; ln -s / root-link; ln -s /etc/passwd pw; ln pw-hard 2>/dev/null; :",
    "mkfifo fifo; mkdir closed; touch closed/x; chmod 000 closed; touch locked; chmod 000 locked",
    "sleep 1045 & setsid sleep 1046 & (trap '' TERM; sleep 1047) & echo started",
    "head -c {size} /dev/urandom > /dev/shm/blob; head -c {size} /dev/urandom > /tmp/blob; ls /dev/shm /tmp | wc -l",
    "command -v ipcmk >/dev/null && ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null; echo ipc",
    "cd /tmp && mkdir -p a/b/c && cd a/b/c && export GONE=1 && f(){ :; }",
    "head -c {size} /dev/urandom | od -An -c | head -c {size}",
]


async def test_resets_in_bwrap_under_sanitizers(
    sanitized: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reset (tree walks, restores, process kills, IPC and keyring cleanup) is the agent's most
    intricate C, and it runs only in a real sandbox: rollouts plant deep trees, odd names, links,
    FIFOs, unreadable directories, background jobs and IPC objects, each sandbox is reset and
    reused, and every agent's stderr (read before its directory is removed) has no report."""
    from trajforge.sandbox import SandboxConfig, create_sandbox_factory, factory, process
    from trajforge.sandbox.layout import AgentFile

    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    logs: list[str] = []
    for module in (factory, process):
        real = module.remove_tree

        def keep_log(root: Path, _real: Any = real) -> None:
            log = Path(root) / "agent.log"
            if log.exists():
                logs.append(log.read_text(errors="replace"))
            _real(root)

        monkeypatch.setattr(module, "remove_tree", keep_log)
    rng = random.Random(SEED)
    config = SandboxConfig(
        kind="bwrap",
        reuse=True,
        command_timeout_s=30,
        root_dir=str(tmp_path / "sb"),
        env={key: SAN_ENV[key] for key in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS")},
    )
    made = create_sandbox_factory(config)
    made.adopt_agent(AgentFile(sanitized.name, await asyncio.to_thread(sanitized.read_bytes)))
    try:
        for rollout in range(6):
            sb = await made.create(f"r{rollout}")
            left = await sb.exec(
                "ls -A /workspace /dev/shm; echo ${GONE-unset}; type f 2>/dev/null | head -1"
            )
            assert left.output == "/dev/shm:\n\n/workspace:\nunset\n", left.output
            for plant in rng.sample(_PLANTS, 5):
                command = plant.replace("{depth}", str(rng.randrange(1, 200)))
                command = command.replace("{size}", str(rng.randrange(0, 100_000)))
                result = await sb.exec(command, timeout=30)
                assert not result.timed_out, (command, result)
            await sb.close()
        counts = made.stats.counts()
    finally:
        await made.aclose()
    assert logs, "no agent log was read"
    reports = [log for log in logs if "Sanitizer" in log or "runtime error" in log]
    assert not reports, reports[0][-3000:]
    assert counts == {"created": 1, "reused": 5}  # every reset verified: nothing discarded
