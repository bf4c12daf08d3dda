#include "ops.h"

long apply(long a, char op, long b, int *ok) {
    *ok = 1;
    switch (op) {
    case '+': return a + b;
    case '-': return a - b;
    case 'x': case '*': return a * b;
    case '/': if (b != 0) return a / b; /* fall through */
    default: *ok = 0; return 0;
    }
}
