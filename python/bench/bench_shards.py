"""Shards at once: a sharded checkpoint loaded cold with 1, 2, 4 shards at a time.

    python bench_shards.py CHECKPOINT_DIR [--rounds 5] [--at-once 1,2,4]

Before every load each shard file is evicted from the page cache
(posix_fadvise DONTNEED, this checkpoint's files only); the rows alternate
within a round. Prints one JSON object: GiB/s per setting, every round, and
the median.
"""

import argparse
import glob
import json
import os
import statistics
import time

import iopath


def evict(d):
    for f in glob.glob(os.path.join(d, "*.safetensors")):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--at-once", default="1,2,4")
    ap.add_argument("--heap", default="memfd")
    args = ap.parse_args()
    settings = [int(x) for x in args.at_once.split(",")]
    runs = {k: [] for k in settings}
    for r in range(args.rounds):
        order = settings if r % 2 == 0 else settings[::-1]
        for k in order:
            evict(args.checkpoint)
            t = time.perf_counter()
            tensors, stats = iopath.load_safetensors(
                args.checkpoint, heap=args.heap, shards_at_once=k, with_stats=True
            )
            s = time.perf_counter() - t
            runs[k].append(stats["bytes"] / s / (1 << 30))
            del tensors
    print(
        json.dumps(
            {
                "bytes": stats["bytes"],
                "shards": stats["shards"],
                "method": stats["method"],
                "gib_per_s": {k: [round(x, 3) for x in v] for k, v in runs.items()},
                "median": {k: round(statistics.median(v), 3) for k, v in runs.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
