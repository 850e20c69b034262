/*
 * The create+destroy experiment of the RPMSG_CREATE_EPT_FD_IOCTL series,
 * written against the Linux uAPI only: LOOPS cycles of
 *
 *   legacy: RPMSG_CREATE_EPT_IOCTL, open the node, RPMSG_DESTROY_EPT_IOCTL, close
 *   fd:     RPMSG_CREATE_EPT_FD_IOCTL, close
 *
 * after 100 cycles of warm-up. Prints one line:
 *   mode=MODE loops=N total_us=T per_cycle_us=P [create_us= open_us= destroy_us= close_us=]
 * the legacy steps' means (each step timed alone) in the brackets.
 * crates/rpmsg-preload/examples/rpmsg_cycles.rs is the same experiment
 * through iopath's client library, with the same output.
 *
 *   rpmsg_cycles legacy|fd LOOPS [NODE]    (NODE: default /dev/rpmsg0, the
 *                                           lowest free number on an idle bus)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include <linux/rpmsg.h>

#include "fd_ioctl.h"

static void die(const char *what)
{
	fprintf(stderr, "rpmsg_cycles: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Time spent in each legacy step, summed. */
static double steps[4];

static void legacy(int ctrl, const char *node)
{
	struct rpmsg_endpoint_info info;
	memset(&info, 0, sizeof(info));
	strcpy(info.name, "echo");
	info.src = RPMSG_ADDR_ANY;
	info.dst = RPMSG_ADDR_ANY;
	double a = now_us();
	if (ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, &info))
		die("RPMSG_CREATE_EPT_IOCTL");
	double b = now_us();
	int ep = open(node, O_RDWR | O_CLOEXEC);
	if (ep < 0)
		die(node);
	double c = now_us();
	if (ioctl(ep, RPMSG_DESTROY_EPT_IOCTL))
		die("RPMSG_DESTROY_EPT_IOCTL");
	double d = now_us();
	if (close(ep))
		die("close");
	double e = now_us();
	steps[0] += b - a;
	steps[1] += c - b;
	steps[2] += d - c;
	steps[3] += e - d;
}

static void fdway(int ctrl)
{
	struct rpmsg_endpoint_fd_info info;
	memset(&info, 0, sizeof(info));
	strcpy(info.name, "echo");
	info.src = RPMSG_ADDR_ANY;
	info.dst = RPMSG_ADDR_ANY;
	info.flags = O_RDWR | O_CLOEXEC;
	if (ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &info))
		die("RPMSG_CREATE_EPT_FD_IOCTL");
	if (close(info.fd))
		die("close");
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: rpmsg_cycles legacy|fd LOOPS [NODE]\n");
		return 2;
	}
	int is_fd = strcmp(argv[1], "fd") == 0;
	if (!is_fd && strcmp(argv[1], "legacy") != 0) {
		fprintf(stderr, "rpmsg_cycles: mode %s: legacy or fd\n", argv[1]);
		return 2;
	}
	long loops = atol(argv[2]);
	const char *node = argc > 3 ? argv[3] : "/dev/rpmsg0";
	int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR | O_CLOEXEC);
	if (ctrl < 0)
		die("/dev/rpmsg_ctrl0");
	for (int i = 0; i < 100; i++)
		is_fd ? fdway(ctrl) : legacy(ctrl, node);
	memset(steps, 0, sizeof(steps));
	double a = now_us();
	for (long i = 0; i < loops; i++)
		is_fd ? fdway(ctrl) : legacy(ctrl, node);
	double us = now_us() - a;
	printf("mode=%s loops=%ld total_us=%.0f per_cycle_us=%.2f", argv[1], loops, us,
	       us / (double)loops);
	if (!is_fd)
		printf(" create_us=%.2f open_us=%.2f destroy_us=%.2f close_us=%.2f", steps[0] / loops,
		       steps[1] / loops, steps[2] / loops, steps[3] / loops);
	printf("\n");
	close(ctrl);
	return 0;
}
