#!/bin/bash
# Hidden test (copied in only after the agent has finished).
G() { git -c 'safe.directory=*' -c core.fsmonitor=false -c core.hooksPath=/dev/null -C /app/repo "$@"; }
ok=1
# the commits were made with fixed names and dates: their ids are known ("Change 14" broke it)
[ "$(tr -d '[:space:]' < /app/first_bad.txt 2>/dev/null)" = 81c33c29adb9b5977b1a6d75f6abf4f3614b0291 ] || { echo "wrong commit"; ok=0; }
[ "$(G rev-parse main 2>/dev/null)" = e3258df64c5e4f06c4c6912db84ab41d13c5eb26 ] || { echo "main moved"; ok=0; }
[ "$(G symbolic-ref --short HEAD 2>/dev/null)" = main ] || { echo "not on main"; ok=0; }
[ "$(G rev-list --count main 2>/dev/null)" = 25 ] || ok=0
[ -z "$(G status --porcelain --untracked-files=no 2>/dev/null)" ] || { echo "tree not clean"; ok=0; }
echo $ok > /logs/verifier/reward.txt
