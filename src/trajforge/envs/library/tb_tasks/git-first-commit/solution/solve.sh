#!/bin/bash
set -e
cd /app/project
git init -q -b main
printf 'build/\n*.log\n.env\n' > .gitignore
git add -A
git -c user.name=Dev -c user.email=dev@example.com commit -q -m "Initial commit"
