"""Turning sampled token ids into text as they come, and cutting the text at stop strings.

Decoding token by token is wrong for byte-level BPE (a character may span tokens) and decoding
the whole sequence at every step is quadratic, so :class:`IncrementalText` decodes a short window
(the prefix/read offsets used by vLLM and TGI) and holds back a trailing replacement character
until the bytes that complete it arrive.

Text that could be the start of a stop string is held back too, so a streamed response never
shows a stop string it will later cut: the concatenation of the deltas always equals the final
text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase


@dataclass(slots=True)
class IncrementalText:
    """Detokenizes one growing sequence of ids; ``push`` returns the newly settled text."""

    tokenizer: PreTrainedTokenizerBase
    skip_special_tokens: bool = True
    _ids: list[int] = field(default_factory=list)
    _prefix: int = 0
    _read: int = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)  # type: ignore[return-value]  # str for a flat list of ids

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back (e.g. an incomplete byte sequence at the very end)."""
        if not self._ids or self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


@dataclass(slots=True)
class StopText:
    """Accumulates a sequence's text, finds stop strings and decides what is safe to emit."""

    stop: tuple[str, ...] = ()
    include_stop: bool = False
    text: str = ""
    emitted: int = 0
    matched: str | None = None
    _cut: int = 0

    def add(self, delta: str) -> str:
        """Append ``delta``; return the text that can be shown now (never part of a stop string)."""
        if self.matched is not None:
            return ""
        search_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += delta
        for s in self.stop:
            idx = self.text.find(s, search_from)
            if idx != -1 and (self.matched is None or idx < self._cut):
                self.matched, self._cut = s, idx
        if self.matched is not None:
            end = self._cut + (len(self.matched) if self.include_stop else 0)
            self.text = self.text[:end]
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._held_back())

    def finish(self) -> str:
        """The rest of the text once the sequence ended for another reason."""
        return self._emit(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out
