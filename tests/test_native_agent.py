"""The native exec agent (exec_agent.c) against the Python one (exec_agent.py), its specification.

The sandbox tests run against either agent (``pytest --sandbox-agent native``); here the two are
driven side by side, outside any sandbox, with the same requests, and must give the same answers
byte for byte (timings aside): the text a model reads -- invalid UTF-8, cut multi-byte characters
at the output cap, surrogate-escaped commands -- is the same whichever agent a sandbox runs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trajforge.batch.config import BatchConfig
from trajforge.sandbox import exec_agent, native_agent
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.sandbox.types import SandboxConfig

pytestmark = pytest.mark.skipif(native_agent.compiler() is None, reason="needs a C compiler")

_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "TF_LIMIT_FSIZE_KB": "1048576",
    "TF_LIMIT_CPU_S": "60",
}


@pytest.fixture(scope="module")
def native_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    agent = native_agent.build_native_agent()
    path = tmp_path_factory.mktemp("native") / agent.name
    path.write_bytes(agent.data)
    path.chmod(0o755)
    return path


def _drive(argv: list[str], root: Path, requests: list[dict[str, Any] | str]) -> list[dict[str, Any]]:
    """Run one agent on fresh ``root/work`` and ``root/tmp``; its answers (greeting first)."""
    if root.exists():
        shutil.rmtree(root)
    (root / "work").mkdir(parents=True)
    (root / "tmp").mkdir()
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    done = subprocess.run(
        [*argv, str(root / "work"), str(root / "tmp")],
        input=lines.encode(),
        capture_output=True,
        env=_ENV,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
    for answer in answers:
        answer.pop("duration_s", None)
        answer.pop("pid", None)
        if "error" in answer:  # the host's reason to discard the sandbox, never the model's text
            answer["error"] = answer["error"].split(":", 1)[0]
    return answers


def _both(native_binary: Path, tmp_path: Path, requests: list[dict[str, Any] | str]) -> list[dict[str, Any]]:
    python = [sys.executable, "-I", "-S", str(Path(exec_agent.__file__))]
    expected = _drive(python, tmp_path / "agent", requests)
    got = _drive([str(native_binary)], tmp_path / "agent", requests)
    assert got == expected
    return got


def _exec(n: int, command: str, **extra: Any) -> dict[str, Any]:
    return {"id": n, "op": "exec", "command": command, "timeout": 10, "cwd": None, "cap": 1000, **extra}


def test_a_session_answers_alike(native_binary: Path, tmp_path: Path) -> None:
    answers = _both(
        native_binary,
        tmp_path,
        [
            _exec(
                1,
                "f(){ echo fn $1; }; X=plain; alias ll='echo aliased'; set -o pipefail; mkdir -p sub; echo hi",
            ),
            _exec(2, "f a; echo $X; ll; shopt -o pipefail; cd sub; pwd"),
            _exec(3, "pwd; exit 3"),
            _exec(4, "f b; pwd"),
            _exec(5, "echo $X; pwd", fresh=True),
            _exec(6, "ls", cwd="/does/not/exist"),
            _exec(7, "pwd", cwd=".."),
            _exec(8, "echo out; echo err >&2; false"),
            _exec(9, "exec true"),
            _exec(10, "f c"),
            _exec(11, "seq 1 5000", cap=300),
            {"id": 12, "op": "stop"},
            _exec(13, "echo after stop; f d"),
            {"id": 14, "op": "reset"},
            {"id": 15, "op": "close"},
        ],
    )
    assert answers[0] == {"ready": True}
    assert answers[2]["output"].endswith(
        "aliased\npipefail       \ton\n" + str(tmp_path / "agent/work/sub") + "\n"
    )
    assert answers[3]["exit_code"] == 3 and "/work/sub\n\n[the shell ended (status 3)" in answers[3]["output"]
    assert answers[11]["truncated"] and answers[11]["output_bytes"] == len(
        "".join(f"{i}\n" for i in range(1, 5001))
    )
    assert answers[14]["reset"] is False  # not in a sandbox of its own: refused, as the python agent does
    assert answers[-1] == {"id": 15, "closed": True}


@pytest.mark.parametrize("cap", [7, 64, 1000])
def test_invalid_and_cut_utf8_reads_the_same(native_binary: Path, tmp_path: Path, cap: int) -> None:
    """Every maximal invalid subpart becomes one U+FFFD, as Python's decode('utf-8', 'replace')."""
    samples = [
        b"\xff\xfe plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",  # bad starts, then 2-, 3-, 4-byte characters
        b"\xe0\x80\x80 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf \xf5",  # overlong, surrogate, > U+10FFFF
        b"\xe2\x82 cut \xf0\x9f\x98 cut \xc3",  # truncated sequences, one at the very end
        b'\x00\x01\x1f\x7f \\ " \t\r\n done',  # controls and JSON's own escapes
        bytes(range(256)) * 3,
    ]
    requests: list[dict[str, Any] | str] = []
    for i, data in enumerate(samples):
        (tmp_path / f"s{i}").write_bytes(data)
        requests.append(_exec(i + 1, f"cat {tmp_path / f's{i}'}", cap=cap))
        requests.append(_exec(100 + i, f"cat {tmp_path / f's{i}'}", cap=cap, fresh=True))
    _both(native_binary, tmp_path, requests)


