#!/bin/bash
cat > /app/wordlen.c <<'C'
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    int hist[16] = {0}, over = 0;
    size_t len = 0, cap = 64, bestlen = 0;
    char *word = malloc(cap), *best = NULL;
    int c;
    if (!word) return 1;
    do {
        c = getchar();
        if (c != EOF && !isspace(c)) {
            if (len + 1 >= cap) {
                char *grown = realloc(word, cap *= 2);
                if (!grown) return 1;
                word = grown;
            }
            word[len++] = (char)c;
            continue;
        }
        if (len > 0) {
            word[len] = '\0';
            if (len <= 15) hist[len]++; else over++;
            if (best == NULL || len > bestlen) {
                free(best);
                best = strdup(word);
                bestlen = len;
            }
            len = 0;
        }
    } while (c != EOF);
    for (int i = 1; i < 16; i++)
        if (hist[i]) printf("%d %d\n", i, hist[i]);
    if (over) printf("15+ %d\n", over);
    printf("longest %s\n", best ? best : "-");
    return 0;
}
C
