/*
 * A program written for Linux's rpmsg character devices and nothing else:
 * it uses only the uAPI of <linux/rpmsg.h> (rpmsg_ctrl, rpmsg_char and
 * RPMSG_CREATE_EPT_FD_IOCTL), declaring only what the installed header
 * lacks. Run against a bus whose remote echoes the channel "echo"; every
 * check prints "ok <what>" or "FAIL <what>: ..." and the exit status is
 * the number of failures.
 *
 *   rpmsg_uapi            the whole sequence (needs the service)
 *   rpmsg_uapi --absent   no rpmsg: /dev/rpmsg_ctrl0 is ENOENT, files work
 *   rpmsg_uapi --until-gone   endpoints up, then EPIPE once the remote dies
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <termios.h>
#include <unistd.h>
#include <linux/rpmsg.h>

/* Flow control (Linux 6.5) and the fd ioctl (the rpmsg-next series that
 * adds it) may be newer than the installed header. */
#ifndef RPMSG_GET_OUTGOING_FLOWCONTROL
#define RPMSG_GET_OUTGOING_FLOWCONTROL _IOR(0xb5, 0x5, int)
#endif
#ifndef RPMSG_SET_INCOMING_FLOWCONTROL
#define RPMSG_SET_INCOMING_FLOWCONTROL _IOR(0xb5, 0x6, int)
#endif
#include "fd_ioctl.h"

#include "check.h"

/* `r` is -1 with errno `want`. */
static void check_err(long r, int want, const char *what)
{
	int e = errno;
	if (r == -1 && e == want) {
		printf("ok %s\n", what);
	} else {
		printf("FAIL %s: returned %ld, errno %d (%s), wanted %d (%s)\n", what, r,
		       e, strerror(e), want, strerror(want));
		failures++;
	}
	fflush(stdout);
}

/* Writes a message and reads the echo back, byte for byte. */
static void echo(int fd, size_t len, int seed, const char *what)
{
	unsigned char msg[496], back[512];
	size_t i;
	for (i = 0; i < len; i++)
		msg[i] = (unsigned char)(i * 7 + seed);
	ssize_t w = write(fd, msg, len);
	check(w == (ssize_t)len, what, errno);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int n = poll(&p, 1, 10000);
	check(n == 1 && (p.revents & POLLIN), "echo readable", errno);
	memset(back, 0xee, sizeof(back));
	ssize_t r = read(fd, back, sizeof(back));
	check(r == (ssize_t)len && memcmp(msg, back, len) == 0, "echo bytes match", errno);
}

/* Everything rpmsg_char promises once the endpoint is destroyed. */
static void after_destroy(int fd, const char *way)
{
	char buf[64], what[96];
	/* Sizes the compiler cannot see: with _FORTIFY_SOURCE these are
	 * glibc's __read_chk and __poll_chk. */
	volatile size_t size = sizeof(buf);
	volatile nfds_t one = 1;
	snprintf(what, sizeof(what), "%s: read after destroy is EPIPE", way);
	check_err(read(fd, buf, size), EPIPE, what);
	snprintf(what, sizeof(what), "%s: write after destroy is EPIPE", way);
	check_err(write(fd, "x", 1), EPIPE, what);
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLOUT };
	int n = poll(&p, one, 1000);
	snprintf(what, sizeof(what), "%s: poll after destroy reports POLLHUP|POLLERR", way);
	check(n == 1 && (p.revents & (POLLHUP | POLLERR)) == (POLLHUP | POLLERR), what, errno);
}

/* How many fds the process has open (what /proc/self/fd lists, less the
 * directory's own). */
static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", "..", the directory's fd */
}

/* A legacy endpoint through a control fd opened for it, closed early or
 * late: its node outlives the control fd (as /dev/rpmsgN outlives
 * /dev/rpmsg_ctrl0), and once destroyed nothing of it stays open. */
static int legacy_on_fresh_ctrl(int close_early)
{
	int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR | O_CLOEXEC);
	struct rpmsg_endpoint_info info;
	memset(&info, 0, sizeof(info));
	strcpy(info.name, "echo");
	info.src = RPMSG_ADDR_ANY;
	info.dst = RPMSG_ADDR_ANY;
	if (ctrl < 0 || ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, &info)) {
		check(0, "fresh control fd: RPMSG_CREATE_EPT_IOCTL", errno);
		return 0;
	}
	if (close_early && close(ctrl)) {
		check(0, "fresh control fd: close before the node is opened", errno);
		return 0;
	}
	int ep = open("/dev/rpmsg0", O_RDWR | O_CLOEXEC);
	if (ep < 0 || ioctl(ep, RPMSG_DESTROY_EPT_IOCTL) || close(ep)) {
		check(0, close_early ? "the node outlives its closed control fd" : "fresh control fd: node", errno);
		return 0;
	}
	if (!close_early && close(ctrl)) {
		check(0, "fresh control fd: close", errno);
		return 0;
	}
	return 1;
}

