"""``trajforge serve``: a local transformers model behind OpenAI-compatible and token-level HTTP APIs.

Import from the submodules (``trajforge.serve.app``, ``.engine``, ``.launcher``); this package
file imports nothing so that ``import trajforge.serve.launcher`` does not load torch.
"""
