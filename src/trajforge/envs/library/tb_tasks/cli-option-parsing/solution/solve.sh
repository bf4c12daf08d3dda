#!/bin/bash
cat > /app/bin/mkbackup <<'SH'
#!/bin/bash
usage() { echo "usage: mkbackup [-n] [-o DIR] FILE..." >&2; exit 64; }
dry=0
dir=/app/backups
while getopts ":no:" opt; do
  case "$opt" in
    n) dry=1 ;;
    o) dir=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || usage
status=0
for f in "$@"; do
  if [ ! -f "$f" ]; then
    echo "mkbackup: no such file: $f" >&2
    status=1
    continue
  fi
  dest="$dir/$(basename "$f").bak"
  if [ $dry = 1 ]; then
    echo "would copy $f -> $dest"
  else
    mkdir -p "$dir" && cp -- "$f" "$dest" && echo "copied $f -> $dest"
  fi
done
exit $status
SH
chmod +x /app/bin/mkbackup
