"""The HTML page: the template, its inline CSS and script, and the embedded data.

The browser's data goes in a ``<script type="application/json">`` block with ``<``, ``>`` and
``&`` written as JSON escapes, so no text in it can close the block or open a tag; the page
script reads it with ``textContent`` and places every string with ``textContent``. The
Content-Security-Policy admits only the page's own script (by hash), so even markup that got
through would run nothing.
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from importlib import resources
from typing import Any

import orjson
from jinja2 import Environment, Template
from markupsafe import Markup


@cache
def _asset(name: str) -> str:
    return resources.files("trajforge.report").joinpath("assets", name).read_text(encoding="utf-8")


@cache
def _template() -> Template:
    env = Environment(autoescape=True, keep_trailing_newline=True)
    return env.from_string(_asset("report.html.j2"))


def embed_json(value: Any) -> bytes:
    """JSON that is safe inside ``<script type="application/json">`` (and still valid JSON)."""
    raw = orjson.dumps(value)
    for char, escape in ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026")):
        raw = raw.replace(char, escape)
    return raw.replace("\u2028".encode(), b"\\u2028").replace("\u2029".encode(), b"\\u2029")


def render(context: dict[str, Any], data: bytes) -> bytes:
    """The page for ``context`` with ``data`` (from :func:`embed_json`) as the browser's data."""
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    html = _template().render(
        **context,
        css=Markup(_asset("report.css")),
        script=Markup(script),
        script_hash=f"sha256-{digest}",
        data=Markup(data.decode()),
    )
    return html.encode()
