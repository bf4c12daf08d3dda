import json
import subprocess

cfg = json.load(open("/app/config.json"))
assert cfg == {
    "name": "inventory",
    "debug": False,
    "server": {"host": "127.0.0.1", "port": 8080, "workers": 4},
    "tags": ["api", "internal"],
}, cfg
out = subprocess.run(["python3", "/app/app.py"], capture_output=True, text=True, timeout=30)
assert (
    out.returncode == 0
    and out.stdout == "inventory on 127.0.0.1:8080 debug=False workers=4 tags=api,internal\n"
), out
src = open("/app/app.py").read()
assert src == open("/tests/app.py").read(), "app.py changed"
