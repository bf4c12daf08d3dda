"""Managed training runs: their files on disk (``schema``), the processes behind them
(``manager``, ``procs``, ``supervise``), ``trajforge rl train`` as a run (``run_config``) and the
RL agent's ``rl_*`` tools over a manager (``tools``)."""
