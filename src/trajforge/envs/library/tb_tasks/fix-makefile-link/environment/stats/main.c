#include <stdio.h>
#include <stdlib.h>
#include "stats.h"

int main(int argc, char **argv) {
    double x[64];
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++) x[n++] = atof(argv[i]);
    if (n == 0) return 2;
    printf("mean %.3f sd %.3f\n", mean(x, n), stddev(x, n));
    return 0;
}
