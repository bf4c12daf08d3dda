"""The YC-Bench driver: runs under the benchmark's own interpreter (Python >= 3.12 with the
``yc-bench`` package), never under trajforge's. Standard library at module level; ``yc_bench`` is
imported inside the functions, after :func:`_deterministic_ids` is in place.

Three modes, one per caller:

``cli ARGS...``
    The agent's ``yc-bench`` in the sandbox (a read-only wrapper script execs this). One published
    CLI command per process, exactly as the published benchmark runs them, against the game's
    SQLite database in ``$HOME/.yc_bench/``; the command is appended to the command log first.
``replay --game G --log L --dir D``
    The verifier: a fresh database seeded from the item's own game settings, every logged
    command run through the same published CLI in order, then the outcome as one JSON line.
``plan --game G``
    The oracle: a greedy CEO played through the same CLI in-process; prints the commands it ran.

Why ids are derived, not random: the package names every row with ``uuid4()``, so two runs of
the same commands would name the same tasks differently and a log could not be replayed. Here
``uuid4`` yields ``uuid(sha256(seed, command index, k))`` instead: the same commands from the
same seed give the same ids in the agent's sandbox, in the verifier's replay and in the oracle's
plan. Nothing else of the package is changed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import io
import json
import os
import shlex
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_DIR = ".yc_bench"
GAME_FILE = "game.json"
LOG_FILE = "commands.jsonl"
DB_FILE = "sim.db"
MAX_ARGV_BYTES = 64 << 10

# What the agent may run: the published agent-facing commands (the system prompt's list). The
# package's own `run`/`start` (an LLM loop) and `sim init` (the world is the item's) are refused.
ALLOWED = {
    "company": {"status"},
    "employee": {"list"},
    "market": {"browse"},
    "task": {"accept", "assign", "dispatch", "cancel", "list", "inspect"},
    "finance": {"ledger"},
    "report": {"monthly"},
    "scratchpad": {"read", "write", "append", "clear"},
    "sim": {"resume"},
}


class _Ids:
    """The replacement for ``uuid.uuid4``: a pure function of (seed, scope, k)."""

    def __init__(self) -> None:
        self.seed = 0
        self.scope = "init"
        self.k = 0

    def at(self, seed: int, scope: str) -> None:
        self.seed, self.scope, self.k = seed, scope, 0

    def __call__(self) -> uuid.UUID:
        self.k += 1
        digest = hashlib.sha256(f"yc-bench:{self.seed}:{self.scope}:{self.k}".encode()).digest()
        return uuid.UUID(bytes=digest[:16], version=4)


_IDS = _Ids()


def _deterministic_ids() -> None:
    if "yc_bench" in sys.modules:  # the models captured uuid4 at import: too late
        raise RuntimeError("yc_bench was imported before the deterministic ids were installed")
    uuid.uuid4 = _IDS


def policy_problem(argv: list[str]) -> str | None:
    """Why ``argv`` (the words after ``yc-bench``) is not an agent command; None when it is."""
    if not argv:
        return "usage: yc-bench GROUP COMMAND [OPTIONS] (see the system prompt's command list)"
    if any(not isinstance(a, str) for a in argv) or sum(len(a) for a in argv) > MAX_ARGV_BYTES:
        return "invalid command"
    if argv[0] in ("--help", "-h"):
        return None
    subs = ALLOWED.get(argv[0])
    if subs is None:
        return f"`yc-bench {argv[0]}` is not an agent command here; groups: {', '.join(sorted(ALLOWED))}"
    if len(argv) < 2 or argv[1] in ("--help", "-h"):
        return None if len(argv) >= 2 else f"usage: yc-bench {argv[0]} {{{','.join(sorted(subs))}}} ..."
    if argv[1] not in subs:
        return f"`yc-bench {argv[0]} {argv[1]}` is not an agent command; {argv[0]}: {', '.join(sorted(subs))}"
    return None


# --------------------------------------------------------------------------------- the world


def _load_game(path: Path) -> dict[str, Any]:
    game = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(game, dict) or not isinstance(game.get("seed"), int) or not game.get("preset"):
        raise ValueError(f"{path}: not a yc_bench game (needs seed and preset)")
    return game


def _use(game: dict[str, Any], db: Path) -> None:
    """Point the package at this game: its database and its preset (the package reads both from
    the environment: ``DATABASE_URL``, ``YC_BENCH_EXPERIMENT``)."""
    os.environ["DATABASE_URL"] = f"sqlite:///{db.resolve()}"
    os.environ["YC_BENCH_EXPERIMENT"] = str(game["preset"])
    for name in ("YC_BENCH_MODEL", "YC_BENCH_AUTO_ADVANCE_TURNS"):
        os.environ.pop(name, None)


def start_time(game: dict[str, Any]) -> dt.datetime:
    day = dt.date.fromisoformat(str(game.get("start_date", "2025-01-01")))
    return dt.datetime(day.year, day.month, day.day, 9, 0, tzinfo=dt.UTC)


def horizon_end_of(game: dict[str, Any], start: dt.datetime, years: int) -> dt.datetime:
    months = game.get("horizon_months")
    if months is None:
        return start.replace(year=start.year + years)
    total = start.month - 1 + int(months)
    return start.replace(year=start.year + total // 12, month=total % 12 + 1)


def ensure_world(game: dict[str, Any]) -> None:
    """Seed the game's world into the (current) database unless it is there: what the published
    runner's ``_init_simulation`` does, with the item's preset, seed and horizon."""
    from yc_bench.config import load_config
    from yc_bench.core.events import insert_event
    from yc_bench.db.models.event import EventType
    from yc_bench.db.models.sim_state import SimState
    from yc_bench.db.session import build_engine, build_session_factory, init_db, session_scope
    from yc_bench.services.seed_world import SeedWorldRequest, seed_world_transactional

    engine = build_engine()
    init_db(engine)
    with session_scope(build_session_factory(engine)) as db:
        if db.query(SimState).first() is not None:
            return
        cfg = load_config(str(game["preset"]))
        start = start_time(game)
        end = horizon_end_of(game, start, cfg.sim.horizon_years)
        _IDS.at(int(game["seed"]), "init")
        world = cfg.world
        req = SeedWorldRequest(
            run_seed=int(game["seed"]),
            company_name=str(game.get("company_name", "BenchCo")),
            horizon_years=cfg.sim.horizon_years,
            employee_count=world.num_employees,
            market_task_count=world.num_market_tasks,
            start_date=start,
            cfg=world,
        )
        result = seed_world_transactional(db, req)
        insert_event(
            db=db,
            company_id=result.company_id,
            event_type=EventType.HORIZON_END,
            scheduled_at=end,
            payload={"reason": "horizon_end"},
            dedupe_key="horizon_end",
        )
        db.add(
            SimState(
                company_id=result.company_id,
                sim_time=start,
                run_seed=int(game["seed"]),
                horizon_end=end,
                replenish_counter=0,
            )
        )
        db.flush()
    engine.dispose()


def run_command(argv: list[str]) -> tuple[int, str]:
    """One published CLI command in this process: (exit code, what it printed)."""
    import click
    from yc_bench.cli import app

    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            ret = app(args=argv, prog_name="yc-bench", standalone_mode=False)
            code = ret if isinstance(ret, int) else 0
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
        except click.exceptions.Abort:
            code = 1
        except Exception as exc:  # a command's own failure is the command's outcome, as in a process
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            code = 1
    return code, out.getvalue()


def _utc(when: dt.datetime) -> dt.datetime:
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def outcome(game: dict[str, Any]) -> dict[str, Any]:
    """The simulation's result as the published benchmark reports it (survival, funds at the end,
    prestige), plus how far the game got."""
    from sqlalchemy import func
    from yc_bench.config import load_config
    from yc_bench.db.models.company import Company, CompanyPrestige
    from yc_bench.db.models.sim_state import SimState
    from yc_bench.db.models.task import Task, TaskStatus
    from yc_bench.db.session import build_engine, build_session_factory, session_scope

    engine = build_engine()
    with session_scope(build_session_factory(engine)) as db:
        state = db.query(SimState).one()
        company = db.query(Company).filter(Company.id == state.company_id).one()
        prestige = [float(p.prestige_level) for p in db.query(CompanyPrestige).all()]
        counts = dict(
            db.query(Task.status, func.count(Task.id))
            .filter(Task.company_id == company.id)
            .group_by(Task.status)
            .all()
        )
        start = start_time(game)
        now, end = _utc(state.sim_time), _utc(state.horizon_end)  # SQLite gives them back naive
        span = (end - start).total_seconds()
        result = {
            "sim_time": now.isoformat(),
            "horizon_end": end.isoformat(),
            "progress": max(0.0, min(1.0, (now - start).total_seconds() / span)) if span > 0 else 0.0,
            "funds_cents": int(company.funds_cents),
            "initial_funds_cents": int(load_config(str(game["preset"])).world.initial_funds_cents),
            "bankrupt": company.funds_cents < 0,
            "horizon_reached": now >= end,
            "max_prestige": max(prestige, default=1.0),
            "mean_prestige": sum(prestige) / len(prestige) if prestige else 1.0,
            "tasks_succeeded": int(counts.get(TaskStatus.COMPLETED_SUCCESS, 0)),
            "tasks_failed": int(counts.get(TaskStatus.COMPLETED_FAIL, 0)),
            "tasks_cancelled": int(counts.get(TaskStatus.CANCELLED, 0)),
        }
    engine.dispose()
    return result


# ------------------------------------------------------------------------------------ modes


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One command at a time per game: the agent's run is then the serial run the replay is."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))
    except FileNotFoundError:
        return 0


def cli(argv: list[str]) -> int:
    problem = policy_problem(argv)
    if problem is not None:
        print(json.dumps({"error": problem}))
        return 2
    home = Path(os.environ.get("HOME") or ".")
    state = home / STATE_DIR
    try:
        game = _load_game(state / GAME_FILE)
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": f"no game here ({exc}); run yc-bench from the task's working directory"}))
        return 2
    _deterministic_ids()
    _use(game, state / DB_FILE)
    with _locked(state / "lock"):
        ensure_world(game)
        log = state / LOG_FILE
        index = _count_lines(log)
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"argv": argv}) + "\n")
        _IDS.at(int(game["seed"]), f"cmd:{index}")
        code, printed = run_command(argv)
    sys.stdout.write(printed)
    return code


def _fresh_world(game: dict[str, Any], work: Path) -> Path:
    """A new database in ``work`` holding the item's world at its start (the replay's and the
    oracle's); any earlier one there is removed first."""
    work.mkdir(parents=True, exist_ok=True)
    db = work / DB_FILE
    if db.exists():
        db.unlink()
    _use(game, db)
    ensure_world(game)
    return db


