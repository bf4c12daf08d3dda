"""A record's :class:`~trajforge.record.Reward` as a trainer takes it: every conversion the
trainers and their adapters need, in one place.

The record carries the judge's reward whole (value, components, reason, error, token
advantages); the builtin GRPO trainer (:mod:`trajforge.rl.samples`), the Atropos groups, TRL and
verifiers read it through these functions (and the record's own ``score``, the scalar: the
value, 0.0 when not judged; ``reward_failed``: the reward code raised). No torch here: the
adapters import it in processes that train nothing.
"""

from __future__ import annotations

from trajforge.llm.token_trace import MASKED
from trajforge.record import Record


def scores_tokens(record: Record) -> bool:
    """The env scored this rollout token by token (``Reward.token_advantages``)."""
    return record.reward is not None and record.reward.token_advantages is not None


def aligned_token_advantages(record: Record) -> list[float] | None:
    """The reward's per-token advantages, one per position of the record's token trace (0.0 where
    the policy did not sample): an env gives them per position, or per sampled token, which are
    scattered onto the sampled positions. None when the env scored no token or there is no trace.
    A count that fits neither raises ``ValueError`` naming the record."""
    adv = record.reward.token_advantages if record.reward is not None else None
    trace = record.trace
    if adv is None or trace is None:
        return None
    if len(adv) == len(trace.tokens):
        return [float(a) for a in adv]
    positions = [i for i, m in enumerate(trace.masks) if m != MASKED]
    if len(adv) != len(positions):
        raise ValueError(
            f"episode {record.key}: {len(adv)} token advantages for {len(positions)} sampled tokens "
            f"({len(trace.tokens)} in all): an env that scores tokens must give one per position or "
            "one per sampled token"
        )
    out = [0.0] * len(trace.tokens)
    for i, a in zip(positions, adv, strict=True):
        out[i] = float(a)
    return out
