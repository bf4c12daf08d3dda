#!/bin/bash
# Hidden test (copied in only after the agent has finished).
G() { git -c 'safe.directory=*' -c core.fsmonitor=false -c core.hooksPath=/dev/null -C /app/repo "$@"; }
ok=1
# the old commits were made with fixed names and dates: their ids are known
[ "$(G rev-parse main~1 2>/dev/null)" = 98b6734a059f2741740b56c1870eb47e87b7a2bf ] || { echo "main rewritten"; ok=0; }
[ "$(G rev-parse hotfix 2>/dev/null)" = df4cb71165ae6b9548b4708e3514479fdd9d8626 ] || { echo "hotfix moved"; ok=0; }
[ "$(G symbolic-ref --short HEAD 2>/dev/null)" = main ] || { echo "not on main"; ok=0; }
[ "$(G log --format=%s main 2>/dev/null | tr '\n' '|')" = "fix: handle empty input|Add cli|Initial|" ] || { echo "main history"; ok=0; }
[ "$(G log --format=%s hotfix 2>/dev/null | tr '\n' '|')" = "wip: experiment|fix: handle empty input|docs: describe util|Initial|" ] || { echo "hotfix changed"; ok=0; }
[ "$(G show main:util.py 2>/dev/null)" = "$(G show hotfix:util.py 2>/dev/null)" ] || { echo "fix missing"; ok=0; }
[ "$(G show main:README.md 2>/dev/null)" = "# Util" ] || { echo "docs leaked"; ok=0; }
G cat-file -e main:experiment.py 2>/dev/null && { echo "experiment leaked"; ok=0; }
G cat-file -e main:cli.py 2>/dev/null || ok=0
[ -z "$(G status --porcelain --untracked-files=no 2>/dev/null)" ] || { echo "tree not clean"; ok=0; }
echo $ok > /logs/verifier/reward.txt
