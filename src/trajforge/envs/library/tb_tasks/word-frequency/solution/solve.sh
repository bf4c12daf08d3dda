#!/bin/bash
export LC_ALL=C
tr 'A-Z' 'a-z' < /app/book.txt | grep -o '[a-z]\+' | sort | uniq -c \
  | awk '{print $1, $2}' | sort -k1,1nr -k2,2 | head -10 > /app/top10.txt
