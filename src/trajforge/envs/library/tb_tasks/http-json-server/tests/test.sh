#!/bin/bash
# Hidden test (copied in only after the agent has finished). Stops the server it starts.
cd /app
[ -f /app/server.py ] || { echo "no /app/server.py"; echo 0 > /logs/verifier/reward.txt; exit 0; }
python3 /app/server.py 18931 </dev/null >/dev/null 2>&1 &
server=$!
timeout 60 python3 -I /tests/test_outputs.py 18931
status=$?
kill -9 $server 2>/dev/null; wait $server 2>/dev/null
if [ $status -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
