"""The one engine that runs rollouts (floor 5, above the rollout step, below the envs): plans in,
records out, at bounded and resizable concurrency, with retries, background teardowns, the
evaluation run directory's books (:mod:`.books`) and one Ray backend (:mod:`.ray`). ``batch``
and ``env eval`` are its two front ends."""

from trajforge.engine.core import Engine, Plan, Ran, RetryPolicy
from trajforge.engine.limiter import ResizableLimiter

__all__ = ["Engine", "Plan", "Ran", "ResizableLimiter", "RetryPolicy"]
