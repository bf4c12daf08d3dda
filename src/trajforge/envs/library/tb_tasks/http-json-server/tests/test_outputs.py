import json
import socket
import sys
import time
import urllib.error
import urllib.request

port = int(sys.argv[1])
deadline = time.time() + 10
while True:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        assert time.time() < deadline, "the server never listened"
        time.sleep(0.1)


def get(path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), json.loads(e.read())


assert get("/health") == (200, "application/json", {"status": "ok"})
assert get("/sum?a=2&b=40") == (200, "application/json", {"sum": 42})
assert get("/sum?b=-5&a=3") == (200, "application/json", {"sum": -2})
code, ctype, body = get("/sum?a=x&b=1")
assert code == 400 and ctype == "application/json" and "error" in body, (code, body)
code, _, body = get("/sum?a=1")
assert code == 400 and "error" in body
assert get("/nope") == (404, "application/json", {"error": "not found"})
