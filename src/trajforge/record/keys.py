"""The one keying rule of a rollout (a record's ``key``), shared by ``batch`` and the envs.

A prompt (a dataset row, an env item) is keyed by its *content*: a hash of the row as canonical
JSON (sorted keys, so key order and whitespace do not matter) plus its occurrence number among
equal prompts of the run (``DIGEST-0``, ``DIGEST-1``: a prompt given twice is two prompts). Its
rollouts are ``PROMPT_KEY#k`` when it has more than one (``batch --group-size``, an env group),
the prompt key itself when it has one. The same row run by ``batch --env`` and the same item run
by ``env eval`` get the same key, and so the same seed (``derive_seed(base seed, key)``): the
key names what was asked, never how a run scheduled it.

``batch`` keys its dataset rows with :func:`content_digest` (``batch/dataset.py``, which saves
them in its index and ledger); ``env eval`` keys its items with :func:`prompt_keys`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from typing import Any

import orjson


def _not_json(value: Any) -> Any:
    """An env item may hold what JSON cannot (bytes of a setup file, a set): keyed by its repr.
    A dataset row is JSON already, so its key never goes through here."""
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, (set, frozenset)):
        return sorted(repr(v) for v in value)
    return repr(value)


def content_digest(row: Any) -> str:
    """A prompt's content hash: BLAKE2b-80 of its canonical JSON (20 hex digits)."""
    try:  # a dataset row (a million of them on a big run's first start): plain JSON, fast path
        data = orjson.dumps(row, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        data = orjson.dumps(row, default=_not_json, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(data, digest_size=10).hexdigest()


def key_of(row: Any, occurrence: int = 0) -> str:
    """The prompt key of ``row`` as its ``occurrence``-th equal row (an item asked on its own,
    outside an evaluation's list, is its first)."""
    return f"{content_digest(row)}-{occurrence}"


def prompt_keys(rows: Iterable[Any]) -> list[str]:
    """The prompt key of each row in order: its digest and its occurrence among equal rows."""
    seen: Counter[str] = Counter()
    keys = []
    for row in rows:
        digest = content_digest(row)
        keys.append(f"{digest}-{seen[digest]}")
        seen[digest] += 1
    return keys


def rollout_key(prompt_key: str, rollout: int, group_size: int) -> str:
    """Rollout ``rollout`` of a prompt with ``group_size`` rollouts: ``PROMPT_KEY#k``, or the
    prompt key alone when it is the prompt's only rollout."""
    return f"{prompt_key}#{rollout}" if group_size > 1 else prompt_key
