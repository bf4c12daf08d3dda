#include <stdio.h>

struct item {
    char name[32];
    int count;
    double price;
};

static double total_value(const struct item *items, int n) {
    double total = 0;
    for (int i = 0; i < n; i++)
        total += items[i].count * items[i].price
    return total;
}

int main(void) {
    struct item items[3];
    strcpy(items[0].name, "bolt");  items[0].count = 120; items[0].price = 0.25;
    strcpy(items[1].name, "nut");   items[1].count = 300; items[1].price = 0.1;
    strcpy(items[2].name, "gear");  items[2].count = 4;   items[2].price = 12.5;
    for (int i = 0; i < 3; i++)
        printf("%-6s %4d\n", items[i].name, itmes[i].count);
    printf("total %d\n", total_value(items, 3));
    return 0;
}
