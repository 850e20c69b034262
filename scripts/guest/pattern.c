/*
 * iopath-pattern: writes or checks the guest-dd data pattern.
 *
 * The pattern over a device range [OFFSET, OFFSET+SIZE): the 8-byte
 * little-endian word at device byte offset o (o a multiple of 8) holds
 * o XOR SEED. OFFSET and SIZE must be multiples of 8. Any host can check an
 * image with a few lines of code: read u64 LE at o, compare with o ^ SEED.
 *
 *   iopath-pattern gen   OFFSET SIZE SEED   > out    (writes SIZE bytes)
 *   iopath-pattern check OFFSET SIZE SEED   < in     (exit 0 iff all match)
 *
 * Numbers accept C prefixes (0x...). Built static by scripts/guest-dd
 * --prepare so it runs in the guest's busybox initramfs; written in C
 * because a busybox awk/printf loop is far too slow for MiBs.
 */
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

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[1], "gen") && strcmp(argv[1], "check"))) {
		fprintf(stderr, "usage: iopath-pattern gen|check OFFSET SIZE SEED\n");
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
