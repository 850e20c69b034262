/*
 * iopath-pattern: writes or checks the guest-dd data pattern, and runs
 * guest-dd's 4 KiB random I/O.
 *
 * The pattern over a device range [OFFSET, OFFSET+SIZE): the 8-byte
 * little-endian word at device byte offset o (o a multiple of 8) holds
 * o XOR SEED. OFFSET and SIZE must be multiples of 8. Any host can check an
 * image with a few lines of code: read u64 LE at o, compare with o ^ SEED.
 *
 *   iopath-pattern gen   OFFSET SIZE SEED   > out    (writes SIZE bytes)
 *   iopath-pattern check OFFSET SIZE SEED   < in     (exit 0 iff all match)
 *   iopath-pattern rand  DEVICE OFFSET SIZE SEED COUNT THREADS BS
 *
 * rand opens DEVICE (a block device or a file) with O_DIRECT and, over
 * [OFFSET, OFFSET+SIZE) cut into BS-byte blocks:
 *   1. fill:   writes the pattern over the whole range (1 MiB writes);
 *   2. read:   COUNT reads of random blocks, THREADS threads each with one
 *              read in flight (queue depth THREADS); every block read is
 *              compared with the pattern;
 *   3. write:  COUNT writes of random blocks, as the reads; a written block
 *              holds the complement pattern, ~(o XOR SEED), so a write that
 *              lands nowhere or at the wrong offset shows in step 4;
 *   4. verify: reads the range back: each block holds the complement iff
 *              step 3 wrote it, the pattern otherwise.
 * One line per step on stdout ("rand read ios=... iops=... p50_us=...");
 * latency is clock_gettime(CLOCK_MONOTONIC) around each pread/pwrite.
 * Random blocks come from a xorshift generator seeded by SEED and the
 * thread, so a run is repeatable. Exit 0 iff every check passed.
 *
 * Numbers accept C prefixes (0x...). Built static by scripts/guest-dd
 * --prepare so it runs in the guest's busybox initramfs; written in C
 * because a busybox awk/printf loop is far too slow for MiBs.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (1u << 20)

static uint64_t parse(const char *what, const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *s == '\0' || *end != '\0') {
		fprintf(stderr, "iopath-pattern: bad %s: %s\n", what, s);
		exit(2);
	}
	return v;
}

static void fill(unsigned char *buf, uint64_t off, size_t len, uint64_t seed)
{
	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = (off + i) ^ seed;
		for (int b = 0; b < 8; b++)
			buf[i + b] = (unsigned char)(v >> (8 * b));
	}
}

/* ------------------------------------------------------------ rand */

struct rand_run {
	int fd;
	uint64_t off, size, seed, bs, count, nblocks;
	unsigned threads;
	int write;               /* this phase writes (else reads) */
	uint64_t *lat_ns;        /* one per I/O */
	unsigned char *written;  /* one per block: step 3 wrote it */
	uint64_t bad;            /* blocks that differ (atomic) */
	uint64_t failed;         /* I/Os that returned an error (atomic) */
};

struct rand_thread {
	struct rand_run *run;
	unsigned id;
	uint64_t first, n;       /* its slice of lat_ns */
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *aligned(size_t len)
{
	void *p;
	if (posix_memalign(&p, 4096, len)) {
		fprintf(stderr, "iopath-pattern: out of memory (%zu bytes)\n", len);
		exit(1);
	}
	return p;
}

/* splitmix64, to spread the seeds of the per-thread xorshift generators */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15u;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
	return x ^ (x >> 31);
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1du;
}

