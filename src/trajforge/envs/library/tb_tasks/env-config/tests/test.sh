#!/bin/bash
# No reward file: the exit code is the verdict.
exec python3 -I - <<'PY'
import json, os
got = json.load(open("/app/config.json"))
assert got == {"name": "inventory", "port": int(os.environ["APP_PORT"]), "mode": os.environ["APP_MODE"]}, got
assert got["port"] == 8080 and got["mode"] == "production"
PY
