/*
 * Echo checker for Linux's rpmsg character devices, run inside the lab's
 * User-Mode Linux against a remote that echoes every message:
 *
 *   rpmsg_echo ctrl CHANNEL   an endpoint made through /dev/rpmsg_ctrl0
 *                             (RPMSG_CREATE_EPT_IOCTL) towards the address
 *                             the remote announced CHANNEL at
 *   rpmsg_echo raw CHANNEL [MTU [BACK [TIMED...]]]
 *                             the /dev/rpmsgN that rpmsg_char made by
 *                             itself for the announced CHANNEL (rpmsg-raw)
 *
 * Every payload size from 1 to MTU (default 496: 512-byte buffers less the
 * 16-byte header) goes out once, with a pattern of its own; those up to
 * BACK (default MTU: the largest the remote can send back) come back and
 * every byte of each reply is compared, those past BACK are only sent.
 * Also checked: MTU + 1 bytes are EMSGSIZE; the endpoint's destroy ioctl
 * (ctrl: removes the node, later writes are EPIPE; raw: the channel's own
 * endpoint is EINVAL). Each TIMED size is then echoed for 2 s and its
 * round trips per second printed ("rpmsg_echo raw: SIZE bytes: N round
 * trips in T s, R/s"). Prints one line per difference and a last line
 * "rpmsg_echo MODE: ok ..." or "rpmsg_echo MODE: FAILED ..."; the exit
 * status is 0 only when every check held.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/rpmsg.h>

#define WAIT_MS 20000

static const char *mode;
static int failures;
/* The largest payload Linux sends, and the largest the remote sends back. */
static int mtu = 496, back = 496;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("rpmsg_echo %s: ", mode);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	failures++;
}

static void die(const char *what)
{
	printf("rpmsg_echo %s: FAILED: %s: %s\n", mode, what, strerror(errno));
	exit(1);
}

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The first line of DIR/ENTRY/ATTR into buf, without its newline; 0 if
 * there is none. */
static int read_attr(const char *dir, const char *entry, const char *attr,
		     char *buf, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s/%s", dir, entry, attr);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	int ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = 0;
	return ok;
}

/* The entry of DIR whose "name" attribute is NAME, waiting up to WAIT_MS
 * for it to appear (name-service announcements arrive after boot). */
static int find_named(const char *dir, const char *name, char *entry, size_t len)
{
	long end = now_ms() + WAIT_MS;
	do {
		DIR *d = opendir(dir);
		struct dirent *e;
		char val[64];
		while (d && (e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			if (read_attr(dir, e->d_name, "name", val, sizeof(val)) &&
			    strcmp(val, name) == 0) {
				snprintf(entry, len, "%s", e->d_name);
				closedir(d);
				return 1;
			}
		}
		if (d)
			closedir(d);
		usleep(50000);
	} while (now_ms() < end);
	return 0;
}

static unsigned char pattern(int size, int i)
{
	return (unsigned char)(i * 131 + size * 7 + 1);
}

/* One message of each size, each reply up to `back` bytes compared byte
 * for byte, larger ones only sent. Returns the bytes echoed intact. */
static long echo_all(int fd)
{
	unsigned char *out = malloc(mtu + 16), *in = malloc(mtu + 16);
	long bytes = 0;
	for (int size = 1; size <= mtu; size++) {
		for (int i = 0; i < size; i++)
			out[i] = pattern(size, i);
		ssize_t w = write(fd, out, size);
		if (w != size) {
			fail("size %d: write returned %zd (%s)", size, w,
			     w < 0 ? strerror(errno) : "short");
			continue;
		}
		if (size > back)
			continue;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = poll(&p, 1, WAIT_MS);
		if (r != 1) {
			fail("size %d: no reply within %d ms (poll %d, revents 0x%x)", size,
			     WAIT_MS, r, p.revents);
			return bytes;
		}
		memset(in, 0, mtu + 16);
		ssize_t n = read(fd, in, mtu + 16);
		if (n != size) {
			fail("size %d: reply of %zd bytes (%s)", size, n,
			     n < 0 ? strerror(errno) : "wrong length");
			continue;
		}
		int bad = 0, first = -1;
		for (int i = 0; i < size; i++) {
			if (in[i] != out[i]) {
				if (first < 0)
					first = i;
				bad++;
			}
		}
		if (bad) {
			fail("size %d: %d bytes differ, first at offset %d: sent 0x%02x, got 0x%02x",
			     size, bad, first, out[first], in[first]);
			continue;
		}
		bytes += size;
	}
	free(out);
	free(in);
	return bytes;
}

/* SIZE-byte round trips for 2 s; prints their rate. */
static void time_round_trips(int fd, int size)
{
	unsigned char *out = malloc(size), *in = malloc(size + 16);
	memset(out, 0x5a, size);
	long n = 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	double secs = 0;
	while (secs < 2.0) {
		if (write(fd, out, size) != size) {
			fail("timed size %d: write: %s", size, strerror(errno));
			break;
		}
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, WAIT_MS) != 1 || read(fd, in, size + 16) != size) {
			fail("timed size %d: no reply of %d bytes", size, size);
			break;
		}
		n++;
		clock_gettime(CLOCK_MONOTONIC, &t);
		secs = (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
	}
	printf("rpmsg_echo %s: %d bytes: %ld round trips in %.3f s, %.0f/s\n", mode, size, n, secs,
	       n / secs);
	free(out);
	free(in);
}

