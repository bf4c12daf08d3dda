#!/bin/bash
cat > /app/render <<'PY'
#!/usr/bin/env python3
import re
import sys

template, varsfile = sys.argv[1], sys.argv[2]
values = {}
for line in open(varsfile):
    line = line.rstrip("\n")
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    name, _, value = line.partition("=")
    values[name.strip()] = value
missing = []


def fill(m):
    if m.group(0) == "$$":
        return "$"
    name, default = m.group(1), m.group(3)
    if name in values:
        return values[name]
    if m.group(2) is not None:
        return default
    missing.append(name)
    return ""


out = re.sub(r"\$\$|\$\{(\w+)(:-([^}]*))?\}", fill, open(template).read())
if missing:
    print(f"render: {missing[0]} is not set", file=sys.stderr)
    sys.exit(1)
sys.stdout.write(out)
PY
chmod +x /app/render
