#!/usr/bin/env python3
"""ycsim: a deterministic simulated startup, operated one command at a time (the ``yc_bench`` env).

Self-contained (standard library only): ``yc_bench`` copies this file into the sandbox as
``ycsim`` and the agent runs ``python3 ycsim COMMAND``. The host imports it too (the oracle
plans with it, tests replay with it).

Tamper-proof by construction: there is no state file. The only thing persisted is the log of
accepted commands (``.ycsim/log.jsonl``); every invocation replays the log from the game's seed,
re-checking each command under the rules. The verifier replays the log with its own copy of
this file and the item's own game settings, so editing the log can only ever produce a play
the CLI would have allowed, and editing the game file or this script changes nothing scored.

Commands (each prints JSON): ``status``, ``roadmap``, ``report [N]``, ``hire ROLE [N]``,
``fire ROLE [N]``, ``set-price DOLLARS``, ``spend marketing DOLLARS``, ``ship FEATURE``,
``raise DOLLARS``, ``advance [WEEKS]`` (1-4), ``score``. Roles: eng, sales, support.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

ROLES = ("eng", "sales", "support")
SALARY = {"eng": 3000.0, "sales": 2200.0, "support": 1200.0}  # per week
HIRING_COST = 4000.0  # per hire, once
SEVERANCE_WEEKS = 2
MAX_TEAM = 40
MAX_ADVANCE = 4
WEEKS_PER_MONTH = 4.33
FOUNDER_LEADS = 15.0  # leads the founders can work per week without a sales team
LEADS_PER_SALES = 40.0
CUSTOMERS_PER_SUPPORT = 120.0
RAISE_EVERY_WEEKS = 12

DIFFICULTY: dict[str, dict[str, Any]] = {
    "easy": {
        "cash": 600_000.0,
        "wtp": (80.0, 120.0),
        "cac": (25.0, 40.0),
        "churn": 0.008,
        "market": (6000, 9000),
    },
    "normal": {
        "cash": 400_000.0,
        "wtp": (55.0, 95.0),
        "cac": (40.0, 65.0),
        "churn": 0.012,
        "market": (4000, 7000),
    },
    "hard": {
        "cash": 250_000.0,
        "wtp": (40.0, 70.0),
        "cac": (60.0, 90.0),
        "churn": 0.018,
        "market": (2500, 5000),
    },
}
FEATURE_NAMES = (
    "sso",
    "mobile-app",
    "analytics",
    "integrations",
    "api",
    "audit-log",
    "offline-mode",
    "ai-assistant",
)
EVENTS = (("outage", 0.05), ("viral", 0.04), ("competitor", 0.03), ("downturn", 0.03))


class CommandError(ValueError):
    """A command the rules refuse; the message says why (nothing is logged)."""


@dataclass
class Game:
    """The item's settings: the same seed and difficulty give the same market and events."""

    seed: int = 0
    difficulty: str = "normal"
    horizon: int = 52
    target: float = 0.0  # founder stake that scores 1.0; 0 = fifteen times the starting cash

    def __post_init__(self) -> None:
        if self.difficulty not in DIFFICULTY:
            raise ValueError(f"difficulty must be one of {', '.join(DIFFICULTY)}, not {self.difficulty!r}")
        if not 4 <= self.horizon <= 520:
            raise ValueError("horizon must be 4..520 weeks")
        if self.target <= 0:
            self.target = 15.0 * float(DIFFICULTY[self.difficulty]["cash"])


@dataclass
class Feature:
    name: str
    effort: float  # engineer-weeks
    gain: float  # product quality added when shipped


@dataclass
class State:
    week: int
    cash: float
    team: dict[str, int]
    price: float
    marketing: float
    customers: float
    quality: float
    wtp: float
    cac: float
    market: int
    churn: float
    roadmap: list[Feature]
    building: dict[str, float] = field(default_factory=dict)  # feature -> engineer-weeks left
    shipped: list[str] = field(default_factory=list)
    ownership: float = 1.0
    last_raise_week: int = -RAISE_EVERY_WEEKS
    dead: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    commands: int = 0

    @property
    def mrr(self) -> float:
        return self.customers * self.price

    @property
    def payroll(self) -> float:
        return sum(SALARY[r] * n for r, n in self.team.items())


