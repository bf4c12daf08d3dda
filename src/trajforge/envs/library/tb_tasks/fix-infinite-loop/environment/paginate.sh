#!/bin/bash
file=$1
size=$2
total=$(wc -l < "$file")
page=1
start=1
while [ "$start" -le "$total" ]; do
  end=$((start + size - 1))
  echo "page $page: $(sed -n "${start},${end}p" "$file" | tr '\n' ' ')"
  page=$((page + 1))
done
