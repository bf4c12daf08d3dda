"""The retry policy shared by the HTTP model clients, and the errors a failed call becomes.

Both :class:`~trajforge.llm.openai_client.OpenAIChatModel` and
:class:`~trajforge.llm.completion_model.CompletionChatModel` talk HTTP to a model server and
must treat its failures alike: transient ones (408/409/425/429, 5xx, timeouts, dropped
connections, malformed bodies; not a status whose body says the server's request validation
refused the request) are retried with exponential backoff and jitter, a server's
``Retry-After`` wins over the backoff (capped), and everything else -- or a transient failure
that outlasts the retries -- becomes one :class:`ModelError` whose kind (auth, context length,
permanent, transient) tells the caller what to do. Keeping that here means one policy to read,
test and change. The clients keep what is theirs: how an attempt is made, and how a response
or an SDK exception is turned into a status and a text (redacted before it reaches this
module, which never sees a key).
"""

from __future__ import annotations

import email.utils
import logging
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Protocol, TypeVar

from pydantic import Field
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from trajforge.llm.types import ModelError, ModelErrorKind

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 409, 425, 429})
"""HTTP statuses below 500 that are worth another attempt."""

_CONTEXT_PATTERNS = re.compile(
    r"context[ _-]?length|context window|maximum context|too many tokens|prompt is too long"
    r"|reduce the length|input is too long|longer than the maximum|exceeds the context",
    re.IGNORECASE,
)

_VALIDATION_PATTERNS = re.compile(
    r"\b\d+ validation errors?(?: for \w+|:)"  # pydantic's / FastAPI's message, some servers send as a 500
    r"|\[type=[a-z_]+, input_value="  # pydantic v2's line for each failed field
    r"|'type': '[a-z_]+', 'loc': \("  # FastAPI's RequestValidationError, str()-ed (llama-cpp-python)
    r"|\"detail\":\s*\[\s*\{\s*\"(?:type|loc|msg)\""  # FastAPI's 422 body
)
"""A request the server's own validation rejected: the same request can never pass. llama-cpp-python
answers a token-id prompt with HTTP 500 and pydantic's message; retried as transient it cost ~70 s
per sample (issue 37)."""

# Config fields, declared once so both client configs validate and document them alike (each
# config keeps its own default).
MaxRetries = Annotated[int, Field(ge=0, description="retries after the first attempt")]
BackoffBase = Annotated[float, Field(ge=0, description="first backoff; doubles per retry")]
BackoffMax = Annotated[float, Field(ge=0, description="cap of one backoff wait")]
MaxRetryAfter = Annotated[float, Field(ge=0, description="cap on a server's Retry-After")]


class RetrySettings(Protocol):
    """The config fields the policy reads (both client configs have them)."""

    @property
    def max_retries(self) -> int: ...

    @property
    def backoff_base_s(self) -> float: ...

    @property
    def backoff_max_s(self) -> float: ...

    @property
    def max_retry_after_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class CallSite:
    """Who calls what, as errors and logs name it: ``"{verb} to {endpoint} ({label})"``.

    ``label`` is how the model is named, e.g. ``"model 'gpt-x'"``; nothing here holds a key.
    """

    verb: str
    endpoint: str
    label: str


