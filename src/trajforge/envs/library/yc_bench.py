"""``yc_bench``: YC-Bench (the ``yc-bench`` package, 0.1.0, MIT), the agent as CEO of an AI
startup over a simulated year, on the real package.

As in the published benchmark the agent acts only through the benchmark's own CLI
(``yc-bench company status``, ``market browse``, ``task accept/assign/dispatch``, ``sim resume``,
...), here with the terminal tool inside the rollout's sandbox. The package needs Python >= 3.12
and trajforge runs on 3.11, so the package lives in the benchmark virtualenv
(:mod:`trajforge.benchpython`, ``make bench-venv``): the sandbox sees it read-only at its own
path, with a ``yc-bench`` on ``PATH`` that runs each command through
:mod:`~trajforge.envs.library.yc_bench_driver` (the published CLI, the command appended to
``.yc_bench/commands.jsonl`` first, row ids derived from the seed and the command's index).

The reward is never read from the agent's database. The verifier reads the command log (bounded
by ``max_read_bytes``), and the driver, from the read-only virtualenv in a fresh exec after the
rollout's processes are gone, seeds the item's own world (preset, seed, horizon from the item, not
from the agent's files) into a new database and replays every logged command through the real
simulator. A line that is not an agent command is refused and counted. What the agent did to its
database, its game file or its log's past only changes what the agent saw.

Score: 0 when the company went bankrupt; otherwise the fraction of the horizon played times how
far the funds grew, on a log scale: ln(final / starting funds) / ln(``funds_target_multiple``),
0 at or below the start, 1 at the target (default 100x). The published benchmark reports survival
and final funds (its runs end between bankrupt and ~170x); this folds both into [0, 1].
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import secrets
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

from trajforge.benchpython import BenchPython, find_bench_python
from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.library import yc_bench_driver as driver
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.envs.verifier import SYSTEM_PATH
from trajforge.sandbox.types import SandboxConfig

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext

PACKAGES = ("yc-bench",)
STATE = driver.STATE_DIR
LOG_PATH = f"{STATE}/{driver.LOG_FILE}"
GAME_PATH = f"{STATE}/{driver.GAME_FILE}"
DRIVER_SOURCE = Path(driver.__file__).read_text(encoding="utf-8")
KEPT_LOG_BYTES = 1 << 20
"""The most of the command log an episode keeps for ``env rescore`` (~100 bytes a command; the
oracle plays a tutorial year in a few thousand)."""
PRESETS = (
    "tutorial",
    "easy",
    "medium",
    "hard",
    "nightmare",
    "challenge",
    "fast_test",
    "default",
    "high_reward",
)

PROMPT = """## Simulation Start — Take Immediate Action
- preset: {preset} (seed {seed})
- current_time: {start}
- horizon_end: {end}
- funds, payroll and runway: run `yc-bench company status`

Run every command with the terminal tool (`yc-bench ...`, from the working directory); each prints JSON.
Time only passes when you run `yc-bench sim resume`; the game ends at the horizon or at bankruptcy.

**Your immediate priority**: generate revenue before payroll drains your runway.
You MUST complete these steps now (multiple commands per turn are fine):
1. `yc-bench market browse --required-prestige-lte 1` — find tasks you can accept
2. `yc-bench task accept --task-id <UUID>` — accept 2-3 suitable tasks
3. `yc-bench employee list` — get employee IDs
4. `yc-bench task assign --task-id <UUID> --employee-id <UUID>` — assign employees
5. `yc-bench task dispatch --task-id <UUID>` — start work on each assigned task
6. `yc-bench sim resume` — advance time to collect the first task completion event

