"""The run manager with real processes: readiness observed, crashes reported with their reason,
graceful then forced stops of whole process groups, runs picked up by a new manager in another
process, and no secret in any argv (``/proc/*/cmdline``).

Until a run needs the real trainer, the processes are a stand-in written here: a real HTTP
server that prints its address the way ``trajforge serve`` does and answers ``/health``, and a
"trainer" that checks the server, writes metrics lines and a checkpoint, and can crash on cue.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trajforge.rl.runs import procs
from trajforge.rl.runs.manager import Manager
from trajforge.rl.runs.schema import ProcessSpec, ReadyCheck, RunSpec, RunState

SECRET_ENV = "TF_RL_TEST_API_KEY"

STANDIN = textwrap.dedent(
    r"""
    import argparse, http.server, json, os, signal, sys, threading, time, urllib.request

    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--server")
    p.add_argument("--out")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--crash-at", type=int, default=-1)
    p.add_argument("--kill-self-at", type=int, default=-1)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--fail-start", action="store_true")
    a = p.parse_args()

    if a.mode == "server":
        if a.fail_start:
            print("server: cannot load the model: weights missing", flush=True)
            sys.exit(2)

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"ok": True, "has_secret": bool(os.environ.get("TF_RL_TEST_API_KEY"))}).encode()
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)

        def term(*_):
            print("server: SIGTERM, shutting down", flush=True)
            threading.Thread(target=srv.shutdown).start()

        signal.signal(signal.SIGTERM, term)
        print(f"trajforge serve: listening on http://127.0.0.1:{srv.server_address[1]}", flush=True)
        srv.serve_forever()
        sys.exit(0)

    # trainer
    stopping = False

    def term(*_):
        global stopping
        if a.ignore_term:
            print("trainer: ignoring SIGTERM", flush=True)
            return
        stopping = True

    signal.signal(signal.SIGTERM, term)
    health = json.load(urllib.request.urlopen(a.server + "/health"))
    print(f"trainer: server health {health}", flush=True)
    os.makedirs(os.path.join(a.out, "checkpoints"), exist_ok=True)
    for step in range(1, a.steps + 1):
        if step == a.crash_at:
            print("trainer: boom: CUDA out of memory (simulated)", flush=True)
            sys.exit(3)
        if step == a.kill_self_at:
            os.kill(os.getpid(), signal.SIGKILL)
        with open(os.path.join(a.out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "reward_mean": step / 10, "server_has_secret": health["has_secret"]}) + "\n")
        if stopping:
            break
        time.sleep(0.2)
    ck = os.path.join(a.out, "checkpoints", f"step-{step}")
    os.makedirs(ck, exist_ok=True)
    open(os.path.join(ck, "model.safetensors"), "wb").write(b"weights")
    print(f"trainer: {'SIGTERM: ' if stopping else ''}saved checkpoint {ck}", flush=True)
    """
)


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    path = tmp_path / "standin.py"
    path.write_text(STANDIN)
    return path


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "sk-test-" + os.urandom(12).hex()
    monkeypatch.setenv(SECRET_ENV, value)
    return value


def _spec(standin: Path, *trainer_args: str, server_args: tuple[str, ...] = ()) -> RunSpec:
    py = sys.executable
    return RunSpec(
        kind="standin",
        config={"note": "stand-in run"},
        processes=[
            ProcessSpec(
                name="server",
                argv=[py, str(standin), "server", *server_args],
                secret_env=[SECRET_ENV],
                ready=ReadyCheck(kind="http", path="/health", timeout_s=120),
            ),
            ProcessSpec(
                name="trainer",
                argv=[
                    py,
                    str(standin),
                    "trainer",
                    "--server",
                    "{server.url}",
                    "--out",
                    "{run_dir}",
                    *trainer_args,
                ],
                ready=ReadyCheck(kind="file_line", path="metrics.jsonl", timeout_s=120),
            ),
        ],
    )


async def _until_ended(manager: Manager, run_id: str, limit_s: float = 120.0) -> RunState:
    """Poll the run until it ended (a bound, not a measurement: a hung run fails the test)."""
    deadline = time.monotonic() + limit_s
    while True:
        state = await manager.status(run_id)
        if state.ended or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.1)


def _group_empty(state: RunState) -> bool:
    return all(not procs.group_members(p.pgid) for p in state.processes if p.pgid)


def _assert_no_secret_anywhere(secret: str, run_dir: Path) -> None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            assert secret not in " ".join(procs.cmdline(int(entry.name))), (
                f"secret in argv of pid {entry.name}"
            )
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f"secret written to {f}"


async def test_start_ready_secret_env_only_and_graceful_stop(
    tmp_path: Path, standin: Path, secret: str
) -> None:
    manager = Manager(tmp_path / "runs")
    state = await manager.start(_spec(standin))
    try:
        assert state.status == "running", state.reason
        server, trainer = state.process("server"), state.process("trainer")
        assert server.url and server.url.startswith("http://127.0.0.1:")
        # the trainer got the server's ready URL and started only after /health answered
        assert server.url in trainer.argv
        assert trainer.pgid != server.pgid and trainer.pgid == trainer.pid  # own groups
        run_dir = Path(state.dir)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert rows and rows[0]["step"] == 1
        # The server saw the key (environment) and nothing shows it: argv of every process, files.
        assert rows[0]["server_has_secret"] is True
        _assert_no_secret_anywhere(secret, run_dir)
        config = (run_dir / "config.yaml").read_text()
        assert SECRET_ENV in config  # by name only
        # key-like variables not named by a process do not reach it
        trainer_child = [pid for pid in procs.group_members(trainer.pgid or 0) if pid != trainer.pid]
        assert trainer_child
        environ = await asyncio.to_thread(Path(f"/proc/{trainer_child[0]}/environ").read_bytes)
        assert SECRET_ENV.encode() not in environ
    finally:
        stopped = await manager.stop(state.id, grace_s=30)
    assert stopped.status == "stopped"
    trainer = stopped.process("trainer")
    assert trainer.status == "stopped" and trainer.stop_signal == "SIGTERM" and trainer.exit_code == 0
    assert "SIGTERM: saved checkpoint" in (Path(stopped.dir) / "trainer.log").read_text()
    assert "server: SIGTERM" in (Path(stopped.dir) / "server.log").read_text()
    assert _group_empty(stopped)
    results = manager.results(state.id)
    assert results.metric_lines >= 1 and results.metrics["step"].first == 1
    assert results.checkpoints and results.checkpoints[-1].endswith(
        "checkpoints/step-" + str(int(results.metrics["step"].last))
    )


async def test_trainer_crash_is_reported_with_exit_code_and_log_and_the_server_stopped(
    tmp_path: Path, standin: Path, secret: str
) -> None:
    manager = Manager(tmp_path / "runs")
    state = await manager.start(_spec(standin, "--crash-at", "3"))
    assert state.status == "running", state.reason
    ended = await _until_ended(manager, state.id)
    assert ended.status == "failed"
    assert ended.reason is not None
    assert "process trainer exited with code 3" in ended.reason
    assert "boom: CUDA out of memory" in ended.reason  # the log tail says why
    assert ended.process("trainer").exit_code == 3
    server = ended.process("server")
    assert server.status == "stopped" and server.stop_signal == "SIGTERM"
    assert _group_empty(ended)


async def test_trainer_killed_by_a_signal_is_reported_by_signal_name(
    tmp_path: Path, standin: Path, secret: str
) -> None:
    manager = Manager(tmp_path / "runs")
    state = await manager.start(_spec(standin, "--kill-self-at", "2"))
    ended = await _until_ended(manager, state.id)
    assert ended.status == "failed"
    assert ended.reason is not None and "trainer was killed by SIGKILL" in ended.reason
    assert ended.process("trainer").signal == "SIGKILL"


async def test_a_process_dying_before_it_is_ready_fails_the_start(
    tmp_path: Path, standin: Path, secret: str
) -> None:
    manager = Manager(tmp_path / "runs")
    state = await manager.start(_spec(standin, server_args=("--fail-start",)))
    assert state.status == "failed"
    assert state.reason is not None
    assert state.reason.startswith("process server exited with code 2 before it was ready")
    assert "weights missing" in state.reason
    assert state.process("trainer").status == "pending"  # never started
    assert _group_empty(state)


async def test_stop_forces_a_process_that_ignores_sigterm(tmp_path: Path, standin: Path, secret: str) -> None:
    manager = Manager(tmp_path / "runs")
    state = await manager.start(_spec(standin, "--ignore-term"))
    assert state.status == "running", state.reason
    stopped = await manager.stop(state.id, grace_s=1.0)
    assert stopped.status == "stopped"
    trainer = stopped.process("trainer")
    assert trainer.stop_signal == "SIGKILL" and trainer.status == "stopped"
    assert "ignoring SIGTERM" in (Path(stopped.dir) / "trainer.log").read_text()
    assert _group_empty(stopped)


def test_a_restarted_manager_picks_the_run_up(tmp_path: Path, standin: Path, secret: str) -> None:
    """One process starts the run and exits; a new process (and a new Manager) finds it running,
    then finished with the exit code its supervisor recorded, and can stop runs it did not start."""
    runs = tmp_path / "runs"
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(_spec(standin, "--steps", "15").model_dump_json())
    starter = textwrap.dedent(
        f"""
        import asyncio, sys
        from trajforge.rl.runs.manager import Manager
        from trajforge.rl.runs.schema import RunSpec
        spec = RunSpec.model_validate_json(open({str(spec_file)!r}).read())
        state = asyncio.run(Manager({str(runs)!r}).start(spec))
        print(state.id, state.status)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", starter], capture_output=True, text=True, check=True, timeout=300
    )
    run_id, status = out.stdout.split()
    assert status == "running"
    checker = textwrap.dedent(
        f"""
        import asyncio, time
        from trajforge.rl.runs.manager import Manager
        async def main():
            m = Manager({str(runs)!r})
            first = await m.status({run_id!r})
            deadline = time.monotonic() + 120
            while not (s := await m.status({run_id!r})).ended and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            print(first.status, s.status, s.process("trainer").exit_code, s.process("server").status)
        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", checker], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.split() == ["running", "finished", "0", "stopped"]
    # and a third manager, in this process, reads the same ended run from disk
    final = asyncio.run(Manager(runs).status(run_id))
    assert final.status == "finished" and final.reason == "trainer exited with code 0"
    assert _group_empty(final)


def test_a_reused_pid_is_not_mistaken_for_the_run_process(tmp_path: Path) -> None:
    """A pid with another start time is someone else's process: not alive, never signalled."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        ticks = procs.start_ticks(proc.pid)
        assert ticks is not None and procs.alive(proc.pid, ticks)
        assert not procs.alive(proc.pid, ticks - 1)
        state = RunState(id="x", kind="k", dir=str(tmp_path), processes=[])
        manager = Manager(tmp_path)
        (tmp_path / "x").mkdir()
        state.dir = str(tmp_path / "x")
        from trajforge.rl.runs.schema import ProcessState

        state.processes = [
            ProcessState(
                name="trainer",
                argv=["x"],
                log="trainer.log",
                pid=proc.pid,
                pgid=proc.pid,
                start_ticks=ticks - 1,
                status="running",
            )
        ]
        (tmp_path / "x" / "state.json").write_text(state.model_dump_json())
        after = asyncio.run(manager.stop("x", grace_s=0.5))
        assert proc.poll() is None  # untouched
        assert after.process("trainer").status == "vanished"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(900)
def test_cli_runs_the_real_trainer_and_stops_its_whole_process_group(tmp_path: Path) -> None:
    """`trajforge rl start` on a tiny random model returns once `trajforge rl train` wrote its
    first metrics line; `status`, `results`, `logs` and `stop` each run as a new process; stop
    ends the trainer and the `trajforge serve` it started (same process group)."""
    from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

    model_dir = tmp_path / "tiny-model"
    build_tiny_model(model_dir, build_tiny_tokenizer(model_dir))
    (tmp_path / "train.yaml").write_text(
        "groups_per_step: 1\ngroup_size: 2\nmax_tokens: 24\nmax_turns: 1\nconcurrency: 2\n"
        "max_batch: 4\nmicro_batch: 4\nenv_overrides:\n  families: [arithmetic]\n"
    )
    runs = tmp_path / "runs"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-c",
                "from trajforge.cli.main import main; main()",
                "rl",
                *args,
                "--output-dir",
                str(runs),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )

    started = cli(
        "start",
        "tiny_tasks",
        "--model-path",
        str(model_dir),
        "--steps",
        "500",
        "--config",
        "train.yaml",
        "--run-name",
        "tiny",
    )
    assert started.returncode == 0, started.stdout + started.stderr
    assert "running" in started.stdout
    status = json.loads(cli("status", "tiny", "--json").stdout)
    assert status["status"] == "running"
    trainer = status["processes"][0]
    # supervisor, trainer and the trainer's own inference server share the group
    assert len(procs.group_members(trainer["pgid"])) >= 3
    results = json.loads(cli("results", "tiny", "--json").stdout)
    assert results["metric_lines"] >= 1 and "reward_mean" in results["last"]
    assert "==> trainer <==" in cli("logs", "tiny", "--lines", "5").stdout
    stopped = cli("stop", "tiny", "--grace", "60")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    final = json.loads(cli("status", "tiny", "--json").stdout)
    assert final["status"] == "stopped"
    assert final["processes"][0]["stop_signal"] == "SIGTERM"
    assert not procs.group_members(trainer["pgid"])
    train_yaml = (runs / "tiny" / "train.yaml").read_text()
    assert "steps: 500" in train_yaml and "families:\n  - arithmetic" in train_yaml


