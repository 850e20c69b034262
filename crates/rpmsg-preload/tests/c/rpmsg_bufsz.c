/*
 * A Linux rpmsg program on a bus whose buffers were negotiated larger than
 * 512 bytes: `rpmsg_bufsz MAX` makes an fd endpoint on the channel "echo"
 * (whose remote echoes) and a legacy one, writes MAX bytes on each and
 * reads them back byte for byte, then finds MAX + 1 bytes refused with
 * EMSGSIZE, as rpmsg_send_offchannel_raw refuses what exceeds the tx
 * buffer. Prints "ok <what>" or "FAIL <what>: ..."; the exit status is the
 * number of failures.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/rpmsg.h>

#include "fd_ioctl.h"

#include "check.h"

/* MAX bytes out and back, byte for byte; MAX + 1 is EMSGSIZE. */
static void at_the_limit(int fd, size_t max, const char *way)
{
	unsigned char *msg = malloc(max + 1), *back = malloc(max + 64);
	char what[96];
	size_t i;
	for (i = 0; i <= max; i++)
		msg[i] = (unsigned char)(i * 7 + i / 251);
	snprintf(what, sizeof(what), "%s: write %zu bytes", way, max);
	check(write(fd, msg, max) == (ssize_t)max, what, errno);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	check(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN), "echo readable", errno);
	memset(back, 0xee, max + 64);
	ssize_t r = read(fd, back, max + 64);
	snprintf(what, sizeof(what), "%s: %zu bytes echoed byte for byte", way, max);
	check(r == (ssize_t)max && memcmp(msg, back, max) == 0, what, errno);
	errno = 0;
	ssize_t w = write(fd, msg, max + 1);
	snprintf(what, sizeof(what), "%s: write %zu bytes is EMSGSIZE", way, max + 1);
	check(w == -1 && errno == EMSGSIZE, what, errno);
	free(msg);
	free(back);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: rpmsg_bufsz MAX_PAYLOAD\n");
		return 2;
	}
	size_t max = strtoul(argv[1], NULL, 0);
	int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR);
	check(ctrl >= 0, "open /dev/rpmsg_ctrl0", errno);
	if (ctrl < 0)
		return failures;

	struct rpmsg_endpoint_fd_info fdinfo;
	memset(&fdinfo, 0, sizeof(fdinfo));
	strcpy(fdinfo.name, "echo");
	fdinfo.src = RPMSG_ADDR_ANY;
	fdinfo.dst = RPMSG_ADDR_ANY;
	fdinfo.flags = O_RDWR | O_CLOEXEC;
	fdinfo.fd = -1;
	check(ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &fdinfo) == 0 && fdinfo.fd >= 0,
	      "RPMSG_CREATE_EPT_FD_IOCTL", errno);
	if (fdinfo.fd >= 0) {
		at_the_limit(fdinfo.fd, max, "fd");
		close(fdinfo.fd);
	}

	struct rpmsg_endpoint_info info;
	memset(&info, 0, sizeof(info));
	strcpy(info.name, "echo");
	info.src = RPMSG_ADDR_ANY;
	info.dst = RPMSG_ADDR_ANY;
	check(ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, &info) == 0, "RPMSG_CREATE_EPT_IOCTL", errno);
	int ep = open("/dev/rpmsg0", O_RDWR);
	check(ep >= 0, "legacy: open /dev/rpmsg0", errno);
	if (ep >= 0) {
		at_the_limit(ep, max, "legacy");
		check(ioctl(ep, RPMSG_DESTROY_EPT_IOCTL) == 0, "legacy: destroy", errno);
		close(ep);
	}
	close(ctrl);
	return failures;
}
