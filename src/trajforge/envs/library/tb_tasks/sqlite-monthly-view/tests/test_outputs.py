import sqlite3
from collections import defaultdict

db = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
want = defaultdict(float)
status = dict(db.execute("SELECT id, status FROM orders"))
placed = dict(db.execute("SELECT id, placed_at FROM orders"))
for oid, qty, price in db.execute("SELECT order_id, quantity, unit_price FROM order_lines"):
    if status.get(oid) == "paid":
        want[placed[oid][:7]] += qty * price
rows = db.execute("SELECT month, revenue FROM monthly_revenue").fetchall()
assert [m for m, _ in rows] == sorted(want), rows
for month, revenue in rows:
    assert abs(revenue - round(want[month], 2)) < 0.005, (month, revenue, want[month])
kind = db.execute("SELECT type FROM sqlite_master WHERE name = 'monthly_revenue'").fetchone()
assert kind == ("view",), kind
assert db.execute("SELECT count(*) FROM orders").fetchone() == (121,)
