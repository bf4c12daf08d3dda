#!/bin/bash
# Hidden test (copied in only after the agent has finished). Stops the listeners it starts.
cd /app
listen() { python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8); time.sleep(120)' "$1" & }
listen 18080; a=$!
listen 16379; b=$!
for i in $(seq 100); do
  python3 -c 'import socket; [socket.create_connection(("127.0.0.1", p), 1).close() for p in (18080, 16379)]' 2>/dev/null && break
  sleep 0.1
done
got=$(timeout 20 bash /app/portcheck.sh 2>/dev/null)
kill -9 $a $b 2>/dev/null; wait $a $b 2>/dev/null
want=$(printf 'web 18080 open\ndb 15432 closed\ncache 16379 open')
if [ "$got" = "$want" ]; then echo 1 > /logs/verifier/reward.txt; else echo "got: $got"; echo 0 > /logs/verifier/reward.txt; fi