def test_commands_with_escaped_bytes_and_unicode_run_alike(native_binary: Path, tmp_path: Path) -> None:
    """A command is written as the host's surrogate-escaped text says: raw bytes where the JSON has
    U+DC80..U+DCFF, UTF-8 for the rest (surrogate pairs included); a lone surrogate of another kind
    cannot be written, and both agents answer it with an error."""
    requests: list[dict[str, Any] | str] = [
        json.dumps(_exec(1, "printf '%s' '\udcff\udc80é€😀' | od -An -tx1")),
        json.dumps(_exec(2, 'echo "\\"quoted\\" / \\\\ back"')),
        json.dumps(_exec(3, "echo '\ud800'")),
    ]
    answers = _both(native_binary, tmp_path, requests)
    assert answers[1]["output"].split() == ["ff", "80", "c3", "a9", "e2", "82", "ac", "f0", "9f", "98", "80"]
    assert "error" in answers[3]


def test_a_killed_or_timed_out_shell_is_recovered_alike(native_binary: Path, tmp_path: Path) -> None:
    answers = _both(
        native_binary,
        tmp_path,
        [
            _exec(1, "X=kept; cd /; sleep 30", timeout=0.5),
            _exec(2, "echo ${X-unset}; pwd"),
            _exec(3, "Y=saved; kill -9 $$"),
            _exec(4, "echo ${Y-unset}"),
            _exec(5, "(sleep 0.3; echo late) & echo started"),
            _exec(6, "sleep 0.5; echo next"),
        ],
    )
    assert answers[1]["timed_out"] and answers[1]["exit_code"] is None
    assert answers[2]["output"].startswith("unset\n")  # the session from before the killed command
    assert "the shell ended (status -9)" in answers[3]["output"]
    assert answers[5]["output"] == "started\n"


def test_the_agent_compiles_without_a_warning() -> None:
    """The product's build tolerates a compiler's new warnings; the tests do not."""
    agent = native_agent.build_native_agent(extra_flags=("-Werror", "-Wshadow", "-Wformat=2"))
    assert agent.executable


def test_the_scripts_come_from_the_python_agent() -> None:
    header = native_agent.scripts_header()
    for line in exec_agent.LOOP.splitlines():
        assert line.replace("\\", "\\\\").replace('"', '\\"') in header
    assert "TF_OVERRAN" in header and "TF_WRAPPER" in header


def test_without_a_compiler_native_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_agent, "compiler", lambda: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install gcc"):
        native_agent.build_native_agent.__wrapped__()


