"""How the exec agent starts a command, both ways: through ``_posixsubprocess.fork_exec`` (the C
path, on the interpreter it was written against) and through a fork in Python (everywhere else).
Either must give the command nothing of the agent: no fd, no capability, no group, no ignored
signal, a session of its own, and the uid it was asked for."""

from __future__ import annotations

import os
import signal

import pytest

from trajforge.sandbox import exec_agent

UID = 54_321
PATHS = ["c", "python"]


@pytest.fixture(params=PATHS)
def start(request, monkeypatch):
    if request.param == "c" and exec_agent._FORK_EXEC is None:
        pytest.skip("this interpreter has no known _posixsubprocess.fork_exec signature")
    if request.param == "python":
        monkeypatch.setattr(exec_agent, "_FORK_EXEC", None)
    return exec_agent._start


def _run(start, script: str, run_as: tuple[int, int] | None) -> tuple[int, str]:
    read_end, write_end = os.pipe()
    try:
        pid = start(["sh", "-c", script], "/tmp", {"PATH": "/usr/bin:/bin"}, run_as, write_end)
    finally:
        os.close(write_end)
    out = b""
    while chunk := os.read(read_end, 65536):
        out += chunk
    os.close(read_end)
    return exec_agent._wait(pid), out.decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_a_command_gets_nothing_of_the_agent(start):
    leaked = os.open("/etc/hostname", os.O_RDONLY)  # an fd of ours without close-on-exec
    os.set_inheritable(leaked, True)
    try:
        code, out = _run(
            start,
            "ls /proc/self/fd | tr '\\n' ' '; echo; id -u; id -g; readlink /proc/self/fd/0; "
            "grep -E '^(CapEff|Groups|SigIgn):' /proc/self/status; "
            '[ "$(ps -o sid= -p $$)" -eq $$ ] && echo own-session; pwd; exit 3',
            (UID, UID),
        )
    finally:
        os.close(leaked)
    lines = out.splitlines()
    assert code == 3, out
    assert set(lines[0].split()) <= {"0", "1", "2", "3"}, out  # 3: the listing's own fd
    assert lines[1:4] == [str(UID), str(UID), "/dev/null"], out
    status = dict(line.split(":", 1) for line in lines if ":" in line)
    assert int(status["CapEff"], 16) == 0 and status["Groups"].strip() == "", out
    ignored = int(status["SigIgn"], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), out
    assert lines[-2:] == ["own-session", "/tmp"], out


def test_a_signal_is_a_negative_exit_code(start):
    code, _ = _run(start, "kill -9 $$", None)
    assert code == -signal.SIGKILL


@pytest.mark.parametrize(
    ("argv", "cwd", "error"),
    [
        (["/nonexistent/program"], "/tmp", FileNotFoundError),
        (["no-such-program-anywhere"], "/tmp", FileNotFoundError),
        (["true"], "/nonexistent-dir", FileNotFoundError),
    ],
)
def test_what_cannot_start_raises_its_oserror(start, argv, cwd, error):
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(error):
            start(argv, cwd, {"PATH": "/usr/bin:/bin"}, None, write_end)
    finally:
        os.close(read_end)
        os.close(write_end)
