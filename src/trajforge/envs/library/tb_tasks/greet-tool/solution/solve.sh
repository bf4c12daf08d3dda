#!/bin/bash
cat > /app/bin/greet <<'SCRIPT'
#!/bin/sh
shout=0
if [ "$1" = "--shout" ]; then shout=1; shift; fi
if [ -z "$1" ]; then echo "usage: greet [--shout] NAME" >&2; exit 2; fi
msg="Hello, $1!"
if [ "$shout" = 1 ]; then echo "$msg" | tr '[:lower:]' '[:upper:]'; else echo "$msg"; fi
SCRIPT
chmod +x /app/bin/greet
