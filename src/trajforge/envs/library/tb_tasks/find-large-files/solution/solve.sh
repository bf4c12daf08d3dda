#!/bin/bash
cd /app/data && find . -type f -size +1048576c | sed 's|^\./||' | LC_ALL=C sort > /app/large.txt
