/*
 * rpmsg-ping-timed: a strict ping-pong driver on OpenAMP's API, timed.
 *
 * iopath's own program (not part of OpenAMP), built by scripts/openamp-demo
 * against OpenAMP's library and the Linux platform layer of its echo demo
 * (platform_info.c: the demo's shared memory /dev/shm/openamp.shm and its
 * unix-socket notifications on /tmp/openamp.event.0, this side connecting).
 * It plays the virtio driver as the demo's rpmsg-echo-ping does, against
 * any remote that announces "rpmsg-openamp-demo-channel" and echoes
 * (OpenAMP's rpmsg-echo, `iopath rpmsg remote`):
 *
 *   rpmsg-ping-timed [-n COUNT] [-w WARM] [-s SIZE] [-t SECONDS]
 *
 * creates the endpoint, waits for the remote's name service to bind it,
 * makes WARM unmeasured round trips, then COUNT measured ones (or as many
 * as fit in SECONDS): send SIZE bytes, spin in platform_poll() until the
 * echo is back, check it byte for byte. Nothing is printed in the loop.
 * Then it destroys the endpoint (name-service DESTROY, which ends the
 * demo's echo) and prints one JSON line on stdout:
 *
 *   {"driver":"openamp","size":16,"warm":200,"count":N,"total_ns":T,
 *    "p50_ns":..,"p99_ns":..,"max_ns":..,"errors":0,"complete":true}
 *
 * (count: measured round trips done; complete: all COUNT done within
 * SECONDS). Exit status 0 when every echo came back right, 1 otherwise.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <metal/alloc.h>
#include <openamp/open_amp.h>

#include "platform_info.h"

#define SERVICE "rpmsg-openamp-demo-channel"
/* The rpmsg header before each payload (16 bytes, as on Linux). */
#define HDR_SIZE 16

static struct rpmsg_endpoint ept;
static unsigned char echo_buf[RPMSG_BUFFER_SIZE];
static size_t echo_len;
static volatile uint64_t echoes; /* messages the callback took */
static volatile int unbound;

static int on_message(struct rpmsg_endpoint *e, void *data, size_t len,
		      uint32_t src, void *priv)
{
	(void)e;
	(void)src;
	(void)priv;
	if (len > sizeof(echo_buf))
		len = sizeof(echo_buf);
	memcpy(echo_buf, data, len);
	echo_len = len;
	echoes++;
	return RPMSG_SUCCESS;
}

