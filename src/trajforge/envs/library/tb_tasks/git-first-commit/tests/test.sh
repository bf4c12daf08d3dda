#!/bin/bash
# Hidden test (copied in only after the agent has finished).
G() { git -c 'safe.directory=*' -c core.fsmonitor=false -c core.hooksPath=/dev/null -C /app/project "$@"; }
ok=1
[ "$(G symbolic-ref --short HEAD 2>/dev/null)" = main ] || { echo "not on main"; ok=0; }
[ "$(G log --format=%s 2>/dev/null)" = "Initial commit" ] || { echo "wrong history"; ok=0; }
files=$(G ls-files 2>/dev/null | LC_ALL=C sort | tr '\n' ' ')
[ "$files" = ".gitignore README.md docs/changelog.txt src/main.py src/util.py " ] || { echo "tracked: $files"; ok=0; }
for p in build/app.o logs/run.log debug.log .env; do
  G check-ignore -q "$p" || { echo "$p not ignored"; ok=0; }
done
G check-ignore -q src/main.py && { echo "src/main.py ignored"; ok=0; }
[ -z "$(G status --porcelain 2>/dev/null)" ] || { echo "tree not clean"; ok=0; }
echo $ok > /logs/verifier/reward.txt
