#!/bin/bash
# Hidden test (copied in only after the agent has finished).
G() { git -c 'safe.directory=*' -c core.fsmonitor=false -c core.hooksPath=/dev/null -C /app/repo "$@"; }
ok=1
subjects=$(G log --format=%s main 2>/dev/null | tr '\n' '|')
[ "$subjects" = "Restore plan|Edit app|Cleanup|Update plan|Initial|" ] || { echo "history: $subjects"; ok=0; }
# the old commits were made with fixed names and dates: their ids are known
[ "$(G rev-parse main~1 2>/dev/null)" = d9b292432e860e150369370495f6cdac7de062c5 ] || { echo "history rewritten"; ok=0; }
[ "$(G show main:plan.txt 2>/dev/null)" = "$(printf 'step 1: draft\nstep 2: review')" ] || { echo "plan.txt wrong"; ok=0; }
[ "$(cat /app/repo/plan.txt 2>/dev/null)" = "$(printf 'step 1: draft\nstep 2: review')" ] || ok=0
[ "$(G show main:app.py 2>/dev/null)" = "print(2)" ] || ok=0
[ -z "$(G status --porcelain --untracked-files=no 2>/dev/null)" ] || { echo "tree not clean"; ok=0; }
echo $ok > /logs/verifier/reward.txt
