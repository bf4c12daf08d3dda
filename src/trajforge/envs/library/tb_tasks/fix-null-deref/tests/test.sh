#!/bin/bash
# Hidden test (copied in only after the agent has finished).
cd /app
rm -f wordlen
ok=1
timeout 60 gcc -O2 -Wall -o wordlen wordlen.c || { echo "does not compile"; ok=0; }
run() { timeout 10 ./wordlen 2>/dev/null; }
[ "$(printf 'a bb cc\nddd a\n' | run)" = "$(printf '1 2\n2 2\n3 1\nlongest ddd')" ] || { echo "basic"; ok=0; }
[ "$(printf '' | run)" = "longest -" ] || { echo "empty input"; ok=0; }
[ "$(printf '  \n\t \n' | run)" = "longest -" ] || { echo "blank input"; ok=0; }
long=$(head -c 300 /dev/zero | tr '\0' x)
[ "$(printf 'hi %s abcdefghijklmnopq\n' "$long" | run)" = "$(printf '2 1\n15+ 2\nlongest %s' "$long")" ] || { echo "long words"; ok=0; }
echo $ok > /logs/verifier/reward.txt
