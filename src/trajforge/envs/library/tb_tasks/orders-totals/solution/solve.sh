#!/bin/bash
python3 - <<'PY'
import json
totals = {}
for line in open("/app/orders.jsonl"):
    order = json.loads(line)
    totals.setdefault(order["customer"], 0.0)
    if order["status"] == "paid":
        totals[order["customer"]] += sum(i["qty"] * i["price"] for i in order["items"])
rows = sorted(totals.items(), key=lambda kv: (-round(kv[1], 2), kv[0]))
with open("/app/totals.csv", "w") as fh:
    fh.write("customer,total\n")
    fh.writelines(f"{c},{t:.2f}\n" for c, t in rows)
PY
