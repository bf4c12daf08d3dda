#!/bin/bash
set -e
export GIT_AUTHOR_DATE="2024-01-01T00:00:00Z" GIT_COMMITTER_DATE="2024-01-01T00:00:00Z"
mkdir repo && cd repo && git init -q -b main
echo "step 1: draft" > plan.txt && echo "print(1)" > app.py
git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Initial"
printf 'step 1: draft\nstep 2: review\n' > plan.txt
git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Update plan"
git rm -q plan.txt && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Cleanup"
echo "print(2)" > app.py && git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Edit app"
