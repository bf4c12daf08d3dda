#!/bin/bash
python3 - <<'PY'
import sqlite3
db = sqlite3.connect("/app/shop.db")
name, total = db.execute(
    "select c.name, sum(o.amount_cents) t from orders o join customers c on c.id = o.customer_id "
    "where o.status = 'paid' group by c.id order by t desc limit 1"
).fetchone()
open("/app/answer.txt", "w").write(f"{name},{total}\n")
PY