Do not spend multiple turns just browsing. Accept and dispatch tasks immediately. \
Keep playing until the horizon, then reply with a one-line summary."""


class YcBenchConfig(EnvConfig):
    # the env's defaults as field defaults too: a YAML config (`env eval --config`) starts from them
    enabled_toolsets: list[str] | None = Field(["terminal"], description="toolsets offered to every rollout")
    max_agent_turns: int = Field(300, ge=1, description="model calls per rollout (a year is hundreds)")
    group_size: int = Field(1, ge=1, description="rollouts per item (GRPO group)")
    sandbox_lifetime_s: float = Field(7200.0, gt=0, description="deadline of one rollout, reward included")
    reward_timeout_s: float = Field(900.0, gt=0, description="deadline of the verifier's replay")

    @model_validator(mode="before")
    @classmethod
    def _distribution_replaces_default_toolsets(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("distribution") is not None and "enabled_toolsets" not in data:
            return {**data, "enabled_toolsets": None}
        return data

    presets: list[str] = Field(
        default_factory=lambda: ["easy", "medium", "hard"],
        description="the package's presets, cycled over the items (eval item i: preset i mod n, seed "
        "1 + i div n, as the published tables' seeds 1-3)",
    )
    horizon_months: int | None = Field(
        None, ge=1, le=120, description="a shorter (or longer) game than the preset's years (smoke tests)"
    )
    bench_venv: str | None = Field(
        None, description="the benchmark virtualenv (Python >= 3.12 with yc-bench); default .venv-bench"
    )
    funds_target_multiple: float = Field(
        100.0,
        gt=1,
        description="funds at the end, as a multiple of the starting funds, that score 1 (on a log "
        "scale from 1x: 10x scores 0.5 with the default 100x)",
    )
    max_log_commands: int = Field(20_000, ge=1, description="log lines the replay runs at most")

    @model_validator(mode="after")
    def _known_presets(self) -> YcBenchConfig:
        unknown = [p for p in self.presets if p not in PRESETS]
        if unknown or not self.presets:
            raise ValueError(f"presets: {unknown or 'none'} not among the package's: {', '.join(PRESETS)}")
        return self


class YcBenchEnv(BaseEnv[YcBenchConfig]):
    name: ClassVar[str] = "yc_bench"
    description: ClassVar[str] = (
        "YC-Bench on the yc-bench package: a year as CEO through its CLI; reward = the replayed simulation"
    )
    config_class: ClassVar[type[EnvConfig]] = YcBenchConfig

    def __init__(self, config: EnvConfig | None = None) -> None:
        super().__init__(config)
        self._bench: BenchPython | None = None
        self._cli_dir: Path | None = None
        self._system: str | None = None
        self._plans: dict[str, list[list[str]]] = {}

    @classmethod
    def default_config(cls) -> EnvConfig:
        return YcBenchConfig()

    @property
    def cfg(self) -> YcBenchConfig:
        return self.config

    # ------------------------------------------------------------------ the benchmark interpreter

    def bench(self) -> BenchPython:
        """The benchmark virtualenv (found once; a ValueError-like ``BenchPythonError`` says how
        to make one)."""
        if self._bench is None:
            self._bench = find_bench_python(self.cfg.bench_venv, PACKAGES)
        return self._bench

    def cli_dir(self) -> Path:
        """A host directory holding ``yc-bench`` (a script that runs the driver with the bench
        interpreter) and the driver: named by its content, made once, bound read-only."""
        if self._cli_dir is None:
            python = self.bench().python
            script = (
                "#!/bin/sh\n# YC-Bench's CLI for trajforge's yc_bench env: each command is logged for "
                "the verifier's replay.\n"
                f'exec {shlex.quote(python)} -I "$(dirname "$0")/yc_bench_driver.py" cli "$@"\n'
            )
            digest = hashlib.sha256((script + DRIVER_SOURCE).encode()).hexdigest()[:16]
            cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trajforge"
            target = cache / f"yc-bench-{digest}"
            if not (target / "yc-bench").exists():
                cache.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=".yc-bench-", dir=cache))
                (tmp / "yc_bench_driver.py").write_text(DRIVER_SOURCE, encoding="utf-8")
                (tmp / "yc-bench").write_text(script, encoding="utf-8")
                os.chmod(tmp / "yc_bench_driver.py", 0o644)
                os.chmod(tmp / "yc-bench", 0o755)
                os.chmod(tmp, 0o755)
                try:
                    tmp.rename(target)
                except OSError:  # made by another process meanwhile: theirs is the same content
                    for f in tmp.iterdir():
                        f.unlink()
                    tmp.rmdir()
            self._cli_dir = target
        return self._cli_dir

    def sandbox_config(self, base: SandboxConfig) -> SandboxConfig:
        """The runner's sandbox config plus what this env's rollouts need: the benchmark
        virtualenv and the ``yc-bench`` directory read-only, that directory first on ``PATH``."""
        binds = [*base.ro_binds, *self.bench().ro_paths, str(self.cli_dir())]
        env = {**base.env, "PATH": f"{self.cli_dir()}:{SYSTEM_PATH}"}
        return base.model_copy(update={"ro_binds": list(dict.fromkeys(binds)), "env": env})

    async def setup(self) -> None:
        await super().setup()
        await asyncio.to_thread(self.system_prompt)

    # ------------------------------------------------------------------ items and prompt

    def generate(self, index: int, *, split: str) -> Item:
        presets = self.cfg.presets
        preset = presets[index % len(presets)]
        if split == "eval":
            seed = 1 + index // len(presets)
        else:
            seed = random.Random(f"yc_bench:{split}:{self.config.seed}:{index}").randrange(1000, 1 << 31)
        game = {"preset": preset, "seed": seed, "start_date": "2025-01-01", "company_name": "BenchCo"}
        if self.cfg.horizon_months is not None:
            game["horizon_months"] = self.cfg.horizon_months
        return {"id": f"yc-{split}-{index}-{preset}-s{seed}", "category": preset, "game": game}

    def system_prompt(self) -> str:
        """The published agent's system prompt (``yc_bench.agent.prompt.SYSTEM_PROMPT``), read from
        the package once, its ``run_command`` tool named as the terminal here."""
        if self.config.system_prompt is not None:
            return self.config.system_prompt
        if self._system is None:
            done = self._driver(["prompt"], timeout=60)
            text = str(json.loads(done)["system"])
            self._system = text.replace(
                "performed via the `run_command` tool, which executes `yc-bench` CLI commands",
                "performed by running `yc-bench` CLI commands with the terminal tool",
            ).replace(
                "Use `run_command` to execute CLI commands", "Run `yc-bench` commands with the terminal tool"
            )
        return self._system

    def format_prompt(self, item: Item) -> str:
        game = item["game"]
        start = driver.start_time(game)
        months = game.get("horizon_months")
        end = driver.horizon_end_of(game, start, 1) if months is not None else None
        return PROMPT.format(
            preset=game["preset"],
            seed=game["seed"],
            start=start.isoformat(),
            end=end.isoformat() if end is not None else "see `yc-bench company status`",
        )

    def setup_files(self, item: Item) -> dict[str, str]:
        return {GAME_PATH: json.dumps(item["game"])}

    # ------------------------------------------------------------------ reward

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        try:
            log = await ctx.read_file(LOG_PATH)  # bounded: over max_read_bytes raises, scoring 0
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            log = b""
        box = f"yc-verify-{secrets.token_hex(8)}"
        await ctx.sandbox.write_scratch_bytes(f"{box}/game.json", json.dumps(item["game"]).encode())
        await ctx.sandbox.write_scratch_bytes(f"{box}/log.jsonl", log)
        where = f"{ctx.sandbox.scratch_dir}/{box}"
        res = await ctx.exec(
            [
                self.bench().python,
                "-I",
                str(self.cli_dir() / "yc_bench_driver.py"),
                "replay",
                "--game",
                f"{where}/game.json",
                "--log",
                f"{where}/log.jsonl",
                "--max-commands",
                str(self.cfg.max_log_commands),
            ],
            timeout=self.config.reward_timeout_s,
        )
        if not res.ok:
            why = (res.stderr or res.stdout).decode(errors="replace")[-500:]
            raise RuntimeError(f"the replay failed ({res.exit_code}): {why}")
        return score(json.loads(res.stdout.strip().splitlines()[-1]), self.cfg.funds_target_multiple)

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        """The command log, for ``env rescore``: at most ``KEPT_LOG_BYTES`` of it, cut after its
        last whole line within the bound, and the record says so (``log_cut``)."""
        try:
            raw = await ctx.read_file(LOG_PATH, limit=KEPT_LOG_BYTES + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            raw = b""
        if len(raw) <= KEPT_LOG_BYTES:
            return {"log": raw.decode(errors="replace")}
        cut = raw[: raw.rfind(b"\n", 0, KEPT_LOG_BYTES) + 1]
        return {
            "log": cut.decode(errors="replace"),
            "log_cut": f"the log is over {KEPT_LOG_BYTES} bytes: only its first {len(cut)} bytes (whole "
            "lines) are kept, so this episode is not rescored offline",
        }

    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> RewardBreakdown | None:
        """The kept log replayed again, on this host, by the same driver (in a temporary directory)."""
        if "log" not in kept or kept.get("log_cut"):
            return None  # nothing kept, or only part of the log: replaying it would be another game
        out = await asyncio.to_thread(self._replay_here, item["game"], str(kept["log"]))
        return score(out, self.cfg.funds_target_multiple)

    def _replay_here(self, game: dict[str, Any], log: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="yc-bench-") as tmp:
            (Path(tmp) / "game.json").write_text(json.dumps(game), encoding="utf-8")
            (Path(tmp) / "log.jsonl").write_text(log, encoding="utf-8")
            args = ["replay", "--game", f"{tmp}/game.json", "--log", f"{tmp}/log.jsonl", "--dir", f"{tmp}/db"]
            args += ["--max-commands", str(self.cfg.max_log_commands)]
            out = self._driver(args, timeout=self.config.reward_timeout_s, cwd=tmp)
        parsed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return parsed

    def _driver(self, args: list[str], *, timeout: float, cwd: str | None = None) -> str:
        """Run the driver on the host with the bench interpreter; its stdout."""
        with tempfile.TemporaryDirectory(prefix="yc-bench-") as home:
            done = subprocess.run(
                [self.bench().python, "-I", str(self.cli_dir() / "yc_bench_driver.py"), *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd or home,
                env={"PATH": SYSTEM_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"},
                check=False,
            )
        if done.returncode != 0:
            raise RuntimeError(f"yc_bench driver {args[0]} failed ({done.returncode}): {done.stderr[-800:]}")
        return done.stdout

    # ------------------------------------------------------------------ oracle

    def plan(self, item: Item) -> list[list[str]]:
        """The greedy CEO's commands for this item, played in-process on the real simulator (the
        ids match the sandbox's: the same commands from the same seed)."""
        key = json.dumps({**item["game"], "turns": self.config.max_agent_turns}, sort_keys=True)
        if key not in self._plans:
            with tempfile.TemporaryDirectory(prefix="yc-bench-") as tmp:
                (Path(tmp) / "game.json").write_text(json.dumps(item["game"]), encoding="utf-8")
                rounds = str(max(6, self.config.max_agent_turns - 3))  # the final status, the answer
                args = ["plan", "--game", f"{tmp}/game.json", "--dir", f"{tmp}/db", "--max-rounds", rounds]
                out = self._driver(args, timeout=1800)
            self._plans[key] = json.loads(out.strip().splitlines()[-1])["commands"]
        return self._plans[key]

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """The plan as terminal calls, one decision round each (up to and including a ``sim resume``)."""
        calls: list[tuple[str, dict[str, Any]]] = []
        round_: list[str] = []
        for argv in self.plan(item):
            round_.append(shlex.join(["yc-bench", *argv]))
            if argv[:2] == ["sim", "resume"]:
                calls.append(("terminal", {"command": " && ".join(round_)}))
                round_ = []
        if round_:
            calls.append(("terminal", {"command": " && ".join(round_)}))
        return calls

    def oracle_answer(self, item: Item, messages: list[dict[str, Any]]) -> str:
        return "Played the greedy strategy to the end of the horizon."


