"""A judged group of :class:`~trajforge.envs.types.Episode` -> an Atropos ``ScoredDataGroup``.

Plain data, no ``atroposlib`` import: the conversion is the contract with Atropos trainers, so it
is kept apart from the ``BaseEnv`` plumbing and tested on its own.

Atropos conventions (``atroposlib.envs.server_handling.managed_server``, ``example_trainer/data.py``):
``masks`` hold the token id on sampled positions and -100 elsewhere; ``inference_logprobs`` are
aligned with ``tokens`` and hold 1.0 on the positions the model did not sample. trajforge's
token traces (:func:`trajforge.llm.token_trace.build_episode_trace`) already use exactly these, so
an episode's trace is passed through unchanged -- never re-tokenized.

What is *not* sent as a score: an episode that could not run or whose model call failed
(status ``failed``: infrastructure, not the policy's doing), and one whose reward code raised
(the record scores it 0 for analysis; a trainer would learn from a bug). They are counted by
reason. A group that lost episodes is sent with ``group_overrides["group_size"]`` set to what is
left, which is how Atropos carries groups of another size (its API buffers them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trajforge.envs.types import Episode
from trajforge.rl.rewards import aligned_token_advantages

MASKED = -100
"""Atropos mask value of a token the model did not sample."""
MASKED_LOGPROB = 1.0
"""Atropos ``inference_logprobs`` value on a token the model did not sample."""


@dataclass
class GroupResult:
    """The group to send (None when nothing usable is left) and why episodes were left out."""

    group: dict[str, Any] | None
    dropped: dict[str, int] = field(default_factory=dict)
    token_level: bool = True


def drop_reason(episode: Episode, *, token_level: bool) -> str | None:
    """Why an episode must not be sent as a score, or None when it can be."""
    if episode.status == "failed":
        return "not_run" if episode.termination == "not_run" else "failed"
    if episode.reward_failed:
        return "reward_error"
    if token_level and episode.trace is None:
        return "no_token_trace"
    return None


def scored_group(
    episodes: Sequence[Episode],
    *,
    token_level: bool,
    group_size: int,
    include_messages: bool = False,
    temperature: float | None = None,
) -> GroupResult:
    """Episodes of one item -> a ``ScoredDataGroup`` dict (JSON-ready, what ``/scored_data`` takes).

    ``token_level``: the endpoint was token-exact (Phase 2): tokens, masks and
    ``inference_logprobs`` come from each episode's trace. Otherwise (Phase 1, a chat endpoint)
    the group carries messages only, with empty token lists, and every sequence is marked
    ``trainable_on_tokens: False`` and ``set_advantage_to_zero: True`` (the override Atropos's
    example trainer honours), so no trainer mistakes it for token data.
    """
    dropped: Counter[str] = Counter()
    kept: list[Episode] = []
    for ep in episodes:
        reason = drop_reason(ep, token_level=token_level)
        if reason is None:
            kept.append(ep)
        else:
            dropped[reason] += 1
    if not kept:
        return GroupResult(None, dict(dropped), token_level)
    group: dict[str, Any] = {
        "tokens": [],
        "masks": [],
        "scores": [ep.score for ep in kept],
        "advantages": None,
        "ref_logprobs": None,
        "messages": None,
        "generation_params": {"temperature": temperature} if temperature is not None else None,
        "inference_logprobs": None,
        "group_overrides": {"group_size": len(kept)} if len(kept) != group_size else {},
        "overrides": [_override(ep, token_level) for ep in kept],
        "images": None,
    }
    if token_level:
        logprobs: list[list[float]] = []
        advantages: list[list[float]] = []
        for ep in kept:
            assert ep.trace is not None  # drop_reason guarantees it
            tr = ep.trace
            if not len(tr.tokens) == len(tr.masks) == len(tr.logprobs):
                raise ValueError(f"episode {ep.key}: token trace fields differ in length")
            group["tokens"].append(list(tr.tokens))
            group["masks"].append(list(tr.masks))
            logprobs.append(list(tr.logprobs))
            aligned = aligned_token_advantages(ep)
            if aligned is not None:
                advantages.append(aligned)
        group["inference_logprobs"] = logprobs
        if advantages:
            if len(advantages) != len(kept):
                raise ValueError("token advantages given for some episodes of the group but not all")
            group["advantages"] = advantages
    else:
        group["tokens"] = [[] for _ in kept]
        group["masks"] = [[] for _ in kept]
    if include_messages or not token_level:
        group["messages"] = [_messages(ep) for ep in kept]
    return GroupResult(group, dict(dropped), token_level)


def _override(ep: Episode, token_level: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"episode": ep.key, "status": ep.status, "trainable_on_tokens": token_level}
    if not token_level:
        out["set_advantage_to_zero"] = True
    return out


def _messages(ep: Episode) -> list[dict[str, Any]]:
    """The episode's messages as Atropos's API takes them (every message has role and content)."""
    return [{**m, "content": m.get("content")} for m in ep.messages]


@dataclass
class GroupTally:
    """What happened to the groups of a run, for logs, wandb and the stats file."""

    groups: int = 0
    groups_sent: int = 0
    groups_equal_scores: int = 0
    groups_empty: int = 0
    episodes: int = 0
    episodes_sent: int = 0
    consecutive_empty: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def add(self, result: GroupResult, n_episodes: int, *, drop_equal: bool) -> bool:
        """Count one group; True when Atropos will send it (it drops equal scores when asked)."""
        self.groups += 1
        self.episodes += n_episodes
        self.dropped.update(result.dropped)
        if result.group is None:
            self.groups_empty += 1
            self.consecutive_empty += 1
            return False
        self.consecutive_empty = 0
        scores = result.group["scores"]
        if drop_equal and len(set(scores)) == 1:
            self.groups_equal_scores += 1
            return False
        self.groups_sent += 1
        self.episodes_sent += len(scores)
        return True

    def as_dict(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "groups_sent": self.groups_sent,
            "groups_equal_scores": self.groups_equal_scores,
            "groups_empty": self.groups_empty,
            "episodes": self.episodes,
            "episodes_sent": self.episodes_sent,
            "episodes_dropped": dict(self.dropped),
        }

    def metrics(self, prefix: str = "trajforge/") -> dict[str, float]:
        out: dict[str, float] = {
            f"{prefix}{k}": float(v) for k, v in self.as_dict().items() if isinstance(v, int)
        }
        out.update({f"{prefix}episodes_dropped_{k}": float(v) for k, v in self.dropped.items()})
        return out


def describe_phase(token_level: bool) -> str:
    return "tokens (Phase 2: exact tokens, masks, logprobs)" if token_level else "messages only (Phase 1)"


__all__ = [
    "MASKED",
    "MASKED_LOGPROB",
    "GroupResult",
    "GroupTally",
    "describe_phase",
    "drop_reason",
    "scored_group",
]
