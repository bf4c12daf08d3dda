"""Which optional parts of trajforge can run here, said in one line when one cannot.

``pip install trajforge`` is enough for the factory against any endpoint; serving a local model,
the embedded default policy and its recipe need the ``ml`` extra (torch, transformers, TRL). A
command that needs it says so before it starts, instead of a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib

ML_MODULES = ("torch", "transformers")


def missing_ml(what: str) -> str | None:
    """None when the ML stack imports; else the one line that says what to install for ``what``."""
    for name in ML_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return (
                f"{what} needs the ML stack ({name} is not importable: {exc}); install it with "
                "`pip install 'trajforge[ml]'` (on a CPU-only machine, install torch from the CPU index first)"
            )
    return None
