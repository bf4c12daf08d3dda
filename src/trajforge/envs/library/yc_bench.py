"""``yc_bench``: run a simulated startup for a year, one CLI command at a time (long horizon).

The simulator (:mod:`trajforge.envs.library.ycsim`, standard library only) is copied into the
sandbox as ``ycsim`` with the item's game settings; the agent operates it through the terminal
over many turns (the year is 52 weeks and ``advance`` moves at most 4, so at least 13 calls
before any decision). It is for testing context growth and turn budgets as much as strategy.

The reward is the simulator's own ``score`` of the final state, computed in a fresh exec by a
copy of the simulator the verifier puts in place after the rollout, with the item's settings,
from the command log the rollout left. There is no state file to edit: the state is always
derived by replaying the log from the seed under the rules, so a hand-edited log can only be a
play the CLI would have accepted (refused lines are counted, not applied).
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.library import ycsim
from trajforge.envs.types import Item, RewardBreakdown

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext

SIM_PATH = "ycsim"
GAME_PATH = "ycsim_game.json"
LOG_PATH = ".ycsim/log.jsonl"
VERIFY_DIR = ".ycverify"
KEPT_LOG_BYTES = 256 << 10
"""The most of the command log an episode keeps for ``env rescore`` (a played year is ~20 KB)."""
SIM_SOURCE = Path(ycsim.__file__).read_text(encoding="utf-8")

PROMPT = """You are the CEO of a young SaaS startup, simulated by the command-line tool `ycsim` in your \
working directory. Run it with the terminal tool: `python3 ycsim COMMAND` (one command per call; \
every command prints JSON). `python3 ycsim help` lists the commands:

{commands}

The company starts at week 0 with ${cash:,.0f} in cash, two engineers, ten customers and a $49 \
monthly price. Difficulty: {difficulty}. The game lasts {horizon} weeks; time only passes when \
you run `advance` (at most 4 weeks per call). Salaries, marketing and infrastructure are paid \
weekly; customers pay the monthly price. If cash goes below zero the company is bankrupt.

