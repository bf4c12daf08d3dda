import collections
import re

words = re.findall(r"[a-z]+", open("/tests/book.txt").read().lower())  # the pristine copy
counts = collections.Counter(words)
want = [f"{n} {w}" for w, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]]
got = open("/app/top10.txt").read().splitlines()
assert got == want, (got, want)
