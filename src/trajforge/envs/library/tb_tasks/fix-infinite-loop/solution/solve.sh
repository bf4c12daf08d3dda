#!/bin/bash
cat > /app/paginate.sh <<'SH'
#!/bin/bash
file=$1
size=$2
total=$(wc -l < "$file")
page=1
start=1
while [ "$start" -le "$total" ]; do
  end=$((start + size - 1))
  echo "page $page: $(sed -n "${start},${end}p" "$file" | paste -sd ' ')"
  page=$((page + 1))
  start=$((end + 1))
done
SH
chmod +x /app/paginate.sh
