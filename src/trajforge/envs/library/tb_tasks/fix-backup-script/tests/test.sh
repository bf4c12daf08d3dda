#!/bin/bash
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ -x /app/backup.sh ] || fail "backup.sh is not executable"
echo "record 4" > /app/data/record-4.txt
/app/backup.sh || fail "first run failed"
/app/backup.sh || fail "second run failed"
[ "$(cat /app/backups/count.txt)" = "4" ] || fail "count.txt is not 4"
for i in 1 2 3 4; do
  [ "$(cat /app/backups/latest/record-$i.txt)" = "record $i" ] || fail "record-$i.txt missing or wrong"
done
echo 1 > /logs/verifier/reward.txt
