got = open("/app/totals.csv").read().splitlines()
assert got == [
    "customer,total",
    "hooli,45.00",
    "acme,44.98",
    "globex,41.90",
    "initech,0.00",
    "umbrella,0.00",
], got
