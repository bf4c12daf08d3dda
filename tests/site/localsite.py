"""A small website on 127.0.0.1 for the web and browser tests (real aiohttp server, real bytes).

Pages link to each other; ``/form`` posts to ``/echo``, which echoes what was submitted; there are
images, a PDF built here byte by byte, redirects (one to a chosen target, for SSRF tests), a slow
page, a huge page, and search endpoints speaking the SearXNG, Brave and Tavily wire formats.
"""

from __future__ import annotations

import asyncio
import html
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

ARTICLE = (
    "The lighthouse keeper of Skerry Point kept a logbook for forty years. "
    "Every storm, every ship and every repair to the great lamp went into it, in a small careful hand. "
)


def _page(title: str, body: str) -> str:
    return f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>"


def png(width: int = 4, height: int = 4, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A valid PNG of one colour (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def pdf(text: str, title: str) -> bytes:
    """A minimal valid one-page PDF showing ``text`` in Helvetica, with a document title."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Title (" + title.encode() + b") >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + obj + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info 6 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


@dataclass
class Site:
    base: str
    runner: web.AppRunner
    requests: list[str] = field(default_factory=list)
    search_results: list[dict[str, Any]] = field(default_factory=list)
    keys_seen: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.base + path


def _app(site_ref: dict[str, Site]) -> web.Application:
    routes = web.RouteTableDef()

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        site_ref["site"].requests.append(request.path_qs)
        resp: web.StreamResponse = await handler(request)
        return resp

    @routes.get("/")
    async def index(_: web.Request) -> web.Response:
        links = "".join(
            f'<li><a href="{p}">{name}</a></li>'
            for p, name in [
                ("/page1", "The lighthouse"),
                ("/page2", "The second page"),
                ("/form", "Contact form"),
                ("/images", "Pictures"),
                ("/doc.pdf", "The report (PDF)"),
            ]
        )
        return web.Response(
            text=_page("Skerry Point home", f"<h1>Skerry Point</h1><ul>{links}</ul>"),
            content_type="text/html",
        )

    @routes.get("/page1")
    async def page1(_: web.Request) -> web.Response:
        body = (
            "<nav><a href='/'>Home</a> | <a href='/page2'>Next</a></nav>"
            "<article><h1>The lighthouse keeper</h1>"
            + "".join(f"<p>{ARTICLE} Paragraph {i}.</p>" for i in range(6))
            + "<p>See <a href='/page2'>the second page</a>.</p></article>"
            "<footer>Copyright Skerry Point Trust</footer>"
        )
        return web.Response(text=_page("The lighthouse keeper", body), content_type="text/html")

    @routes.get("/page2")
    async def page2(_: web.Request) -> web.Response:
        body = (
            "<article><h1>Second page</h1><p>The lamp was rebuilt in 1911 after the great gale. "
            "It burned paraffin until electricity arrived in 1952.</p>"
            "<table><tr><th>Year</th><th>Event</th></tr><tr><td>1911</td><td>Rebuilt</td></tr></table>"
            "<p><a href='/'>Back home</a></p></article>"
        )
        return web.Response(text=_page("Second page", body), content_type="text/html")

    @routes.get("/form")
    async def form(_: web.Request) -> web.Response:
        body = (
            "<h1>Contact</h1><form method='post' action='/echo'>"
            "<label for='name'>Your name</label> <input id='name' name='name' type='text'>"
            "<label for='msg'>Message</label> <input id='msg' name='message' type='text'>"
            "<button type='submit'>Send</button></form>"
        )
        return web.Response(text=_page("Contact form", body), content_type="text/html")

    @routes.post("/echo")
    async def echo(request: web.Request) -> web.Response:
        data = await request.post()
        items = "".join(f"<li>{html.escape(k)} = {html.escape(str(v))}</li>" for k, v in data.items())
        body = f"<h1>Thank you</h1><p>You submitted:</p><ul>{items}</ul><a href='/'>Home</a>"
        return web.Response(text=_page("Submitted", body), content_type="text/html")

    @routes.get("/images")
    async def images(_: web.Request) -> web.Response:
        body = (
            "<h1>Pictures</h1><img src='/img/red.png' alt='A red square' width='40' height='40'>"
            "<img src='/img/blue.png' alt='A blue square' width='40' height='40'>"
        )
        return web.Response(text=_page("Pictures", body), content_type="text/html")

    @routes.get("/img/red.png")
    async def red(_: web.Request) -> web.Response:
        return web.Response(body=png(rgb=(220, 20, 20)), content_type="image/png")

    @routes.get("/img/blue.png")
    async def blue(_: web.Request) -> web.Response:
        return web.Response(body=png(rgb=(20, 20, 220)), content_type="image/png")

    @routes.get("/doc.pdf")
    async def doc(_: web.Request) -> web.Response:
        return web.Response(
            body=pdf("Annual report: the lamp burned 3650 nights.", "Skerry Report"),
            content_type="application/pdf",
        )

    @routes.get("/redirect")
    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound("/page1")

    @routes.get("/redirect-to")
    async def redirect_to(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["target"])

    @routes.get("/ssrf-image")
    async def ssrf_image(request: web.Request) -> web.Response:
        target = html.escape(request.query["target"])
        body = f"<h1>Innocent page</h1><img src='{target}' alt='tracker'><p>Nothing to see.</p>"
        return web.Response(text=_page("Innocent", body), content_type="text/html")

    @routes.get("/slow")
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response(text=_page("Slow", "<p>finally</p>"), content_type="text/html")

    @routes.get("/huge")
    async def huge(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        await resp.prepare(request)
        await resp.write(b"<html><body>")
        for _ in range(200):  # 20 MB, streamed without a Content-Length
            await resp.write(b"<p>" + b"x" * 100_000 + b"</p>")
        await resp.write_eof()
        return resp

    @routes.get("/console")
    async def console(_: web.Request) -> web.Response:
        body = "<h1>Console</h1><script>console.log('hello from the page'); console.error('something broke');</script>"
        return web.Response(text=_page("Console", body), content_type="text/html")

    @routes.get("/search")
    async def searxng(request: web.Request) -> web.Response:
        if request.query.get("format") != "json":
            return web.Response(status=403, text="format not allowed")
        q = request.query.get("q", "")
        results = [dict(r, content=f"{r.get('content', '')} ({q})") for r in site_ref["site"].search_results]
        return web.json_response({"query": q, "results": results})

    @routes.get("/brave")
    async def brave(request: web.Request) -> web.Response:
        site_ref["site"].keys_seen.append(request.headers.get("X-Subscription-Token", ""))
        items = [
            {"title": r["title"], "url": r["url"], "description": r.get("content", "")}
            for r in site_ref["site"].search_results
        ]
        return web.json_response({"type": "search", "web": {"results": items}})

    @routes.post("/tavily")
    async def tavily(request: web.Request) -> web.Response:
        site_ref["site"].keys_seen.append(request.headers.get("Authorization", ""))
        body = await request.json()
        items = site_ref["site"].search_results[: int(body.get("max_results", 5))]
        return web.json_response({"query": body["query"], "results": items})

    app = web.Application(middlewares=[record])
    app.add_routes(routes)
    return app


async def start_site() -> Site:
    ref: dict[str, Site] = {}
    runner = web.AppRunner(_app(ref), shutdown_timeout=0.5)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    site = Site(base=f"http://127.0.0.1:{port}", runner=runner)
    ref["site"] = site
    return site
