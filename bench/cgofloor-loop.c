/* bench/cgofloor's loop (capi-pingpong.sh): times n calls of ucpx_bench_noop from one C thread: prints ns per call (best of 5). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern int ucpx_bench_noop(int x);

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	double best = 1e30;
	int x = 0;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++) {
			x = ucpx_bench_noop(x);
		}
		double per = (now_ns() - t0) / n;
		if (per < best) {
			best = per;
		}
	}
	printf("noop_call_ns %.1f\n", best);
	return x == 0; /* keep the calls */
}
