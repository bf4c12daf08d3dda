"""The docker backend against a real engine (tests/docker_engine.py: a private dockerd and a base
image debootstrapped from Debian packages): sessions, timeouts, the output cap, file access, no
network, memory/pids/CPU limits, cleanup after ``kill -9``, and the documented differences from
bwrap (commands are root in the container, no reuse). Each defence is shown next to its control.

Then ``terminal_bench`` under ``--sandbox docker``, end to end: the shipped Harbor tasks that need
no more than the local base has (bash, coreutils, python3: ``DOCKER_TASKS``, 8 of the suite's 40)
have their Dockerfile built on that base (its ``FROM`` names that image, as a task directory
prepared for an offline machine does), the agent runs in the built image, the tests run in the same
container at their real paths (``/tests``, ``/logs``), and the reward comes back: the oracle 1.0, the
do-nothing agent 0.0, on every task, in-process and through the CLI. The agent cannot plant the
reward: not as files, not with a detached process that writes it during verification.

One file on purpose: pytest-xdist (``--dist loadfile``) runs a file on one worker, and any docker
factory's first ``create`` sweeps the containers of dead processes -- a concurrent one would remove
the killed run's container before the control in the ``kill -9`` test has looked at it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.envs import RolloutBackends, Rollouts, load_env
from trajforge.envs.agents import NothingModel, nothing_model_for, oracle_model_for
from trajforge.envs.library.terminal_bench import TerminalBenchEnv, shipped_dir
from trajforge.sandbox import (
    SandboxConfig,
    SandboxLimits,
    SandboxUnavailableError,
    close_factory,
    create_sandbox_factory,
)
from trajforge.sandbox.docker import OWNER_LABEL, owner_dead, owner_label
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = [pytest.mark.docker]


def _config(tmp_path: Path, image: str, **kw: object) -> SandboxConfig:
    return SandboxConfig(kind="docker", root_dir=str(tmp_path / "sb"), docker_image=image, **kw)  # type: ignore[arg-type]


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=120).stdout


def _container_of(sb) -> str:
    """The sandbox's container name (the ``docker exec`` argv of its agent names it)."""
    argv = sb.agent._argv
    return next(a for a in argv if a.startswith("trajforge-"))


@pytest.fixture
async def sandbox(docker_engine, tmp_path):
    """A docker sandbox (its exec agent: the static build of exec_agent.c, mounted read-only)."""
    factory = create_sandbox_factory(_config(tmp_path, docker_engine.base))
    sb = await factory.create("t-docker")
    yield sb
    await sb.close()


async def test_session_files_and_timeout(sandbox):
    sb = sandbox
    await sb.exec("mkdir d && cd d && export Z=3")
    assert (await sb.exec('pwd; echo "$Z"')).output == "/workspace/d\n3\n"
    data = os.urandom(50_000)
    await sb.write_bytes("blob", data)
    assert (await sb.exec("stat -c %s /workspace/blob")).output.strip() == "50000"
    assert await sb.read_bytes("/workspace/blob") == data
    await sb.exec("head -c 3000 /dev/urandom > /workspace/made-inside")
    assert len(await sb.read_bytes("made-inside")) == 3000
    assert (await sb.exec("sleep 30", timeout=1)).timed_out
    assert (await sb.exec("echo still here")).output == "still here\n"


async def test_a_timeout_kills_the_commands_whole_process_group(sandbox):
    sb = sandbox
    res = await sb.exec("sleep 301 & sleep 302 & sleep 303", timeout=1)
    assert res.timed_out and res.exit_code is None
    left = await sb.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert "sleep 30" not in left.output.replace("sleep infinity", ""), left.output
    # the control: without a timeout the background job outlives the call that started it
    await sb.exec("sleep 304 >/dev/null 2>&1 &")
    alive = await sb.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert "sleep 304" in alive.output


async def test_output_is_capped_inside_the_container(docker_engine, tmp_path):
    factory = create_sandbox_factory(_config(tmp_path, docker_engine.base, output_cap_bytes=4096))
    sb = await factory.create("cap")
    try:
        res = await sb.exec("head -c 5000000 /dev/zero | tr '\\0' a; echo; echo the-end")
        assert res.truncated and res.exit_code == 0
        assert res.output_bytes > 5_000_000 and len(res.output) < 6000
        assert res.output.rstrip().endswith("the-end")
    finally:
        await sb.close()


