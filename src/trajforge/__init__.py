"""trajforge: agent trajectory factory and RL environments for tool-using LLMs.

The public boundaries live in :mod:`trajforge.protocols`; concrete pieces are in the
subpackages (``llm``, ``sandbox``, ``tools``, ``agent``, ``trajectory``, ``batch``).
"""

__version__ = "0.1.0"
