#!/bin/bash
cat > /app/server.py <<'PY'
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/health":
            return self.reply(200, {"status": "ok"})
        if url.path == "/sum":
            q = parse_qs(url.query)
            try:
                return self.reply(200, {"sum": int(q["a"][0]) + int(q["b"][0])})
            except (KeyError, ValueError):
                return self.reply(400, {"error": "a and b must be integers"})
        self.reply(404, {"error": "not found"})

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
PY
