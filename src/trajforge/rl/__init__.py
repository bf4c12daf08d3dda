"""Reinforcement learning on trajforge's own rollouts (issue 12).

``trajforge rl train`` trains a policy with GRPO on an environment's judged, token-exact episodes:
the ``builtin`` trainer (torch, :mod:`trajforge.rl.builtin`) samples from ``trajforge serve``
hosting the current policy and hands new weights to it through its reload after each step; the
``trl`` trainer (:mod:`trajforge.rl.trl_trainer`) drives TRL's ``GRPOTrainer`` through the env
adapter. The closed loop (``rl demo``: evaluate, train, the controls, evaluate) is an experiment on
top of these, in :mod:`trajforge.experiments.closed_loop`.

Nothing heavy is imported here: torch and transformers load when a trainer starts.
"""
