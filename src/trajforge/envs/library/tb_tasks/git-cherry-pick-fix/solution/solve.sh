#!/bin/bash
set -e
cd /app/repo
git checkout -q main
git -c user.name=Dev -c user.email=dev@example.com cherry-pick "$(git log --format=%H --grep='^fix:' hotfix -n 1)" >/dev/null