async def test_file_access_stays_in_the_workdir(sandbox):
    sb = sandbox
    await sb.exec("ln -s /etc/hostname link; mkdir -p sub")
    for path in ("/etc/passwd", "../../etc/passwd", "link", "sub/../../etc/hostname"):
        with pytest.raises((PermissionError, ValueError, OSError)):
            await sb.read_bytes(path)
    with pytest.raises((PermissionError, ValueError, OSError)):
        await sb.write_bytes("link", b"x")
    assert (await sb.exec("cat /etc/hostname")).output == "sandbox\n"  # the container's, unchanged


async def test_no_network_not_even_the_hosts_loopback(docker_engine, tmp_path):
    """A server on the host's 127.0.0.1: the host reaches it (the control), the sandbox cannot,
    and the container has no interface but ``lo``."""
    got: list[bytes] = []

    async def serve(reader, writer):
        got.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=3); s.sendall(b'hi'); print('connected')\n"
        "except OSError as e:\n"
        "    print('refused', e)\n"
    )
    try:
        control = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30
        )
        assert control.stdout.startswith("connected")
        factory = create_sandbox_factory(_config(tmp_path, docker_engine.base))
        sb = await factory.create("net")
        try:
            await sb.write_bytes("probe.py", probe.encode())
            inside = await sb.exec("python3 probe.py")
            assert inside.output.startswith("refused"), inside.output
            ifaces = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
            assert ifaces.output.split() == ["lo"]
        finally:
            await sb.close()
    finally:
        server.close()
        await server.wait_closed()
    assert got == [b"hi"]  # only the host's connection arrived


async def test_memory_limit_kills_a_hog_and_a_larger_limit_lets_it_run(docker_engine, tmp_path):
    hog = 'python3 -c \'x = bytearray(300 * 1024 * 1024); x[::4096] = b"y" * len(x[::4096]); print("kept")\''
    results = {}
    for memory in (128, 1024):
        limits = SandboxLimits(memory_mb=memory)
        factory = create_sandbox_factory(_config(tmp_path / str(memory), docker_engine.base, limits=limits))
        sb = await factory.create("mem")
        try:
            results[memory] = await sb.exec(hog, timeout=60)
            host = _docker(
                "inspect", "--format", "{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}}", _container_of(sb)
            )
            assert host.split() == [str(memory * 2**20)] * 2
        finally:
            await sb.close()
    assert results[128].exit_code == 137 and not results[128].output.endswith("kept\n"), results[128]
    assert results[1024].output == "kept\n", results[1024]


async def test_process_limit_holds_and_a_fork_bomb_is_survived(docker_engine, tmp_path):
    limits = SandboxLimits(max_processes=64)
    factory = create_sandbox_factory(
        _config(tmp_path, docker_engine.base, limits=limits, command_timeout_s=20)
    )
    sb = await factory.create("bomb")
    try:
        assert _docker("inspect", "--format", "{{.HostConfig.PidsLimit}}", _container_of(sb)).strip() == "64"
        assert sb.cgroup.limits_pids  # the container's cgroup is the sandbox's: refused forks are seen
        # bash retries a refused fork for ~30 s (sleeping 1, 2, 4, ... s): the pipeline ends by the
        # timeout, which then finds the limit reached and kills every process
        many = await sb.exec("for i in $(seq 100); do sleep 60 & done 2>&1 | tail -1; echo done", timeout=6)
        assert "Resource temporarily unavailable" in many.output or "process limit" in many.shown, many
        bomb = await sb.exec(":(){ :|:& };:", timeout=5)
        later = await sb.exec("echo alive; ls /proc | grep -c '^[0-9]'")
        assert bomb.timed_out or "process limit" in bomb.shown + later.shown
        assert later.output.startswith("alive"), later.output
        assert int(later.output.split()[-1]) <= 8, later.output  # the bomb is gone
    finally:
        await sb.close()


