"""The tiny policy's chat format: ChatML turns, Hermes tool calls, a compact tool list.

Tools are rendered as one line each (``- name(arg, arg)``) instead of full JSON schemas: a
tiny model has a short context and little capacity, and the schemas of the terminal/file tools
would otherwise be most of every sequence. The call syntax is not spelled out in the prompt either: the
policy learns it from data, and every token of context costs training time on two CPU cores. Assistant turns are wrapped in ``{% generation %}``
so the same template yields the assistant-token mask used for assistant-only SFT loss.
"""

from __future__ import annotations

DEFAULT_SYSTEM = "You are a helpful assistant with tools."

BOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CONTROL_TOKENS = (BOS_TOKEN, IM_START, IM_END)
"""Special tokens (skipped when decoding with ``skip_special_tokens``)."""
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Single tokens that stay in decoded text: parsers need to see them."""

CHAT_TEMPLATE = (
    # transformers renders with trim_blocks: a newline right after a block tag would vanish, so
    # every newline that follows a tag is written as {{ NL }}.
    "{%- set NL = '\\n' -%}"
    "{%- set sys = messages[0].content if messages and messages[0].role == 'system' else '"
    + DEFAULT_SYSTEM
    + "' -%}"
    "<|im_start|>system{{ NL }}{{ sys }}"
    "{%- if tools %}{{ NL }}Tools:"
    "{%- for t in tools %}{%- set f = t.function if t.function is defined else t %}"
    "{{ NL }}- {{ f.name }}({{ ((f.parameters or {}).properties or {}).keys() | join(', ') }})"
    "{%- endfor %}"
    "{%- endif %}<|im_end|>{{ NL }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}<|im_start|>user{{ NL }}{{ m.content }}<|im_end|>{{ NL }}"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant{{ NL }}{% generation %}"
    "{%- set r = m.reasoning or m.reasoning_content %}"
    "{%- if r %}<think>{{ NL }}{{ r | trim }}{{ NL }}</think>{{ NL }}{% endif %}"
    "{{- (m.content or '') | trim }}"
    "{%- for c in (m.tool_calls or []) %}{%- set fc = c.function if c.function is defined else c %}"
    "{%- if loop.first and (m.content or '') | trim %}{{ NL }}{% endif %}"
    '<tool_call>{{ NL }}{"name": "{{ fc.name }}", "arguments": '
    "{{ fc.arguments if fc.arguments is string else (fc.arguments | tojson) }}}{{ NL }}</tool_call>"
    "{%- if not loop.last %}{{ NL }}{% endif %}"
    "{%- endfor %}<|im_end|>{% endgeneration %}{{ NL }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ NL }}<tool_response>{{ NL }}{{ m.content }}{{ NL }}</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{{ NL }}{% endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant{{ NL }}{% endif %}"
)
