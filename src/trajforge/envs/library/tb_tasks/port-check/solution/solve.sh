#!/bin/bash
cat > /app/portcheck.sh <<'SH'
#!/bin/bash
while read -r name port; do
  case "$name" in ''|'#'*) continue ;; esac
  if timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    echo "$name $port open"
  else
    echo "$name $port closed"
  fi
done < /app/services.txt
SH
chmod +x /app/portcheck.sh
