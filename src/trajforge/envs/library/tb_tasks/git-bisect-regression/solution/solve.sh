#!/bin/bash
set -e
cd /app/repo
for c in $(git rev-list --reverse main); do
  git checkout -q "$c"
  if ! python3 -B check.py >/dev/null 2>&1; then echo "$c" > /app/first_bad.txt; break; fi
done
git checkout -q main
