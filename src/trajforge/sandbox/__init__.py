"""Where a rollout's commands run: one sandbox per rollout, backends ``bwrap``, ``local``, ``docker``.

``create_sandbox_factory(config)`` picks the backend named by ``config.kind`` (imported lazily from
a fixed map, so nothing optional is imported up front); ``await factory.create(task_id)`` gives a
:class:`trajforge.protocols.Sandbox`.
"""

from __future__ import annotations

import importlib

from trajforge.sandbox.errors import SandboxBrokenError, SandboxStartError, SandboxUnavailableError
from trajforge.sandbox.factory import ProcessSandboxFactory
from trajforge.sandbox.process import ProcessSandbox
from trajforge.sandbox.types import ExecResult, SandboxConfig, SandboxKind, SandboxLimits

_BACKENDS = {
    "bwrap": ("trajforge.sandbox.bwrap", "BwrapSandboxFactory"),
    "local": ("trajforge.sandbox.local", "LocalSandboxFactory"),
    "docker": ("trajforge.sandbox.docker", "DockerSandboxFactory"),
}


def create_sandbox_factory(config: SandboxConfig | None = None) -> ProcessSandboxFactory:
    """The factory for ``config.kind`` (every backend is a :class:`ProcessSandboxFactory`, which
    satisfies :class:`trajforge.protocols.SandboxFactory`). Availability is checked on the first
    ``create``."""
    config = config or SandboxConfig()
    try:
        module_name, class_name = _BACKENDS[config.kind]
    except KeyError:
        raise ValueError(
            f"unknown sandbox backend {config.kind!r}; choose one of {', '.join(_BACKENDS)}"
        ) from None
    factory_cls: type[ProcessSandboxFactory] = getattr(importlib.import_module(module_name), class_name)
    return factory_cls(config)


async def close_factory(factory: object) -> None:
    """Release what a factory keeps between sandboxes (reusable idle sandboxes), if anything.

    ``aclose`` is optional in :class:`trajforge.protocols.SandboxFactory`: a factory that keeps
    nothing (most test doubles) need not have one.
    """
    aclose = getattr(factory, "aclose", None)
    if aclose is not None:
        await aclose()


def factory_counts(factory: object) -> dict[str, int] | None:
    """A factory's sandbox counters (created, reused, ``discarded: <why>``), when it keeps any."""
    stats = getattr(factory, "stats", None)
    counts = getattr(stats, "counts", None)
    return counts() if callable(counts) else None


__all__ = [
    "ExecResult",
    "ProcessSandbox",
    "ProcessSandboxFactory",
    "SandboxConfig",
    "SandboxKind",
    "SandboxLimits",
    "SandboxBrokenError",
    "SandboxStartError",
    "SandboxUnavailableError",
    "close_factory",
    "factory_counts",
    "create_sandbox_factory",
]
