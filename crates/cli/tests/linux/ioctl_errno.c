/*
 * LD_PRELOAD library that counts a program's ioctl, open and close calls
 * and their failures by errno, so that a program which prints no errno (or
 * only some) can be checked for "no failed call" and for the exact errno
 * of the calls that fail. At exit it prints, on stderr, one line per
 * (call, request, result):
 *
 *   ioctl_errno: ioctl 0x4028b501 calls 200 ok 200
 *   ioctl_errno: ioctl 0xc030b507 calls 200 failed EINVAL 200
 *
 * The program itself is not changed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#define SLOTS 64

struct tally {
	const char *call;
	unsigned long req;
	int err; /* 0: succeeded */
	unsigned long count;
};

static struct tally tallies[SLOTS];

static void count(const char *call, unsigned long req, int ret, int err)
{
	int e = ret < 0 ? err : 0;
	for (int i = 0; i < SLOTS; i++) {
		struct tally *t = &tallies[i];
		if (!t->call) {
			t->call = call;
			t->req = req;
			t->err = e;
		}
		if (t->call == call && t->req == req && t->err == e) {
			t->count++;
			return;
		}
	}
}

int ioctl(int fd, unsigned long req, ...)
{
	static int (*real)(int, unsigned long, ...);
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (!real)
		real = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	int ret = real(fd, req, arg);
	int err = errno;
	count("ioctl", req, ret, err);
	errno = err;
	return ret;
}

int open(const char *path, int flags, ...)
{
	static int (*real)(const char *, int, ...);
	mode_t mode = 0;
	if (flags & (O_CREAT | O_TMPFILE)) {
		va_list ap;
		va_start(ap, flags);
		mode = va_arg(ap, mode_t);
		va_end(ap);
	}
	if (!real)
		real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
	int ret = real(path, flags, mode);
	int err = errno;
	count("open", 0, ret, err);
	errno = err;
	return ret;
}

int close(int fd)
{
	static int (*real)(int);
	if (!real)
		real = (int (*)(int))dlsym(RTLD_NEXT, "close");
	int ret = real(fd);
	int err = errno;
	count("close", 0, ret, err);
	errno = err;
	return ret;
}

__attribute__((destructor)) static void report(void)
{
	for (int i = 0; i < SLOTS && tallies[i].call; i++) {
		struct tally *t = &tallies[i];
		if (t->err)
			fprintf(stderr, "ioctl_errno: %s 0x%lx failed %s %lu\n", t->call, t->req,
				strerrorname_np(t->err), t->count);
		else
			fprintf(stderr, "ioctl_errno: %s 0x%lx ok %lu\n", t->call, t->req, t->count);
	}
}
