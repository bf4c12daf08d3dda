#!/bin/bash
touch /app/wordtool/__init__.py
cat > /app/wordtool/__main__.py <<'PY'
import sys

from wordtool.core import count


def main(argv):
    status, totals = 0, [0, 0, 0]
    for name in argv:
        try:
            with open(name) as fh:
                text = fh.read()
        except OSError:
            print(f"wordtool: cannot read {name}", file=sys.stderr)
            status = 2
            continue
        got = count(text)
        totals = [t + g for t, g in zip(totals, got)]
        print(f"{name}: {got[0]} {got[1]} {got[2]}")
    if len(argv) > 1:
        print(f"total: {totals[0]} {totals[1]} {totals[2]}")
    return status


sys.exit(main(sys.argv[1:]))
PY
