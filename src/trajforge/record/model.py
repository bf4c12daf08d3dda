"""The one record of a rollout: what a batch line, an env episode and an RL rollout each are.

Every output line of trajforge (``trajectories.jsonl`` / ``failed.jsonl`` / ``filtered.jsonl`` of
a batch run, ``episodes.jsonl`` of ``env eval``, the rollouts ``rl train`` trains on) is a
:class:`Record`. One type means one reader: export, report, rescore, DPO pairs and RL samples all
read it, so data generated for SFT with ``batch`` trains RL or DPO as it is.

Versioned (``schema_version``): :mod:`trajforge.record.upgrade` reads the lines written before
this type existed (version 1: the batch line and the env ``Episode``) into it. docs/formats.md
documents every field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajforge.record.reward import Reward

SCHEMA_VERSION = 4
"""Version 1: the batch line and the env ``Episode`` before they were one type (no such field).
Version 2: ``worker`` at the top level; version 3 keeps it in ``timings`` (where and when it ran).
Version 4: the reward one nested :class:`~trajforge.record.reward.Reward` (value, components,
reason, error, token advantages, kept), where version 3 had flat ``reward``, ``reward_components``,
``reward_reason``, ``reward_error``, ``kept`` and ``trace.token_advantages``."""

Status = Literal["completed", "partial", "failed", "filtered"]


class TokenRecord(BaseModel):
    """The rollout's exact tokens, in the Atropos convention: ``masks`` is -100 where the model
    did not sample (prompt, tool results: not trained) and the token id where it did;
    ``logprobs`` are the sampler's (1.0 where masked, as Atropos writes it). All of equal length."""

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    span_versions: list[tuple[int, int, int]] | None = None
    """``(start, end, model_version)`` of each sampled turn when the server named the weights
    that sampled it: a multi-turn episode can straddle a weight reload (staleness per span)."""


class ToolCounts(BaseModel):
    """Calls of one tool in one rollout: how many, how many succeeded, how many failed."""

    count: int = 0
    success: int = 0
    failure: int = 0


class Timings(BaseModel):
    """Where the rollout's time went (seconds), when it ran (ISO 8601, UTC) and which worker ran
    it. Two runs of the same rollout differ here and nowhere else: ``batch --env`` and ``env
    eval`` of one item write records equal but for this (``tests/test_record.py``).

    ``worker`` is here, not beside the rollout's identity, because it is execution provenance
    like the clock: which of a batch's processes happened to take the row depends on
    ``--workers`` and scheduling, never on what was asked, and an env eval has no such workers."""

    wall_s: float = 0.0
    model_s: float = Field(0.0, description="waiting for the model")
    tool_s: float = Field(0.0, description="running tools")
    reward_s: float = Field(0.0, description="judging (the env's compute_reward)")
    started_at: str | None = None
    finished_at: str | None = None
    worker: int | None = Field(None, description="the batch worker that ran it (-1: a bad row)")


class Record(BaseModel):
    """One rollout of one prompt (a dataset row or an env item), however it ended.

    Extra keys are kept (``extra="allow"``): a batch line also carries the reference's ShareGPT
    view (``conversations``, ``metadata``, ``completed``, ...: :func:`trajforge.record.views.reference_view`),
    which is an export of this record, never read back as its truth."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    # -- which rollout
    key: str = Field(
        description="unique in its run: the prompt's content key, #ROLLOUT when it has several (record.keys)"
    )
    prompt_index: int | None = Field(
        None, description="0-based row of the dataset (batch) or item of the evaluation (env eval)"
    )
    rollout: int = Field(
        0, description="index of this rollout among its prompt's (group / samples-per-prompt)"
    )
    group_size: int = Field(1, description="rollouts of this prompt")
    env: str | None = Field(None, description="the env that set the task or judged it (batch --env)")
    item_id: str | None = None
    category: str | None = None
    item: dict[str, Any] = Field(
        default_factory=dict, description="the dataset row's fields / the env item (what grading reads)"
    )
    # -- what happened
    messages: list[dict[str, Any]] = Field(
        default_factory=list, description="the whole conversation as OpenAI messages, lossless"
    )
    system_prompt: str | None = Field(None, description="the run's own system prompt, when it had one")
    status: Status
    reason: str | None = None
    reason_kind: str | None = Field(
        None, description="the reason's kind, for counting (final_answer, max_turns, ...)"
    )
    termination: str = "not_run"
    turns: int = Field(0, description="model calls")
    attempts: int = 1
    # -- the judgement
    reward: Reward | None = Field(
        None,
        description="the judge's reward, whole; null: the run had no judge (a batch without --env). "
        "A rollout a judge could not judge has a reward whose value is null",
    )
    # -- tools and tokens
    tool_stats: dict[str, ToolCounts] = Field(default_factory=dict)
    tool_error_counts: dict[str, int] = Field(default_factory=dict)
    trace: TokenRecord | None = Field(None, description="exact tokens (a token-level endpoint)")
    trace_error: str | None = Field(None, description="why a token-level endpoint gave no usable trace")
    usage: dict[str, int | None] = Field(
        default_factory=dict,
        description="token usage summed over the model calls; null: unknown (a call's endpoint did not say)",
    )
    recovered_calls: list[str] = Field(
        default_factory=list,
        description="ids of the tool calls trajforge parsed out of the model's text because the endpoint "
        "returned them as content (--tool-call-parser); in messages they are ordinary tool calls",
    )
    timings: Timings = Field(default_factory=Timings)
    # -- how it was asked
    model: str | None = None
    sampling: dict[str, Any] = Field(
        default_factory=dict, description="what every model call sent: temperature, max_tokens, seed, ..."
    )
    seed: int = Field(0, description="seeds the toolset draw (and sampling, where supported); < 2**63")
    toolsets: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list, description="the tool names offered")

    @model_validator(mode="before")
    @classmethod
    def _episode_key(cls, data: Any) -> Any:
        """A record built by hand from an item id and a rollout (a test, an adapter's own) is keyed
        ``ITEM_ID#ROLLOUT``, the key of the episodes written before version 3."""
        if isinstance(data, dict) and "key" not in data and data.get("item_id") is not None:
            return {**data, "key": f"{data['item_id']}#{data.get('rollout', 0)}"}
        return data

    @property
    def score(self) -> float:
        """The reward a trainer uses: 0.0 when the rollout was not judged."""
        return 0.0 if self.reward is None else self.reward.score

    @property
    def reward_value(self) -> float | None:
        """The reward's value; None when not judged (no judge, or one that could not judge)."""
        return None if self.reward is None else self.reward.value

    @property
    def reward_failed(self) -> bool:
        """The reward code raised (or timed out): the rollout is scored 0 for a reason not its
        own (summaries count these apart; trainers drop or flag them)."""
        return self.reward is not None and self.reward.error is not None

    def line(self) -> bytes:
        """The JSONL line (schema fields, then any view fields it carries)."""
        return self.model_dump_json().encode() + b"\n"
