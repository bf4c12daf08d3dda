"""The exec agent (exec_agent.c), its specification: what it answers, written out.

The agent is driven outside any sandbox with protocol lines, and its answers (timings and pids
aside) must be these: the session's state across commands, a killed or exec'd shell, a timeout,
the output cap's head and tail, invalid and cut UTF-8 at the cap, surrogate-escaped commands. These
are the answers the Python agent gave in the same scenarios when it was removed (issue 40), when
the two agents were compared byte for byte. tests/test_agent_sanitized.py runs the same scenarios
against a build under AddressSanitizer and UBSan.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent_driver import ENDED, ENV, RESTARTED, drive, exec_request, ran, write_program
from trajforge.batch.config import BatchConfig
from trajforge.sandbox import native_agent
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.sandbox.types import SandboxConfig

pytestmark = pytest.mark.skipif(native_agent.compiler() is None, reason="needs a C compiler")


@pytest.fixture(scope="module")
def native_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    agent = native_agent.build_native_agent()
    return write_program(tmp_path_factory.mktemp("native"), agent.name, agent.data)


def session_requests() -> list[dict[str, Any] | str]:
    return [
        exec_request(
            1, "f(){ echo fn $1; }; X=plain; alias ll='echo aliased'; set -o pipefail; mkdir -p sub; echo hi"
        ),
        exec_request(2, "f a; echo $X; ll; shopt -o pipefail; cd sub; pwd"),
        exec_request(3, "pwd; exit 3"),
        exec_request(4, "f b; pwd"),
        exec_request(5, "echo $X; pwd", fresh=True),
        exec_request(6, "ls", cwd="/does/not/exist"),
        exec_request(7, "pwd", cwd=".."),
        exec_request(8, "echo out; echo err >&2; false"),
        exec_request(9, "exec true"),
        exec_request(10, "f c"),
        exec_request(11, "seq 1 5000", cap=300),
        {"id": 12, "op": "stop"},
        exec_request(13, "echo after stop; f d"),
        {"id": 14, "op": "reset"},
        {"id": 15, "op": "close"},
    ]


def session_answers(root: Path) -> list[dict[str, Any]]:
    work = str(root / "work")
    numbers = "".join(f"{i}\n" for i in range(1, 5001))
    return [
        {"ready": True},
        ran(1, "hi\n"),
        ran(2, f"fn a\nplain\naliased\npipefail       \ton\n{work}/sub\n"),
        ran(3, f"{work}/sub\n", exit_code=3, notes=(ENDED.format(3),)),  # the session from before: cwd kept
        ran(4, f"fn b\n{work}/sub\n"),
        ran(5, f"\n{work}\n"),  # fresh: none of the session, the workdir
        ran(6, "", exit_code=1, notes=("cwd does not exist: '/does/not/exist'",)),  # it did not run
        ran(7, f"{work}\n"),  # cwd relative to the session's (sub)
        ran(8, "out\nerr\n", exit_code=1),
        ran(9, "", notes=(ENDED.format(0),)),
        ran(10, "fn c\n"),
        ran(
            11,
            numbers[:150]
            + f"\n\n[... {len(numbers) - 300} bytes of output omitted ({len(numbers)} total) ...]\n\n"
            + numbers[-150:],
            truncated=True,
            output_bytes=len(numbers),
        ),
        {"id": 12, "stopped": True},
        ran(13, "after stop\nfn d\n"),
        {"id": 14, "reset": False, "reason": "not started as a reusable sandbox in its own pid namespace"},
        {"id": 15, "closed": True},
    ]


def test_a_session_keeps_its_state_and_survives_its_shell(native_binary: Path, tmp_path: Path) -> None:
    root = tmp_path / "agent"
    assert drive([str(native_binary)], root, session_requests()) == session_answers(root)


# Files a command cats, and what the model reads of them at caps 7 and 64: the head (cap // 2
# bytes) and the tail (the rest of the cap) each decoded on its own, one U+FFFD per maximal invalid
# subpart, a character cut at the cap's edge becoming U+FFFD too.
SAMPLES = [
    b"\xff\xfe plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",  # bad starts, then 2-, 3-, 4-byte characters
    b"\xe0\x80\x80 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf \xf5",  # overlong, surrogate, > U+10FFFF
    b"\xe2\x82 cut \xf0\x9f\x98 cut \xc3",  # truncated sequences, one at the very end
    b'\x00\x01\x1f\x7f \\ " \t\r\n done',  # controls and JSON's own escapes
    bytes(range(256)) * 3,
]
R = "\ufffd"
READ = {
    7: [
        f"{R}{R} \n\n[... 13 bytes of output omitted (20 total) ...]\n\n\U0001f600",
        f"{R}{R}{R}\n\n[... 10 bytes of output omitted (17 total) ...]\n\n{R}{R} {R}",
        f"{R} \n\n[... 9 bytes of output omitted (16 total) ...]\n\nut {R}",
        "\x00\x01\x1f\n\n[... 10 bytes of output omitted (17 total) ...]\n\ndone",
        "\x00\x01\x02\n\n[... 761 bytes of output omitted (768 total) ...]\n\n" + R * 4,
    ],
    64: [
        f"{R}{R} plain \u00e9 \u20ac \U0001f600",
        f"{R}{R}{R} {R}{R}{R} {R}{R}{R}{R} {R}{R} {R}",
        f"{R} cut {R} cut {R}",
        '\x00\x01\x1f\x7f \\ " \t\r\n done',
        "".join(map(chr, range(32))) + "\n\n[... 704 bytes of output omitted (768 total) ...]\n\n" + R * 32,
    ],
}


def read_requests(tmp_path: Path, cap: int) -> list[dict[str, Any] | str]:
    requests: list[dict[str, Any] | str] = []
    for i, data in enumerate(SAMPLES):
        (tmp_path / f"s{i}").write_bytes(data)
        requests.append(exec_request(i + 1, f"cat {tmp_path / f's{i}'}", cap=cap))
        requests.append(exec_request(100 + i, f"cat {tmp_path / f's{i}'}", cap=cap, fresh=True))
    return requests


def read_answers(cap: int) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = [{"ready": True}]
    for i, data in enumerate(SAMPLES):
        if cap in READ:
            text = READ[cap][i]
        elif len(data) <= cap:  # whole: the decoding alone (cap 1000 keeps all but the last sample)
            text = data.decode("utf-8", "replace")
        else:
            head, tail = data[: cap // 2], data[len(data) - (cap - cap // 2) :]
            omitted = f"\n\n[... {len(data) - cap} bytes of output omitted ({len(data)} total) ...]\n\n"
            text = head.decode("utf-8", "replace") + omitted + tail.decode("utf-8", "replace")
        flags = {"truncated": len(data) > cap, "output_bytes": len(data)}
        answers += [ran(i + 1, text, **flags), ran(100 + i, text, **flags)]
    return answers


@pytest.mark.parametrize("cap", [7, 64, 1000])
def test_invalid_and_cut_utf8_reads_as_replacement_characters(
    native_binary: Path, tmp_path: Path, cap: int
) -> None:
    """Every maximal invalid subpart becomes one U+FFFD, in the session and in a fresh command."""
    got = drive([str(native_binary)], tmp_path / "agent", read_requests(tmp_path, cap))
    assert got == read_answers(cap)


ESCAPED_REQUESTS: list[dict[str, Any] | str] = [
    json.dumps(exec_request(1, "printf '%s' '\udcff\udc80é€😀' | od -An -tx1")),
    json.dumps(exec_request(2, 'echo "\\"quoted\\" / \\\\ back"')),
    json.dumps(exec_request(3, "echo '\ud800'")),
]
ESCAPED_ANSWERS = [
    {"ready": True},
    ran(1, " ff 80 c3 a9 e2 82 ac f0 9f 98 80\n"),  # U+DC80..U+DCFF: the raw byte; the rest UTF-8
    ran(2, '"quoted" / \\ back\n'),
    {"id": 3, "error": "UnicodeEncodeError"},  # another lone surrogate cannot be written
]


def test_commands_with_escaped_bytes_and_unicode_are_written_as_the_host_meant(
    native_binary: Path, tmp_path: Path
) -> None:
    """A command is written as the host's surrogate-escaped text says: raw bytes where the JSON has
    U+DC80..U+DCFF, UTF-8 for the rest (surrogate pairs included); a lone surrogate of another kind
    cannot be written, and is answered with an error."""
    assert drive([str(native_binary)], tmp_path / "agent", ESCAPED_REQUESTS) == ESCAPED_ANSWERS


def recovery_requests() -> list[dict[str, Any] | str]:
    return [
        exec_request(1, "X=kept; cd /; sleep 30", timeout=0.5),
        exec_request(2, "echo ${X-unset}; pwd"),
        exec_request(3, "Y=saved; kill -9 $$"),
        exec_request(4, "echo ${Y-unset}"),
        exec_request(5, "(sleep 0.3; echo late) & echo started"),
        exec_request(6, "sleep 0.5; echo next"),
    ]


def recovery_answers(root: Path) -> list[dict[str, Any]]:
    return [
        {"ready": True},
        ran(1, "", exit_code=None, timed_out=True, notes=(RESTARTED,)),
        ran(2, f"unset\n{root / 'work'}\n"),  # the session from before the timed-out command
        ran(3, "", exit_code=-9, notes=(ENDED.format(-9),)),
        ran(4, "unset\n"),
        ran(5, "started\n"),  # a background job's later output is not the command's
        ran(6, "next\n"),  # nor the next one's
    ]


def test_a_killed_or_timed_out_shell_is_recovered(native_binary: Path, tmp_path: Path) -> None:
    root = tmp_path / "agent"
    assert drive([str(native_binary)], root, recovery_requests()) == recovery_answers(root)


@pytest.mark.parametrize(
    "line",
    [
        '{"id": -, "op": "stop"}',
        '{"id": [1,}, "op": "stop"}',
        '{"id": tru, "op": "stop"}',
        '{"id": 01}',
        '{"id": 3, "op": "stop"} trailing',
        '{"id": 3, "op": "exec", "command": 5}',
    ],
)
def test_a_request_that_is_not_json_ends_the_agent_clearly(
    native_binary: Path, tmp_path: Path, line: str
) -> None:
    """The id is echoed as sent, so it must be JSON: a lenient reader once echoed ``-`` or ``[1,}``
    into an answer the host could not parse (found by the fuzzer, tests/test_agent_sanitized.py)."""
    (tmp_path / "w").mkdir()
    (tmp_path / "t").mkdir()
    done = subprocess.run(
        [str(native_binary), str(tmp_path / "w"), str(tmp_path / "t")],
        input=f'{{"id": 1, "op": "stop"}}\n{line}\n{{"id": 2, "op": "stop"}}\n'.encode(),
        capture_output=True,
        env=ENV,
        timeout=60,
    )
    answers = [json.loads(out) for out in done.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [None, 1]  # the greeting, then the line before it
    assert done.returncode == 1 and done.stderr.startswith(
        b"exec agent: unreadable request: " + line.encode()
    )


def notes_requests() -> list[dict[str, Any] | str]:
    printed = "[the shell ended (status 0); " + ENDED.format(0).split("; ", 1)[1] + "]"
    return [
        exec_request(1, f"printf '%s\\n' '{printed}'"),  # a command that prints a note's words
        exec_request(2, f"printf '%s\\n' '{printed}'; exit 0"),  # ... and then ends the shell
        exec_request(3, f"printf '%s\\n' '{printed}'", fresh=True),
        exec_request(4, "printf 'x%.0s' 1 2 3 4 5 6 7 8 9 10; exit 3", cap=10),  # the cap is the output's
        exec_request(5, "exit 4", cap=-1),  # a cap that keeps nothing cuts no note
        exec_request(6, "echo partial; sleep 30", timeout=0.5, cap=4),
        exec_request(7, "true", cap=3, cwd="/does/not/exist", fresh=True),
    ]


def notes_answers() -> list[dict[str, Any]]:
    printed = "[the shell ended (status 0); " + ENDED.format(0).split("; ", 1)[1] + "]\n"
    omitted = "\n\n[... 4 bytes of output omitted (8 total) ...]\n\n"
    return [
        {"ready": True},
        ran(1, printed),  # kept: no note came from the agent
        ran(2, printed, notes=(ENDED.format(0),)),
        ran(3, printed),
        ran(4, "x" * 10, exit_code=3, notes=(ENDED.format(3),)),  # 10 bytes at cap 10: not truncated
        ran(5, "", exit_code=4, notes=(ENDED.format(4),)),
        ran(6, "pa" + omitted + "l\n", None, (RESTARTED,), timed_out=True, truncated=True, output_bytes=8),
        ran(7, "", exit_code=1, notes=("cwd does not exist: '/does/not/exist'",)),
    ]


def test_notes_travel_apart_from_the_output(native_binary: Path, tmp_path: Path) -> None:
    """The agent's notes are in ``notes``, never in ``output``: what a command printed is exactly
    that (a command printing a note's words keeps them), and the cap counts output alone."""
    assert drive([str(native_binary)], tmp_path / "agent", notes_requests()) == notes_answers()


def test_huge_timeouts_and_caps_are_long_ones(native_binary: Path, tmp_path: Path) -> None:
    requests: list[dict[str, Any] | str] = [
        exec_request(1, "echo a", timeout=1e308, cap=2**62),
        exec_request(2, "echo b", timeout=2**63, fresh=True),
        exec_request(3, "echo c", cap=-5),  # a negative cap keeps nothing, and says so
    ]
    assert drive([str(native_binary)], tmp_path / "agent", requests) == [
        {"ready": True},
        ran(1, "a\n"),
        ran(2, "b\n"),
        ran(3, "\n\n[... 2 bytes of output omitted (2 total) ...]\n\n", truncated=True, output_bytes=2),
    ]


def test_the_agent_compiles_without_a_warning() -> None:
    """The product's build tolerates a compiler's new warnings; the tests do not."""
    agent = native_agent.build_native_agent(extra_flags=("-Werror", "-Wshadow", "-Wformat=2"))
    assert agent.data[:4] == b"\x7fELF"
    static = native_agent.build_native_agent(static=True, extra_flags=("-Werror", "-Wshadow", "-Wformat=2"))
    assert static.data[:4] == b"\x7fELF"


def test_the_scripts_come_from_agent_scripts() -> None:
    from trajforge.sandbox import agent_scripts

    header = native_agent.scripts_header()
    for line in agent_scripts.LOOP.splitlines():
        assert line.replace("\\", "\\\\").replace('"', '\\"') in header
    assert "TF_OVERRAN" in header and "TF_WRAPPER" in header


def test_without_a_compiler_the_build_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_agent, "compiler", lambda: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install gcc libc6-dev"):
        native_agent.build_native_agent.__wrapped__()


@pytest.mark.parametrize("kind", ["bwrap", "local", "docker"])
@pytest.mark.parametrize("agent", ["auto", "native"])
async def test_without_a_compiler_the_first_sandbox_fails_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str, agent: str
) -> None:
    """No fallback: every backend runs the one agent, and where it cannot be built the first
    sandbox is refused with the line that says what to install."""
    from trajforge.sandbox import create_sandbox_factory, factory

    monkeypatch.setattr(native_agent, "compiler", lambda: None)
    monkeypatch.setattr(factory, "build_native_agent", native_agent.build_native_agent.__wrapped__)
    built = create_sandbox_factory(SandboxConfig(kind=kind, agent=agent, root_dir=str(tmp_path)))  # type: ignore[arg-type]
    with pytest.raises(
        SandboxUnavailableError, match="no C compiler was found.*apt-get install gcc libc6-dev"
    ):
        await built.create("no-cc")
    assert built.agent_file is None


