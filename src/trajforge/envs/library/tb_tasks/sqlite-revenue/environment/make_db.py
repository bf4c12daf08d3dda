import random
import sqlite3
import sys

path, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
db = sqlite3.connect(path)
db.execute("create table customers(id integer primary key, name text)")
db.execute("create table orders(id integer primary key, customer_id int, amount_cents int, status text)")
names = ["ada", "bert", "cleo", "dov", "eli", "fay"]
db.executemany("insert into customers values (?, ?)", list(enumerate(names, 1)))
for i in range(300):
    status = rng.choice(["paid", "paid", "refunded", "pending"])
    db.execute(
        "insert into orders values (?, ?, ?, ?)", (i, rng.randint(1, 6), rng.randint(100, 9999), status)
    )
# the richest customer by all orders is not the richest by paid ones
db.execute("insert into orders values (1000, 6, 900000, 'refunded')")
db.commit()
