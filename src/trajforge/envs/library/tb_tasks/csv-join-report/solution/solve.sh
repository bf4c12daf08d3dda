#!/bin/bash
python3 - <<'PY'
import csv
users = list(csv.DictReader(open("/app/users.csv", newline="")))
agg = {u["id"]: [0, 0.0] for u in users}
for p in csv.DictReader(open("/app/purchases.csv", newline="")):
    if p["user_id"] in agg:
        agg[p["user_id"]][0] += 1
        agg[p["user_id"]][1] += float(p["amount"])
rows = sorted(users, key=lambda u: (-round(agg[u["id"]][1], 2), u["name"]))
with open("/app/report.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["name", "country", "purchases", "total"])
    for u in rows:
        n, total = agg[u["id"]]
        w.writerow([u["name"], u["country"], n, f"{total:.2f}"])
PY
