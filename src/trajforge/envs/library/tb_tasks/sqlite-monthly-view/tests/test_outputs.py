import os
import sqlite3
import subprocess
import sys
import tempfile
from collections import defaultdict

NEW_ORDER = "INSERT INTO orders VALUES (900, '2024-11-05 09:00:00', 'paid')"
NEW_LINE = "INSERT INTO order_lines VALUES (900, 'pen', 3, 1.5)"

# The expected numbers come from the pristine data (the generator, run again here), never from
# the database the agent could edit.
scratch = tempfile.mkdtemp()
subprocess.run([sys.executable, "/tests/make_db.py"], cwd=scratch, check=True, timeout=60)
ref = sqlite3.connect(os.path.join(scratch, "shop.db"))
ref.execute(NEW_ORDER)
ref.execute(NEW_LINE)
want = defaultdict(float)
query = (
    "SELECT o.placed_at, l.quantity, l.unit_price FROM orders o "
    "JOIN order_lines l ON l.order_id = o.id WHERE o.status = 'paid'"
)
for placed, qty, price in ref.execute(query):
    want[placed[:7]] += qty * price

db = sqlite3.connect("/app/shop.db")
kind = db.execute("SELECT type FROM sqlite_master WHERE name = 'monthly_revenue'").fetchone()
assert kind == ("view",), kind
# an order added now must show: the view computes its numbers, it does not hold them
db.execute(NEW_ORDER)
db.execute(NEW_LINE)
rows = db.execute("SELECT month, revenue FROM monthly_revenue").fetchall()
assert [m for m, _ in rows] == sorted(want), rows
for month, revenue in rows:
    assert abs(revenue - round(want[month], 2)) < 0.005, (month, revenue, want[month])
