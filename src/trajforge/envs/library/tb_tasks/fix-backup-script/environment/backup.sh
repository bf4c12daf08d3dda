#!/bin/bash
set -e
SRC=/app/dta
DEST="$BACKUP_ROOT/latest"
mkdir "$DEST"
cp "$SRC"/* "$DEST"/
ls "$DEST" | wc -l > "$BACKUP_ROOT/count"
