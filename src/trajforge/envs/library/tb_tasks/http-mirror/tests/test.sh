#!/bin/bash
# Hidden test (copied in only after the agent has finished). Stops the server it starts.
cd /app
site=$(mktemp -d)
cp -r /tests/site/. "$site/"
python3 -m http.server 18642 --bind 127.0.0.1 --directory "$site" </dev/null >/dev/null 2>&1 &
server=$!
for i in $(seq 100); do
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", 18642), 1).close()' 2>/dev/null && break
  sleep 0.1
done
out=$(mktemp -d)/mirror
timeout 60 python3 /app/mirror.py http://127.0.0.1:18642/ "$out" </dev/null >/dev/null 2>&1
timeout 60 python3 -I /tests/test_outputs.py "$site" "$out"
status=$?
kill -9 $server 2>/dev/null; wait $server 2>/dev/null
if [ $status -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
