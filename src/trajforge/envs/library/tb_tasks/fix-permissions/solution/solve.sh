#!/bin/bash
set -e
cd /app/srv
find . -type d -exec chmod 755 {} +
find . -type f -exec chmod 644 {} +
chmod 755 bin/*
chmod 700 secrets
chmod 600 secrets/*
