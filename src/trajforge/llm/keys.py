"""API keys: read from the environment once, held as secrets, never shown.

Keys never travel through argv (visible in ``ps``), records or logs. A client is told the
*name* of an environment variable; this module reads it at construction and hands back a
:class:`pydantic.SecretStr`, whose ``repr`` is masked, plus :func:`redact` for any text that
might echo the key back (some providers quote it in their 401 message).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from pydantic import SecretStr

DEFAULT_KEY_ENVS: tuple[str, ...] = ("OPENAI_API_KEY", "OPENROUTER_API_KEY")


class MissingApiKeyError(ValueError):
    """An explicitly named key variable is unset or empty."""


@dataclass(frozen=True)
class ResolvedKey:
    """The key (if any) and where it came from, for error messages that help without leaking."""

    secret: SecretStr | None
    source: str | None
    searched: tuple[str, ...]

    def describe(self) -> str:
        if self.source:
            return f"API key from ${self.source}"
        return "no API key (looked in " + ", ".join(f"${n}" for n in self.searched) + ")"


def default_key_envs(base_url: str) -> tuple[str, ...]:
    """``OPENAI_API_KEY`` then ``OPENROUTER_API_KEY`` -- reversed for an openrouter.ai endpoint.

    Someone with both keys set who points at OpenRouter means the OpenRouter key.
    """
    host = urlparse(base_url).hostname or ""
    if host == "openrouter.ai" or host.endswith(".openrouter.ai"):
        return tuple(reversed(DEFAULT_KEY_ENVS))
    return DEFAULT_KEY_ENVS


def resolve_api_key(
    env_name: str | None,
    base_url: str,
    environ: Mapping[str, str] | None = None,
) -> ResolvedKey:
    """Reads the key named by ``env_name``, or the default variables when it is None.

    A named variable that is unset raises :class:`MissingApiKeyError` (the user asked for it);
    with the defaults, no key at all is allowed -- local servers (vLLM, the scripted server)
    usually need none, and a remote one answers 401, which the client reports with
    :meth:`ResolvedKey.describe`.
    """
    env = os.environ if environ is None else environ
    names: Sequence[str] = (env_name,) if env_name else default_key_envs(base_url)
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return ResolvedKey(SecretStr(value), name, tuple(names))
    if env_name:
        raise MissingApiKeyError(
            f"environment variable {env_name} is unset or empty; export it with your API key "
            f"(keys are never accepted on the command line)"
        )
    return ResolvedKey(None, None, tuple(names))


def redact(text: str, secret: SecretStr | None) -> str:
    """``text`` with every occurrence of the key replaced by ``***``."""
    if secret is None:
        return text
    value = secret.get_secret_value()
    return text.replace(value, "***") if value else text
