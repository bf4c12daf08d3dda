"""Which optional parts of trajforge can run here, said in one line when one cannot.

``pip install trajforge`` is enough for the factory against any endpoint; serving a local model,
the embedded default policy and its recipe need the ``ml`` extra (torch, transformers, TRL). A
command that needs it says so before it starts, instead of a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib.util

ML_MODULES = ("torch", "transformers")


def missing_ml(what: str) -> str | None:
    """None when the ML stack is installed; else the one line that says what to install for ``what``.

    Only looks the modules up (``find_spec``), never imports them: importing torch costs seconds and
    hundreds of MB, and the process asking (``run`` and ``batch`` before they start the embedded
    server as a child) does not need it itself."""
    for name in ML_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError) as exc:
            found, why = False, str(exc)
        else:
            why = f"No module named {name!r}"
        if not found:
            return (
                f"{what} needs the ML stack ({name} is not installed: {why}); install it with "
                "`pip install 'trajforge[ml]'` (on a CPU-only machine, install torch from the CPU index first)"
            )
    return None
