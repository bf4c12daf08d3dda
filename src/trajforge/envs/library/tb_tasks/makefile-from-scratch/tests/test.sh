#!/bin/bash
# Hidden test (copied in only after the agent has finished).
cd /app/calc || { echo 0 > /logs/verifier/reward.txt; exit 0; }
ok=1
for f in calc.c ops.c ops.h; do cmp -s "$f" "/tests/sources/$f" || { echo "$f changed"; ok=0; }; done
t() { sleep 0.1; touch "$1"; }
timeout 60 make clean >/dev/null 2>&1
[ -e calc ] || [ -e calc.o ] || [ -e ops.o ] && { echo "clean left files"; ok=0; }
timeout 60 make >/dev/null 2>&1 || { echo "make failed"; ok=0; }
[ -f calc.o ] && [ -f ops.o ] || { echo "no object files"; ok=0; }
[ "$(./calc 3 + 4 2>/dev/null)" = 7 ] || { echo "3 + 4"; ok=0; }
[ "$(./calc 6 x 7 2>/dev/null)" = 42 ] || { echo "6 x 7"; ok=0; }
timeout 60 make -q >/dev/null 2>&1 || { echo "second make is not a no-op"; ok=0; }
for f in ops.h ops.c calc.c; do
  t "$f"
  timeout 60 make -q >/dev/null 2>&1 && { echo "$f change not seen"; ok=0; }
  timeout 60 make >/dev/null 2>&1 || ok=0
done
timeout 60 make clean >/dev/null 2>&1
[ -e calc ] || [ -e calc.o ] || [ -e ops.o ] && { echo "clean left files"; ok=0; }
echo $ok > /logs/verifier/reward.txt
