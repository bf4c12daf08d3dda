"""The policy being trained, hosted by ``trajforge serve`` as a child process, and reloaded in place.

Rollouts sample from the same server a user would run (``trajforge serve`` on loopback, its
``/generate`` route with per-token logprobs), through the token-exact
:class:`~trajforge.llm.completion_model.CompletionChatModel`, so the episode traces the trainer
learns from are the server's own ids and logprobs. New weights reach it through
``POST /v1/load_weights`` (swapped between decode batches; the answer is the new version) --
never a restart.

The server reports ``processed`` logprobs (after temperature), and the trainer computes its
logprobs at the same temperature, so the GRPO ratio compares the distribution that really
sampled with the one being trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig
from trajforge.serve.launcher import LocalServer


class PolicyServerError(RuntimeError):
    """The rollout server refused new weights (the message carries its answer)."""


class PolicyServer:
    """``async with PolicyServer(model_dir, tokenizer_dir) as server: server.chat_model``."""

    def __init__(
        self,
        model_dir: Path,
        tokenizer_dir: Path,
        *,
        parser: str = "hermes",
        max_batch: int = 32,
        device: str = "cpu",
        dtype: str = "float32",
        max_tokens: int = 256,
        log_path: Path | None = None,
        name: str = "policy",
    ) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.parser = parser
        self.max_tokens = max_tokens
        self.name = name
        self._server = LocalServer(
            model_dir,
            parser=parser,
            max_batch=max_batch,
            device=device,
            extra_args=(
                "--served-model-name",
                name,
                "--logprobs-mode",
                "processed",
                "--batch-wait-ms",
                "20",
                "--dtype",
                dtype,
            ),
            log_path=log_path,
        )
        self._chat: CompletionChatModel | None = None
        self.version = 0
        self.weights_path: str = str(model_dir)

    @property
    def base_url(self) -> str:
        if self._server.base_url is None:
            raise PolicyServerError("the policy server is not running")
        return self._server.base_url

    @property
    def chat_model(self) -> CompletionChatModel:
        if self._chat is None:
            raise PolicyServerError("the policy server is not running; use `async with PolicyServer(...)`")
        return self._chat

    async def start(self) -> PolicyServer:
        await self._server.start()
        self._chat = CompletionChatModel(
            CompletionModelConfig(
                tokenizer_path=str(self.tokenizer_dir),
                base_url=self.base_url,
                endpoint="vllm_generate",
                model=self.name,
                parser=self.parser,
                default_max_tokens=self.max_tokens,
                max_retries=0,  # a local server that fails will fail again: say so at once
            )
        )
        health = await self._server.health()
        self.version = int(health.get("model_version", 0))
        return self

    async def reload(self, path: Path) -> int:
        """Swap the served weights for the checkpoint at ``path``; returns the server's new version."""
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session,
            session.post(
                f"{self.base_url}/v1/load_weights",
                json={"path": str(path)},
                headers=self._server.auth_headers(),
            ) as resp,
        ):
            body: dict[str, Any] = await resp.json(content_type=None)
            if resp.status != 200:
                raise PolicyServerError(f"the server refused weights {path}: HTTP {resp.status} {body}")
        self.version = int(body["version"])
        self.weights_path = str(body.get("path", path))
        return self.version

    async def health(self) -> dict[str, Any]:
        return await self._server.health()

    async def aclose(self) -> None:
        chat, self._chat = self._chat, None
        if chat is not None:
            await chat.aclose()
        await self._server.stop()

    async def __aenter__(self) -> PolicyServer:
        try:
            return await self.start()
        except BaseException:
            await self.aclose()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
