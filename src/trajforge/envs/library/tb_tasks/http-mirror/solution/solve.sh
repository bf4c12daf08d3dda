#!/bin/bash
cat > /app/mirror.py <<'PY'
import os
import sys
import urllib.error
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin, urlsplit


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.found += [v for k, v in attrs if k == "href" and v]


def main(start, out):
    origin = urlsplit(start).netloc
    todo, seen = [start], set()
    while todo:
        url = urldefrag(todo.pop())[0].split("?")[0]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.netloc != origin or url in seen:
            continue
        seen.add(url)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read()
        except (urllib.error.URLError, OSError):
            continue
        path = parts.path or "/"
        if path.endswith("/"):
            path += "index.html"
        dest = os.path.join(out, path.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as fh:
            fh.write(body)
        parser = Links()
        parser.feed(body.decode("utf-8", "replace"))
        todo += [urljoin(url, h) for h in parser.found]


main(sys.argv[1], sys.argv[2])
PY
