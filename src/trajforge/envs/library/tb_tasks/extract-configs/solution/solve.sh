#!/bin/bash
set -e
mkdir -p /app/configs
tmp=$(mktemp -d)
tar -xzf /app/bundle.tar.gz -C "$tmp"
cd "$tmp"
find . -type f -name '*.conf' | sed 's|^\./||' | while read -r p; do
  cp "$p" /app/configs/
  echo "$(basename "$p") $p"
done | sort > /app/configs/index.txt
rm -rf "$tmp"
