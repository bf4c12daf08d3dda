"""The ``opd`` column of the reward-hack table: opd needs a token-level student and a teacher.

The student is a :class:`~trajforge.testing.token_server.TokenServer` whose sampler plays a hack
policy: it decodes the prompt ids (the tiny chat template), rebuilds the conversation, asks the
policy for the next turn and returns that turn's text as real token ids of the tiny tokenizer.
The teacher is ``trajforge serve`` on a tiny random model (SGLang prompt logprobs), as in
``tests/test_env_opd.py``.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from trajforge.envs import load_env
from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig
from trajforge.serve.app import run_server
from trajforge.serve.config import ServeConfig
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer
from trajforge.testing.token_server import TokenServer

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_TOOL = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


class PolicySampler:
    """``TokenServer`` sampler that answers with a scripted policy's next turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.policy: Any = None

    def __call__(
        self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[list[int], list[float], str]:
        text = self.tokenizer.decode(prompt_ids)
        prompt = next(u for u in _USER.findall(text) if not u.startswith("<tool_response>"))
        outputs = _TOOL.findall(text)
        turns = text.count("<|im_start|>assistant") - 1
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        for i in range(turns):
            messages.append({"role": "assistant", "content": ""})
            if i < len(outputs):
                messages.append({"role": "tool", "content": outputs[i]})
        turn = self.policy(messages, None, None)
        if turn.tool_calls:
            reply = "".join(
                "<tool_call>\n"
                + json.dumps({"name": c.name, "arguments": json.loads(c.arguments)})
                + "\n</tool_call>"
                for c in turn.tool_calls
            )
        else:
            reply = str(turn.content)
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        return ids, [-0.5] * len(ids), "stop"


@asynccontextmanager
async def opd_column(stack: AsyncExitStack) -> AsyncIterator[Any]:
    from reward_hacks import Column

    root = Path(tempfile.mkdtemp(prefix="tf-opd-hacks-"))
    tok = build_tiny_tokenizer(root / "tok")
    build_tiny_model(root / "teacher", tok, seed=1)
    teacher = await stack.enter_async_context(
        run_server(
            ServeConfig(model_path=root / "teacher", port=0, device="cpu", max_batch=4, batch_wait_ms=1)
        )
    )
    sampler = PolicySampler(tok)
    student = await stack.enter_async_context(TokenServer(tok, sampler=sampler))
    env = load_env(
        "opd",
        {
            "teacher_base_url": teacher.base_url,
            "max_tokens": 4000,
            "max_agent_turns": 4,
            "inner_overrides": {"families": ["find_value", "count_lines", "write_file"]},
        },
    )
    await env.setup()

    def model(policy: Any) -> Any:
        sampler.policy = policy
        client = CompletionChatModel(
            CompletionModelConfig(
                tokenizer_path=str(root / "tok"), base_url=student.base_url, endpoint="sglang_generate"
            )
        )
        stack.push_async_callback(client.aclose)
        return client

    yield Column("opd", env, env.eval_items(3), model=model)
