#!/bin/bash
python3 - <<'PY'
import csv, json
rows = [r for r in csv.DictReader(open("/app/people.csv")) if r["age"].strip()]
out = sorted(({"name": r["name"], "age": int(r["age"]), "city": r["city"]} for r in rows), key=lambda r: r["name"])
json.dump(out, open("/app/people.json", "w"), indent=2)
PY
