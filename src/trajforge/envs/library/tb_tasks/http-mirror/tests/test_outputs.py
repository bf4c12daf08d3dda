import os
import sys

site, out = sys.argv[1], sys.argv[2]
want = {"index.html", "about.html", "docs/guide.html", "docs/index.html", "docs/notes.txt"}
got = set()
for top, _, files in os.walk(out):
    got |= {os.path.relpath(os.path.join(top, f), out) for f in files}
assert got == want, got
for rel in want:
    assert open(os.path.join(out, rel), "rb").read() == open(os.path.join(site, rel), "rb").read(), rel