Your score (from `python3 ycsim score`) is 0 if you go bankrupt; otherwise it is \
(weeks played / {horizon}) x min(1, your stake / ${target:,.0f}), where your stake is your \
ownership times the valuation (cash + 12 x MRR x a growth multiple). Play all {horizon} weeks, \
then reply with a one-line summary."""


class YcBenchConfig(EnvConfig):
    # the env's defaults as field defaults too: a YAML config (`env eval --config`) starts from them
    enabled_toolsets: list[str] | None = Field(["terminal"], description="toolsets offered to every rollout")
    max_agent_turns: int = Field(60, ge=1, description="model calls per rollout (a game is >= 13)")
    command_timeout_s: float = Field(30.0, gt=0, description="default timeout of one command")
    group_size: int = Field(2, ge=1, description="rollouts per item (GRPO group)")

    @model_validator(mode="before")
    @classmethod
    def _distribution_replaces_default_toolsets(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("distribution") is not None and "enabled_toolsets" not in data:
            return {**data, "enabled_toolsets": None}
        return data

    difficulties: list[str] = Field(
        default_factory=lambda: ["easy", "normal", "hard"], description="cycled over the items"
    )
    horizon_weeks: int = Field(52, ge=4, le=520, description="weeks in one game")


class YcBenchEnv(BaseEnv[YcBenchConfig]):
    name: ClassVar[str] = "yc_bench"
    description: ClassVar[str] = (
        "long horizon: run a simulated startup for a year through a CLI; reward = scored final state"
    )
    config_class: ClassVar[type[EnvConfig]] = YcBenchConfig

    @classmethod
    def default_config(cls) -> EnvConfig:
        return YcBenchConfig()

    def _settings(self) -> tuple[list[str], int]:
        cfg = self.config
        diffs = list(cfg.difficulties)
        for d in diffs:
            if d not in ycsim.DIFFICULTY:
                raise ValueError(f"difficulties: {d!r} is not one of {', '.join(ycsim.DIFFICULTY)}")
        return diffs, cfg.horizon_weeks

    def generate(self, index: int, *, split: str) -> Item:
        diffs, horizon = self._settings()
        difficulty = diffs[index % len(diffs)]
        seed = random.Random(f"yc_bench:{split}:{self.config.seed}:{index}").randrange(1 << 31)
        game = ycsim.Game(seed=seed, difficulty=difficulty, horizon=horizon)
        return {"id": f"yc-{split}-{index}-{difficulty}", "category": difficulty, "game": _game_dict(game)}

    def format_prompt(self, item: Item) -> str:
        game = _game(item)
        commands = "\n".join(f"- {usage}: {what}" for usage, what in ycsim.HELP.items())
        return PROMPT.format(
            commands=commands,
            cash=ycsim.DIFFICULTY[game.difficulty]["cash"],
            difficulty=game.difficulty,
            horizon=game.horizon,
            target=game.target,
        )

    def setup_files(self, item: Item) -> dict[str, str]:
        return {SIM_PATH: SIM_SOURCE, GAME_PATH: json.dumps(item["game"])}

    def verifier_files(self, item: Item) -> dict[str, str]:
        # Put in place after the rollout: whatever the agent did to its own copies is replaced.
        return {f"{VERIFY_DIR}/ycsim.py": SIM_SOURCE, f"{VERIFY_DIR}/game.json": json.dumps(item["game"])}

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        try:
            log = await ctx.read_file(LOG_PATH)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            log = b""
        await ctx.write_file(f"{VERIFY_DIR}/log.jsonl", log)
        res = await ctx.exec(
            [
                "python3",
                "-I",
                f"{VERIFY_DIR}/ycsim.py",
                "--game",
                f"{VERIFY_DIR}/game.json",
                "--log",
                f"{VERIFY_DIR}/log.jsonl",
                "score",
            ],
            timeout=120,
        )
        if not res.ok:
            raise RuntimeError(
                f"ycsim score failed ({res.exit_code}): {res.stderr.decode(errors='replace')[-500:]}"
            )
        return _breakdown(json.loads(res.stdout))

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        """The command log, for ``env rescore``: at most ``KEPT_LOG_BYTES`` of it (a rollout can
        leave a huge or sparse log: kept whole, a 20 MB one was a 126 MB line). A longer log is cut
        after its last whole line within the bound, and the record says so (``log_cut``)."""
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
        if "log" not in kept or kept.get("log_cut"):
            return None  # nothing kept, or only part of the log: replaying it would be another game
        game = _game(item)
        state, rejected = ycsim.replay(game, str(kept["log"]).splitlines())
        return _breakdown(ycsim.score(state, game, rejected))

    # ------------------------------------------------------------------ oracle

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """The best of a small grid of scripted strategies, planned with the simulator itself
        (it is deterministic, so the plan replays exactly in the sandbox)."""
        commands = plan(_game(item))
        return [
            ("terminal", {"command": f"python3 {SIM_PATH} {' '.join(c)}"}) for c in [["status"], *commands]
        ]

    def oracle_answer(self, item: Item, messages: list[dict[str, Any]]) -> str:
        return "Played the scripted strategy to the end of the horizon."


def _game_dict(game: ycsim.Game) -> dict[str, Any]:
    return {"seed": game.seed, "difficulty": game.difficulty, "horizon": game.horizon, "target": game.target}


def _game(item: Item) -> ycsim.Game:
    g = item["game"]
    return ycsim.Game(
        seed=int(g["seed"]),
        difficulty=str(g["difficulty"]),
        horizon=int(g.get("horizon", 52)),
        target=float(g.get("target", 0.0)),
    )


def _breakdown(scored: dict[str, Any]) -> RewardBreakdown:
    comps = {k: float(v) for k, v in scored["components"].items()}
    reason = (
        f"week {scored['week']}/{scored['horizon']}, "
        + ("bankrupt" if comps["survived"] == 0 else f"stake ${comps['stake']:,.0f}")
        + f", {int(comps['rejected'])} log lines refused"
    )
    return RewardBreakdown(reward=float(scored["reward"]), components=comps, reason=reason)


def _strategy(
    game: ycsim.Game, price_f: float, marketing: int, sales: int, eng: int, raise_amt: int
) -> tuple[float, list[list[str]]]:
    """Play one scripted strategy in-process; (reward, the accepted commands)."""
    st = ycsim.new_state(game)
    cmds: list[list[str]] = []

    def do(*args: object) -> None:
        words = [str(a) for a in args]
        try:
            ycsim.apply(st, game, words[0], words[1:])
        except ycsim.CommandError:
            return
        cmds.append(words)

    do("set-price", round(st.wtp * price_f))
    if eng > 2:
        do("hire", "eng", eng - 2)
    if sales:
        do("hire", "sales", sales)
    for f in sorted(st.roadmap, key=lambda f: -f.gain / f.effort):
        do("ship", f.name)
    do("spend", "marketing", marketing)
    while st.week < game.horizon and not st.dead:
        need = int(st.customers / ycsim.CUSTOMERS_PER_SUPPORT) - st.team["support"]
        if need > 0:
            do("hire", "support", min(5, need))
        if raise_amt and st.week >= 8 and st.week - st.last_raise_week >= ycsim.RAISE_EVERY_WEEKS:
            do("raise", raise_amt)
        if st.customers > 0.9 * st.market and st.marketing > 0:
            do("spend", "marketing", 0)
        do("advance", ycsim.MAX_ADVANCE)
    return float(ycsim.score(st, game)["reward"]), cmds


def plan(game: ycsim.Game) -> list[list[str]]:
    """The commands of the best strategy on a small grid (what the oracle runs)."""
    grid = itertools.product(
        [0.5, 0.7, 0.85], [2000, 5000, 10000, 20000], [0, 2, 4, 6], [2, 3], [0, 300_000, 500_000]
    )
    best: tuple[float, list[list[str]]] | None = None
    for params in grid:
        reward, cmds = _strategy(game, *params)
        if best is None or reward > best[0]:
            best = (reward, cmds)
    assert best is not None
    return best[1]
