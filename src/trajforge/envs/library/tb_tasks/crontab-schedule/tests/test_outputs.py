NAMES = {
    3: {n: i for i, n in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)},
    4: {n: i for i, n in enumerate("sun mon tue wed thu fri sat".split())},
}
RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def expand(field, i):
    lo, hi = RANGES[i]
    out = set()
    for part in field.lower().split(","):
        base, _, step = part.partition("/")
        step = int(step) if step else 1
        if base == "*":
            a, b = lo, hi
        else:
            ends = [int(NAMES.get(i, {}).get(x, x)) for x in base.split("-")]
            a, b = (ends[0], ends[-1]) if len(ends) <= 2 else (None, None)
            if step != 1 and len(ends) == 1:
                b = hi
        assert a is not None and lo <= a <= b <= hi, field
        out |= set(range(a, b + 1, step))
    if i == 4 and 7 in out:
        out = (out - {7}) | {0}
    return out


jobs = {}
for line in open("/app/crontab"):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    fields = line.split(None, 5)
    assert len(fields) == 6, line
    jobs[fields[5]] = [expand(f, i) for i, f in enumerate(fields[:5])]
ALL_DOM, ALL_MON, ALL_DOW = set(range(1, 32)), set(range(1, 13)), set(range(0, 7))
assert sorted(jobs) == ["/app/bin/backup.sh", "/app/bin/cleanup.sh", "/app/bin/report.sh"], jobs
assert jobs["/app/bin/backup.sh"] == [{30}, {2}, ALL_DOM, ALL_MON, ALL_DOW], jobs
assert jobs["/app/bin/report.sh"] == [
    {0, 15, 30, 45},
    set(range(9, 18)),
    ALL_DOM,
    ALL_MON,
    {1, 2, 3, 4, 5},
], jobs
assert jobs["/app/bin/cleanup.sh"] == [{0}, {4}, {1}, ALL_MON, ALL_DOW], jobs
