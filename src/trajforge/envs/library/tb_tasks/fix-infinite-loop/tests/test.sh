#!/bin/bash
# Hidden test (copied in only after the agent has finished).
cd /app
ok=1
tmp=$(mktemp -d)
printf 'a\nb\nc\nd\ne\nf\ng\n' > "$tmp/seven"
: > "$tmp/empty"
[ "$(timeout 3 bash /app/paginate.sh /app/items.txt 2)" = "$(printf 'page 1: apple banana\npage 2: cherry date\npage 3: elder')" ] || { echo "items by 2"; ok=0; }
[ "$(timeout 3 bash /app/paginate.sh "$tmp/seven" 3)" = "$(printf 'page 1: a b c\npage 2: d e f\npage 3: g')" ] || { echo "seven by 3"; ok=0; }
[ "$(timeout 3 bash /app/paginate.sh "$tmp/seven" 7)" = "page 1: a b c d e f g" ] || { echo "one page"; ok=0; }
[ -z "$(timeout 3 bash /app/paginate.sh "$tmp/empty" 2)" ] || { echo "empty"; ok=0; }
timeout 3 bash /app/paginate.sh "$tmp/empty" 2 >/dev/null || { echo "empty failed"; ok=0; }
rm -rf "$tmp"
echo $ok > /logs/verifier/reward.txt
