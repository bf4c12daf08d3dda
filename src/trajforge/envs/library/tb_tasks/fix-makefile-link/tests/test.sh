#!/bin/bash
# Hidden test (copied in only after the agent has finished).
cd /app/stats || { echo 0 > /logs/verifier/reward.txt; exit 0; }
ok=1
for f in main.c stats.c stats.h; do
  cmp -s "$f" "/tests/sources/$f" || { echo "$f changed"; ok=0; }
done
rm -f stats *.o
timeout 60 make >/dev/null 2>&1 || { echo "make failed"; ok=0; }
[ "$(timeout 10 ./stats 2 4 4 4 5 5 7 9 2>/dev/null)" = "mean 5.000 sd 2.000" ] || { echo "wrong output"; ok=0; }
[ "$(timeout 10 ./stats 1 1 2>/dev/null)" = "mean 1.000 sd 0.000" ] || ok=0
echo $ok > /logs/verifier/reward.txt
