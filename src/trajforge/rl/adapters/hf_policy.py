"""A live, in-memory transformers model as a token-exact ``ChatModel`` (for on-policy RL).

An RL trainer must sample rollouts from the weights it is training, and the trainer needs the
exact ids the policy sampled, with their logprobs, for every turn of a multi-turn tool-use
episode. trajforge already has both halves:

- ``trajforge serve``'s :class:`~trajforge.serve.engine.Engine` (batched generation with
  per-token logprobs, left-padded batches, each row stopping on its own) and its HTTP routes;
- :class:`~trajforge.llm.completion_model.CompletionChatModel`, which renders the chat template
  itself, extends the previous turn's exact ids instead of re-tokenizing, parses tool calls and
  returns a :class:`~trajforge.llm.types.TokenTrace` per turn, from which
  :class:`~trajforge.envs.running.episode.Rollouts` builds the episode's tokens/masks/logprobs.

:class:`LivePolicy` joins them around a model object the caller keeps training: the engine holds
*that module* (not a copy, not a checkpoint), so an optimizer step is visible to the next
rollout with no reload and no staleness. The routes listen on an ephemeral 127.0.0.1 port and
the chat model talks to them like to any vLLM-style ``/generate`` server -- the same path the
Atropos adapter and ``trajforge serve`` use, so nothing here re-implements sampling or token
bookkeeping. Rollouts must not overlap an optimizer step (trainers call rollouts between
steps; :meth:`LivePolicy.sampling` switches the module to eval mode for the duration).

Heavy imports (torch, transformers, the serve engine) happen when a policy starts, never when
:mod:`trajforge.envs` is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trajforge.llm.chat_template import ChatTemplate
from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig

if TYPE_CHECKING:
    from aiohttp import web

    from trajforge.serve.engine import Engine


class LivePolicyError(RuntimeError):
    """The live policy cannot serve (not started, or the model/tokenizer pair is unusable)."""


class LivePolicy:
    """Serve a model being trained on loopback and talk to it token-exactly.

    ``async with LivePolicy(model, tokenizer) as policy: policy.chat_model`` -- a
    :class:`CompletionChatModel` whose turns carry exact token traces. ``max_batch`` sequences
    are decoded together (concurrent rollouts share batches); ``default_max_tokens`` applies to
    requests that give no ``max_tokens``. Must be started and used on one event loop.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "policy",
        parser: str = "hermes",
        max_batch: int = 16,
        default_max_tokens: int = 256,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise LivePolicyError(
                "the tokenizer has no chat_template; rollouts render conversations with it "
                "(use a chat/instruct tokenizer or set tokenizer.chat_template)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.parser = parser
        self.max_batch = max_batch
        self.default_max_tokens = default_max_tokens
        self.template = ChatTemplate(tokenizer, template_kwargs=chat_template_kwargs)
        self._engine: Engine | None = None
        self._runner: web.AppRunner | None = None
        self._chat_model: CompletionChatModel | None = None
        self.base_url: str | None = None

    @property
    def chat_model(self) -> CompletionChatModel:
        if self._chat_model is None:
            raise LivePolicyError("the live policy is not started; use `async with LivePolicy(...)`")
        return self._chat_model

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise LivePolicyError("the live policy is not started; use `async with LivePolicy(...)`")
        return self._engine

    async def start(self) -> LivePolicy:
        from aiohttp import web

        from trajforge.llm.parsers import get_parser
        from trajforge.serve.app import create_app
        from trajforge.serve.context import ServerContext
        from trajforge.serve.engine import Engine

        engine = Engine(
            self.model,
            self.tokenizer,
            max_batch=self.max_batch,
            default_max_tokens=self.default_max_tokens,
        )
        await engine.start()
        ctx = ServerContext(
            engine=engine, tokenizer=self.tokenizer, model_name=self.name, parser=get_parser(self.parser)
        )
        runner = web.AppRunner(create_app(ctx), access_log=None, shutdown_timeout=1.0)
        try:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = next(a[1] for a in runner.addresses if isinstance(a, tuple) and len(a) >= 2)
        except BaseException:
            await runner.cleanup()
            await engine.close()
            raise
        self._engine, self._runner = engine, runner
        self.base_url = f"http://127.0.0.1:{port}"
        self._chat_model = CompletionChatModel(
            CompletionModelConfig(
                tokenizer_path=self.name,  # unused: the template is given
                base_url=self.base_url,
                endpoint="vllm_generate",
                model=self.name,
                parser=self.parser,
                default_max_tokens=self.default_max_tokens,
                max_retries=0,  # a local engine that fails will fail again; say so at once
            ),
            template=self.template,
        )
        return self

    async def aclose(self) -> None:
        chat, self._chat_model = self._chat_model, None
        runner, self._runner = self._runner, None
        engine, self._engine = self._engine, None
        if chat is not None:
            await chat.aclose()
        if runner is not None:
            await runner.cleanup()
        if engine is not None:
            await engine.close()

    async def __aenter__(self) -> LivePolicy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        """Eval mode (no dropout) while rollouts sample; the previous mode is restored after."""
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            yield
        finally:
            if was_training:
                self.model.train()
