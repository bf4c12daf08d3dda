"""The local backend (no isolation, same session semantics) and the shared pieces: output cap,
path confinement, copy-in, factory selection."""

from __future__ import annotations

import asyncio
import os

import pytest

from trajforge.protocols import Sandbox
from trajforge.sandbox import SandboxConfig, create_sandbox_factory
from trajforge.sandbox.confined import ConfinedDir


@pytest.fixture
async def sandbox(tmp_path):
    factory = create_sandbox_factory(
        SandboxConfig(kind="local", root_dir=str(tmp_path / "sb"), output_cap_bytes=1000, env={"X": "1"})
    )
    sb = await factory.create("t-local")
    yield sb
    await sb.close()


async def test_local_session_semantics(sandbox, monkeypatch):
    assert isinstance(sandbox, Sandbox)
    assert sandbox.workdir == str(sandbox.host_workdir)
    await sandbox.exec("mkdir a && cd a && export Y=2")
    result = await sandbox.exec('pwd; echo "$X$Y"; exit 7')
    assert result.output.startswith(f"{sandbox.workdir}/a\n12\n") and result.exit_code == 7
    assert (await sandbox.exec("cd /nonexistent")).exit_code != 0
    assert (await sandbox.exec("pwd")).output == f"{sandbox.workdir}/a\n"


async def test_local_does_not_leak_host_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    factory = create_sandbox_factory(SandboxConfig(kind="local", root_dir=str(tmp_path / "sb")))
    sb = await factory.create("t-env")
    try:
        assert "sk-should-not-leak" not in (await sb.exec("env")).output
    finally:
        await sb.close()


async def test_local_timeout_and_output_cap(sandbox):
    timed = await sandbox.exec("sleep 1031 & sleep 1031", timeout=0.5)
    assert timed.timed_out and timed.exit_code is None
    assert "1031" not in (await sandbox.exec("ps -eo args | grep '^sleep 1031' || true")).output
    big = await sandbox.exec("seq 1 100000")
    assert big.truncated and big.output.startswith("1\n2\n") and big.output.endswith("99999\n100000\n")
    assert big.output_bytes == len("".join(f"{i}\n" for i in range(1, 100001)))


async def test_local_files_and_close(sandbox):
    data = os.urandom(5000)  # larger than this sandbox's output cap
    await sandbox.write_bytes("d/f.bin", data)
    assert await sandbox.read_bytes(f"{sandbox.workdir}/d/f.bin") == data
    with pytest.raises(PermissionError):
        await sandbox.read_bytes("../outside")
    await sandbox.exec("nohup sleep 1033 >/dev/null 2>&1 &")
    assert (await sandbox.exec("ps -eo args | grep -c '^sleep 1033'")).output == "1\n"
    root = sandbox.layout.root
    await sandbox.close()
    assert not root.exists()
    ps = await asyncio.create_subprocess_exec("ps", "-eo", "args", stdout=asyncio.subprocess.PIPE)
    probe, _ = await ps.communicate()
    assert b"sleep 1033" not in probe


async def test_cwd_contents_are_copied_in(tmp_path):
    src = tmp_path / "row"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("x = 1\n")
    factory = create_sandbox_factory(SandboxConfig(kind="local", root_dir=str(tmp_path / "sb")))
    sb = await factory.create("t-cwd", cwd=str(src))
    try:
        assert (await sb.exec("cat pkg/mod.py")).output == "x = 1\n"
        await sb.exec("echo changed > pkg/mod.py")
        assert (src / "pkg" / "mod.py").read_text() == "x = 1\n"  # the original is untouched
    finally:
        await sb.close()
    with pytest.raises(ValueError, match="not a directory"):
        await factory.create("t-bad", cwd=str(tmp_path / "missing"))