/* A payload past the buffer is refused by virtio_rpmsg_bus. */
static void check_too_big(int fd)
{
	size_t len = (size_t)mtu + 1;
	unsigned char *big = malloc(len);
	memset(big, 0x5a, len);
	ssize_t w = write(fd, big, len);
	if (w != -1 || errno != EMSGSIZE)
		fail("write of %zu bytes returned %zd (%s), want EMSGSIZE", len, w,
		     w < 0 ? strerror(errno) : "accepted");
	free(big);
}

static void report(const char *node, long bytes, const char *how)
{
	long want = (long)back * (back + 1) / 2;
	if (bytes != want)
		fail("%ld of %ld bytes echoed intact", bytes, want);
	if (failures) {
		printf("rpmsg_echo %s: FAILED: %d checks failed through %s\n", mode, failures, node);
		exit(1);
	}
	char sent[80] = "";
	if (back < mtu)
		snprintf(sent, sizeof(sent), ", sizes %d..%d sent one way", back + 1, mtu);
	printf("rpmsg_echo %s: ok: sizes 1..%d, %ld bytes echoed byte-exact%s, %d bytes EMSGSIZE, through %s (%s)\n",
	       mode, back, bytes, sent, mtu + 1, node, how);
}

/* The announced channel's remote address, from its rpmsg device. */
static unsigned long channel_addr(const char *channel, char *dev, size_t len)
{
	char val[64];
	if (!find_named("/sys/bus/rpmsg/devices", channel, dev, len)) {
		errno = ENOENT;
		die("channel not in /sys/bus/rpmsg/devices");
	}
	if (!read_attr("/sys/bus/rpmsg/devices", dev, "dst", val, sizeof(val)))
		die("dst of the channel");
	return strtoul(val, NULL, 0);
}

