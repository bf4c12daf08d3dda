#!/bin/bash
# Hidden test (copied in only after the agent has finished).
cd /app
rm -f inventory
ok=1
grep -q 'total_value(items, 3)' inventory.c && grep -q 'struct item' inventory.c || { echo "program rewritten"; ok=0; }
timeout 60 gcc -Wall -Wextra -Werror -o inventory inventory.c || { echo "does not compile"; ok=0; }
want=$(printf 'bolt    120\nnut     300\ngear      4\ntotal 110.00')
[ "$(timeout 10 ./inventory 2>/dev/null)" = "$want" ] || { echo "wrong output"; ok=0; }
echo $ok > /logs/verifier/reward.txt
