"""Guided groups: an oracle trajectory in a group the policy never solves (off-policy guidance).

Why: GRPO learns only from reward spread within a group. On families the policy almost never
solves at its sampling temperature, every group scores 0 and carries no signal, so the policy
cannot climb out (the closed-loop demo's write_file/find_value). LUFFY-style guidance puts one
*reference* trajectory into such a group: the env's oracle (``oracle_calls``/``oracle_answer``,
:mod:`trajforge.envs.agents`) runs through the same rollout machinery, tools, sandbox and
verifier, so its messages and reward are real, and it replaces one of the group's episodes.

The oracle is not a token model, so its episode has no token trace. :func:`oracle_trace` makes
one the way the token-exact client (``CompletionChatModel``) would have seen it: the first
prompt rendered with the policy's chat template, then, per assistant turn, the tokens the
template writes for that turn (up to and including the end-of-turn marker: the positions the
policy would have sampled, and the only ones trained) and the template segment for what came
next (:meth:`ChatTemplate.continuation_ids`). :func:`attach_guided_traces` fills its
"sampler" logprobs with the CURRENT policy's logprobs of those tokens (detached), so the
importance ratio of the guided sample starts at 1 and the clipped surrogate treats it like an
on-policy sample with the group's (high) advantage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trajforge.envs.running.episode import Rollouts
from trajforge.envs.types import Episode, Item, TokenRecord
from trajforge.llm.chat_template import ChatTemplate, TemplateError
from trajforge.llm.token_trace import MASKED, MASKED_LOGPROB
from trajforge.rl.samples import PASS_THRESHOLD


class GuideError(ValueError):
    """An oracle conversation that the policy's template cannot turn into sampled tokens."""


def needs_guide(group: Sequence[Episode]) -> bool:
    """No episode of the group solved its item: the group has no success to learn from."""
    return not any(ep.score >= PASS_THRESHOLD for ep in group)


async def guide_group(
    group: list[Episode], oracle: Rollouts, item: Item, *, seed: int
) -> tuple[list[Episode], Episode | None]:
    """``group`` with its last episode replaced by the oracle's, when no episode succeeded and
    the oracle does (an oracle that fails teaches nothing, so the group is left as sampled).
    Returns the group and the guided episode (None when none was put in)."""
    if not group or not needs_guide(group):
        return group, None
    last = group[-1]
    ep = await oracle.episode(item, rollout=last.rollout, group_size=last.group_size, seed=seed)
    if ep.score < PASS_THRESHOLD:
        return group, None
    return [*group[:-1], ep], ep


def oracle_trace(
    messages: Sequence[Mapping[str, Any]],
    template: ChatTemplate,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[list[int], list[bool]]:
    """Tokens of a finished conversation as the policy would have produced them, and per position
    whether the policy would have sampled it (the assistant turns' tokens, end-of-turn marker
    included). Raises :class:`GuideError` when the template does not extend a prompt with the
    assistant turn (then no guided sample can be made for this model)."""
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise GuideError("the oracle conversation has no assistant turn")
    marker = template.end_of_turn
    try:
        tokens = template.prompt_ids(messages[: turns[0]], tools)
        sampled = [False] * len(tokens)
        for k, i in enumerate(turns):
            prompt = template.render(messages[:i], tools, add_generation_prompt=True)
            full = template.render(messages[: i + 1], tools, add_generation_prompt=False)
            if not full.startswith(prompt):
                raise GuideError(
                    f"assistant turn {k}: the template does not render it as a continuation of its prompt"
                )
            body = full[len(prompt) :]
            end = body.find(marker)
            if end < 0:
                raise GuideError(f"assistant turn {k}: no {marker!r} after it in the rendered template")
            turn_ids = template.encode(body[: end + len(marker)])
            tokens += turn_ids
            sampled += [True] * len(turn_ids)
            nxt = turns[k + 1] if k + 1 < len(turns) else None
            if nxt is not None:
                segment = template.continuation_ids(
                    messages[: i + 1], messages[i + 1 : nxt], tools, sampled_end_of_turn=True
                )
                tokens += segment
                sampled += [False] * len(segment)
    except TemplateError as exc:
        raise GuideError(str(exc)) from exc
    return tokens, sampled


def attach_guided_traces(
    guided: Sequence[Episode],
    model: Any,
    template: ChatTemplate,
    tool_schemas: Sequence[Sequence[Mapping[str, Any]]],
    *,
    temperature: float,
    device: str = "cpu",
) -> int:
    """Give each guided episode a token trace whose logprobs are the current policy's (no grad).

    Blocking (a forward pass): run it in a worker thread, between updates. Returns how many got a
    trace; an episode the template cannot tokenize keeps ``trace=None`` (untraced, not trained).
    """
    import torch

    from trajforge.rl.grpo import Sample, collate, token_logprobs

    done = 0
    for ep, tools in zip(guided, tool_schemas, strict=True):
        try:
            tokens, sampled = oracle_trace(ep.messages, template, tools)
        except GuideError as exc:
            ep.trace_error = f"guide: {exc}"
            continue
        sample = Sample(tokens=tokens, sampled=sampled, old_logprobs=[0.0] * len(tokens), advantage=0.0)
        batch = collate([sample], 0, device)
        with torch.no_grad():
            lp, _ = token_logprobs(model, batch, temperature=temperature)
        shifted = [MASKED_LOGPROB, *(float(x) for x in lp[0].tolist())]
        ep.trace = TokenRecord(
            tokens=tokens,
            masks=[t if s else MASKED for t, s in zip(tokens, sampled, strict=True)],
            logprobs=[p if s else MASKED_LOGPROB for p, s in zip(shifted, sampled, strict=True)],
        )
        done += 1
    return done