static int run_ctrl(const char *channel)
{
	char dev[256], ept[64], node[128];
	unsigned long dst = channel_addr(channel, dev, sizeof(dev));

	int ctrl = -1;
	for (long end = now_ms() + WAIT_MS; ctrl < 0; usleep(50000)) {
		ctrl = open("/dev/rpmsg_ctrl0", O_RDWR | O_CLOEXEC);
		if (ctrl < 0 && now_ms() > end)
			die("open /dev/rpmsg_ctrl0");
	}
	struct rpmsg_endpoint_info info;
	memset(&info, 0, sizeof(info));
	snprintf(info.name, sizeof(info.name), "iopath-check-%d", getpid());
	info.src = RPMSG_ADDR_ANY;
	info.dst = (__u32)dst;
	if (ioctl(ctrl, RPMSG_CREATE_EPT_IOCTL, &info) < 0)
		die("RPMSG_CREATE_EPT_IOCTL");
	if (!find_named("/sys/class/rpmsg", info.name, ept, sizeof(ept))) {
		errno = ENOENT;
		die("the new endpoint in /sys/class/rpmsg");
	}
	char val[64];
	if (!read_attr("/sys/class/rpmsg", ept, "dst", val, sizeof(val)) ||
	    strtoul(val, NULL, 0) != dst)
		fail("%s: dst %s, want %lu", ept, val, dst);
	snprintf(node, sizeof(node), "/dev/%s", ept);
	int fd = open(node, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		die(node);
	/* One open at a time: rpmsg_char refuses a second. */
	int again = open(node, O_RDWR | O_CLOEXEC);
	if (again >= 0 || errno != EBUSY)
		fail("second open of %s: %d (%s), want EBUSY", node, again,
		     again < 0 ? strerror(errno) : "opened");

	long bytes = echo_all(fd);
	check_too_big(fd);

	if (ioctl(fd, RPMSG_DESTROY_EPT_IOCTL) < 0)
		fail("RPMSG_DESTROY_EPT_IOCTL: %s", strerror(errno));
	struct stat st;
	if (stat(node, &st) == 0 || errno != ENOENT)
		fail("%s still there after RPMSG_DESTROY_EPT_IOCTL", node);
	if (write(fd, "x", 1) != -1 || errno != EPIPE)
		fail("write after destroy: want EPIPE, got %s", strerror(errno));
	close(fd);
	close(ctrl);
	char how[160];
	snprintf(how, sizeof(how), "channel %s at 0x%lx", channel, dst);
	report(node, bytes, how);
	return 0;
}

static int run_raw(const char *channel, char **timed, int ntimed)
{
	char dev[256], ept[64], node[128], drv[256], link[512];
	unsigned long dst = channel_addr(channel, dev, sizeof(dev));

	/* rpmsg_char bound the channel itself. */
	snprintf(link, sizeof(link), "/sys/bus/rpmsg/devices/%s/driver", dev);
	ssize_t n = readlink(link, drv, sizeof(drv) - 1);
	drv[n > 0 ? n : 0] = 0;
	if (n <= 0 || strcmp(strrchr(drv, '/') ? strrchr(drv, '/') + 1 : drv, "rpmsg_chrdev"))
		fail("%s: driver %s, want rpmsg_chrdev", dev, n > 0 ? drv : "none");
	if (!find_named("/sys/class/rpmsg", channel, ept, sizeof(ept))) {
		errno = ENOENT;
		die("the channel's node in /sys/class/rpmsg");
	}
	snprintf(node, sizeof(node), "/dev/%s", ept);
	int fd = -1;
	for (long end = now_ms() + WAIT_MS; fd < 0; usleep(50000)) {
		fd = open(node, O_RDWR | O_CLOEXEC);
		if (fd < 0 && now_ms() > end)
			die(node);
	}
	long bytes = echo_all(fd);
	check_too_big(fd);
	for (int i = 0; i < ntimed; i++)
		time_round_trips(fd, atoi(timed[i]));
	/* The channel's own endpoint outlives its node's users. */
	if (ioctl(fd, RPMSG_DESTROY_EPT_IOCTL) != -1 || errno != EINVAL)
		fail("RPMSG_DESTROY_EPT_IOCTL on the channel's endpoint: want EINVAL, got %s",
		     strerror(errno));
	close(fd);
	char how[160];
	snprintf(how, sizeof(how), "channel %s at 0x%lx, bound by rpmsg_chrdev", channel, dst);
	report(node, bytes, how);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 3 || (strcmp(argv[1], "ctrl") && strcmp(argv[1], "raw")) ||
	    (argc > 3 && strcmp(argv[1], "raw"))) {
		fprintf(stderr, "usage: rpmsg_echo ctrl CHANNEL | raw CHANNEL [MTU [BACK [TIMED...]]]\n");
		return 2;
	}
	mode = argv[1];
	if (argc > 3)
		mtu = back = atoi(argv[3]);
	if (argc > 4)
		back = atoi(argv[4]);
	if (mtu < 1 || mtu > 65520 || back < 1 || back > mtu) {
		fprintf(stderr, "rpmsg_echo: MTU 1..65520, BACK 1..MTU\n");
		return 2;
	}
	return strcmp(mode, "ctrl") == 0 ? run_ctrl(argv[2])
					 : run_raw(argv[2], argv + 5, argc > 5 ? argc - 5 : 0);
}
