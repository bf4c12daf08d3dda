"""The shared retry policy of both model clients (llm/retry.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from trajforge.llm.retry import (
    CallSite,
    TransientError,
    backoff_s,
    call_with_retries,
    parse_retry_after,
    status_error,
)
from trajforge.llm.types import ModelError, ModelErrorKind


@dataclass
class Settings:
    max_retries: int = 3
    backoff_base_s: float = 0.0
    backoff_max_s: float = 0.0
    max_retry_after_s: float = 5.0


SITE = CallSite(endpoint="http://127.0.0.1:1/v1", label="test", verb="request")


def test_status_mapping():
    assert isinstance(status_error(SITE, 429, "slow down"), TransientError)
    assert isinstance(status_error(SITE, 503, "down"), TransientError)
    auth = status_error(SITE, 401, "bad key", auth_hint=" (key from $K)")
    assert isinstance(auth, ModelError) and auth.kind is ModelErrorKind.AUTH
    assert "HTTP 401 from http://127.0.0.1:1/v1" in str(auth) and "$K" in str(auth)
    ctx = status_error(SITE, 400, "This model's maximum context length is 4096 tokens")
    assert ctx.kind is ModelErrorKind.CONTEXT_LENGTH
    ctx2 = status_error(SITE, 400, "prompt is longer than the maximum model length")
    assert ctx2.kind is ModelErrorKind.CONTEXT_LENGTH
    assert status_error(SITE, 404, "no such model").kind is ModelErrorKind.PERMANENT


def test_retry_after_parsing_and_cap():
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0) == 10.0
    assert parse_retry_after({}) is None
    wait = backoff_s(Settings(max_retry_after_s=1.0), 1, retry_after=100.0)
    assert 1.0 <= wait <= 1.1


async def test_call_with_retries_recovers_then_gives_up():
    calls = 0

    async def flaky():
        nonlocal calls
        calls += 1
        if calls < 3:
            raise TransientError("HTTP 500: boom", status=500, retry_after=0.0)
        return "ok"

    assert await call_with_retries(flaky, Settings(), SITE) == "ok" and calls == 3

    async def always():
        raise TransientError("HTTP 503: down", status=503, retry_after=0.0)

    with pytest.raises(ModelError) as info:
        await call_with_retries(always, Settings(max_retries=2), SITE)
    assert info.value.kind is ModelErrorKind.TRANSIENT and info.value.attempts == 3
    assert "failed after 3 attempt(s)" in str(info.value)

    async def permanent():
        raise status_error(SITE, 404, "missing")

    with pytest.raises(ModelError) as info:
        await call_with_retries(permanent, Settings(), SITE)
    assert info.value.kind is ModelErrorKind.PERMANENT


async def test_call_with_retries_logs_each_failure_in_order(caplog):
    """The first attempt runs outside tenacity; its failure is still retry 1 with its own
    reason and Retry-After, and the attempts are counted as before."""
    calls = 0

    async def flaky():
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise TransientError(f"HTTP 503: failure {calls}", status=503, retry_after=0.0)
        return "ok"

    with caplog.at_level(logging.INFO, logger="trajforge.llm.retry"):
        assert await call_with_retries(flaky, Settings(max_retries=2), SITE) == "ok"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and calls == 3
    assert "(HTTP 503: failure 1); retry 1/2" in lines[0] and "(HTTP 503: failure 2); retry 2/2" in lines[1]

    async def down():
        raise TransientError("HTTP 503: down", status=503)

    caplog.clear()
    with pytest.raises(ModelError) as info:  # no retries allowed: the first failure is final
        await call_with_retries(down, Settings(max_retries=0), SITE)
    assert info.value.attempts == 1 and "failed after 1 attempt(s): HTTP 503: down" in str(info.value)
    assert not caplog.records