async def test_cpu_seconds_kill_a_busy_loop(docker_engine, tmp_path):
    limits = SandboxLimits(cpu_seconds=1)
    factory = create_sandbox_factory(_config(tmp_path, docker_engine.base, limits=limits))
    sb = await factory.create("cpu")
    try:
        res = await sb.exec("python3 -c 'while True: pass'", timeout=60)
        # SIGXCPU at the soft limit, SIGKILL at the hard one (ulimit -t sets both): never the timeout
        assert not res.timed_out and res.exit_code in (128 + 24, 128 + 9), res
        assert (await sb.exec("echo next")).output == "next\n"
    finally:
        await sb.close()


async def test_disk_cap_fills_the_sandbox_not_the_host(docker_engine, tmp_path):
    """/workspace, /tmp and /dev/shm share the per-sandbox tmpfs, as under bwrap."""
    if os.geteuid() != 0:
        pytest.skip("the disk cap is a tmpfs, which only root may mount")
    limits = SandboxLimits(disk_mb=32, disk_inodes=1000)
    factory = create_sandbox_factory(_config(tmp_path, docker_engine.base, limits=limits))
    sb = await factory.create("disk")
    try:
        assert sb.layout.disk_capped
        big = await sb.exec("dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1")
        assert "No space left on device" in big.output
        more = await sb.exec("dd if=/dev/zero of=/tmp/more bs=1M count=10 2>&1")
        assert "No space left on device" in more.output  # the cap is one total for both
        # /dev/shm is the sandbox's, in the same cap, not the engine's own 64 MiB tmpfs
        shm = await sb.exec("dd if=/dev/zero of=/dev/shm/more bs=1M count=10 2>&1")
        assert "No space left on device" in shm.output
        assert (sb.layout.shm / "more").exists()
    finally:
        await sb.close()


async def _stop_reaches_a_setsid_daemon(sb) -> None:
    """A ``setsid`` daemon rewriting a file beats until ``stop_processes``, and never after."""
    await sb.exec(
        "setsid sh -c 'while :; do date +%s%N > /workspace/beat; sleep 0.05; done' >/dev/null 2>&1 < /dev/null &"
    )
    await asyncio.sleep(0.5)
    assert (await sb.read_bytes("beat")).strip()
    await sb.stop_processes()
    first = await sb.read_bytes("beat")
    await asyncio.sleep(0.5)
    assert await sb.read_bytes("beat") == first, "a process of the rollout still runs"


async def test_stop_processes_reaches_a_detached_daemon(docker_engine, tmp_path):
    """Before a verifier looks, everything the rollout started dies: also a ``setsid`` daemon in
    its own process group that would otherwise keep rewriting (say) the reward file."""
    factory = create_sandbox_factory(_config(tmp_path, docker_engine.base))
    sb = await factory.create("daemon")
    try:
        await _stop_reaches_a_setsid_daemon(sb)
    finally:
        await sb.close()


