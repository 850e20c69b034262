/*
 * fork(2) while another thread opens and closes rpmsg fds: a Linux rpmsg
 * program that forks workers must not hang them. A thread loops opening
 * /dev/rpmsg_ctrl0, creating and destroying endpoints both ways
 * (RPMSG_CREATE_EPT_IOCTL + /dev/rpmsg0, RPMSG_CREATE_EPT_FD_IOCTL) and
 * closing the control fd; meanwhile the main thread forks FORKS children.
 * Each child, on the thread's control fd if one was open at the fork (the
 * thread is then most likely inside a request on it, and keeps using it
 * in the parent), makes and releases a local channel
 * (RPMSG_CREATE_DEV_IOCTL, no round trip to the service) and an fd
 * endpoint with one echo; then it closes the control fd it inherited from
 * the main thread, opens its own, creates an fd endpoint on "echo",
 * checks one echo byte for byte, closes both and exits. A child that has not exited within 10 s is killed and counted as
 * hung. Prints "ok ..." / "FAIL ..." lines; the exit status is the number
 * of failures.
 *
 *   rpmsg_fork [FORKS]      (default 1000)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/rpmsg.h>

#include "fd_ioctl.h"

static atomic_int stop;
/* The thread's control fd while it is open, else -1. */
static atomic_int thread_ctrl = -1;
static atomic_long cycles;
static atomic_int thread_failed;

static void fd_info(struct rpmsg_endpoint_fd_info *info)
{
	memset(info, 0, sizeof(*info));
	strcpy(info->name, "echo");
	info->src = RPMSG_ADDR_ANY;
	info->dst = RPMSG_ADDR_ANY;
	info->flags = O_RDWR | O_CLOEXEC;
}

/* The other thread: rpmsg fds opened and closed as fast as it can. */
static void *churn(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR | O_CLOEXEC);
		if (ctrl < 0) {
			perror("thread: /dev/rpmsg_ctrl0");
			atomic_store(&thread_failed, 1);
			return NULL;
		}
		atomic_store(&thread_ctrl, ctrl);
		for (int i = 0; i < 8 && !atomic_load(&stop); i++) {
			if (i % 2) {
				struct rpmsg_endpoint_fd_info info;
				fd_info(&info);
				if (ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &info) || close(info.fd)) {
					perror("thread: fd endpoint");
					atomic_store(&thread_failed, 1);
					return NULL;
				}
			} else {
				struct rpmsg_endpoint_info info;
				memset(&info, 0, sizeof(info));
				strcpy(info.name, "fork-churn");
				info.src = RPMSG_ADDR_ANY;
				info.dst = RPMSG_ADDR_ANY;
				if (ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, &info)) {
					perror("thread: RPMSG_CREATE_EPT_IOCTL");
					atomic_store(&thread_failed, 1);
					return NULL;
				}
				/* Children create no legacy endpoint: it is rpmsg0. */
				int ep = open("/dev/rpmsg0", O_RDWR | O_CLOEXEC);
				if (ep < 0 || ioctl(ep, RPMSG_DESTROY_EPT_IOCTL) || close(ep)) {
					perror("thread: /dev/rpmsg0");
					atomic_store(&thread_failed, 1);
					return NULL;
				}
			}
			atomic_fetch_add(&cycles, 1);
		}
		atomic_store(&thread_ctrl, -1);
		close(ctrl);
	}
	return NULL;
}

/* One fd endpoint on control fd `ctrl`, one echo through it. */
static int fd_echo(int ctrl, int base)
{
	struct rpmsg_endpoint_fd_info info;
	fd_info(&info);
	if (ioctl(ctrl, RPMSG_CREATE_EPT_FD_IOCTL, &info))
		return base;
	char msg[16], back[32];
	snprintf(msg, sizeof(msg), "child %d", (int)getpid());
	size_t len = strlen(msg);
	if (write(info.fd, msg, len) != (ssize_t)len)
		return base + 1;
	struct pollfd p = { .fd = info.fd, .events = POLLIN };
	if (poll(&p, 1, 5000) != 1)
		return base + 2;
	if (read(info.fd, back, sizeof(back)) != (ssize_t)len || memcmp(msg, back, len))
		return base + 3;
	if (close(info.fd))
		return base + 4;
	return 0;
}

/* A child: the thread's control fd, then its own, then out. */
static int child(int inherited)
{
	int tc = atomic_load(&thread_ctrl);
	if (tc >= 0) {
		struct rpmsg_endpoint_info ch;
		memset(&ch, 0, sizeof(ch));
		snprintf(ch.name, sizeof(ch.name), "fork-%d", (int)getpid());
		ch.src = RPMSG_ADDR_ANY;
		ch.dst = RPMSG_ADDR_ANY;
		if (ioctl(tc, RPMSG_CREATE_DEV_IOCTL, &ch))
			return 20;
		if (ioctl(tc, RPMSG_RELEASE_DEV_IOCTL, &ch))
			return 21;
		int r = fd_echo(tc, 30);
		if (r)
			return r;
	}
	if (close(inherited))
		return 10;
	int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR | O_CLOEXEC);
	if (ctrl < 0)
		return 11;
	int r = fd_echo(ctrl, 12);
	if (r)
		return r;
	if (close(ctrl))
		return 17;
	return 0;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	long forks = argc > 1 ? atol(argv[1]) : 1000;
	int failures = 0;
	int ctrl = open("/dev/rpmsg_ctrl0", O_RDWR | O_CLOEXEC);
	if (ctrl < 0) {
		printf("FAIL open /dev/rpmsg_ctrl0: %s\n", strerror(errno));
		return 100;
	}
	pthread_t t;
	if (pthread_create(&t, NULL, churn, NULL)) {
		printf("FAIL pthread_create\n");
		return 100;
	}
	long hung = 0, bad = 0, done = 0;
	for (long i = 0; i < forks && !atomic_load(&thread_failed); i++) {
		pid_t pid = fork();
		if (pid < 0) {
			printf("FAIL fork: %s\n", strerror(errno));
			failures++;
			break;
		}
		if (pid == 0)
			_exit(child(ctrl));
		int status = 0;
		double deadline = now() + 10;
		pid_t w;
		while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now() < deadline)
			usleep(200);
		if (w == 0) {
			printf("FAIL child %ld (pid %d) hung after fork\n", i, (int)pid);
			fflush(stdout);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			hung++;
			continue;
		}
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			printf("FAIL child %ld: status 0x%x\n", i, status);
			bad++;
		}
		done++;
	}
	atomic_store(&stop, 1);
	pthread_join(t, NULL);
	if (atomic_load(&thread_failed)) {
		printf("FAIL the churning thread stopped\n");
		failures++;
	}
	failures += hung + bad;
	if (hung == 0 && bad == 0 && done == forks)
		printf("ok %ld forks while another thread made %ld rpmsg cycles: no child hung\n", forks,
		       atomic_load(&cycles));
	if (close(ctrl)) {
		printf("FAIL close /dev/rpmsg_ctrl0: %s\n", strerror(errno));
		failures++;
	}
	printf("rpmsg_fork: %ld forks, %ld hung, %ld failed\n", forks, hung, bad);
	return failures > 100 ? 100 : failures;
}
