import sqlite3

db = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
totals = dict(
    db.execute(
        "select c.name, sum(o.amount_cents) from orders o join customers c on c.id = o.customer_id "
        "where o.status = 'paid' group by c.id"
    ).fetchall()
)
assert len(totals) == 6 and db.execute("select count(*) from orders").fetchone()[0] == 301
best = max(totals, key=totals.get)
with open("/app/answer.txt") as fh:
    assert fh.read().strip() == f"{best},{totals[best]}"
