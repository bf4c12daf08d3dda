"""The error a batch run stops with when the user must change something."""

from __future__ import annotations


class RunError(RuntimeError):
    """The run cannot start or finish; the message says what to do."""