_VICTIM = """
import asyncio, sys
from trajforge.sandbox import SandboxConfig, create_sandbox_factory

async def main():
    factory = create_sandbox_factory(SandboxConfig(kind="docker", root_dir=sys.argv[1], docker_image=sys.argv[2]))
    sb = await factory.create("victim")
    await sb.exec("echo data > file; sleep 1035 >/dev/null 2>&1 &")
    name = next(a for a in sb.agent._argv if a.startswith("trajforge-"))
    print(name, sb.layout.root, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _containers(*names: str) -> list[str]:
    out = _docker("ps", "-a", "--format", "{{.Names}}")
    return [n for n in names if n in out.split()]


def _run_and_kill_victim(root: Path, image: str) -> tuple[str, Path]:
    """A process that makes a docker sandbox, then dies by SIGKILL (no cleanup of its runs)."""
    victim = subprocess.Popen([sys.executable, "-c", _VICTIM, str(root), image], stdout=subprocess.PIPE)
    assert victim.stdout is not None
    name, layout_root = victim.stdout.readline().decode().split()
    victim.kill()
    victim.wait()
    return name, Path(layout_root)


async def test_containers_of_a_killed_run_are_swept_by_the_next_factory(docker_engine, tmp_path):
    name, layout_root = await asyncio.to_thread(_run_and_kill_victim, tmp_path / "sb", docker_engine.base)
    await asyncio.sleep(1)
    assert _containers(name) == [name]  # what a killed run leaves: a running container (the need)

    factory = create_sandbox_factory(_config(tmp_path, docker_engine.base))
    live = await factory.create("live")  # the first create sweeps
    try:
        assert _containers(name) == []
        assert not await asyncio.to_thread(layout_root.exists)
        other = create_sandbox_factory(_config(tmp_path, docker_engine.base))
        second = await other.create("second")  # sweeps too and must leave the live one alone
        assert _containers(_container_of(live)) == [_container_of(live)]
        assert (await live.exec("echo alive")).output == "alive\n"
        await second.close()
    finally:
        await live.close()
    assert _containers(_container_of(live)) == []


def test_owner_labels_judge_only_this_machines_processes():
    mine = owner_label()
    assert not owner_dead(mine, mine.rsplit("/", 2)[0])  # this process: alive
    here = mine.rsplit("/", 2)[0]
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert owner_dead(f"{here}/{gone.pid}/1", here)  # a dead pid (or a reused one) of this boot
    assert not owner_dead(f"other-boot/1/{gone.pid}/1", here)  # another machine's: never judged
    assert not owner_dead("garbage", here)
    assert OWNER_LABEL == "trajforge.owner"


async def test_commands_are_root_in_the_container_and_sandboxes_are_never_reused(docker_engine, tmp_path):
    """Two documented differences from bwrap: no per-sandbox uid (Harbor tasks expect root), and
    ``reuse`` does nothing (every rollout gets a new container)."""
    factory = create_sandbox_factory(_config(tmp_path, docker_engine.base, reuse=True))
    first = await factory.create("a")
    assert (await first.exec("id -u")).output == "0\n"
    await first.exec("echo planted > /etc/planted; echo mine > file")
    first_name = _container_of(first)
    await first.close()
    second = await factory.create("b")
    try:
        assert _container_of(second) != first_name
        look = await second.exec("cat /etc/planted file 2>&1; true")
        assert "No such file" in look.output and "planted" not in look.output.replace("/etc/planted", "")
        assert factory.stats.reused == 0 and factory.stats.created == 2
    finally:
        await second.close()
        await factory.aclose()


def _all_argvs() -> list[bytes]:
    argvs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argvs.append(Path(f"/proc/{entry}/cmdline").read_bytes())
    return argvs


async def test_command_environment_never_on_a_command_line(docker_engine, tmp_path):
    factory = create_sandbox_factory(
        _config(tmp_path, docker_engine.base, env={"TF_TEST_VALUE": "v4lue-9f3k"})
    )
    sb = await factory.create("env")
    try:
        assert (await sb.exec('echo "$TF_TEST_VALUE"')).output == "v4lue-9f3k\n"
        argvs = await asyncio.to_thread(_all_argvs)
        assert any(b"TF_TEST_VALUE" in a for a in argvs)  # the docker exec client names it...
        assert not any(b"v4lue-9f3k" in a for a in argvs)  # ...but no process shows its value
    finally:
        await sb.close()


async def test_an_image_not_on_the_engine_or_without_a_shell_is_refused_clearly(docker_engine, tmp_path):
    tag = f"trajforge-test-refused:{int(time.time())}"
    try:
        factory = create_sandbox_factory(_config(tmp_path, docker_engine.base))
        with pytest.raises(SandboxUnavailableError, match="trajforge never pulls"):
            await factory.create("missing", image="trajforge-test-absent:never")
        await asyncio.to_thread(_empty_image, f"{tag}-empty")  # no /bin/sh: created, never started
        with pytest.raises(SandboxUnavailableError, match="docker run"):
            await factory.create("no-shell", image=f"{tag}-empty")
        assert not [p for p in (tmp_path / "sb").iterdir() if p.is_dir()]  # nothing left behind
        assert not _docker("ps", "-a", "--filter", f"ancestor={tag}-empty", "--format", "{{.Names}}").split()
    finally:
        _docker("rmi", "-f", f"{tag}-empty")


async def test_the_agent_needs_no_python_in_the_image(docker_engine, tmp_path):
    """The agent is a static binary: an image without python3 runs a rollout's session, its
    timeouts and a stop that reaches a ``setsid`` daemon; an image without bash is refused with
    the reason."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {docker_engine.base}\nRUN rm -f /usr/bin/python3*\n")
    tag = f"trajforge-test-nopython:{int(time.time())}"
    _docker("build", "-q", "-t", tag, str(context))
    (context / "Dockerfile").write_text(f"FROM {docker_engine.base}\nRUN rm -f /bin/bash /usr/bin/bash\n")
    _docker("build", "-q", "-t", f"{tag}-nobash", str(context))
    try:
        factory = create_sandbox_factory(_config(tmp_path, tag))
        sb = await factory.create("nopython")
        try:
            assert "python3" not in (await sb.exec("command -v python3 || echo none")).output
            await sb.exec("f(){ echo kept $1; }; cd /tmp; X=plain")
            assert (await sb.exec("f a; pwd; echo $X")).output == "kept a\n/tmp\nplain\n"
            timed = await sb.exec("sleep 30 & sleep 30", timeout=1)
            assert timed.timed_out and timed.exit_code is None
            # the session's parent is the agent, which calls itself exec-agent: its command line
            # names no path of the harness
            assert (await sb.exec("tr '\\0' ' ' < /proc/$PPID/cmdline")).output == "exec-agent "
            await _stop_reaches_a_setsid_daemon(sb)
        finally:
            await sb.close()
        with pytest.raises(SandboxUnavailableError, match="has no bash"):
            await factory.create("nobash", image=f"{tag}-nobash")
        assert not [p for p in (tmp_path / "sb").iterdir() if p.is_dir()]  # nothing left behind
    finally:
        _docker("rmi", "-f", tag, f"{tag}-nobash")