def new_state(game: Game) -> State:
    d = DIFFICULTY[game.difficulty]
    rng = random.Random(f"ycsim:{game.seed}:{game.difficulty}:market")
    names = list(FEATURE_NAMES)
    rng.shuffle(names)
    roadmap = [
        Feature(name=n, effort=float(rng.randint(4, 20)), gain=round(rng.uniform(0.04, 0.16), 3))
        for n in names[:6]
    ]
    return State(
        week=0,
        cash=float(d["cash"]),
        team={"eng": 2, "sales": 0, "support": 0},
        price=49.0,
        marketing=0.0,
        customers=10.0,
        quality=0.3,
        wtp=round(rng.uniform(*d["wtp"]), 2),
        cac=round(rng.uniform(*d["cac"]), 2),
        market=rng.randint(*d["market"]),
        churn=float(d["churn"]),
        roadmap=roadmap,
    )


# ------------------------------------------------------------------------------------- rules


def _count(args: list[str], at: int, default: int = 1) -> int:
    if len(args) <= at:
        return default
    try:
        n = int(args[at])
    except ValueError:
        raise CommandError(f"{args[at]!r} is not a whole number") from None
    return n


def _money(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CommandError(f"{text!r} is not an amount of dollars") from None
    if not math.isfinite(value) or value < 0:
        raise CommandError("amounts must be finite and not negative")
    return round(value, 2)


def _role(args: list[str]) -> str:
    if not args or args[0] not in ROLES:
        raise CommandError(f"give a role: {', '.join(ROLES)}")
    return args[0]


def apply(state: State, game: Game, cmd: str, args: list[str]) -> dict[str, Any]:
    """Apply one state-changing command (raises CommandError when the rules refuse it)."""
    if state.dead:
        raise CommandError("the company is bankrupt; only status, report and score remain")
    if state.week >= game.horizon:
        raise CommandError(f"the game is over (week {state.week} of {game.horizon}); run score")
    if cmd == "hire":
        role, n = _role(args), _count(args, 1)
        if not 1 <= n <= 5:
            raise CommandError("hire 1 to 5 at a time")
        if sum(state.team.values()) + n > MAX_TEAM:
            raise CommandError(f"the team is capped at {MAX_TEAM} people")
        cost = HIRING_COST * n
        if cost > state.cash:
            raise CommandError(f"hiring costs ${cost:,.0f}; you have ${state.cash:,.0f}")
        state.cash -= cost
        state.team[role] += n
        return {"hired": {role: n}, "recruiting_cost": cost, "team": dict(state.team)}
    if cmd == "fire":
        role, n = _role(args), _count(args, 1)
        if not 1 <= n <= state.team[role]:
            raise CommandError(f"you have {state.team[role]} {role}; fire between 1 and that many")
        cost = SALARY[role] * SEVERANCE_WEEKS * n
        state.cash -= cost
        state.team[role] -= n
        return {"fired": {role: n}, "severance": cost, "team": dict(state.team)}
    if cmd == "set-price":
        if len(args) != 1:
            raise CommandError("usage: set-price DOLLARS (monthly price per customer)")
        price = _money(args[0])
        if not 5 <= price <= 1000:
            raise CommandError("the monthly price must be between $5 and $1000")
        state.price = price
        return {"price": price}
    if cmd == "spend":
        if len(args) != 2 or args[0] != "marketing":
            raise CommandError("usage: spend marketing DOLLARS (per week; 0 stops it)")
        amount = _money(args[1])
        if amount > 200_000:
            raise CommandError("weekly marketing is capped at $200,000")
        state.marketing = amount
        return {"marketing_per_week": amount}
    if cmd == "ship":
        if len(args) != 1:
            raise CommandError("usage: ship FEATURE (see roadmap)")
        feat = next((f for f in state.roadmap if f.name == args[0]), None)
        if feat is None:
            raise CommandError(
                f"no feature {args[0]!r} on the roadmap: {', '.join(f.name for f in state.roadmap)}"
            )
        if feat.name in state.shipped or feat.name in state.building:
            raise CommandError(f"{feat.name} is already shipped or being built")
        state.building[feat.name] = feat.effort
        return {"building": dict(state.building)}
    if cmd == "raise":
        if len(args) != 1:
            raise CommandError("usage: raise DOLLARS")
        amount = _money(args[0])
        if state.week - state.last_raise_week < RAISE_EVERY_WEEKS:
            raise CommandError(f"investors take {RAISE_EVERY_WEEKS} weeks between rounds")
        pre = max(1_000_000.0, valuation(state))
        if not 50_000 <= amount <= 0.5 * pre:
            raise CommandError(f"raise between $50,000 and half the pre-money valuation (${pre:,.0f})")
        dilution = amount / (pre + amount)
        state.ownership *= 1 - dilution
        state.cash += amount
        state.last_raise_week = state.week
        return {"raised": amount, "pre_money": round(pre, 2), "ownership": round(state.ownership, 6)}
    if cmd == "advance":
        weeks = _count(args, 0)
        if not 1 <= weeks <= MAX_ADVANCE:
            raise CommandError(f"advance 1 to {MAX_ADVANCE} weeks at a time")
        weeks = min(weeks, game.horizon - state.week)
        for _ in range(weeks):
            tick(state, game)
            if state.dead:
                break
        return {"advanced_to": state.week, "last_weeks": state.history[-weeks:], "dead": state.dead}
    raise CommandError(f"unknown command {cmd!r}")


def tick(state: State, game: Game) -> None:
    """One simulated week. Events come from the seed and the week alone (not from the play)."""
    rng = random.Random(f"ycsim:{game.seed}:{game.difficulty}:week:{state.week}")
    events = [name for name, p in EVENTS if rng.random() < p]
    if "competitor" in events:
        state.wtp = round(state.wtp * 0.93, 2)
    if "downturn" in events:
        state.cac = round(state.cac * 1.15, 2)
    paid = state.marketing / state.cac * (0.6 + state.quality)
    organic = 3.0 + 8.0 * state.quality + 0.02 * state.customers * state.quality
    if "viral" in events:
        organic += 150.0 * state.quality
    leads = paid + organic
    worked = min(leads, FOUNDER_LEADS + LEADS_PER_SALES * state.team["sales"])
    ratio = state.price / state.wtp
    conversion = 0.5 * (0.5 + state.quality) * math.exp(-ratio * ratio)
    room = max(0.0, state.market - state.customers)
    new = min(worked * conversion, room)
    load = state.customers / (CUSTOMERS_PER_SUPPORT * (state.team["support"] + 0.25))
    churn = state.churn * (1.3 - state.quality) * (1.0 + max(0.0, load - 1.0)) * (0.6 + 0.4 * ratio * ratio)
    if "outage" in events and state.team["eng"] < 3:
        churn *= 2.5
    churn = min(churn, 0.5)
    lost = state.customers * churn
    state.customers = round(max(0.0, state.customers + new - lost), 6)
    # engineering: the queue in order, one engineer-week per engineer per week
    capacity = float(state.team["eng"])
    for name in list(state.building):
        if capacity <= 0:
            break
        spent = min(capacity, state.building[name])
        state.building[name] -= spent
        capacity -= spent
        if state.building[name] <= 1e-9:
            del state.building[name]
            state.shipped.append(name)
            gain = next(f.gain for f in state.roadmap if f.name == name)
            state.quality = min(1.0, state.quality + gain)
    if state.team["eng"] < 2:  # nobody maintains the product: it decays
        state.quality = max(0.05, state.quality - 0.01)
    state.quality = round(state.quality, 6)
    revenue = state.customers * state.price / WEEKS_PER_MONTH
    infra = 200.0 + 1.5 * state.customers
    burn = state.payroll + state.marketing + infra
    state.cash = round(state.cash + revenue - burn, 2)
    state.week += 1
    if state.cash < 0:
        state.dead = True
    state.history.append(
        {
            "week": state.week,
            "cash": round(state.cash, 2),
            "customers": round(state.customers, 2),
            "new": round(new, 2),
            "churned": round(lost, 2),
            "revenue": round(revenue, 2),
            "burn": round(burn, 2),
            "quality": round(state.quality, 3),
            "events": events,
        }
    )


def valuation(state: State) -> float:
    """Cash plus ARR times a multiple that rewards growth over the last 8 weeks."""
    arr = 12.0 * state.mrr
    past = state.history[-9]["customers"] if len(state.history) >= 9 else 10.0
    growth = state.customers / max(past, 1.0)
    multiple = min(12.0, max(2.0, 4.0 + 4.0 * (growth - 1.0)))
    return max(0.0, state.cash) + arr * multiple


def score(state: State, game: Game, rejected: int = 0) -> dict[str, Any]:
    """The final assessment: 0 when bankrupt; else progress x (founder stake / target, capped at 1)."""
    progress = min(1.0, state.week / game.horizon)
    stake = 0.0 if state.dead else state.ownership * valuation(state)
    ratio = min(1.0, stake / game.target)
    reward = 0.0 if state.dead else progress * ratio
    return {
        "reward": round(reward, 6),
        "components": {
            "survived": 0.0 if state.dead else 1.0,
            "progress": round(progress, 6),
            "stake_ratio": round(ratio, 6),
            "stake": round(stake, 2),
            "valuation": round(0.0 if state.dead else valuation(state), 2),
            "cash": round(state.cash, 2),
            "mrr": round(state.mrr, 2),
            "customers": round(state.customers, 2),
            "ownership": round(state.ownership, 6),
            "commands": float(state.commands),
            "rejected": float(rejected),
        },
        "week": state.week,
        "horizon": game.horizon,
        "finished": state.week >= game.horizon or state.dead,
    }


def status(state: State, game: Game) -> dict[str, Any]:
    weekly_revenue = state.customers * state.price / WEEKS_PER_MONTH
    burn = state.payroll + state.marketing + 200.0 + 1.5 * state.customers
    net = weekly_revenue - burn
    return {
        "week": state.week,
        "horizon": game.horizon,
        "bankrupt": state.dead,
        "cash": round(state.cash, 2),
        "runway_weeks": None if net >= 0 else round(state.cash / -net, 1),
        "team": dict(state.team),
        "payroll_per_week": state.payroll,
        "price_per_month": state.price,
        "marketing_per_week": state.marketing,
        "customers": round(state.customers, 2),
        "mrr": round(state.mrr, 2),
        "product_quality": round(state.quality, 3),
        "building": {k: round(v, 2) for k, v in state.building.items()},
        "shipped": list(state.shipped),
        "ownership": round(state.ownership, 6),
        "valuation_estimate": round(valuation(state), 2),
        "last_week": state.history[-1] if state.history else None,
    }


# ------------------------------------------------------------------------------------- replay


def replay(game: Game, lines: list[str]) -> tuple[State, int]:
    """The state a command log leads to, and how many of its lines the rules refused."""
    state = new_state(game)
    rejected = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            cmd, args = entry["cmd"], entry.get("args", [])
            if (
                not isinstance(cmd, str)
                or not isinstance(args, list)
                or not all(isinstance(a, str) for a in args)
            ):
                raise CommandError("malformed entry")
            apply(state, game, cmd, list(args))
            state.commands += 1
        except (CommandError, ValueError, KeyError, TypeError):
            rejected += 1
    return state, rejected


READ_ONLY = ("status", "roadmap", "report", "score")
HELP = {
    "status": "company state now",
    "roadmap": "features you can build (engineer-weeks, quality gain)",
    "report [N]": "the last N weeks (default 8)",
    "hire ROLE [N]": "hire 1-5 eng|sales|support ($4,000 each, then weekly salary)",
    "fire ROLE [N]": "let people go (two weeks' severance)",
    "set-price DOLLARS": "monthly price per customer ($5-$1000)",
    "spend marketing DOLLARS": "weekly marketing budget",
    "ship FEATURE": "queue a roadmap feature for the engineers to build",
    "raise DOLLARS": "sell equity (every 12 weeks; up to half the pre-money valuation)",
    "advance [WEEKS]": "let 1-4 weeks pass",
    "score": "the assessment (final when the horizon is reached)",
}


def run(game: Game, log_path: str, argv: list[str]) -> tuple[int, dict[str, Any]]:
    """One CLI invocation: (exit code, JSON answer)."""
    lines: list[str] = []
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    state, rejected = replay(game, lines)
    if not argv or argv[0] in ("help", "-h", "--help"):
        return 0, {"commands": HELP}
    cmd, args = argv[0], argv[1:]
    if cmd == "status":
        return 0, status(state, game)
    if cmd == "roadmap":
        return 0, {
            "features": [
                {
                    **asdict(f),
                    "state": "shipped"
                    if f.name in state.shipped
                    else "building"
                    if f.name in state.building
                    else "open",
                }
                for f in state.roadmap
            ]
        }
    if cmd == "report":
        try:
            n = _count(args, 0, 8)
        except CommandError as exc:
            return 2, {"error": str(exc)}
        return 0, {"weeks": state.history[-max(1, n) :]}
    if cmd == "score":
        return 0, score(state, game, rejected)
    try:
        out = apply(state, game, cmd, args)
    except CommandError as exc:
        return 2, {"error": str(exc)}
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"cmd": cmd, "args": args}) + "\n")
    return 0, {"ok": True, **out}


def load_game(path: str) -> Game:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    return Game(**{k: data[k] for k in ("seed", "difficulty", "horizon", "target") if k in data})


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(sys.argv[0] if argv is None else "."))
    parser = argparse.ArgumentParser(prog="ycsim", description="a simulated startup; one command per call")
    parser.add_argument("--game", default=os.path.join(here, "ycsim_game.json"), help="game settings JSON")
    parser.add_argument("--log", default=os.path.join(here, ".ycsim", "log.jsonl"), help="command log")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    try:
        game = load_game(ns.game)
    except (OSError, ValueError, TypeError) as exc:
        print(json.dumps({"error": f"cannot read the game settings {ns.game}: {exc}"}))
        return 2
    code, out = run(game, ns.log, list(ns.command))
    print(json.dumps(out, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
