"""Agent-written envs: kept apart from the operator's, read statically, run only in a sandbox.

- :mod:`.store`: where the RL agent's env files are copied on the host (content-addressed, with a
  manifest recording provenance and the operator's approval), and the ``agent-env:`` references.
- :mod:`.static`: what an env file says about itself, read with :mod:`ast` -- never imported.
- :mod:`.host` + :mod:`.child`: the env host, a Python process in bubblewrap that runs the env's
  code, and the JSON-lines pipe to it (:mod:`.wire`).
- :mod:`.proxy`: ``SandboxedEnv``, the env host as an ``AgentEnv`` on the host;
  :func:`load_agent_env` builds one from an approved reference.

Nothing is imported here, so the env host's own start-up loads only what it uses.
"""
