#include <ctype.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    int hist[16] = {0};
    char word[64], best[64];
    char *longest = NULL;
    int c, len = 0;
    do {
        c = getchar();
        if (c != EOF && !isspace(c)) {
            word[len++] = (char)c;
            continue;
        }
        if (len > 0) {
            word[len] = '\0';
            hist[len]++;
            if (longest == NULL || len > (int)strlen(longest)) {
                strcpy(best, word);
                longest = best;
            }
            len = 0;
        }
    } while (c != EOF);
    for (int i = 1; i < 16; i++)
        if (hist[i]) printf("%d %d\n", i, hist[i]);
    printf("longest %s (%zu)\n", longest, strlen(longest));
    return 0;
}
