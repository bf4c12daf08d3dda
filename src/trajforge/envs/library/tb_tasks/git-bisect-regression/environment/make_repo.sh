#!/bin/bash
set -e
export GIT_AUTHOR_DATE="2024-03-01T00:00:00Z" GIT_COMMITTER_DATE="2024-03-01T00:00:00Z"
mkdir repo && cd repo && git init -q -b main
printf 'def scale(x, k):\n    return x * k\n' > calc.py
printf 'from calc import scale\nassert scale(3, 4) == 12, scale(3, 4)\nprint("ok")\n' > check.py
git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Initial"
for i in $(seq 1 24); do
  echo "note $i" >> notes.txt
  if [ "$i" = 14 ]; then
    printf 'def scale(x, k):\n    return x * k if k < 3 else x + k\n' > calc.py
  fi
  git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Change $i"
done