def replay(game_path: Path, log_path: Path, work: Path, max_commands: int) -> dict[str, Any]:
    """The verifier's recomputation: the item's world from scratch, the log's commands in order.
    A line that is not a command the agent may run counts as refused and changes nothing (its
    index is used all the same: the agent's own run counted it)."""
    game = _load_game(game_path)
    _deterministic_ids()
    _fresh_world(game, work)
    refused = failed = ran = 0
    with log_path.open("rb") as f:
        for index, raw in enumerate(f):
            if index >= max_commands:
                refused += 1
                continue
            try:
                argv = json.loads(raw)["argv"]
                if not isinstance(argv, list) or policy_problem(argv) is not None:
                    raise ValueError(argv)
            except (ValueError, KeyError, TypeError):
                refused += 1
                continue
            _IDS.at(int(game["seed"]), f"cmd:{index}")
            code, _ = run_command(argv)
            ran += 1
            failed += code != 0
    return {**outcome(game), "commands": ran, "failed": failed, "refused": refused}


# ------------------------------------------------------------------------------------ oracle


class _Play:
    """The in-process game the oracle plans on, recording every command it runs."""

    def __init__(self, game: dict[str, Any]) -> None:
        self.game = game
        self.commands: list[list[str]] = []

    @property
    def rounds(self) -> int:
        return sum(argv[:2] == ["sim", "resume"] for argv in self.commands)

    def run(self, *argv: str) -> Any:
        """An act: recorded, so the agent runs it too (at the same index: the same ids)."""
        _IDS.at(int(self.game["seed"]), f"cmd:{len(self.commands)}")
        self.commands.append(list(argv))
        return self.look(*argv)

    def look(self, *argv: str) -> Any:
        """A read the oracle makes to decide, not recorded: reads change nothing, and the agent
        does not need them (the replay's final state checks that they changed nothing)."""
        code, printed = run_command(list(argv))
        if code != 0:
            raise RuntimeError(f"yc-bench {shlex.join(argv)} failed ({code}): {printed[-300:]}")
        return json.loads(printed)


