#!/bin/bash
set -e
export GIT_AUTHOR_DATE="2024-02-01T00:00:00Z" GIT_COMMITTER_DATE="2024-02-01T00:00:00Z"
mkdir repo && cd repo && git init -q -b main
printf 'def parse(text):\n    return text.split(",")\n' > util.py
printf '# Util\n' > README.md
git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Initial"
git checkout -q -b hotfix
printf '# Util\nSplits text.\n' > README.md && git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "docs: describe util"
printf 'def parse(text):\n    if not text:\n        return []\n    return text.split(",")\n' > util.py
git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "fix: handle empty input"
echo "import random" > experiment.py && git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "wip: experiment"
git checkout -q main
printf 'print("cli")\n' > cli.py && git add -A && git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Add cli"
