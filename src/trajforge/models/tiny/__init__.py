"""The embedded tiny tool-calling policy: its recipe and its committed weights.

Importing this package is cheap (no torch); the recipe modules import the ML stack when used.
"""

from __future__ import annotations

from pathlib import Path

_WEIGHTS = Path(__file__).resolve().parent / "weights"


def weights_path() -> Path:
    """Directory of the committed policy (config.json, model.safetensors, tokenizer, template).

    Raises ``FileNotFoundError`` saying how to build it when the weights are missing (for
    example in a source checkout where they were deleted).
    """
    if not (_WEIGHTS / "config.json").is_file() or not (_WEIGHTS / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the embedded tiny policy is missing from {_WEIGHTS}; rebuild it with "
            f"`trajforge model build-tiny --out {_WEIGHTS}`"
        )
    return _WEIGHTS


__all__ = ["weights_path"]
