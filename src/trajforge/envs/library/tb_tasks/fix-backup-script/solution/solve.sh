#!/bin/bash
set -e
cat > /app/backup.sh <<'SCRIPT'
#!/bin/bash
set -e
SRC=/app/data
DEST="${BACKUP_ROOT:-/app/backups}/latest"
rm -rf "$DEST"
mkdir -p "$DEST"
cp "$SRC"/* "$DEST"/
ls "$DEST" | wc -l | tr -d ' ' > "${BACKUP_ROOT:-/app/backups}/count.txt"
SCRIPT
chmod +x /app/backup.sh