@pytest.mark.parametrize(
    ("sig", "reason"),
    [
        (signal.SIGINT, "the start was interrupted before every process was ready"),
        (signal.SIGKILL, "ended before every process was ready"),
    ],
)
def test_a_start_that_dies_before_the_run_is_ready_leaves_nothing_running(
    tmp_path: Path, sig: signal.Signals, reason: str
) -> None:
    """Ctrl-C on `rl start` stops what it started; a starter killed outright is noticed by the
    next manager (its pid and start time are in the state), which fails the run and stops it."""
    runs = tmp_path / "runs"
    spec = RunSpec(
        run_id="r",
        processes=[
            ProcessSpec(
                name="trainer",
                argv=[sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(600)"],
                ready=ReadyCheck(kind="file_line", path="never.jsonl", timeout_s=600),
            )
        ],
    )
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # Ctrl-C as a terminal delivers it: a test run started in the background by a
            # non-interactive shell ignores SIGINT, a child inherits that, and the case would hang.
            "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "import asyncio; from trajforge.rl.runs.manager import Manager; from trajforge.rl.runs.schema import RunSpec; "
            f"asyncio.run(Manager({str(runs)!r}).start(RunSpec.model_validate_json(open({str(tmp_path / 'spec.json')!r}).read())))",
        ]
    )
    log = runs / "r" / "trainer.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and b"loading" in log.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert asyncio.run(Manager(runs).status("r")).status == "starting"
    starter.send_signal(sig)
    starter.wait(timeout=120)
    state = asyncio.run(Manager(runs).status("r"))
    assert state.status == "failed"
    assert state.reason is not None and reason in state.reason
    assert state.process("trainer").status == "stopped"
    assert _group_empty(state)


