/*
 * Ordinary file I/O, to measure what the preload costs the calls it does
 * not serve: ITER times open(PATH) + read(64 bytes) + close, then ITER
 * times read(64 bytes) + lseek(0) on one fd. Times are the thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID: system calls included, time spent
 * preempted by other work on a busy machine not). Prints one line:
 *   open_read_close_ns=X read_ns=Y
 *
 *   file_io PATH ITER
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: file_io PATH ITER\n");
		return 2;
	}
	long iter = atol(argv[2]);
	char buf[64];
	double a = now_ns();
	for (long i = 0; i < iter; i++) {
		int fd = open(argv[1], O_RDONLY);
		if (fd < 0 || read(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
			perror(argv[1]);
			return 1;
		}
		close(fd);
	}
	double b = now_ns();
	int fd = open(argv[1], O_RDONLY);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	double c = now_ns();
	for (long i = 0; i < iter; i++) {
		if (read(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
			perror("read");
			return 1;
		}
		lseek(fd, 0, SEEK_SET);
	}
	double d = now_ns();
	printf("open_read_close_ns=%.1f read_ns=%.1f\n", (b - a) / iter, (d - c) / iter);
	return 0;
}
