"""``mixture_of_agents``: several reference models answer a hard question in parallel, and an
aggregator model synthesises their answers into one.

Every model is a :class:`~trajforge.tools.model_endpoint.ModelEndpoint` from config (each on its
own endpoint if wanted). A reference model that fails is reported in the result and left out of
the synthesis; the call fails only when fewer than ``min_references`` answered, or the aggregator
failed -- the model then sees why.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajforge.tools._args import ArgumentError, req_str
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput
from trajforge.tools.model_endpoint import ModelEndpoint, open_chat_client

AGGREGATOR_PROMPT = (
    "You have been given several models' answers to the user's request below. Critically evaluate "
    "them: some may be wrong, incomplete or biased. Synthesise one accurate, complete and "
    "well-structured answer; do not just copy one, and do not mention that there were several.\n\n"
    "Answers:\n"
)


class MoAConfig(BaseModel):
    """The models of ``mixture_of_agents``; not offered without references and an aggregator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reference_models: list[ModelEndpoint] = Field(
        default_factory=list, description="models that answer the request in parallel"
    )
    aggregator: ModelEndpoint | None = Field(None, description="model that synthesises their answers")
    min_references: int = Field(1, ge=1, description="fewest reference answers the aggregator needs")
    max_reference_chars: int = Field(20_000, ge=100, description="longest reference answer passed on")

    @model_validator(mode="after")
    def _enough(self) -> MoAConfig:
        if self.reference_models and self.min_references > len(self.reference_models):
            raise ValueError(
                f"tools.moa.min_references is {self.min_references} but only "
                f"{len(self.reference_models)} reference_models are configured; lower it or add models"
            )
        if bool(self.reference_models) != (self.aggregator is not None):
            raise ValueError(
                "tools.moa needs both reference_models and an aggregator (or neither: not offered)"
            )
        return self

    @property
    def ready(self) -> bool:
        return bool(self.reference_models) and self.aggregator is not None


MOA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "user_prompt": {
            "type": "string",
            "description": "The complete, self-contained problem for the expert models.",
        }
    },
    "required": ["user_prompt"],
}


async def _answer(endpoint: ModelEndpoint, messages: list[dict[str, Any]]) -> str:
    """One model's answer (raises ``ModelError``/``MissingApiKeyError``, or ValueError when empty)."""
    from trajforge.llm.types import SamplingParams

    sampling = SamplingParams(max_tokens=endpoint.max_tokens, temperature=endpoint.temperature)
    async with open_chat_client(endpoint) as client:
        turn = await client.complete(messages, None, sampling)
    text = (turn.content or "").strip()
    if not text:
        raise ValueError("empty answer")
    return text


def moa_tools(config: MoAConfig) -> list[FunctionTool]:
    aggregator = config.aggregator
    if not config.ready or aggregator is None:
        raise ValueError("moa needs tools.moa.reference_models and tools.moa.aggregator")

    async def mixture_of_agents(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        from trajforge.llm.keys import MissingApiKeyError
        from trajforge.llm.types import ModelError

        failures = (ModelError, MissingApiKeyError, ValueError)
        try:
            prompt = req_str(args, "user_prompt").strip()
        except ArgumentError as exc:
            return ToolOutput.failure(str(exc))
        if not prompt:
            return ToolOutput.failure("argument 'user_prompt' must not be empty")
        question = [{"role": "user", "content": prompt}]
        results = await asyncio.gather(
            *(_answer(m, question) for m in config.reference_models), return_exceptions=True
        )
        answers: list[str] = []
        failed: list[dict[str, str]] = []
        for model, result in zip(config.reference_models, results, strict=True):
            if isinstance(result, str):
                answers.append(result[: config.max_reference_chars])
            elif isinstance(result, failures):
                failed.append({"model": model.model, "error": str(result)[:500]})
            else:  # a bug, not a model failure: let the agent loop report the crash
                raise result
        report = {"references_answered": len(answers), "references_failed": failed}
        if len(answers) < config.min_references:
            return ToolOutput.failure(
                f"only {len(answers)} of {len(results)} reference models answered "
                f"(need {config.min_references})",
                content=orjson.dumps({"error": "reference models failed", **report}).decode(),
            )
        listing = "\n\n".join(f"{i}. {a}" for i, a in enumerate(answers, 1))
        synthesis = [{"role": "system", "content": AGGREGATOR_PROMPT + listing}, *question]
        try:
            final = await _answer(aggregator, synthesis)
        except failures as exc:
            return ToolOutput.failure(
                f"the aggregator model failed: {str(exc)[:500]}",
                content=orjson.dumps({"error": f"aggregator failed: {exc}", **report}).decode(),
            )
        return ToolOutput(content=orjson.dumps({"response": final, **report}).decode())

    return [
        FunctionTool(
            name="mixture_of_agents",
            toolset="moa",
            description="Ask several expert models a hard problem at once and get one synthesised "
            "answer. Use for difficult reasoning, maths or design questions; give the whole "
            "problem, self-contained.",
            parameters=MOA_SCHEMA,
            handler=mixture_of_agents,
        )
    ]
