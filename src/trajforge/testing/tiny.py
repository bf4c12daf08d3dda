"""Tiny tokenizers and models built locally, for tests that must not touch the hub.

Token-exact code (chat templates, token traces, RL batches) is only trustworthy when tested
against a *real* tokenizer with a *real* Jinja chat template -- a mock cannot show re-tokenization
drift. These builders train a small byte-level BPE on an in-code corpus (seconds, offline) and
attach one of two templates:

- ``"chatml"``: Hermes/ChatML. Tools go into the system turn inside ``<tools></tools>``;
  assistant tool calls render as ``<tool_call>\\n{json}\\n</tool_call>``; consecutive tool
  results merge into one ``user`` turn of ``<tool_response>`` blocks. Reasoning is kept on every
  assistant turn, so re-rendering a conversation reproduces what the model saw.
- ``"qwen3"``: the same turns, but like the real Qwen3 template it *strips* ``<think>``
  reasoning from every assistant turn except a final one. Re-rendering a finished multi-turn
  conversation therefore differs from the tokens the model saw -- exactly the case the reference
  system's prefix matching got wrong.

Both are saved with ``save_pretrained`` so ``AutoTokenizer.from_pretrained(out_dir)`` works
offline, like a downloaded model directory would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

TemplateName = Literal["chatml", "qwen3"]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"
SPECIAL_TOKENS = (IM_START, IM_END, PAD)
"""Control tokens: one id each, dropped by ``decode(skip_special_tokens=True)``."""
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Single-id markup the model writes itself (kept by ``skip_special_tokens``, as in Qwen)."""

_TOOLS_SYSTEM = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures are inside <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call a function, reply with <tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}'
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
)

# ``KEEP_REASONING`` is the only difference between the two templates. All literal text is in
# ``{{ }}`` expressions because transformers renders with trim_blocks/lstrip_blocks.
_BODY = (
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content and (KEEP_REASONING) %}"
    "{{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content or '' }}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    "{%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\\\"name\\\": \\\"' + f.name + '\\\", \\\"arguments\\\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHATML_TEMPLATE = _TOOLS_SYSTEM + _BODY.replace("KEEP_REASONING", "true")
"""Hermes/ChatML: every assistant turn keeps its reasoning."""
QWEN3_TEMPLATE = _TOOLS_SYSTEM + _BODY.replace("KEEP_REASONING", "loop.last")
"""Qwen3-style: reasoning survives only on an assistant turn that ends the conversation."""

TEMPLATES: dict[str, str] = {"chatml": CHATML_TEMPLATE, "qwen3": QWEN3_TEMPLATE}


def _corpus() -> list[str]:
    """Text shaped like what the tests send: chat markup, JSON tool calls, shell, some unicode."""
    tool = {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command in the sandbox and return its output.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
    call = {"name": "write_file", "arguments": {"path": "notes/hello.txt", "content": "hi there"}}
    return [
        "You are a helpful assistant that uses tools to solve tasks step by step.",
        "Please create a file called hello.txt with the text hello world, then list the files.",
        json.dumps(tool),
        json.dumps(call),
        '{"name": "terminal", "arguments": {"command": "ls -la && cat hello.txt"}}',
        '{"stdout": "hello world\\n", "exit_code": 0, "error": null}',
        "I should look at the directory first. Then I will write the answer.",
        "The file was created successfully. Done! The answer is 42.",
        "def main():\n    print('hello')\n    return 0\n",
        "numbers 0 1 2 3 4 5 6 7 8 9 10 100 3.14 -1 true false null",
        "Größe café naïve 日本語 テキスト 中文 emoji 🙂 ✓",
        "# Tools\n\nYou may call one or more functions. Function signatures are inside <tools></tools>",
    ] * 4


def build_tiny_tokenizer(
    out_dir: str | Path, template: TemplateName = "chatml", *, vocab_size: int = 600
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with a chat template and save it to ``out_dir``.

    Byte-level means every string round-trips (``decode(encode(s)) == s``), unicode included,
    so tests can compare decoded token sequences with rendered text exactly. Deterministic:
    the same arguments give the same vocabulary, whichever template is chosen.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {sorted(TEMPLATES)}")
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=_train_bpe(vocab_size),
        eos_token=AddedToken(IM_END, special=True, normalized=False),
        pad_token=AddedToken(PAD, special=True, normalized=False),
        additional_special_tokens=[IM_START],
        chat_template=TEMPLATES[template],
        model_max_length=32768,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def _train_bpe(vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on :func:`_corpus`, with the special and markup tokens added."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def build_tiny_model(
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden: int = 32,
    layers: int = 2,
    seed: int = 0,
) -> Any:
    """A randomly initialised Qwen2-architecture causal LM sized for CPU tests, saved to ``out_dir``.

    The tokenizer is saved next to it, so ``out_dir`` is a complete local model directory.
    Returns the ``transformers`` model (in eval mode).
    """
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(_qwen2_config(tokenizer, hidden, layers)).eval()  # type: ignore[no-untyped-call]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return model


def _qwen2_config(tokenizer: PreTrainedTokenizerFast, hidden: int, layers: int) -> Any:
    from transformers import Qwen2Config

    heads = max(1, hidden // 8)
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