def score(out: dict[str, Any], target_multiple: float) -> RewardBreakdown:
    """The replay's outcome as a reward in [0, 1] (module doc), every number kept as a component."""
    funds, initial = int(out["funds_cents"]), int(out["initial_funds_cents"])
    grown = funds / initial if initial > 0 else 0.0
    wealth = min(1.0, math.log(grown) / math.log(target_multiple)) if grown > 1 else 0.0
    survived = not out["bankrupt"]
    reward = float(out["progress"]) * wealth if survived else 0.0
    comps = {
        "survived": float(survived),
        "progress": float(out["progress"]),
        "funds": funds / 100,
        "wealth": wealth,
        "max_prestige": float(out["max_prestige"]),
        "tasks_succeeded": float(out["tasks_succeeded"]),
        "tasks_failed": float(out["tasks_failed"]),
        "commands": float(out["commands"]),
        "failed_commands": float(out["failed"]),
        "refused": float(out["refused"]),
    }
    reason = (
        f"{out['sim_time'][:10]} of {out['horizon_end'][:10]}, "
        + ("bankrupt" if not survived else f"funds ${funds / 100:,.0f}")
        + f", {int(out['tasks_succeeded'])} tasks done, {int(out['refused'])} log lines refused"
    )
    return RewardBreakdown(value=max(0.0, min(1.0, reward)), components=comps, reason=reason)
