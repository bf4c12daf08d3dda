#!/bin/bash
set -e
cd /app/inbox
for f in *; do
  case "$f" in
    *.*) ext="${f##*.}"; ext="${ext,,}" ;;
    *) ext=none ;;
  esac
  mkdir -p "/app/sorted/$ext"
  mv -- "$f" "/app/sorted/$ext/"
done