def _hours_needed(task: dict[str, Any], employees: list[dict[str, Any]]) -> float:
    """Business hours for the whole team on this one task (the slowest domain decides)."""
    worst = 0.0
    for req in task["requirements"]:
        rate = sum(float(e["skills"].get(req["domain"], 0.0)) for e in employees)
        if rate <= 0:
            return float("inf")
        worst = max(worst, float(req["required_qty"]) / rate)
    return worst


def plan(game: dict[str, Any], work: Path, max_rounds: int = 250) -> list[list[str]]:
    """A greedy CEO: one task at a time with the whole team, the best-paying per hour among those
    the team finishes well before the deadline; ``sim resume`` until it is done; again.

    ``max_rounds``: the decision rounds (each ending in a ``sim resume``) it may use: the agent's
    turn budget. Skills compound with every task, so late in a year tasks finish within hours and
    the rounds would grow without end; with five rounds left it stops taking work and resumes to
    the horizon."""
    _deterministic_ids()
    from yc_bench.config import load_config

    _fresh_world(game, work)
    world = load_config(str(game["preset"])).world
    day_hours = world.workday_end_hour - world.workday_start_hour
    p = _Play(game)
    team = p.look("employee", "list")["employees"]
    while True:
        status = p.look("company", "status")
        if status["risk"]["bankrupt"] or status["sim_time"] >= status["horizon_end"]:
            break
        if p.rounds >= max_rounds - 5:  # nearly out of turns (a task takes 2-3): let the year run out
            resumed = p.run("sim", "resume")
            if resumed.get("terminal_reason") or resumed.get("message") == "no_pending_events":
                break
            continue
        level = int(max(status["prestige"].values(), default=1.0))
        market = p.look("market", "browse", "--required-prestige-lte", str(level), "--limit", "200")
        best: tuple[float, dict[str, Any]] | None = None
        for task in market["tasks"]:
            hours = _hours_needed(task, team)
            total = sum(float(r["required_qty"]) for r in task["requirements"])
            deadline = max(world.deadline_min_biz_days, int(total / world.deadline_qty_per_day)) * day_hours
            if hours <= 0.8 * deadline:
                value = task["reward_funds_cents"] / max(hours, 1.0)
                if best is None or value > best[0]:
                    best = (value, task)
        if best is None:
            resumed = p.run("sim", "resume")
            if resumed.get("terminal_reason") or resumed.get("message") == "no_pending_events":
                break
            continue
        tid = best[1]["task_id"]
        p.run("task", "accept", "--task-id", tid)
        for e in team:
            p.run("task", "assign", "--task-id", tid, "--employee-id", e["employee_id"])
        p.run("task", "dispatch", "--task-id", tid)
        while True:
            resumed = p.run("sim", "resume")
            finished = any(
                w.get("task_id") == tid and w.get("type") == "task_completed" for w in resumed["wake_events"]
            )
            if finished or resumed.get("terminal_reason") or resumed.get("message") == "no_pending_events":
                break
        if resumed.get("terminal_reason"):
            break
        team = p.look("employee", "list")["employees"]  # skills grow with every completed task
    p.run("company", "status")  # the final state, as the agent sees it
    return p.commands


def main(argv: list[str]) -> int:
    if argv[:1] == ["cli"]:
        return cli(argv[1:])
    import argparse

    parser = argparse.ArgumentParser(prog="yc_bench_driver")
    parser.add_argument("mode", choices=["replay", "plan", "prompt"])
    parser.add_argument("--game", type=Path)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR") or "/tmp") / "yc-bench")
    parser.add_argument("--max-commands", type=int, default=100_000)
    parser.add_argument("--max-rounds", type=int, default=250, help="plan: decision rounds at most")
    args = parser.parse_args(argv)
    if args.mode == "prompt":
        from yc_bench.agent.prompt import SYSTEM_PROMPT

        print(json.dumps({"system": SYSTEM_PROMPT}))
        return 0
    if args.game is None:
        parser.error("--game is required")
    if args.mode == "replay":
        if args.log is None:
            parser.error("replay needs --log")
        print(json.dumps(replay(args.game, args.log, args.dir, args.max_commands)))
        return 0
    print(json.dumps({"commands": plan(_load_game(args.game), args.dir, args.max_rounds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