class TransientError(Exception):
    """One failed attempt worth retrying; ``retry_after`` is the server's wish, in seconds."""

    def __init__(self, reason: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date).

    ``headers`` must look names up case-insensitively (httpx and aiohttp headers do).
    """
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    reference = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - reference)


def is_context_error(text: str, error_code: str | None = None) -> bool:
    """Whether a 400/413 says the prompt did not fit (servers word it many ways)."""
    return error_code == "context_length_exceeded" or bool(_CONTEXT_PATTERNS.search(text))


def is_validation_error(text: str) -> bool:
    """Whether an error text is a request-validation failure (permanent, whatever the status)."""
    return bool(_VALIDATION_PATTERNS.search(text))


def status_error(
    site: CallSite,
    status: int,
    text: str,
    *,
    retry_after: float | None = None,
    error_code: str | None = None,
    auth_hint: str = "",
) -> TransientError | ModelError:
    """What a non-2xx answer is: a :class:`TransientError` to retry, or the final ModelError.

    ``text`` is the server's (already redacted) error text; ``auth_hint`` is appended to
    auth failures (e.g. where the key came from, never the key).
    """
    hint = ""
    if (status in RETRY_STATUSES or status >= 500) and is_validation_error(text):
        hint = " (the server's request validation refused it: the same request cannot pass, so no retry)"
    elif status in RETRY_STATUSES or status >= 500:
        return TransientError(f"HTTP {status}: {text}", status=status, retry_after=retry_after)
    if status in (401, 403):
        kind, hint = ModelErrorKind.AUTH, auth_hint
    elif status in (400, 413) and is_context_error(text, error_code):
        kind = ModelErrorKind.CONTEXT_LENGTH
    else:
        kind = ModelErrorKind.PERMANENT
    message = f"HTTP {status} from {site.endpoint} ({site.label}): {text}{hint}"
    return ModelError(message, kind=kind, endpoint=site.endpoint, status=status)


def exhausted_error(site: CallSite, exc: TransientError, attempts: int) -> ModelError:
    """The ModelError for a transient failure that no (further) retry is left for."""
    return ModelError(
        f"{site.verb} to {site.endpoint} ({site.label}) failed after {attempts} attempt(s): {exc.reason}",
        kind=ModelErrorKind.TRANSIENT,
        endpoint=site.endpoint,
        status=exc.status,
        attempts=attempts,
    )


def backoff_s(settings: RetrySettings, attempt_number: int, retry_after: float | None = None) -> float:
    """Wait before the next attempt: the server's Retry-After when given, else exp + jitter.

    Jitter spreads out the retries of many rollouts that failed together (a server restart).
    """
    if retry_after is not None:
        return min(retry_after, settings.max_retry_after_s) + random.uniform(0, 0.1)
    exp = settings.backoff_base_s * 2.0 ** (attempt_number - 1)
    return min(settings.backoff_max_s, exp) * random.uniform(0.5, 1.0)


def _failure(state: RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome else None


@dataclass(frozen=True, slots=True)
class _RetryHooks:
    """tenacity's ``wait`` and ``before_sleep`` callbacks for the calls of one site."""

    settings: RetrySettings
    site: CallSite

    def wait(self, state: RetryCallState) -> float:
        exc = _failure(state)
        retry_after = exc.retry_after if isinstance(exc, TransientError) else None
        return backoff_s(self.settings, state.attempt_number, retry_after)

    def log_retry(self, state: RetryCallState) -> None:
        exc = _failure(state)
        log.info(
            "%s to %s failed (%s); retry %d/%d in %.2fs",
            self.site.verb,
            self.site.endpoint,
            getattr(exc, "reason", exc),
            state.attempt_number,
            self.settings.max_retries,
            state.next_action.sleep if state.next_action else 0.0,
        )


async def call_with_retries(
    attempt: Callable[[], Awaitable[T]], settings: RetrySettings, site: CallSite
) -> T:
    """Run ``attempt`` until it returns, raises anything but :class:`TransientError`, or the
    ``max_retries`` retries are spent (then a TRANSIENT :class:`ModelError` with the attempts).

    Each retry is logged at INFO with its reason (already redacted by the client).

    The first attempt runs before tenacity is set up: nearly every call succeeds at once, and
    a retrying object per call cost CPU on each of them. After a transient failure tenacity
    runs as it always did, its first attempt being the failure already in hand (so the
    attempts, waits and log lines are the same).
    """
    try:
        return await attempt()
    except TransientError as exc:
        failed: TransientError | None = exc

    async def again() -> T:
        nonlocal failed
        if failed is not None:
            exc, failed = failed, None
            raise exc
        return await attempt()

    hooks = _RetryHooks(settings, site)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(settings.max_retries + 1),
        wait=hooks.wait,
        retry=retry_if_exception_type(TransientError),
        before_sleep=hooks.log_retry,
        reraise=True,
    )
    try:
        async for try_ in retrying:
            with try_:
                return await again()
    except TransientError as exc:
        raise exhausted_error(site, exc, retrying.statistics.get("attempt_number", 1)) from None
    raise AssertionError("unreachable: tenacity neither returned nor raised")  # pragma: no cover
