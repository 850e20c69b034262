"""One load, many processes: PSS of N workers that attach to one loaded model.

    python bench_share.py MODEL [--workers 8] [--make-gib 1 --shards 8] [--method map]

The parent loads MODEL (a safetensors file, a directory or an index; with
--make-gib a checkpoint of that many GiB in --shards shards is written there
first) with iopath and shares it; N worker processes attach to the share and
read every page of every tensor (so each maps all of it). Memory is the sum
of every process's Pss from /proc/PID/smaps_rollup (shared pages divided
among the processes that map them), taken before the load (parent) and
before the attach (workers), then with all workers attached. For comparison,
one extra worker loads the model on its own and its Pss growth is reported:
that is what each worker would add without sharing. With --method map the
cached tensors are views of their files (mapped private in every process,
the attaching ones too): the page cache's pages, counted once among all the
processes that map them. Prints one JSON object.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

import iopath

WORKER = r"""
import sys, time
import numpy as np
import iopath

def pss():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024

def touch(tensors):
    total = 0
    for a in tensors.values():
        b = a.reshape(-1).view(np.uint8)
        total += int(b[::4096].sum()) + (int(b[-1]) if b.size else 0)
    return total

mode, arg, method = sys.argv[1], sys.argv[2], sys.argv[3]
before = pss()
t = time.perf_counter()
tensors = iopath.attach(arg) if mode == "attach" else iopath.load_safetensors(arg, method=method)
took = time.perf_counter() - t
touch(tensors)
print(f"{before} {pss()} {took}", flush=True)
sys.stdin.readline()   # hold the mapping until the parent has measured
"""


def pss(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss for {pid}")


def make_checkpoint(d, gib, shards):
    os.makedirs(d, exist_ok=True)
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        return
    from safetensors.numpy import save_file

    per = (gib << 30) // shards
    rng = np.random.default_rng(1)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for t in range(8):
            n = per // 8 // 4
            tensors[f"layers.{s}.w{t}"] = rng.integers(0, 1 << 31, size=n, dtype=np.int32).view(np.float32)
        save_file(tensors, os.path.join(d, file))
        weight_map.update({k: file for k in tensors})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def start(mode, arg, method):
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, mode, arg, method], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--make-gib", type=int, default=0)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--heap", default="memfd")
    ap.add_argument("--method", default="auto", help='load method: auto, map (cached tensors: views of the files), ...')
    args = ap.parse_args()
    if args.make_gib:
        make_checkpoint(args.model, args.make_gib, args.shards)
    parent_before = pss(os.getpid())
    t = time.perf_counter()
    tensors, stats = iopath.load_safetensors(args.model, heap=args.heap, method=args.method, with_stats=True)
    load_s = time.perf_counter() - t
    share = iopath.share(tensors)
    workers = [start("attach", share.handle, args.method) for _ in range(args.workers)]
    lines = [w.stdout.readline().split() for w in workers]
    before = [int(x[0]) for x in lines]
    attach_s = sorted(float(x[2]) for x in lines)
    after = [pss(w.pid) for w in workers]
    parent_after = pss(os.getpid())
    for w in workers:
        w.stdin.write("\n")
        w.stdin.flush()
        w.wait()
    share.close()
    alone = start("load", args.model, args.method)
    b, a, alone_s = alone.stdout.readline().split()
    alone.stdin.write("\n")
    alone.stdin.flush()
    alone.wait()
    model = stats["bytes"] + stats.get("mapped_bytes", 0)
    grown = sum(after) - sum(before) + parent_after - parent_before
    print(
        json.dumps(
            {
                "model_bytes": model,
                "shards": stats["shards"],
                "workers": args.workers,
                "heap": stats["heap"],
                "method": args.method,
                "mapped_bytes": stats.get("mapped_bytes", 0),
                "load_seconds": load_s,
                "attach_seconds_median": attach_s[len(attach_s) // 2],
                "attach_seconds_max": attach_s[-1],
                "pss_growth_bytes": grown,
                "pss_growth_per_model": grown / model,
                "parent_pss_growth_bytes": parent_after - parent_before,
                "workers_pss_growth_bytes": sum(after) - sum(before),
                "one_own_load_pss_growth_bytes": int(a) - int(b),
                "one_own_load_seconds": float(alone_s),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
