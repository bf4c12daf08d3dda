"""What the engine raises: a request it cannot serve as asked (400), or a failure inside it (500)."""

from __future__ import annotations


class RequestError(ValueError):
    """The request cannot be served as asked (too long, bad token ids, bad path): a 400."""


class EngineError(RuntimeError):
    """Generation failed inside the engine (a 500); the message says why."""
