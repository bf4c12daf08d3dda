#!/bin/bash
cat > /app/svc.sh <<'SH'
#!/bin/bash
pidfile=/app/run/worker.pid
alive() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
case "$1" in
  start)
    alive && exit 0
    mkdir -p /app/run
    setsid python3 /app/worker.py </dev/null >/dev/null 2>&1 &
    echo $! > "$pidfile"
    ;;
  status)
    if alive; then echo "running $(cat "$pidfile")"; else echo stopped; exit 3; fi
    ;;
  stop)
    if alive; then
      pid=$(cat "$pidfile")
      kill "$pid"
      while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    fi
    rm -f "$pidfile"
    ;;
  *) echo "usage: svc.sh start|stop|status" >&2; exit 64 ;;
esac
SH
chmod +x /app/svc.sh