static int absent(void)
{
	check_err(open("/dev/rpmsg_ctrl0", O_RDWR), ENOENT, "no rpmsg: open /dev/rpmsg_ctrl0 is ENOENT");
	check_err(open("/dev/rpmsg0", O_RDWR), ENOENT, "no rpmsg: open /dev/rpmsg0 is ENOENT");
	int fd = open("/proc/self/status", O_RDONLY);
	char buf[16];
	check(fd >= 0 && read(fd, buf, 5) == 5 && memcmp(buf, "Name:", 5) == 0,
	      "no rpmsg: ordinary files still open and read", errno);
	check(close(fd) == 0, "no rpmsg: close", errno);
	return failures;
}

/* Waits (up to 20 s) for the endpoint to go with the remote, then checks
 * what rpmsg_char promises. */
static void remote_gone(int fd, const char *way)
{
	char buf[64], what[96];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int n = poll(&p, 1, 20000);
	snprintf(what, sizeof(what), "%s: remote gone: poll reports POLLHUP|POLLERR", way);
	check(n == 1 && (p.revents & (POLLHUP | POLLERR)) == (POLLHUP | POLLERR), what, errno);
	snprintf(what, sizeof(what), "%s: remote gone: read is EPIPE", way);
	check_err(read(fd, buf, sizeof(buf)), EPIPE, what);
	snprintf(what, sizeof(what), "%s: remote gone: write is EPIPE", way);
	check_err(write(fd, "x", 1), EPIPE, what);
}

/* One endpoint each way, an echo through each, then (once the caller has
 * killed the remote) what their users see. */
