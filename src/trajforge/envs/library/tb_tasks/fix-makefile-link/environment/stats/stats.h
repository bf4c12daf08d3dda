double mean(const double *x, int n);
double stddev(const double *x, int n);