def _agent_program(pids: list[int]) -> str:
    """The program the process named ``exec-agent`` among ``pids`` runs (as the host sees it)."""
    (agent,) = [p for p in pids if Path(f"/proc/{p}/comm").read_text() == "exec-agent\n"]
    return os.readlink(f"/proc/{agent}/exe")


@pytest.mark.parametrize("agent", ["native", "auto"])  # both name the one agent
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
        assert factory.agent_file is not None and factory.agent_file.name == native_agent.BINARY
        assert "python" not in _agent_program(sandbox.cgroup.pids())
    finally:
        await sandbox.close()


@pytest.mark.parametrize("agent", ["native", "auto"])
async def test_local_sandboxes_run_the_native_agent(tmp_path: Path, agent: str) -> None:
    """The local backend runs the same program on the host (it was refused there while a python
    agent existed): the resident shell's parent is the agent's binary in the sandbox directory."""
    from trajforge.sandbox.local import LocalSandboxFactory

    factory = LocalSandboxFactory(SandboxConfig(kind="local", agent=agent, root_dir=str(tmp_path)))  # type: ignore[arg-type]
    sandbox = await factory.create(agent)
    try:
        program = (await sandbox.exec("readlink /proc/$PPID/exe; f(){ echo kept; }")).output.strip()
        assert program.startswith(str(tmp_path)) and program.endswith("/" + native_agent.BINARY)
        assert (await sandbox.exec("f")).output == "kept\n"
        timed = await sandbox.exec("sleep 30", timeout=0.3)
        assert timed.timed_out and timed.exit_code is None
    finally:
        await sandbox.close()


