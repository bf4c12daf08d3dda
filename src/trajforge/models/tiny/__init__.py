"""The embedded tiny tool-calling policy: its recipe and its committed weights.

Importing this package is cheap (no torch); the recipe modules import the ML stack when used.
"""

from __future__ import annotations

from pathlib import Path

from trajforge.endpoint import embedded_weights


def weights_path() -> Path:
    """Directory of the committed policy; see :func:`trajforge.endpoint.embedded_weights`."""
    return embedded_weights()


__all__ = ["weights_path"]