static int until_gone(void)
{
	int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR);
	check(ctrl >= 0, "open /dev/rpmsg_ctrl0", errno);
	struct rpmsg_endpoint_info info;
	memset(&info, 0, sizeof(info));
	strcpy(info.name, "echo");
	info.src = RPMSG_ADDR_ANY;
	info.dst = RPMSG_ADDR_ANY;
	check(ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, &info) == 0, "RPMSG_CREATE_EPT_IOCTL", errno);
	int ep = open("/dev/rpmsg0", O_RDWR);
	check(ep >= 0, "open /dev/rpmsg0", errno);
	struct rpmsg_endpoint_fd_info fdinfo;
	memset(&fdinfo, 0, sizeof(fdinfo));
	strcpy(fdinfo.name, "echo");
	fdinfo.src = RPMSG_ADDR_ANY;
	fdinfo.dst = RPMSG_ADDR_ANY;
	fdinfo.flags = O_RDWR;
	check(ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &fdinfo) == 0, "RPMSG_CREATE_EPT_FD_IOCTL", errno);
	echo(ep, 20, 5, "legacy: write");
	echo(fdinfo.fd, 20, 6, "fd: write");
	if (failures)
		return failures;
	check(1, "endpoints up", 0);
	remote_gone(ep, "legacy");
	remote_gone(fdinfo.fd, "fd");
	check(close(ep) == 0 && close(fdinfo.fd) == 0 && close(ctrl) == 0, "close all", errno);
	return failures;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--absent") == 0)
		return absent();
	if (argc > 1 && strcmp(argv[1], "--until-gone") == 0)
		return until_gone();

	int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR | O_CLOEXEC);
	check(ctrl >= 0, "open /dev/rpmsg_ctrl0", errno);
	if (ctrl < 0)
		return 100;
	check_err(open("/dev/rpmsg_ctrl1", O_RDWR), ENOENT, "open /dev/rpmsg_ctrl1 is ENOENT");
	/* Flags the compiler cannot see: with _FORTIFY_SOURCE this open is
	 * glibc's __open_2 (or __open64_2); and openat relative to nothing. */
	volatile int rw = O_RDWR;
	int c2 = open("/dev/rpmsg_ctrl0", rw);
	check(c2 >= 0 && close(c2) == 0, "open with run-time flags", errno);
	int c3 = openat(AT_FDCWD, "/dev/rpmsg_ctrl0", rw);
	check(c3 >= 0 && close(c3) == 0, "openat /dev/rpmsg_ctrl0", errno);

	/* The legacy way: a node to open. */
	struct rpmsg_endpoint_info info;
	memset(&info, 0, sizeof(info));
	strcpy(info.name, "echo");
	info.src = RPMSG_ADDR_ANY;
	info.dst = RPMSG_ADDR_ANY;
	check(ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, &info) == 0, "RPMSG_CREATE_EPT_IOCTL", errno);
	check_err(ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, NULL), EFAULT, "RPMSG_CREATE_EPT_IOCTL with NULL is EFAULT");
	check_err(ioctl(ctrl, _IO(0xb5, 0x42), &info), EINVAL, "unknown ioctl on the control fd is EINVAL");
	/* What fs/ioctl.c answers before the driver: a terminal request is
	 * the driver's (EINVAL); FIOQSIZE and turning FIOASYNC on are ENOTTY
	 * (a character device, no fasync). */
	struct termios tio;
	check_err(ioctl(ctrl, TCGETS, &tio), EINVAL, "TCGETS on the control fd is EINVAL");
	long long qsize;
	check_err(ioctl(ctrl, FIOQSIZE, &qsize), ENOTTY, "FIOQSIZE on the control fd is ENOTTY");
	int async_on = 1, async_off = 0;
	check_err(ioctl(ctrl, FIOASYNC, &async_on), ENOTTY, "FIOASYNC on the control fd is ENOTTY");
	check(ioctl(ctrl, FIOASYNC, &async_off) == 0, "FIOASYNC off on the control fd", errno);
	int ep = open("/dev/rpmsg0", O_RDWR);
	check(ep >= 0, "open /dev/rpmsg0", errno);
	check_err(open("/dev/rpmsg0", O_RDWR), EBUSY, "second open of /dev/rpmsg0 is EBUSY");
	echo(ep, 11, 1, "legacy: write");
	echo(ep, 496, 2, "legacy: write 496 bytes");
	char big[497];
	memset(big, 'b', sizeof(big));
	check_err(write(ep, big, sizeof(big)), EMSGSIZE, "legacy: write 497 bytes is EMSGSIZE");
	struct pollfd quiet = { .fd = ep, .events = POLLIN };
	check(poll(&quiet, 1, 200) == 0, "legacy: nothing of the 497 bytes came back", errno);
	int restricted = -1;
	check(ioctl(ep, RPMSG_GET_OUTGOING_FLOWCONTROL, &restricted) == 0 && restricted == 0,
	      "RPMSG_GET_OUTGOING_FLOWCONTROL answers 0 (virtio)", errno);
	check_err(ioctl(ep, RPMSG_SET_INCOMING_FLOWCONTROL, 1), EOPNOTSUPP,
		  "RPMSG_SET_INCOMING_FLOWCONTROL is EOPNOTSUPP (virtio)");
	check_err(ioctl(ep, RPMSG_SET_INCOMING_FLOWCONTROL, 2), EINVAL,
		  "RPMSG_SET_INCOMING_FLOWCONTROL 2 is EINVAL");
	check_err(ioctl(ep, _IO(0xb5, 0x42)), EINVAL, "unknown ioctl on an endpoint is EINVAL");
	check_err(ioctl(ep, TCGETS, &tio), EINVAL, "TCGETS on an endpoint is EINVAL");
	check_err(ioctl(ep, FIOQSIZE, &qsize), ENOTTY, "FIOQSIZE on an endpoint is ENOTTY");
	check_err(ioctl(ep, FIOASYNC, &async_on), ENOTTY, "FIOASYNC on an endpoint is ENOTTY");
	int copy = dup(ep);
	check(copy >= 0, "dup of the endpoint", errno);
	check(ioctl(ep, RPMSG_DESTROY_EPT_IOCTL) == 0, "legacy: RPMSG_DESTROY_EPT_IOCTL", errno);
	after_destroy(ep, "legacy");
	after_destroy(copy, "legacy copy");
	check_err(open("/dev/rpmsg0", O_RDWR), ENOENT, "legacy: the node is gone after destroy");
	check(close(copy) == 0, "legacy: close the copy", errno);
	check(close(ep) == 0, "legacy: close", errno);

	/* The fd way: the endpoint comes back as an fd. */
	struct rpmsg_endpoint_fd_info fdinfo;
	memset(&fdinfo, 0, sizeof(fdinfo));
	strcpy(fdinfo.name, "echo");
	fdinfo.src = RPMSG_ADDR_ANY;
	fdinfo.dst = RPMSG_ADDR_ANY;
	fdinfo.flags = O_RDWR | O_APPEND;
	fdinfo.fd = -1;
	check_err(ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &fdinfo), EINVAL,
		  "RPMSG_CREATE_EPT_FD_IOCTL with O_APPEND is EINVAL");
	fdinfo.flags = O_RDWR | O_CLOEXEC;
	check(ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &fdinfo) == 0 && fdinfo.fd >= 0,
	      "RPMSG_CREATE_EPT_FD_IOCTL", errno);
	int efd = fdinfo.fd;
	check((fcntl(efd, F_GETFD) & FD_CLOEXEC) && !(fcntl(efd, F_GETFL) & O_NONBLOCK),
	      "fd: O_CLOEXEC honoured, blocking", errno);
	echo(efd, 100, 3, "fd: write");
	check_err(write(efd, big, sizeof(big)), EMSGSIZE, "fd: write 497 bytes is EMSGSIZE");
	/* writev: the buffers make one message (read_iter/write_iter). */
	struct iovec two[2] = { { "hello ", 6 }, { "vectors", 7 } };
	check(writev(efd, two, 2) == 13, "fd: writev of two buffers", errno);
	char h[6], v[16];
	struct iovec back[2] = { { h, sizeof(h) }, { v, sizeof(v) } };
	struct pollfd pv = { .fd = efd, .events = POLLIN };
	check(poll(&pv, 1, 10000) == 1 && readv(efd, back, 2) == 13 &&
		      memcmp(h, "hello ", 6) == 0 && memcmp(v, "vectors", 7) == 0,
	      "fd: readv gets the one message back", errno);
	struct iovec over[2] = { { big, 300 }, { big, 197 } };
	check_err(writev(efd, over, 2), EMSGSIZE, "fd: writev of 497 bytes is EMSGSIZE");
	check(ioctl(efd, RPMSG_DESTROY_EPT_IOCTL) == 0, "fd: RPMSG_DESTROY_EPT_IOCTL", errno);
	after_destroy(efd, "fd");
	check(close(efd) == 0, "fd: close", errno);

	/* Non-blocking and read-only endpoints. */
	fdinfo.flags = O_RDONLY | O_NONBLOCK;
	check(ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &fdinfo) == 0, "fd: O_RDONLY | O_NONBLOCK", errno);
	char b;
	check_err(read(fdinfo.fd, &b, 1), EAGAIN, "fd: non-blocking read with nothing queued is EAGAIN");
	check_err(write(fdinfo.fd, "x", 1), EBADF, "fd: write on a read-only endpoint is EBADF");
	check(close(fdinfo.fd) == 0, "fd: close the read-only endpoint", errno);

	/* Legacy endpoints through control fds opened and closed for each,
	 * 200 times, under a limit of 64 open fds: nothing stays open once
	 * they are destroyed. */
	struct rlimit old_lim, lim;
	getrlimit(RLIMIT_NOFILE, &old_lim);
	lim = old_lim;
	lim.rlim_cur = 64;
	int fds_before = open_fds();
	int limited = setrlimit(RLIMIT_NOFILE, &lim) == 0;
	int cycled = 1;
	for (int i = 0; i < 200 && cycled; i++)
		cycled = legacy_on_fresh_ctrl(i % 2);
	check(cycled && limited && open_fds() == fds_before,
	      "200 legacy endpoints on fresh control fds leave no fd open", errno);
	setrlimit(RLIMIT_NOFILE, &old_lim);

	/* Local channels, as the virtio bus answers them. */
	struct rpmsg_endpoint_info ch;
	memset(&ch, 0, sizeof(ch));
	strcpy(ch.name, "rpmsg-uapi-test");
	ch.src = 0x500;
	ch.dst = RPMSG_ADDR_ANY;
	check(ioctl(ctrl, RPMSG_CREATE_DEV_IOCTL, &ch) == 0, "RPMSG_CREATE_DEV_IOCTL", errno);
	check_err(ioctl(ctrl, RPMSG_CREATE_DEV_IOCTL, &ch), ENXIO, "RPMSG_CREATE_DEV_IOCTL twice is ENXIO");
	check(ioctl(ctrl, RPMSG_RELEASE_DEV_IOCTL, &ch) == 0, "RPMSG_RELEASE_DEV_IOCTL", errno);
	check_err(ioctl(ctrl, RPMSG_RELEASE_DEV_IOCTL, &ch), EINVAL, "RPMSG_RELEASE_DEV_IOCTL twice is EINVAL");

	check_err(read(ctrl, &b, 1), EINVAL, "read on the control fd is EINVAL");
	check(close(ctrl) == 0, "close /dev/rpmsg_ctrl0", errno);
	printf("%s: %d failures\n", argv[0], failures);
	return failures;
}
