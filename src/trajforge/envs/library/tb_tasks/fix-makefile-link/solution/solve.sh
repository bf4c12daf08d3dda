#!/bin/bash
cd /app/stats
sed -i 's/^    \$(CC)/\t$(CC)/' Makefile
sed -i 's/-o stats main.o stats.o$/-o stats main.o stats.o -lm/' Makefile