async def test_output_cap_keeps_head_and_tail(tmp_path):
    """The agent keeps the first cap/2 and the last cap - cap/2 bytes, whatever the chunks were."""
    factory = create_sandbox_factory(SandboxConfig(kind="local", root_dir=str(tmp_path), output_cap_bytes=10))
    sb = await factory.create("t-cap")
    try:
        big = await sb.exec("printf abc; printf defgh; head -c 1000 /dev/zero | tr '\\0' x; printf 12345")
        assert big.truncated and big.output_bytes == 1013
        assert big.output == "abcde\n\n[... 1003 bytes of output omitted (1013 total) ...]\n\n12345"
        small = await sb.exec("printf hello")
        assert (small.output, small.truncated, small.output_bytes) == ("hello", False, 5)
    finally:
        await sb.close()


def test_confined_dir_resolves_inside_and_refuses_outside(tmp_path):
    (tmp_path / "d").mkdir()
    os.symlink("/ws/d", tmp_path / "abs-in")
    os.symlink("/etc", tmp_path / "abs-out")
    os.symlink("../..", tmp_path / "d" / "rel-out")
    os.symlink("../d/f", tmp_path / "d" / "rel-in")
    files = ConfinedDir(inside="/ws", host=str(tmp_path))
    files.write("d/f", b"one")
    assert (tmp_path / "d" / "f").read_bytes() == b"one"
    files.write("/ws/abs-in/g", b"two")
    assert (tmp_path / "d" / "g").read_bytes() == b"two"
    assert files.read("/ws/d/rel-in") == b"one"
    files.write("new/deep/h", b"three")
    assert files.read("new/./deep/../deep/h") == b"three"
    for bad in ["/etc/passwd", "../x", "abs-out/passwd", "d/rel-out/x", "/ws/../x", "a\0b"]:
        with pytest.raises(PermissionError):
            files.read(bad)
        with pytest.raises(PermissionError):
            files.write(bad, b"x")
    assert not os.path.exists("/x") and not os.path.exists(tmp_path.parent / "x")
    with pytest.raises(IsADirectoryError):
        files.read("d")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError):  # never blocks the host on a FIFO
        files.read("fifo")


def test_unknown_backend_is_a_clear_error():
    config = SandboxConfig.model_construct(kind="chroot")
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        create_sandbox_factory(config)


async def test_session_state_survives_odd_values_and_shell_settings(sandbox):
    """The loop saves the session with bash builtins only; values with newlines, '=' and
    NUL-free oddities, a changed IFS, or a shadowing function must not corrupt it."""
    await sandbox.exec(
        "export MULTI=$'line1\\nline2' EQ='a=b=c' EMPTY= SPACEY='  x  '; IFS=:; "
        "printf() { echo hijacked; }; pwd() { echo /nowhere; }; mkdir -p 'dir with space' && cd 'dir with space'"
    )
    out = await sandbox.exec('echo "[$MULTI]"; echo "[$EQ][$EMPTY][$SPACEY]"; builtin pwd')
    assert out.output == f"[line1\nline2]\n[a=b=c][][  x  ]\n{sandbox.workdir}/dir with space\n"
    await sandbox.exec("unset EQ")
    out = await sandbox.exec('echo "[${EQ-unset}][$MULTI]"')
    assert out.output == "[unset][line1\nline2]\n"


async def test_a_timeout_spares_an_earlier_commands_background_job(tmp_path) -> None:
    """The local backend's pids are the host's: a timed-out command's kill reaches what it started
    (by start time against the moment it was sent), never an earlier command's background job."""
    factory = create_sandbox_factory(SandboxConfig(kind="local", root_dir=str(tmp_path)))
    sb = await factory.create("t-spare")
    try:
        job = (await sb.exec("sleep 1041 >/dev/null 2>&1 & echo $!")).output.strip()
        timed = await sb.exec("sleep 1042 & sleep 1043", timeout=0.5)
        assert timed.timed_out and timed.exit_code is None
        assert (await sb.exec(f"kill -0 {job} && echo alive")).output == "alive\n"
        left = await sb.exec("pgrep -f 'sleep 104[23]' || echo none")
        assert left.output == "none\n"
    finally:
        await sb.close()
