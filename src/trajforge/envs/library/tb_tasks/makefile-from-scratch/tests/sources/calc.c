#include <stdio.h>
#include <stdlib.h>
#include "ops.h"

int main(int argc, char **argv) {
    int ok;
    long r;
    if (argc != 4) {
        fprintf(stderr, "usage: calc A OP B\n");
        return 2;
    }
    r = apply(atol(argv[1]), argv[2][0], atol(argv[3]), &ok);
    if (!ok) {
        fprintf(stderr, "bad operation\n");
        return 1;
    }
    printf("%ld\n", r);
    return 0;
}