async def test_a_factory_given_the_agent_does_not_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A batch worker process runs the agent its parent built (``adopt_agent``): no compile."""
    from trajforge.sandbox import bwrap, factory

    built = native_agent.build_native_agent()

    def no_build(*_: Any) -> Any:
        raise AssertionError("the adopted agent was built again")

    monkeypatch.setattr(factory, "build_native_agent", no_build)
    made = bwrap.BwrapSandboxFactory(SandboxConfig(agent="auto", root_dir=str(tmp_path)))
    made.adopt_agent(built)
    sandbox = await made.create("adopted")
    try:
        assert (await sandbox.exec("echo ok")).output == "ok\n"
        assert made.agent_file is built
    finally:
        await sandbox.close()
        await made.aclose()


def test_the_default_is_auto() -> None:
    assert SandboxConfig.model_fields["agent"].default == "auto"
    assert BatchConfig.model_fields["sandbox_agent"].default == "auto"


def test_the_python_agent_is_refused_saying_what_to_do() -> None:
    """Configs that named the removed python agent fail at load with what to change."""
    batch = {"dataset": Path("d.jsonl"), "output_dir": Path("out"), "run_name": "r"}
    refused = (
        lambda: SandboxConfig(agent="python"),  # type: ignore[arg-type]
        lambda: BatchConfig(**batch, sandbox_agent="python"),  # type: ignore[arg-type]
    )
    for build in refused:
        with pytest.raises(ValueError, match="agent: python was removed.*apt-get install gcc libc6-dev"):
            build()
    for kind in ("bwrap", "local", "docker"):  # auto and native load everywhere, and mean the same
        for agent in ("auto", "native"):
            assert SandboxConfig(kind=kind, agent=agent).agent == agent  # type: ignore[arg-type]
    assert BatchConfig(**batch, sandbox_agent="native").sandbox_agent == "native"  # type: ignore[arg-type]


def test_the_static_build_links_no_shared_library() -> None:
    agent = native_agent.build_native_agent(static=True)
    assert agent.data[:4] == b"\x7fELF"
    assert b"ld-linux" not in agent.data[:4096]  # no program interpreter in its headers


def test_the_source_ships_with_the_package() -> None:
    """An installed wheel builds the agent from its own copy of the source (package data)."""
    import tomllib

    source = Path(native_agent.__file__).with_name(native_agent.SOURCE)
    assert source.is_file() and os.path.getsize(source) > 10_000
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "sandbox/*.c" in pyproject["tool"]["setuptools"]["package-data"]["trajforge"]
