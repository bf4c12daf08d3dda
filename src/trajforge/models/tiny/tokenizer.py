"""A byte-level BPE tokenizer trained on the synthetic corpus, with ChatML/Hermes tokens.

The policy's job is mostly to copy values (numbers, file names, texts, keys) between the prompt,
the tool output, the command and the answer, and a tiny transformer copies a *token* far more
easily than it learns that two different tokens mean the same word. So the pre-tokenizer makes a
value the same tokens wherever it appears: digits are split one per token, and every space is a
token of its own (GPT-2 style BPE would make ``' yellow'`` in the prompt and ``'yellow'`` after a
JSON quote two unrelated ids).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trajforge.models.tiny.template import BOS_TOKEN, CHAT_TEMPLATE, CONTROL_TOKENS, IM_END, MARKUP_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train the BPE on ``texts`` and wrap it as a transformers tokenizer with the chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", "isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CONTROL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=IM_END,
        pad_token=BOS_TOKEN,
        unk_token=None,
        additional_special_tokens=[t for t in CONTROL_TOKENS if t not in (BOS_TOKEN, IM_END)],
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