static void on_unbind(struct rpmsg_endpoint *e)
{
	(void)e;
	unbound = 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Nearest rank, as iopath-bench's percentile(). */
static uint64_t pct(const uint64_t *sorted, uint64_t n, double p)
{
	uint64_t i;

	if (!n)
		return 0;
	i = (uint64_t)((double)(n - 1) * p + 0.5);
	return sorted[i < n ? i : n - 1];
}

static void usage(void)
{
	fprintf(stderr, "usage: rpmsg-ping-timed [-n COUNT] [-w WARM] "
		"[-s SIZE 8..%d] [-t SECONDS]\n",
		RPMSG_BUFFER_SIZE - HDR_SIZE);
	exit(2);
}

/* One round trip of `size` bytes numbered `seq`; 0 when the echo is right. */
static int round_trip(void *platform, unsigned char *msg, size_t size,
		      uint64_t seq, uint64_t deadline)
{
	uint64_t want = echoes + 1;

	memcpy(msg, &seq, sizeof(seq));
	if (rpmsg_send(&ept, msg, (int)size) < 0)
		return -1;
	while (echoes < want && !unbound) {
		platform_poll(platform);
		if (echoes < want && now_ns() > deadline)
			return -1;
	}
	if (echoes != want || echo_len != size || memcmp(echo_buf, msg, size))
		return -1;
	return 0;
}

int main(int argc, char *argv[])
{
	uint64_t count = 10000, warm = 200, seconds = 60, done = 0, errors = 0;
	uint64_t i, t0, total, deadline, *lat;
	size_t size = 16, max = RPMSG_BUFFER_SIZE - HDR_SIZE;
	char *plat_argv[] = { argv[0], "1", NULL }; /* 1: the demo's driver side */
	struct rpmsg_device *rdev;
	unsigned char *msg;
	void *platform;
	int opt, ret = 1;

	while ((opt = getopt(argc, argv, "n:w:s:t:")) != -1) {
		char *end;
		unsigned long long v;

		errno = 0;
		v = strtoull(optarg, &end, 0);
		if (errno || *end || end == optarg)
			usage();
		switch (opt) {
		case 'n': count = v; break;
		case 'w': warm = v; break;
		case 's': size = (size_t)v; break;
		case 't': seconds = v; break;
		default: usage();
		}
	}
	if (optind != argc || !count || size < sizeof(uint64_t) || size > max ||
	    !seconds)
		usage();
	lat = calloc(count, sizeof(*lat));
	msg = calloc(1, size);
	if (!lat || !msg) {
		fprintf(stderr, "rpmsg-ping-timed: out of memory\n");
		return 1;
	}
	for (i = sizeof(uint64_t); i < size; i++)
		msg[i] = (unsigned char)(0xA5 ^ i);
	/* Whatever hangs (a remote that never announces) ends here. */
	alarm((unsigned int)(seconds + 60));

	if (platform_init(2, plat_argv, &platform)) {
		fprintf(stderr, "rpmsg-ping-timed: platform_init failed\n");
		return 1;
	}
	rdev = platform_create_rpmsg_vdev(platform, 0, VIRTIO_DEV_DRIVER,
					  NULL, NULL);
	if (!rdev) {
		fprintf(stderr, "rpmsg-ping-timed: no rpmsg virtio device\n");
		goto out;
	}
	if (rpmsg_create_ept(&ept, rdev, SERVICE, RPMSG_ADDR_ANY,
			     RPMSG_ADDR_ANY, on_message, on_unbind)) {
		fprintf(stderr, "rpmsg-ping-timed: rpmsg_create_ept failed\n");
		goto release;
	}
	if (rpmsg_get_tx_buffer_size(&ept) < (int)size) {
		fprintf(stderr, "rpmsg-ping-timed: buffers hold %d bytes, "
			"not %zu\n", rpmsg_get_tx_buffer_size(&ept), size);
		goto destroy;
	}
	/* The remote's name service binds the endpoint to its address. */
	while (!is_rpmsg_ept_ready(&ept))
		platform_poll(platform);

	deadline = now_ns() + 30 * 1000000000ull;
	for (i = 0; i < warm; i++)
		if (round_trip(platform, msg, size, i, deadline)) {
			fprintf(stderr, "rpmsg-ping-timed: warm-up echo %" PRIu64
				" failed\n", i);
			goto destroy;
		}
	t0 = now_ns();
	deadline = t0 + seconds * 1000000000ull;
	while (done < count && now_ns() < deadline) {
		uint64_t t = now_ns();

		if (round_trip(platform, msg, size, warm + done, deadline)) {
			errors++;
			break;
		}
		lat[done++] = now_ns() - t;
	}
	total = now_ns() - t0;
	ret = errors ? 1 : 0;
	qsort(lat, done, sizeof(*lat), cmp_u64);
	printf("{\"driver\":\"openamp\",\"size\":%zu,\"warm\":%" PRIu64
	       ",\"count\":%" PRIu64 ",\"total_ns\":%" PRIu64
	       ",\"p50_ns\":%" PRIu64 ",\"p99_ns\":%" PRIu64
	       ",\"max_ns\":%" PRIu64 ",\"errors\":%" PRIu64
	       ",\"complete\":%s}\n",
	       size, warm, done, total, pct(lat, done, 0.5),
	       pct(lat, done, 0.99), done ? lat[done - 1] : 0, errors,
	       done == count ? "true" : "false");
	fflush(stdout);
destroy:
	rpmsg_destroy_ept(&ept);
release:
	platform_release_rpmsg_vdev(rdev, platform);
out:
	platform_cleanup(platform);
	free(lat);
	free(msg);
	return ret;
}
