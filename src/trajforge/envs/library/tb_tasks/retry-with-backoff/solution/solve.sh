#!/bin/bash
cat > /app/retry.sh <<'SH'
#!/bin/bash
max=$1; delay=$2; shift 2
n=1
while :; do
  "$@"
  status=$?
  [ $status -eq 0 ] && exit 0
  echo "attempt $n failed with status $status" >&2
  [ $n -ge "$max" ] && exit $status
  sleep "$delay"
  delay=$(python3 -c 'import sys; print(float(sys.argv[1]) * 2)' "$delay")
  n=$((n + 1))
done
SH
chmod +x /app/retry.sh
