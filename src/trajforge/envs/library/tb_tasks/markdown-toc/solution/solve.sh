#!/bin/bash
python3 - <<'PY'
import re
out, fenced = [], False
for line in open("/app/README.md"):
    line = line.rstrip("\n")
    if line.startswith("```"):
        fenced = not fenced
        continue
    m = re.match(r"^(##|###) (.*)$", line)
    if fenced or not m:
        continue
    text = m.group(2)
    slug = re.sub(r"[^a-z0-9 -]", "", text.lower()).replace(" ", "-")
    out.append(("  " if m.group(1) == "###" else "") + f"- [{text}](#{slug})")
open("/app/toc.md", "w").write("\n".join(out) + "\n")
PY
