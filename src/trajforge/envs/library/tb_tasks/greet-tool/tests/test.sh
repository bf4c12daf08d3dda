#!/bin/bash
score=0
[ "$(/app/bin/greet Ann 2>/dev/null)" = "Hello, Ann!" ] && score=$((score + 1))
[ "$(/app/bin/greet --shout Bo 2>/dev/null)" = "HELLO, BO!" ] && score=$((score + 1))
err=$(/app/bin/greet 2>&1 >/dev/null); code=$?
[ "$code" = 2 ] && [ "$err" = "usage: greet [--shout] NAME" ] && score=$((score + 1))
if [ "$score" = 3 ]; then r=1.0; else r=0.0; fi
printf '{"reward": %s, "checks_passed": %d}\n' "$r" "$score" > /logs/verifier/reward.json
# the exit status says the verdict too: a harness that reads only reward.txt or the exit code
# (Hermes Agent's Terminal-Bench 2 env) must not see a pass for no work
[ "$score" = 3 ]
