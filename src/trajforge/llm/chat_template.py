"""A model's chat template, rendered locally, and the token segments between sampled turns.

Token-exact RL needs the prompt of turn k+1 to be *the prompt of turn k, plus the exact ids the
model sampled, plus the template's text for what came next* (tool results, a later user turn,
the next generation prompt). Re-tokenizing the whole conversation instead drifts: sampled ids
are rarely the canonical tokenization of their text, and templates such as Qwen3's strip
``<think>`` from earlier turns. The reference system matched re-rendered prefixes, which breaks
on exactly those templates.

:meth:`ChatTemplate.continuation_ids` finds the segment without assuming the re-render keeps
earlier turns unchanged: every assistant turn ends with the end-of-turn marker (``<|im_end|>``
for ChatML/Qwen), and stripping reasoning never removes one, so the end of the last sampled
turn is the N-th marker of the full render, where N is the number of markers in the render that
ends with that turn. What follows it is the segment, tokenized on its own; it starts at a
special token, so tokenizing it alone gives the same ids as tokenizing it in context.

Tokenizers are loaded from a local directory only: trajforge never downloads.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trajforge.messages import content_text, message_reasoning


class TemplateError(ValueError):
    """The chat template cannot be used for token-exact traces (says why and what to do)."""


def load_tokenizer(path: str | Path) -> Any:
    """A transformers tokenizer from a LOCAL directory (no hub access, ever)."""
    local = Path(path).expanduser()
    if not local.is_dir():
        raise TemplateError(
            f"tokenizer path {str(path)!r} is not a local directory; download the model once "
            "(e.g. `huggingface-cli download ORG/MODEL --local-dir DIR`) and pass DIR"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(local), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TemplateError(f"cannot load a tokenizer from {str(local)!r}: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(
            f"the tokenizer in {str(local)!r} has no chat_template; use an instruct/chat model's "
            "tokenizer or add chat_template.jinja to the directory"
        )
    return tokenizer


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-format messages reshaped the way HF chat templates expect them.

    - assistant reasoning (``reasoning`` / ``reasoning_details``) -> ``reasoning_content``,
      the field Qwen/DeepSeek templates read;
    - tool-call ``arguments`` JSON strings -> objects (templates apply ``tojson`` themselves;
      an invalid string is left as is, so the template shows what the model wrote);
    - ``None``/list content -> text.
    """
    out: list[dict[str, Any]] = []
    for msg in messages:
        m = dict(msg)
        m["content"] = content_text(msg.get("content"))
        if m.get("role") == "assistant":
            reasoning = message_reasoning(msg)
            if reasoning is not None:
                m["reasoning_content"] = reasoning
            if msg.get("tool_calls"):
                m["tool_calls"] = [_template_call(tc) for tc in msg["tool_calls"]]
        out.append(m)
    return out


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # invalid: the template shows it verbatim
            fn["arguments"] = json.loads(args) if args.strip() else {}
    return {**call, "function": fn}


class ChatTemplate:
    """A tokenizer plus its chat template: render, encode, decode, and find segments.

    Methods are synchronous and may take milliseconds on long conversations; async callers run
    them with ``asyncio.to_thread``. A lock serialises tokenizer use, because a fast tokenizer
    shared across threads can fail with "Already borrowed".
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        end_of_turn: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn or tokenizer.eos_token
        if not self.end_of_turn:
            raise TemplateError("the tokenizer has no eos_token; pass end_of_turn (e.g. '<|im_end|>')")
        ids = tokenizer.encode(self.end_of_turn, add_special_tokens=False)
        if len(ids) != 1:
            raise TemplateError(
                f"end_of_turn {self.end_of_turn!r} is not a single token in this tokenizer ({ids}); "
                "pass the template's end-of-turn token, e.g. '<|im_end|>' or '<|eot_id|>'"
            )
        self.end_of_turn_id: int = ids[0]
        self.template_kwargs = dict(template_kwargs or {})
        self._lock = threading.Lock()

    @classmethod
    def from_path(cls, path: str | Path, **kwargs: Any) -> ChatTemplate:
        return cls(load_tokenizer(path), **kwargs)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn: the end-of-turn token and the tokenizer's eos."""
        ids = {self.end_of_turn_id}
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for ``messages`` (OpenAI format) and ``tools``."""
        with self._lock:
            text = self.tokenizer.apply_chat_template(
                template_messages(messages),
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self.template_kwargs,
            )
        if not isinstance(text, str):  # pragma: no cover - transformers contract
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def encode(self, text: str) -> list[int]:
        """Ids of template text; special tokens in it are parsed, none are added."""
        with self._lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        with self._lock:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """A fresh prompt: the whole conversation rendered with the generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def continuation_ids(
        self,
        head: Sequence[Mapping[str, Any]],
        rest: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        sampled_end_of_turn: bool,
    ) -> list[int]:
        """The ids that follow a sampled assistant turn: ``rest`` plus the generation prompt.

        ``head`` ends with that assistant turn. When the model sampled the end-of-turn token
        (``sampled_end_of_turn``) the segment starts right after the marker; when it did not
        (cut off by ``max_tokens`` or a stop string) the segment starts *with* the marker, which
        the template requires and the model never sampled (so it is masked in training).
        """
        if not head or head[-1].get("role") != "assistant":
            raise ValueError("head must end with the assistant turn whose tokens were sampled")
        marker = self.end_of_turn
        n = self.render(head, tools, add_generation_prompt=False).count(marker)
        full = self.render([*head, *rest], tools, add_generation_prompt=True)
        pos = _nth(full, marker, n)
        if n == 0 or pos < 0:
            raise TemplateError(
                f"cannot find the end of the last assistant turn in the rendered template: expected "
                f"{max(n, 1)} {marker!r} marker(s). Is end_of_turn right for this model's template?"
            )
        cut = pos + len(marker) if sampled_end_of_turn else pos
        return self.encode(full[cut:])


def _nth(text: str, needle: str, n: int) -> int:
    """Start of the n-th (1-based) occurrence of ``needle`` in ``text``, or -1."""
    pos = -1
    for _ in range(n):
        pos = text.find(needle, pos + 1)
        if pos < 0:
            return -1
    return pos
