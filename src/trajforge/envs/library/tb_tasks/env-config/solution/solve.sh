#!/bin/bash
name=$(sed -n 's/^name=//p' /app/app.env)
printf '{"name": "%s", "port": %d, "mode": "%s"}\n' "$name" "$APP_PORT" "$APP_MODE" > /app/config.json
