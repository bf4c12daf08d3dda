"""Named toolset distributions and a seeded sampler.

A distribution gives each toolset an independent chance (in percent) of being offered to a
sample, so a dataset run yields trajectories over many tool combinations. The 17 distributions
and their percentages are those of the reference system (Hermes Agent's batch runner; `trajforge
distributions` lists them); users select them by name.

Sampling takes an explicit ``random.Random``: with :func:`sample_rng` derived from the run seed
and a sample's key, the same sample always gets the same toolsets, whichever worker runs it and
in whatever order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from trajforge.tools.toolsets import UnknownToolsetError, check_toolsets


class UnknownDistributionError(ValueError):
    """A distribution name that trajforge does not know."""


@dataclass(frozen=True)
class Distribution:
    """A named set of independent per-toolset probabilities, in percent (0-100).

    Validated at construction: every toolset must exist and every percentage be in range.
    """

    name: str
    description: str
    toolsets: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.toolsets:
            raise ValueError(f"distribution {self.name!r} names no toolsets")
        try:
            check_toolsets(self.toolsets)
        except UnknownToolsetError as exc:
            raise UnknownToolsetError(f"distribution {self.name!r}: {exc}") from None
        for toolset, pct in self.toolsets.items():
            if not 0 <= pct <= 100:
                raise ValueError(f"distribution {self.name!r}: {toolset} has {pct}%, expected 0..100")
        object.__setattr__(self, "toolsets", MappingProxyType(dict(self.toolsets)))

    @property
    def most_likely(self) -> str:
        """The fallback when a draw selects nothing: highest percentage, first declared on ties."""
        return max(self.toolsets.items(), key=lambda kv: kv[1])[0]

    def describe_toolsets(self) -> str:
        """``"web 90%, browser 70%"`` for listings."""
        return ", ".join(f"{ts} {pct:g}%" for ts, pct in self.toolsets.items())


def _all(pct: int) -> dict[str, int]:
    return dict.fromkeys(("web", "vision", "image_gen", "terminal", "file", "moa", "browser"), pct)


_DEFINITIONS: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("default", "Every toolset offered to every sample", _all(100)),
    (
        "image_gen",
        "Image generation and vision first, with some web and terminal",
        {"image_gen": 90, "vision": 90, "web": 55, "terminal": 45, "moa": 10},
    ),
    (
        "research",
        "Web research and browsing with vision, occasional reasoning help and terminal",
        {"web": 90, "browser": 70, "vision": 50, "moa": 40, "terminal": 10},
    ),
    (
        "science",
        "Scientific work: web, terminal and files nearly always, browser and vision often",
        {"web": 94, "terminal": 94, "file": 94, "vision": 65, "browser": 50, "image_gen": 15, "moa": 10},
    ),
    (
        "development",
        "Software work: terminal and files, reasoning help, some web look-ups",
        {"terminal": 80, "file": 80, "moa": 60, "web": 30, "vision": 10},
    ),
    (
        "safe",
        "No command execution: web, browser, vision, images and reasoning only",
        {"web": 80, "browser": 70, "vision": 60, "image_gen": 60, "moa": 50},
    ),
    ("balanced", "Each toolset offered half of the time", _all(50)),
    ("minimal", "Web search and extraction only", {"web": 100}),
    (
        "terminal_only",
        "Terminal and file tools only, for code execution tasks",
        {"terminal": 100, "file": 100},
    ),
    (
        "terminal_web",
        "Terminal and file tools plus web search for documentation",
        {"terminal": 100, "file": 100, "web": 100},
    ),
    ("creative", "Image generation and vision, some web", {"image_gen": 90, "vision": 90, "web": 30}),
    ("reasoning", "Mixture-of-agents reasoning with few other tools", {"moa": 90, "web": 30, "terminal": 20}),
    (
        "browser_use",
        "Browser automation with web search and vision",
        {"browser": 100, "web": 80, "vision": 70},
    ),
    ("browser_only", "Browser automation tools only", {"browser": 100}),
    (
        "browser_tasks",
        "Browser-centred tasks, occasionally vision or terminal",
        {"browser": 97, "vision": 12, "terminal": 15},
    ),
    (
        "terminal_tasks",
        "Terminal-centred tasks: terminal, files and web nearly always, browser often",
        {"terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10},
    ),
    (
        "mixed_tasks",
        "Complex tasks mixing browser, terminal and files, sometimes web, vision or images",
        {"browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15},
    ),
)

DISTRIBUTIONS: Mapping[str, Distribution] = MappingProxyType(
    {name: Distribution(name, description, toolsets) for name, description, toolsets in _DEFINITIONS}
)


def list_distributions() -> list[Distribution]:
    """All built-in distributions, in declaration order."""
    return list(DISTRIBUTIONS.values())


def get_distribution(name: str) -> Distribution:
    """The built-in distribution called ``name``; an unknown name raises with the known ones."""
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        raise UnknownDistributionError(
            f"unknown distribution {name!r}; known distributions: {', '.join(DISTRIBUTIONS)} "
            "(see `trajforge distributions`)"
        ) from None


def sample_toolsets(distribution: str | Distribution, rng: random.Random) -> list[str]:
    """Draw toolsets: an independent Bernoulli trial per toolset, in declaration order.

    If no toolset is drawn, the most likely one is used, so a sample is never offered nothing.
    """
    dist = get_distribution(distribution) if isinstance(distribution, str) else distribution
    chosen = [ts for ts, pct in dist.toolsets.items() if rng.random() * 100 < pct]
    return chosen or [dist.most_likely]


def derive_seed(run_seed: int, sample_key: str) -> int:
    """A 63-bit seed for one sample, stable across processes and Python versions.

    ``hash()`` is salted per process, so it cannot be used: resuming a run elsewhere must give
    every sample the toolsets it had before. 63 bits, not 64: the recorded seed must fit
    Arrow/Parquet int64 (and a signed 64-bit field anywhere), and ``random.Random(seed)`` replays it.
    """
    digest = hashlib.sha256(f"{run_seed}\x00{sample_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def sample_rng(run_seed: int, sample_key: str) -> random.Random:
    """A fresh RNG for one sample, seeded by :func:`derive_seed`."""
    return random.Random(derive_seed(run_seed, sample_key))