def _empty_image(tag: str) -> None:
    tar = subprocess.run(["tar", "-c", "-T", "/dev/null"], capture_output=True, check=True).stdout
    subprocess.run(["docker", "import", "-", tag], input=tar, capture_output=True, check=True, timeout=120)


async def test_without_an_engine_the_backend_refuses_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-engine.sock")
    factory = create_sandbox_factory(SandboxConfig(kind="docker", root_dir=str(tmp_path / "sb")))
    with pytest.raises(SandboxUnavailableError, match="--sandbox bwrap"):
        await factory.create("t")
    assert not [p for p in (tmp_path / "sb").glob("*") if p.is_dir()]


# ---------------------------------------------------------------- terminal_bench end to end

# The shipped tasks whose Dockerfile builds on the debootstrapped base (minbase + python3): no
# gcc, make or git there, and no registry to pull the images the other tasks name.
DOCKER_TASKS = sorted(
    [
        "csv-to-json", "env-config", "fix-backup-script", "greet-tool", "log-summary", "sqlite-revenue",
        "organize-by-extension", "http-json-server",
    ]
)  # fmt: skip
SHIPPED = DOCKER_TASKS


def _offline_copy(dest: Path, base: str) -> Path:
    """DOCKER_TASKS with every ``FROM`` on the local base image (no registry is reachable)."""
    for name in DOCKER_TASKS:
        shutil.copytree(shipped_dir() / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    for dockerfile in dest.glob("*/environment/Dockerfile"):
        text = dockerfile.read_text()
        dockerfile.write_text(re.sub(r"(?im)^FROM\s+\S+", f"FROM {base}", text))
    return dest


@pytest.fixture(scope="module")
def tasks_dir(docker_engine_session, tmp_path_factory) -> Path:
    return _offline_copy(tmp_path_factory.mktemp("tb") / "tasks", docker_engine_session.base)


@pytest.fixture(scope="module")
def env(docker_engine_session, tasks_dir) -> TerminalBenchEnv:
    loaded = load_env("terminal_bench", {"sandbox": "docker", "tasks_dir": str(tasks_dir)})
    assert isinstance(loaded, TerminalBenchEnv)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", docker_engine_session.host)
        asyncio.run(loaded.setup())  # docker build of every task, once for the module
    return loaded


@pytest.fixture
async def factory(docker_engine, tmp_path):
    f = create_sandbox_factory(
        SandboxConfig(kind="docker", root_dir=str(tmp_path / "sb"), docker_image=docker_engine.base)
    )
    yield f
    await close_factory(f)


def _rollouts(env, factory, *, model=None, model_for=None) -> Rollouts:
    backends = RolloutBackends(
        model=model or NothingModel(), factory=factory, registry=default_registry(), model_for=model_for
    )
    return Rollouts(env, backends)


async def test_the_docker_tasks_build_on_the_local_base(env):
    assert env.skipped == {}
    assert sorted(t.name for t in env.tasks) == SHIPPED and len(SHIPPED) >= 6
    for task in env.tasks:
        assert task.image and task.image.startswith("trajforge-tb-"), task


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
async def test_oracle_scores_one_and_nothing_zero(name, env, factory):
    item = next(i for i in env.eval_items(100) if i["id"] == name)
    oracle = await _rollouts(env, factory, model_for=oracle_model_for(env)).episode(item)
    assert oracle.status == "completed" and oracle.reward.error is None, oracle.reason
    assert oracle.reward.value == 1.0, oracle.reward.reason
    nothing = await _rollouts(env, factory, model_for=nothing_model_for(env)).episode(item)
    assert nothing.status == "completed" and nothing.reward.error is None, nothing.reason
    assert nothing.reward.value == 0.0, nothing.reward.reason


async def test_the_rollout_runs_in_the_built_image_at_the_real_paths(env, factory):
    """WORKDIR, ENV, COPY and RUN of the Dockerfile are the image's (no replay, no path mapping)."""
    item = next(i for i in env.eval_items(100) if i["id"] == "fix-backup-script")
    look = "pwd; echo root=$BACKUP_ROOT; ls -l /app/backup.sh; cat data/record-2.txt; id -u; cat /etc/os-release | head -1"
    model = ScriptedModel([tool_turn(("terminal", {"command": look})), answer("looked")])
    ep = await _rollouts(env, factory, model=model).episode(item)
    (content,) = [str(m["content"]) for m in ep.messages if m["role"] == "tool"]
    out = json.loads(content)["output"]
    assert "/app\n" in out and "root=/app/backups" in out and "-rwx" in out and "record 2" in out, out
    assert "Debian GNU/Linux" in out, out


async def test_agent_cannot_plant_reward_files_or_a_reward_writing_daemon(env, factory):
    item = next(i for i in env.eval_items(100) if i["id"] == "log-summary")
    plant = (
        "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
        "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && echo 'wrong 1' > /app/summary.txt; "
        "setsid sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; done' "
        ">/dev/null 2>&1 < /dev/null &"
    )
    model = ScriptedModel([tool_turn(("terminal", {"command": plant})), answer("done")])
    ep = await _rollouts(env, factory, model=model).episode(item)
    assert ep.reward.error is None and ep.reward.value == 0.0, ep.reward.reason
    assert ep.reward.reason.startswith("reward.txt"), ep.reward.reason


def _cli_eval(tasks: Path, agent: str, out: Path) -> dict:
    """``trajforge env eval terminal_bench --sandbox docker`` as a user types it."""
    done = CliRunner().invoke(
        app,
        [
            "env", "eval", "terminal_bench", "--sandbox", "docker", "--agent", agent, "--tasks", str(tasks),
            "--max-samples", "100", "--group-size", "1", "--output-dir", str(out), "--json",
        ],
    )  # fmt: skip
    assert done.exit_code == 0, done.output[-3000:]
    return json.loads(done.stdout[done.stdout.index("{") :])


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("none", 0.0)])
def test_env_eval_cli_with_sandbox_docker(agent, reward, docker_engine, tasks_dir, tmp_path):
    summary = _cli_eval(tasks_dir, agent, tmp_path / "runs")
    assert summary["episodes"] == len(SHIPPED) and summary["failed"] == 0, summary
    assert summary["reward_errors"] == 0 and summary["mean_reward"]["value"] == reward, summary
