import random
import sqlite3

rng = random.Random(7)
db = sqlite3.connect("shop.db")
db.executescript(
    "CREATE TABLE orders(id INTEGER PRIMARY KEY, placed_at TEXT, status TEXT);"
    "CREATE TABLE order_lines(order_id INTEGER, product TEXT, quantity INTEGER, unit_price REAL);"
)
for oid in range(1, 121):
    month = rng.randint(1, 6)
    day = rng.randint(1, 28)
    status = rng.choice(["paid", "paid", "paid", "cancelled", "pending"])
    db.execute(
        "INSERT INTO orders VALUES (?, ?, ?)",
        (oid, f"2024-{month:02d}-{day:02d} 12:{oid % 60:02d}:00", status),
    )
    for _ in range(rng.randint(1, 3)):
        db.execute(
            "INSERT INTO order_lines VALUES (?, ?, ?, ?)",
            (
                oid,
                rng.choice(["pen", "ink", "pad", "clip"]),
                rng.randint(1, 5),
                rng.choice([0.99, 2.5, 7.25, 12.0]),
            ),
        )
db.execute("INSERT INTO orders VALUES (500, '2024-09-03 08:00:00', 'cancelled')")
db.execute("INSERT INTO order_lines VALUES (500, 'pen', 9, 0.99)")
db.commit()
