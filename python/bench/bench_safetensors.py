"""Cold-load benchmark: iopath.load_safetensors beside the loaders people use.

Writes a safetensors file of about --size bytes (a few hundred tensors of
mixed dtypes, numpy + the safetensors package) on a disk file system, then
in --rounds alternating rounds (row order rotates each round) times, each
from a cold file:

    safetensors.numpy.load_file        (reads the file, copies out arrays)
    safetensors.safe_open get_tensor   (every tensor, one by one)
    numpy.fromfile                     (the whole file, one read)
    iopath.load_safetensors            (heap buffers, direct I/O)
    fio O_DIRECT read                  (the limit: io_uring, iopath's
                                        request size and queue depth)

Cold means: fsync, then posix_fadvise(POSIX_FADV_DONTNEED) on the file
(only this file's pages leave the page cache, nobody else's), checked with
mincore(2) before every row. Each loader runs in a fresh Python process, so
no row reuses memory another freed; its time is taken around the load call
only. Page-cache growth is the file's resident bytes (mincore) after the
row minus before. The scratch file is deleted at the end (--keep keeps it).
Reports GiB/s (median, min-max), the ratio to the limit and the page-cache
growth; --json prints one JSON object instead of the Markdown table.
"""

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30

ROWS = ["load_file", "safe_open", "fromfile", "iopath", "fio"]
LABELS = {
    "load_file": "safetensors.numpy.load_file",
    "safe_open": "safetensors.safe_open, every get_tensor",
    "fromfile": "numpy.fromfile (whole file)",
    "iopath": "iopath.load_safetensors",
    "fio": "fio O_DIRECT read (limit)",
}

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(path):
    """Bytes of `path` in the page cache, by mincore(2) over a fresh mapping
    (mapping without touching faults nothing in)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap for mincore")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(b & 1 for b in bytes(vec)) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cache(path):
    """Evicts `path`'s pages: fsync, then POSIX_FADV_DONTNEED."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def make_model(path, size, count, seed):
    """A safetensors file of about `size` bytes: `count` tensors of mixed
    dtypes with log-uniform sizes (a few big, many small, as real models)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_]
    weights = rng.uniform(np.log(1.0), np.log(4096.0), size=count)
    weights = np.exp(weights)
    weights *= size / weights.sum()
    tensors = {}
    for i, w in enumerate(weights):
        dt = np.dtype(dtypes[i % len(dtypes)])
        n = max(1, int(w) // dt.itemsize)
        cols = 1 << int(rng.integers(4, 11))
        rows = max(1, n // cols)
        raw = rng.bytes(rows * cols * dt.itemsize)
        a = np.frombuffer(raw, dtype=np.uint8).copy()
        if dt == np.bool_:
            a &= 1
        tensors[f"layers.{i}.{dt.name}"] = a.view(dt).reshape(rows, cols)
    save_file(tensors, path, metadata={"format": "np", "by": "bench_safetensors.py"})
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return len(tensors)


def one(row, path, method, buffer_size):
    """Runs one loader once (in this, a fresh, process) and prints JSON."""
    out = {}
    if row == "load_file":
        from safetensors.numpy import load_file

        t = time.perf_counter()
        r = load_file(path)
        secs = time.perf_counter() - t
        out["tensors"] = len(r)
    elif row == "safe_open":
        from safetensors import safe_open

        t = time.perf_counter()
        r = {}
        with safe_open(path, framework="np") as f:
            for k in f.keys():
                r[k] = f.get_tensor(k)
        secs = time.perf_counter() - t
        out["tensors"] = len(r)
    elif row == "fromfile":
        import numpy as np

        t = time.perf_counter()
        r = np.fromfile(path, dtype=np.uint8)
        secs = time.perf_counter() - t
        out["tensors"] = None
    elif row == "iopath":
        import iopath

        t = time.perf_counter()
        r, stats = iopath.load_safetensors(
            path, method=method, buffer_size=buffer_size, with_stats=True
        )
        secs = time.perf_counter() - t
        out["tensors"] = len(r)
        out["method"] = stats["method"]
        # Allocation (on the loader's allocator thread, overlapped) and
        # transfer time: which of the two bounds the load.
        out["alloc_seconds"] = stats["alloc_seconds"]
        out["read_seconds"] = stats["read_seconds"]
    else:
        raise SystemExit(f"--one: unknown row {row!r}; one of {ROWS[:-1]}")
    out["seconds"] = secs
    print(json.dumps(out))


def run_child(row, args, path):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", row, "--file", path]
    cmd += ["--method", args.method, "--buffer-size", str(args.buffer_size)]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_fio(args, path, size):
    span = size // args.fio_bs * args.fio_bs
    cmd = [
        "fio",
        "--name=limit",
        f"--filename={path}",
        "--readonly",
        "--rw=read",
        f"--bs={args.fio_bs}",
        f"--iodepth={args.fio_depth}",
        "--ioengine=io_uring",
        "--direct=1",
        f"--size={span}",
        "--output-format=json",
    ]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    j = json.loads(p.stdout[p.stdout.index("{") :])
    read = j["jobs"][0]["read"]
    return {"seconds": read["io_bytes"] / read["bw_bytes"], "bytes": read["io_bytes"]}, cmd


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def summary(xs):
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "runs": xs,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=float, default=1.0, help="file size in GiB [1]")
    ap.add_argument("--tensors", type=int, default=300, help="tensors in the file [300]")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds, >= 1 [5]")
    ap.add_argument("--dir", default="/var/tmp", help="where the scratch file goes (a disk, not tmpfs) [/var/tmp]")
    ap.add_argument("--file", help="use this safetensors file instead of writing one (never deleted)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch file")
    ap.add_argument("--method", default="auto", help="iopath transfer method [auto]")
    ap.add_argument("--buffer-size", type=int, default=32 << 20, help="iopath buffer size in bytes [32 MiB]")
    ap.add_argument("--fio-bs", type=int, default=4 << 20, help="fio block size (iopath's request size) [4 MiB]")
    ap.add_argument("--fio-depth", type=int, default=16, help="fio queue depth (iopath's) [16]")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"rows to run [{','.join(ROWS)}]")
    ap.add_argument("--json", action="store_true", help="print one JSON object, not the table")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.one:
        return one(args.one, args.file, args.method, args.buffer_size)
    rows = [r for r in args.rows.split(",") if r]
    bad = [r for r in rows if r not in ROWS]
    if bad or not rows:
        ap.error(f"--rows: unknown {bad}; choose from {','.join(ROWS)}")
    if args.rounds < 1:
        ap.error("--rounds: give at least 1")

    def say(*a):
        print(*a, file=sys.stderr, flush=True)

    scratch = None
    if args.file:
        path = args.file
        count = None
    else:
        fd, scratch = tempfile.mkstemp(prefix="iopath-bench-", suffix=".safetensors", dir=args.dir)
        os.close(fd)
        path = scratch
        say(f"writing {args.size:g} GiB, {args.tensors} tensors to {path}")
        count = make_model(path, int(args.size * GIB), args.tensors, 15)
    try:
        size = os.path.getsize(path)
        load_before = loadavg()
        results = {r: {"gib_per_s": [], "growth": [], "alloc_s": [], "read_s": []} for r in rows}
        fio_cmd = None
        for rnd in range(args.rounds):
            order = rows[rnd % len(rows) :] + rows[: rnd % len(rows)]
            for row in order:
                drop_cache(path)
                before = resident_bytes(path)
                if before > size // 100:
                    say(f"warning: {before} bytes still cached before {row}")
                if row == "fio":
                    got, fio_cmd = run_fio(args, path, size)
                    gib = got["bytes"] / GIB / got["seconds"]
                else:
                    got = run_child(row, args, path)
                    gib = size / GIB / got["seconds"]
                    if "alloc_seconds" in got:
                        results[row].setdefault("methods", []).append(got["method"])
                        results[row]["alloc_s"].append(got["alloc_seconds"])
                        results[row]["read_s"].append(got["read_seconds"])
                    if got.get("tensors") is not None:
                        results[row]["tensors"] = got["tensors"]
                growth = max(0, resident_bytes(path) - before)
                results[row]["gib_per_s"].append(gib)
                results[row]["growth"].append(growth)
                say(f"round {rnd + 1}/{args.rounds} {row}: {gib:.3f} GiB/s, cache +{growth >> 20} MiB")
        drop_cache(path)
        load_after = loadavg()
    finally:
        if scratch and not args.keep:
            os.unlink(scratch)
    limit = statistics.median(results["fio"]["gib_per_s"]) if "fio" in results else None
    report = {
        "file": path,
        "bytes": size,
        "tensors": count,
        "rounds": args.rounds,
        "loadavg": [load_before, load_after],
        "cold": "fsync + posix_fadvise(POSIX_FADV_DONTNEED) on the file, checked with mincore",
        "affinity": sorted(os.sched_getaffinity(0)),
        "iopath": {"method": args.method, "buffer_size": args.buffer_size},
        "fio": {"bs": args.fio_bs, "iodepth": args.fio_depth, "command": fio_cmd},
        "rows": [],
    }
    for r in rows:
        s = summary(results[r]["gib_per_s"])
        row = {
            "row": r,
            "label": LABELS[r],
            "gib_per_s": s,
            "vs_limit": s["median"] / limit if limit else None,
            "page_cache_growth": max(results[r]["growth"]),
            "page_cache_growth_of_file": max(results[r]["growth"]) / size,
        }
        if "methods" in results[r]:
            # What moved the bytes, round by round (auto chooses per load).
            ms = results[r]["methods"]
            row["methods"] = ms
            row["method"] = ", ".join(f"{m} {ms.count(m)}x" for m in sorted(set(ms)))
            row["alloc_ms"] = summary([x * 1e3 for x in results[r]["alloc_s"]])
            row["read_ms"] = summary([x * 1e3 for x in results[r]["read_s"]])
        report["rows"].append(row)
    if "iopath" in results and "load_file" in results:
        a = statistics.median(results["iopath"]["gib_per_s"])
        b = statistics.median(results["load_file"]["gib_per_s"])
        report["iopath_vs_load_file"] = a / b
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{size / GIB:.2f} GiB, {count if count is not None else '?'} tensors, "
        f"{args.rounds} rounds, load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print()
    print("| loader | GiB/s median | min-max | vs fio | page-cache growth |")
    print("|---|---|---|---|---|")
    for row in report["rows"]:
        s = row["gib_per_s"]
        label = row["label"]
        if "method" in row:
            label += f" ({row['method']})"
        vs = f"{row['vs_limit'] * 100:.0f}%" if row["vs_limit"] is not None else "-"
        g = row["page_cache_growth"]
        print(
            f"| {label} | {s['median']:.3f} | {s['min']:.3f}-{s['max']:.3f} | {vs} | "
            f"{g / (1 << 20):.1f} MiB ({row['page_cache_growth_of_file'] * 100:.1f}%) |"
        )
    for row in report["rows"]:
        if "alloc_ms" in row:
            print()
            print(
                f"{row['label']}: allocation {row['alloc_ms']['median']:.0f} ms median "
                f"(allocator thread, overlapped), transfers {row['read_ms']['median']:.0f} ms"
            )
    if "iopath_vs_load_file" in report:
        print()
        print(f"iopath.load_safetensors / safetensors.numpy.load_file: {report['iopath_vs_load_file']:.2f}x")


if __name__ == "__main__":
    main()