@pytest.mark.parametrize("bad", ["run-1\n", "run-1\r\n", "a\nb", "-x", "../x", "x/y", "", "a" * 101])
def test_run_ids_are_matched_whole_a_trailing_newline_included(tmp_path: Path, bad: str) -> None:
    """``re.match(r"^...$")`` let ``"run-1\\n"`` through (``$`` matches before a final newline):
    a run directory whose name ends in a newline. Every id and name is matched whole now."""
    from pydantic import ValidationError

    from trajforge.rl.runs.schema import RunError

    spec = {"processes": [{"name": "trainer", "argv": ["true"]}]}
    with pytest.raises(ValidationError, match="run id"):
        RunSpec.model_validate({**spec, "run_id": bad})
    manager = Manager(tmp_path)
    if bad and "/" not in bad and bad not in {"..", "."}:
        (tmp_path / bad).mkdir(exist_ok=True)
        (tmp_path / bad / "state.json").write_text("{}")  # even a directory of that name is no run
    with pytest.raises(RunError, match="no run"):
        manager.run_dir(bad)


@pytest.mark.parametrize("bad", ["trainer\n", "Trainer", "a b", ""])
def test_process_names_are_matched_whole(bad: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="process name"):
        ProcessSpec(name=bad, argv=["true"])


def test_rl_start_refuses_a_run_id_with_a_newline(tmp_path: Path) -> None:
    """The CLI answers with one error line and starts nothing."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from trajforge.cli.main import main; main()",
            "rl",
            "start",
            "tiny_tasks",
            "--output-dir",
            str(tmp_path / "runs"),
            "--run-name",
            "run-1\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "run id" in done.stderr
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []
