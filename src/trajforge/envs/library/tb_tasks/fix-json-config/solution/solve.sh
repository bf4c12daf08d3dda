#!/bin/bash
cat > /app/config.json <<'JSON'
{
  "name": "inventory",
  "debug": false,
  "server": {"host": "127.0.0.1", "port": 8080, "workers": 4},
  "tags": ["api", "internal"]
}
JSON
