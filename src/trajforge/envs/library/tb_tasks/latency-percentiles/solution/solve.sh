#!/bin/bash
python3 - <<'PY'
import json, math, re
by = {}
for line in open("/app/access.log"):
    m = re.match(r"^\S+ (\S+) ([^?\s]+)\S* \d{3} (\d+)ms$", line.strip())
    if m:
        by.setdefault(f"{m.group(1)} {m.group(2)}", []).append(int(m.group(3)))
out = {}
for key, values in by.items():
    values.sort()
    rank = lambda p: values[max(1, math.ceil(p / 100 * len(values))) - 1]
    out[key] = {"count": len(values), "p50": rank(50), "p95": rank(95)}
json.dump(out, open("/app/latency.json", "w"), indent=2)
PY