async def test_auto_without_a_compiler_runs_the_python_agent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from trajforge.sandbox import bwrap

    monkeypatch.setattr(bwrap, "compiler", lambda: "/nonexistent/cc")

    def broken() -> Any:
        raise SandboxUnavailableError("the native exec agent did not compile with /nonexistent/cc (test)")

    monkeypatch.setattr(bwrap, "build_native_agent", broken)
    factory = bwrap.BwrapSandboxFactory(SandboxConfig(agent="auto", root_dir=str(tmp_path)))
    with caplog.at_level(logging.WARNING):
        sandbox = await factory.create("auto")
    try:
        assert (await sandbox.exec("echo ok")).output == "ok\n"
        assert factory.agent_file is not None and factory.agent_file.name.endswith(".pyc")
        assert "sandboxes run the python agent" in caplog.text
    finally:
        await sandbox.close()


def _agent_program(pids: list[int]) -> str:
    """The program the process named ``exec-agent`` among ``pids`` runs (as the host sees it)."""
    (agent,) = [p for p in pids if Path(f"/proc/{p}/comm").read_text() == "exec-agent\n"]
    return os.readlink(f"/proc/{agent}/exe")


@pytest.mark.parametrize("agent", ["native", "auto"])  # auto: native where it compiles
async def test_bwrap_sandboxes_run_the_native_agent(tmp_path: Path, agent: str) -> None:
    from trajforge.sandbox.bwrap import BwrapSandboxFactory

    factory = BwrapSandboxFactory(SandboxConfig(agent=agent, root_dir=str(tmp_path)))  # type: ignore[arg-type]
    sandbox = await factory.create(agent)
    try:
        # a command runs in the resident shell itself: its parent is the agent, which shows by a
        # name of its own (its command line named the harness's paths); the host sees its program
        found = (await sandbox.exec("tr -d '\\0' < /proc/$PPID/cmdline; echo; f(){ echo kept; }")).output
        assert found == "exec-agent\n"
        assert (await sandbox.exec("f")).output == "kept\n"
        assert factory.runs_native_agent
        assert "python" not in _agent_program(sandbox.cgroup.pids())
    finally:
        await sandbox.close()


async def test_a_factory_given_the_agent_does_not_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A batch worker process runs the agent its parent built (``adopt_agent``): no compile."""
    from trajforge.sandbox import bwrap

    built = native_agent.build_native_agent()

    def no_build(*_: Any) -> Any:
        raise AssertionError("the adopted agent was built again")

    monkeypatch.setattr(bwrap, "build_native_agent", no_build)
    monkeypatch.setattr(bwrap, "compile_agent", no_build)
    factory = bwrap.BwrapSandboxFactory(SandboxConfig(agent="auto", root_dir=str(tmp_path)))
    factory.adopt_agent(built)
    sandbox = await factory.create("adopted")
    try:
        assert (await sandbox.exec("echo ok")).output == "ok\n"
        assert factory.agent_file is built and factory.runs_native_agent
    finally:
        await sandbox.close()
        await factory.aclose()


def test_the_default_is_auto(request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--sandbox-agent") is None:  # the option replaces the default
        assert SandboxConfig.model_fields["agent"].default == "auto"
    assert BatchConfig.model_fields["sandbox_agent"].default == "auto"


def test_native_is_not_for_the_local_backend() -> None:
    with pytest.raises(ValueError, match="local backend runs the python agent"):
        SandboxConfig(kind="local", agent="native")
    assert SandboxConfig(kind="local", agent="auto").agent == "auto"  # auto: python there
    assert SandboxConfig(kind="docker", agent="native").agent == "native"  # a static build


def test_the_static_build_links_no_shared_library() -> None:
    agent = native_agent.build_native_agent(static=True)
    assert agent.executable and agent.data[:4] == b"\x7fELF"
    assert b"ld-linux" not in agent.data[:4096]  # no program interpreter in its headers


def test_the_source_ships_with_the_package() -> None:
    """An installed wheel builds the agent from its own copy of the source (package data)."""
    import tomllib

    source = Path(native_agent.__file__).with_name(native_agent.SOURCE)
    assert source.is_file() and os.path.getsize(source) > 10_000
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "sandbox/*.c" in pyproject["tool"]["setuptools"]["package-data"]["trajforge"]
