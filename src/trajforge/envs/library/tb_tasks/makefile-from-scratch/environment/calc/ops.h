#ifndef OPS_H
#define OPS_H
long apply(long a, char op, long b, int *ok);
#endif
