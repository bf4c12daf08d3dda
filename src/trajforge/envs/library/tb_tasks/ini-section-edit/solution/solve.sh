#!/bin/bash
sed -i '/^\[server\]$/,/^\[/{s/^host = .*/host = 127.0.0.1/;s/^port = .*/port = 9090/}' /app/site.ini
