import json
import math

durations = {}
for line in open("/tests/access.log"):  # the pristine copy
    parts = line.split()
    if len(parts) != 5 or not parts[4].endswith("ms"):
        continue
    key = parts[1] + " " + parts[2].split("?")[0]
    durations.setdefault(key, []).append(int(parts[4][:-2]))
want = {}
for key, vals in durations.items():
    vals.sort()
    want[key] = {
        "count": len(vals),
        "p50": vals[math.ceil(0.5 * len(vals)) - 1],
        "p95": vals[math.ceil(0.95 * len(vals)) - 1],
    }
got = json.load(open("/app/latency.json"))
assert got == want, (got, want)
