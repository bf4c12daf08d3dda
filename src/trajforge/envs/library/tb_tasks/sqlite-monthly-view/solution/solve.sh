#!/bin/bash
python3 - <<'PY'
import sqlite3
db = sqlite3.connect("/app/shop.db")
db.execute(
    "CREATE VIEW monthly_revenue AS SELECT substr(o.placed_at, 1, 7) AS month, "
    "round(sum(l.quantity * l.unit_price), 2) AS revenue FROM orders o JOIN order_lines l "
    "ON l.order_id = o.id WHERE o.status = 'paid' GROUP BY month ORDER BY month"
)
db.commit()
PY
