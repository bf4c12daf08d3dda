#!/bin/bash
python3 - <<'PY'
import hashlib, os
root = "/app/photos"
paths = []
for top, _, files in os.walk(root):
    paths += [os.path.relpath(os.path.join(top, f), root) for f in files]
seen, removed = {}, []
for rel in sorted(paths, key=lambda p: p.encode()):
    digest = hashlib.sha256(open(os.path.join(root, rel), "rb").read()).hexdigest()
    if digest in seen:
        os.remove(os.path.join(root, rel))
        removed.append(rel)
    else:
        seen[digest] = rel
with open("/app/removed.txt", "w") as fh:
    fh.writelines(r + "\n" for r in sorted(removed, key=lambda p: p.encode()))
PY
