"""Experiments built on trajforge, kept out of the library's core.

:mod:`trajforge.experiments.closed_loop` is ``trajforge rl demo``: GRPO against the controls a
researcher asks for (RFT, supervised training on a demonstration set or on oracle demonstrations),
from one start with one counted budget, measured on the same held-out items. It uses the library
(``rl``'s trainers, ``envs``' evaluation, ``serve``) as a user's experiment would; nothing in the
library imports it, only the CLI (``tests/test_import_graph.py``: the floor above ``rl/``).
"""
