#!/bin/bash
# Hidden test (copied in only after the agent has finished).
G() { git -c 'safe.directory=*' -c core.fsmonitor=false -c core.hooksPath=/dev/null -C /app/repo "$@"; }
ok=1
want=$(G rev-parse 'main^{/^Change 14$}' 2>/dev/null)
[ -n "$want" ] && [ "$(tr -d '[:space:]' < /app/first_bad.txt 2>/dev/null)" = "$want" ] || { echo "wrong commit"; ok=0; }
[ "$(G symbolic-ref --short HEAD 2>/dev/null)" = main ] || { echo "not on main"; ok=0; }
[ "$(G rev-list --count main 2>/dev/null)" = 25 ] || ok=0
[ -z "$(G status --porcelain 2>/dev/null)" ] || { echo "tree not clean"; ok=0; }
echo $ok > /logs/verifier/reward.txt