/* Reads or writes all of buf at device offset o; 0 or an errno. */
static int io_full(int fd, int write, unsigned char *buf, size_t len, uint64_t o)
{
	size_t done = 0;
	while (done < len) {
		ssize_t n = write ? pwrite(fd, buf + done, len - done, (off_t)(o + done))
				  : pread(fd, buf + done, len - done, (off_t)(o + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		if (n == 0)
			return EIO;
		done += (size_t)n;
	}
	return 0;
}

static void report_block(const char *what, uint64_t o, const unsigned char *got, uint64_t want)
{
	uint64_t g = 0;
	for (int b = 7; b >= 0; b--)
		g = (g << 8) | got[b];
	fprintf(stderr, "iopath-pattern: %s: block at device offset %llu: first word 0x%016llx, want 0x%016llx\n",
		what, (unsigned long long)o, (unsigned long long)g, (unsigned long long)want);
}

static void *rand_worker(void *arg)
{
	struct rand_thread *t = arg;
	struct rand_run *r = t->run;
	unsigned char *buf = aligned(r->bs), *want = r->write ? NULL : malloc(r->bs);
	uint64_t rng = mix(r->seed ^ ((uint64_t)(r->write + 1) << 56) ^ t->id) | 1;
	for (uint64_t i = 0; i < t->n; i++) {
		uint64_t blk = xorshift(&rng) % r->nblocks;
		uint64_t o = r->off + blk * r->bs;
		if (r->write)
			fill(buf, o, r->bs, ~r->seed);
		uint64_t t0 = now_ns();
		int err = io_full(r->fd, r->write, buf, r->bs, o);
		r->lat_ns[t->first + i] = now_ns() - t0;
		if (err) {
			if (__atomic_fetch_add(&r->failed, 1, __ATOMIC_RELAXED) == 0)
				fprintf(stderr, "iopath-pattern: %s of %llu bytes at device offset %llu: %s\n",
					r->write ? "pwrite" : "pread", (unsigned long long)r->bs,
					(unsigned long long)o, strerror(err));
			continue;
		}
		if (r->write) {
			__atomic_store_n(&r->written[blk], 1, __ATOMIC_RELAXED);
		} else {
			fill(want, o, r->bs, r->seed);
			if (memcmp(buf, want, r->bs) &&
			    __atomic_fetch_add(&r->bad, 1, __ATOMIC_RELAXED) == 0)
				report_block("random read differs from the pattern", o, buf, o ^ r->seed);
		}
	}
	free(buf);
	free(want);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* nearest-rank percentile of sorted v[0..n) in microseconds */
static double pct_us(const uint64_t *v, uint64_t n, unsigned p)
{
	uint64_t rank = (n * p + 99) / 100;
	return v[rank ? rank - 1 : 0] / 1000.0;
}

/* Step 2 or 3: COUNT random I/Os on THREADS threads; prints its line. */
static int rand_phase(struct rand_run *r, int write)
{
	r->write = write;
	r->bad = r->failed = 0;
	pthread_t tid[r->threads];
	struct rand_thread th[r->threads];
	uint64_t first = 0;
	uint64_t t0 = now_ns();
	for (unsigned i = 0; i < r->threads; i++) {
		uint64_t n = r->count / r->threads + (i < r->count % r->threads);
		th[i] = (struct rand_thread){ .run = r, .id = i, .first = first, .n = n };
		first += n;
		if (pthread_create(&tid[i], NULL, rand_worker, &th[i])) {
			fprintf(stderr, "iopath-pattern: cannot start thread %u\n", i);
			exit(1);
		}
	}
	for (unsigned i = 0; i < r->threads; i++)
		pthread_join(tid[i], NULL);
	double secs = (now_ns() - t0) / 1e9;
	qsort(r->lat_ns, r->count, sizeof(uint64_t), cmp_u64);
	printf("rand %s ios=%llu bs=%llu threads=%u seconds=%.6f iops=%.1f p50_us=%.1f p99_us=%.1f",
	       write ? "write" : "read", (unsigned long long)r->count,
	       (unsigned long long)r->bs, r->threads, secs, r->count / secs,
	       pct_us(r->lat_ns, r->count, 50), pct_us(r->lat_ns, r->count, 99));
	if (write) {
		uint64_t distinct = 0;
		for (uint64_t b = 0; b < r->nblocks; b++)
			distinct += r->written[b];
		printf(" distinct_blocks=%llu\n", (unsigned long long)distinct);
	} else {
		printf(" verified_bytes=%llu\n",
		       (unsigned long long)((r->count - r->failed - r->bad) * r->bs));
	}
	fflush(stdout);
	if (r->failed)
		fprintf(stderr, "iopath-pattern: %llu of %llu random %ss failed\n",
			(unsigned long long)r->failed, (unsigned long long)r->count,
			write ? "write" : "read");
	if (r->bad)
		fprintf(stderr, "iopath-pattern: %llu of %llu random reads differ from the pattern\n",
			(unsigned long long)r->bad, (unsigned long long)r->count);
	return r->failed || r->bad;
}

/* Step 1 (write = 1) or 4: the whole range in 1 MiB requests. */
static int rand_sweep(struct rand_run *r, int write)
{
	size_t chunk = CHUNK - CHUNK % r->bs;
	if (chunk == 0)
		chunk = r->bs;
	unsigned char *buf = aligned(chunk), *want = malloc(r->bs);
	uint64_t t0 = now_ns(), seed_blocks = 0, bad = 0;
	for (uint64_t done = 0; done < r->size;) {
		size_t len = r->size - done < chunk ? (size_t)(r->size - done) : chunk;
		uint64_t o = r->off + done;
		if (write)
			fill(buf, o, len, r->seed);
		int err = io_full(r->fd, write, buf, len, o);
		if (err) {
			fprintf(stderr, "iopath-pattern: %s of %zu bytes at device offset %llu: %s\n",
				write ? "pwrite" : "pread", len, (unsigned long long)o, strerror(err));
			return 1;
		}
		for (size_t i = 0; !write && i < len; i += r->bs) {
			uint64_t bo = o + i, blk = (done + i) / r->bs;
			uint64_t seed = r->written[blk] ? ~r->seed : r->seed;
			seed_blocks += !r->written[blk];
			fill(want, bo, r->bs, seed);
			if (memcmp(buf + i, want, r->bs) && bad++ == 0)
				report_block(r->written[blk] ? "a randomly written block lacks the complement pattern"
							     : "a block holds something but the pattern",
					     bo, buf + i, bo ^ seed);
		}
		done += len;
	}
	double secs = (now_ns() - t0) / 1e9;
	if (write)
		printf("rand fill bytes=%llu seconds=%.6f\n", (unsigned long long)r->size, secs);
	else
		printf("rand verify blocks=%llu pattern_blocks=%llu written_blocks=%llu bad_blocks=%llu\n",
		       (unsigned long long)r->nblocks, (unsigned long long)seed_blocks,
		       (unsigned long long)(r->nblocks - seed_blocks), (unsigned long long)bad);
	fflush(stdout);
	free(buf);
	free(want);
	return bad != 0;
}

static int rand_main(char **argv)
{
	struct rand_run r = { 0 };
	const char *dev = argv[2];
	r.off = parse("offset", argv[3]);
	r.size = parse("size", argv[4]);
	r.seed = parse("seed", argv[5]);
	r.count = parse("count", argv[6]);
	uint64_t threads = parse("threads", argv[7]);
	r.bs = parse("block size", argv[8]);
	if (r.bs == 0 || r.bs % 4096 || r.bs > (64u << 20)) {
		fprintf(stderr, "iopath-pattern: block size must be a multiple of 4096 up to 64 MiB\n");
		return 2;
	}
	if (r.off % 4096 || r.size == 0 || r.size % r.bs) {
		fprintf(stderr, "iopath-pattern: offset must be a multiple of 4096 and size a positive multiple of the block size\n");
		return 2;
	}
	if (r.count == 0 || r.count > (1u << 24)) {
		fprintf(stderr, "iopath-pattern: count must be 1 to %u\n", 1u << 24);
		return 2;
	}
	if (threads == 0 || threads > 64) {
		fprintf(stderr, "iopath-pattern: threads must be 1 to 64\n");
		return 2;
	}
	r.threads = (unsigned)threads;
	r.nblocks = r.size / r.bs;
	r.fd = open(dev, O_RDWR | O_DIRECT);
	if (r.fd < 0) {
		fprintf(stderr, "iopath-pattern: open %s with O_DIRECT: %s\n", dev, strerror(errno));
		return 1;
	}
	r.lat_ns = calloc(r.count, sizeof(uint64_t));
	r.written = calloc(r.nblocks, 1);
	if (!r.lat_ns || !r.written) {
		fprintf(stderr, "iopath-pattern: out of memory\n");
		return 1;
	}
	if (rand_sweep(&r, 1) || rand_phase(&r, 0) || rand_phase(&r, 1))
		return 1;
	if (fsync(r.fd)) {
		fprintf(stderr, "iopath-pattern: fsync %s: %s\n", dev, strerror(errno));
		return 1;
	}
	return rand_sweep(&r, 0);
}

int main(int argc, char **argv)
{
	if (argc == 9 && strcmp(argv[1], "rand") == 0)
		return rand_main(argv);
	if (argc != 5 || (strcmp(argv[1], "gen") && strcmp(argv[1], "check"))) {
		fprintf(stderr, "usage: iopath-pattern gen|check OFFSET SIZE SEED\n"
				"       iopath-pattern rand DEVICE OFFSET SIZE SEED COUNT THREADS BS\n");
		return 2;
	}
	uint64_t off = parse("offset", argv[2]);
	uint64_t size = parse("size", argv[3]);
	uint64_t seed = parse("seed", argv[4]);
	if (off % 8 || size % 8) {
		fprintf(stderr, "iopath-pattern: offset and size must be multiples of 8\n");
		return 2;
	}
	static unsigned char want[CHUNK], got[CHUNK];
	int gen = strcmp(argv[1], "gen") == 0;
	uint64_t done = 0, bad = 0;
	while (done < size) {
		size_t len = size - done < CHUNK ? (size_t)(size - done) : CHUNK;
		fill(want, off + done, len, seed);
		if (gen) {
			for (size_t w = 0; w < len;) {
				ssize_t n = write(1, want + w, len - w);
				if (n < 0 && errno == EINTR)
					continue;
				if (n <= 0) {
					perror("iopath-pattern: write");
					return 1;
				}
				w += (size_t)n;
			}
		} else {
			size_t r = 0;
			while (r < len) {
				ssize_t n = read(0, got + r, len - r);
				if (n < 0 && errno == EINTR)
					continue;
				if (n < 0) {
					perror("iopath-pattern: read");
					return 1;
				}
				if (n == 0) {
					fprintf(stderr,
						"iopath-pattern: short input: %llu of %llu bytes\n",
						(unsigned long long)(done + r),
						(unsigned long long)size);
					return 1;
				}
				r += (size_t)n;
			}
			if (memcmp(want, got, len)) {
				for (size_t i = 0; i < len; i += 8) {
					if (memcmp(want + i, got + i, 8) == 0)
						continue;
					if (bad++ == 0) {
						uint64_t g = 0;
						for (int b = 7; b >= 0; b--)
							g = (g << 8) | got[i + b];
						fprintf(stderr,
							"iopath-pattern: first mismatch at device offset %llu: "
							"want 0x%016llx got 0x%016llx\n",
							(unsigned long long)(off + done + i),
							(unsigned long long)((off + done + i) ^ seed),
							(unsigned long long)g);
					}
				}
			}
		}
		done += len;
	}
	if (!gen) {
		if (bad) {
			fprintf(stderr, "iopath-pattern: %llu of %llu words differ\n",
				(unsigned long long)bad, (unsigned long long)(size / 8));
			return 1;
		}
		char extra;
		if (read(0, &extra, 1) > 0) {
			fprintf(stderr, "iopath-pattern: input longer than %llu bytes\n",
				(unsigned long long)size);
			return 1;
		}
	}
	return 0;
}
