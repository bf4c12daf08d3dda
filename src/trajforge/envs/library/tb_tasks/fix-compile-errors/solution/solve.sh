#!/bin/bash
cd /app
sed -i 's/^#include <stdio.h>$/#include <stdio.h>\n#include <string.h>/' inventory.c
sed -i 's/items\[i\].price$/items[i].price;/' inventory.c
sed -i 's/itmes/items/' inventory.c
sed -i 's/printf("total %d\\n"/printf("total %.2f\\n"/' inventory.c
