#!/bin/bash
cat > /app/crontab <<'CRON'
# m h dom mon dow command
30 2 * * * /app/bin/backup.sh
*/15 9-17 * * 1-5 /app/bin/report.sh
0 4 1 * * /app/bin/cleanup.sh
CRON
