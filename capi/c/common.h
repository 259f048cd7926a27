/*
 * common.h: what the C programs over libucpx.so share: the check of a ucpx call, the
 * EXPECT of a condition (either prints the failure with ucpx_last_error and exits 1),
 * and the wire-up through files in a directory both ranks see.
 */
#ifndef UCPX_CAPI_COMMON_H
#define UCPX_CAPI_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ucpx.h"

static int rank;

#define CHECK(call)                                                                        \
	do {                                                                               \
		int rc_ = (call);                                                          \
		if (rc_ != UCPX_OK) {                                                      \
			char msg_[512];                                                    \
			ucpx_last_error(msg_, sizeof msg_);                                \
			fprintf(stderr, "rank %d: %s:%d: %s = %s: %s\n", rank, __FILE__, __LINE__, \
			        #call, ucpx_strerror(rc_), msg_);                          \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

#define EXPECT(cond, ...)                                                                  \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "rank %d: %s:%d: expected %s: ", rank, __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

/* publish writes s to DIR/NAME.RANK atomically (write, then rename). */
static inline void publish(const char *dir, const char *name, const char *s) {
	char tmp[4096], path[4096];
	snprintf(tmp, sizeof tmp, "%s/.%s.%d", dir, name, rank);
	snprintf(path, sizeof path, "%s/%s.%d", dir, name, rank);
	FILE *f = fopen(tmp, "w");
	EXPECT(f != NULL, "open %s", tmp);
	EXPECT(fputs(s, f) >= 0 && fclose(f) == 0, "write %s", tmp);
	EXPECT(rename(tmp, path) == 0, "rename %s", path);
}

/* fetch reads DIR/NAME.PEER, waiting up to a minute for it. */
static inline char *fetch(const char *dir, const char *name) {
	char path[4096];
	snprintf(path, sizeof path, "%s/%s.%d", dir, name, 1 - rank);
	for (int i = 0; i < 6000; i++) {
		FILE *f = fopen(path, "r");
		if (f) {
			char *buf = malloc(1 << 16);
			size_t n = fread(buf, 1, (1 << 16) - 1, f);
			buf[n] = 0;
			fclose(f);
			return buf;
		}
		usleep(10000);
	}
	EXPECT(0, "no %s from the peer", path);
	return NULL;
}

#endif
