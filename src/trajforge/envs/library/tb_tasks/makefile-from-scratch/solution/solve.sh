#!/bin/bash
cat > /app/calc/Makefile <<'MK'
CC = gcc
CFLAGS = -O2 -Wall

calc: calc.o ops.o
	$(CC) $(CFLAGS) -o $@ calc.o ops.o

calc.o: calc.c ops.h
	$(CC) $(CFLAGS) -c calc.c

ops.o: ops.c ops.h
	$(CC) $(CFLAGS) -c ops.c

clean:
	rm -f calc *.o

.PHONY: clean
MK
