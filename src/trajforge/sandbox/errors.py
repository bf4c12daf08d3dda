"""Sandbox failures that are the infrastructure's, never the model's: they end or retry a rollout
and are never shown to the model as a tool result."""

from __future__ import annotations


class SandboxUnavailableError(RuntimeError):
    """The chosen sandbox backend cannot run on this machine; the message says what to do."""


class SandboxStartError(SandboxUnavailableError):
    """One rollout's sandbox failed to start."""


class SandboxBrokenError(SandboxUnavailableError):
    """A running sandbox stopped working: its exec agent died, stopped answering or failed.

    A rollout whose commands cannot run any more must not be saved as if the model had finished
    its task; the batch retries the sample in a fresh sandbox (or records it failed)."""
