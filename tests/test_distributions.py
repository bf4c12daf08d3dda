"""Toolset distributions: the reference's 17 tables, seeded Bernoulli sampling, fallback, errors, CLI."""

from __future__ import annotations

import random

import pytest
import typer
from typer.testing import CliRunner

from trajforge.cli.distributions import register
from trajforge.distributions import (
    DISTRIBUTIONS,
    Distribution,
    UnknownDistributionError,
    derive_seed,
    get_distribution,
    sample_rng,
    sample_toolsets,
)
from trajforge.tools.toolsets import TOOLSETS, UnknownToolsetError

ALL7 = ("web", "vision", "image_gen", "terminal", "file", "moa", "browser")

# SPEC section 3, typed out independently of the module under test.
EXPECTED = {
    "default": dict.fromkeys(ALL7, 100),
    "image_gen": {"image_gen": 90, "vision": 90, "web": 55, "terminal": 45, "moa": 10},
    "research": {"web": 90, "browser": 70, "vision": 50, "moa": 40, "terminal": 10},
    "science": {
        "web": 94,
        "terminal": 94,
        "file": 94,
        "vision": 65,
        "browser": 50,
        "image_gen": 15,
        "moa": 10,
    },
    "development": {"terminal": 80, "file": 80, "moa": 60, "web": 30, "vision": 10},
    "safe": {"web": 80, "browser": 70, "vision": 60, "image_gen": 60, "moa": 50},
    "balanced": dict.fromkeys(ALL7, 50),
    "minimal": {"web": 100},
    "terminal_only": {"terminal": 100, "file": 100},
    "terminal_web": {"terminal": 100, "file": 100, "web": 100},
    "creative": {"image_gen": 90, "vision": 90, "web": 30},
    "reasoning": {"moa": 90, "web": 30, "terminal": 20},
    "browser_use": {"browser": 100, "web": 80, "vision": 70},
    "browser_only": {"browser": 100},
    "browser_tasks": {"browser": 97, "vision": 12, "terminal": 15},
    "terminal_tasks": {"terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10},
    "mixed_tasks": {"browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15},
}


def test_all_17_with_exact_percentages_and_descriptions() -> None:
    assert len(DISTRIBUTIONS) == 17
    assert {name: dict(d.toolsets) for name, d in DISTRIBUTIONS.items()} == EXPECTED
    for dist in DISTRIBUTIONS.values():
        assert dist.description.strip()
        assert set(dist.toolsets) <= set(TOOLSETS)


def test_distributions_are_immutable() -> None:
    dist = get_distribution("research")
    with pytest.raises(TypeError):
        dist.toolsets["web"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        dist.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        DISTRIBUTIONS["x"] = dist  # type: ignore[index]


def test_seeded_sampling_is_reproducible() -> None:
    draws_a = [sample_toolsets("balanced", sample_rng(7, f"key-{k}")) for k in range(50)]
    draws_b = [sample_toolsets("balanced", sample_rng(7, f"key-{k}")) for k in range(50)]
    draws_c = [sample_toolsets("balanced", sample_rng(8, f"key-{k}")) for k in range(50)]
    assert draws_a == draws_b
    assert draws_a != draws_c
    assert len({tuple(d) for d in draws_a}) > 10  # actually varies between samples


def test_derive_seed_is_stable_and_distinct() -> None:
    # A fixed value: must not change between processes, machines or releases (resume depends on it).
    assert derive_seed(0, "abc") == 0x588EFE4211B26978
    assert derive_seed(1, "abc") == derive_seed(1, "abc")
    assert len({derive_seed(1, f"k{k}") for k in range(1000)}) == 1000
    assert derive_seed(1, "a") != derive_seed(2, "a")
    assert all(0 <= derive_seed(123, f"x{k}") < 2**63 for k in range(1000))  # fits int64


@pytest.mark.parametrize("name", ["research", "mixed_tasks", "image_gen"])
def test_empirical_frequencies_match_percentages(name: str) -> None:
    rng = random.Random(1234)
    n = 20_000
    counts = dict.fromkeys(EXPECTED[name], 0)
    for _ in range(n):
        for ts in sample_toolsets(name, rng):
            counts[ts] += 1
    for ts, pct in EXPECTED[name].items():
        # 4.5 standard deviations of a binomial at n=20k is < 1.6 points; the fallback adds a bit
        # to the most likely toolset only when nothing else is drawn (rare for these tables).
        assert abs(100 * counts[ts] / n - pct) < 1.6, (ts, counts[ts] / n, pct)


def test_draws_are_in_declaration_order_and_100_percent_always_drawn() -> None:
    rng = random.Random(0)
    for _ in range(200):
        drawn = sample_toolsets("terminal_web", rng)
        assert drawn == ["terminal", "file", "web"]
        order = list(EXPECTED["science"])
        drawn = sample_toolsets("science", rng)
        assert drawn == sorted(drawn, key=order.index)


def test_fallback_to_most_likely_toolset_when_nothing_drawn() -> None:
    dist = Distribution("rare", "almost never anything", {"web": 1, "terminal": 2, "file": 2})
    assert dist.most_likely == "terminal"  # highest, first declared on a tie
    rng = random.Random(5)
    draws = [sample_toolsets(dist, rng) for _ in range(500)]
    assert ["terminal"] in draws  # the fallback happened
    assert all(d for d in draws)  # never empty
    zero = Distribution("zero", "nothing ever drawn", {"vision": 0})
    assert sample_toolsets(zero, random.Random(0)) == ["vision"]


def test_unknown_distribution_lists_the_known_names() -> None:
    with pytest.raises(UnknownDistributionError, match="unknown distribution 'nope'.*research"):
        get_distribution("nope")
    with pytest.raises(UnknownDistributionError):
        sample_toolsets("nope", random.Random(0))


def test_invalid_custom_distributions_are_rejected() -> None:
    with pytest.raises(UnknownToolsetError, match="distribution 'x': unknown toolset 'websearch'"):
        Distribution("x", "d", {"websearch": 50})
    with pytest.raises(ValueError, match="expected 0..100"):
        Distribution("x", "d", {"web": 150})
    with pytest.raises(ValueError, match="names no toolsets"):
        Distribution("x", "d", {})


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Group mode, as in the real app with its many commands."""

    register(app)
    return app


def test_cli_lists_all(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["distributions"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in EXPECTED:
        assert name in result.output
    assert "web 94%, terminal 94%, file 94%, vision 65%" in result.output


def test_cli_shows_one(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["distributions", "browser_tasks"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "browser 97%, vision 12%, terminal 15%" in result.output
    assert "mixed_tasks" not in result.output


def test_cli_json(cli: typer.Typer) -> None:
    import json

    result = CliRunner().invoke(cli, ["distributions", "minimal", "--json"])
    assert json.loads(result.output) == [
        {"name": "minimal", "description": get_distribution("minimal").description, "toolsets": {"web": 100}}
    ]


def test_cli_unknown_name_exits_2_with_clear_error(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["distributions", "nope"])
    assert result.exit_code == 2
    assert "unknown distribution 'nope'" in result.stderr
    assert "terminal_tasks" in result.stderr
