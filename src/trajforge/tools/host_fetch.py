"""The host's fetch of one image for a tool, under the network policy.

``vision_analyze`` and ``image_generate`` fetch image URLs in the host process, so they go through
the web tools' :class:`~trajforge.tools.web_fetch.SafeFetcher`: the same URL gate and
:class:`~trajforge.tools.netpolicy.NetPolicy`, every redirect hop and every connection checked,
the body read up to a cap. A fetcher session is opened per fetch: these tools are built once
per process but called on whatever event loop runs the rollout, and an image fetch is rare next
to a model call.
"""

from __future__ import annotations

from trajforge.tools.netpolicy import NetPolicy, NetPolicyError, Resolve
from trajforge.tools.vision import FetchRefused, UrlFetcher
from trajforge.tools.web_fetch import FetchError, SafeFetcher

USER_AGENT = "trajforge-tools/1 (+image fetch)"


def policy_fetcher(
    policy: NetPolicy, *, timeout_s: float = 30.0, resolve: Resolve | None = None
) -> UrlFetcher:
    """A :data:`~trajforge.tools.vision.UrlFetcher` that obeys ``policy`` (``resolve``: see
    :class:`~trajforge.tools.web_fetch.SafeFetcher`)."""

    async def fetch(url: str, max_bytes: int) -> bytes:
        try:
            async with SafeFetcher(policy, user_agent=USER_AGENT, resolve=resolve) as fetcher:
                response = await fetcher.fetch(url, max_bytes=max_bytes, timeout_s=timeout_s)
        except (NetPolicyError, FetchError) as exc:
            raise FetchRefused(str(exc)) from None
        if response.status != 200:
            raise FetchRefused(f"{response.url} answered HTTP {response.status}")
        return response.body

    return fetch
