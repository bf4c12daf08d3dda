"""An env's items run on the engine (:mod:`trajforge.engine`): the env front end.

``envs/`` says what an env is (its protocol, hooks, judge and verifier, the library); this
package runs one: :class:`~.episode.Rollouts` (an item and its place in a group -> an engine
plan -> a judged record), :func:`~.evaluate.run_eval` (``env eval``: the token budget fitted
(:mod:`.budget`), then the rollouts inside the engine's books), ``--backend ray``
(:mod:`.ray_backend`) and the backends built from settings (:mod:`.backends`).
"""
