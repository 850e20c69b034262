"""Model loading beside the loaders inference servers use.

Writes a safetensors model of about --size bytes twice on a disk file
system: as one file and as an 8-shard checkpoint (model.safetensors.index.json
and its shards) of the same total. For each layout and each page-cache case

    cold       every file dropped from the page cache (fsync + POSIX_FADV_DONTNEED)
    warm       every file read into the page cache first
    half-warm  every other shard cached (one file: every other eighth of it)

runs each row once per round, --rounds alternating rounds (the row order
rotates every round), each row in a fresh process pinned to --cpus:

    safetensors.numpy.load_file     eager: arrays are copies
    safetensors.torch.load_file     lazy (views of a mapping): one byte of
                                    every 4 KiB page of every tensor is
                                    read, so every page is resident
    runai-model-streamer            SafetensorsStreamer, tensors cloned
    fastsafetensors                 device cpu, nogds, tensors cloned
    iopath.load_safetensors         the file, or the checkpoint's directory
    iopath, reload (warm only)      the same process loads a second time
                                    (a server's reload) through an
                                    iopath.Pool, whose buffers the first
                                    load left free; the second timed
    iopath (map), and its reload    method="map": tensors cached whole are
                                    views of their file (mapped private,
                                    pages made resident in the load), the
                                    rest read as auto reads them
    fio O_DIRECT read (limit)       the cold limit: every file, io_uring
    copy from a mapping (limit)     the warm limit: one thread copies each
                                    cached file's mapping (pages mapped
                                    first) into memory faulted in first

A row is timed around the load alone and counts as done when every byte is
resident. Reported: GiB/s (median, min-max), the ratio to the case's limit
(cold and half-warm: fio; warm: the copy), the page cache's growth over the
files (mincore after minus before, worst round), the row's peak RSS
(ru_maxrss of the process), and for iopath the bytes it copied from the
page cache. The torch-based peers run from --peers-python (a virtualenv
made by scripts/bench-models --install); a peer that cannot be imported
there drops its row, with a note.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The shared helpers of the other bench script; no __pycache__ in the tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_safetensors as bs  # noqa: E402

GIB = 1 << 30
SHARDS = 8
PEERS = ["np", "pt", "runai", "fast"]
ROWS = PEERS + ["iopath", "reload", "map", "map-reload", "fio", "copy"]
#: iopath's rows: (method, loads a second time through a pool).
IOPATH_ROWS = {"iopath": ("auto", False), "reload": ("auto", True), "map": ("map", False), "map-reload": ("map", True)}
#: Rows only measured where they mean something: the reloads and the copy
#: limit warm, fio cold and half-warm.
SKIP = {"cold": {"reload", "map-reload", "copy"}, "warm": {"fio"}, "half-warm": {"reload", "map-reload", "copy"}}
LABELS = {
    "np": "safetensors.numpy.load_file",
    "pt": "safetensors.torch.load_file (every page touched)",
    "runai": "runai-model-streamer (cloned)",
    "fast": "fastsafetensors, cpu, nogds (cloned)",
    "iopath": "iopath.load_safetensors",
    "reload": "iopath.load_safetensors, second load in the process (pool)",
    "map": "iopath.load_safetensors (map)",
    "map-reload": "iopath.load_safetensors (map), second load in the process (pool)",
    "fio": "fio O_DIRECT read (cold limit)",
    "copy": "one-thread copy from a cached mapping (warm limit)",
}
MODULES = {"np": "safetensors", "pt": "torch", "runai": "runai_model_streamer", "fast": "fastsafetensors"}
CASES = ["cold", "warm", "half-warm"]


def make_shard(path, size, count, seed, prefix):
    """A safetensors file of about `size` bytes, `count` tensors of mixed
    dtypes (as bench_safetensors.make_model), names under `prefix`."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, np.uint8]
    w = np.exp(rng.uniform(0.0, np.log(4096.0), size=count))
    w *= size / w.sum()
    tensors = {}
    for i, x in enumerate(w):
        dt = np.dtype(dtypes[i % len(dtypes)])
        cols = 1 << int(rng.integers(4, 11))
        rows = max(1, int(x) // dt.itemsize // cols)
        raw = np.frombuffer(rng.bytes(rows * cols * dt.itemsize), dtype=np.uint8)
        tensors[f"{prefix}.{i}.{dt.name}"] = raw.view(dt).reshape(rows, cols)
    save_file(tensors, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return list(tensors)


def make_layouts(root, size, tensors):
    """`{"single": [file], "sharded": [shards]}` under `root`, the sharded
    one with its index."""
    single = os.path.join(root, "single")
    sharded = os.path.join(root, "sharded")
    os.makedirs(single, exist_ok=True)
    os.makedirs(sharded, exist_ok=True)
    one = os.path.join(single, "model.safetensors")
    make_shard(one, size, tensors, 15, "layers")
    files = []
    weight_map = {}
    for k in range(SHARDS):
        name = f"model-{k + 1:05d}-of-{SHARDS:05d}.safetensors"
        p = os.path.join(sharded, name)
        for t in make_shard(p, size // SHARDS, max(1, tensors // SHARDS), 100 + k, f"layers.{k}"):
            weight_map[t] = name
        files.append(p)
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(map(os.path.getsize, files))}, "weight_map": weight_map}, f)
    return {"single": [one], "sharded": files}


def warm_range(path, off, length):
    """Reads `path[off:off+length]` through a descriptor without readahead,
    so exactly those pages are cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        end = off + length
        while off < end:
            n = len(os.pread(fd, min(8 << 20, end - off), off))
            if n == 0:
                break
            off += n
    finally:
        os.close(fd)


def set_case(files, case):
    """Puts the files' pages in the page cache as `case` wants; returns the
    bytes cached."""
    for p in files:
        bs.drop_cache(p)
    if case == "warm":
        for p in files:
            warm_range(p, 0, os.path.getsize(p))
    elif case == "half-warm":
        if len(files) > 1:
            for p in files[::2]:
                warm_range(p, 0, os.path.getsize(p))
        else:
            size = os.path.getsize(files[0])
            part = -(-size // SHARDS)
            for k in range(0, SHARDS, 2):
                warm_range(files[0], k * part, part)
    return sum(bs.resident_bytes(p) for p in files)


def touch_pages(t):
    """Reads one byte of every 4 KiB page of a torch tensor's bytes."""
    import torch

    b = t.reshape(-1).view(torch.uint8)
    return int(b[::4096].sum()) if b.numel() else 0


def one(row, files):
    """Runs one loader once in this (fresh) process; prints JSON."""
    out = {}
    if row == "np":
        from safetensors.numpy import load_file

        t = time.perf_counter()
        keep = {}
        for p in files:
            keep.update(load_file(p))
        n = len(keep)
    elif row == "pt":
        from safetensors.torch import load_file

        t = time.perf_counter()
        keep = {}
        for p in files:
            r = load_file(p)
            for x in r.values():
                touch_pages(x)
            keep.update(r)
        n = len(keep)
    elif row == "runai":
        from runai_model_streamer import SafetensorsStreamer

        t = time.perf_counter()
        keep = {}
        with SafetensorsStreamer() as s:
            for p in files:
                s.stream_file(p)
                for name, x in s.get_tensors():
                    keep[name] = x.clone()
        n = len(keep)
    elif row == "fast":
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        t = time.perf_counter()
        loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
        loader.add_filenames({0: files})
        fb = loader.copy_files_to_device()
        keep = {k: fb.get_tensor(k).clone() for k in loader.get_keys()}
        fb.close()
        loader.close()
        n = len(keep)
    elif row in IOPATH_ROWS:
        import iopath

        # A sharded checkpoint in one call, by its directory.
        what = files[0] if len(files) == 1 else os.path.dirname(files[0])
        method, reload = IOPATH_ROWS[row]
        pool = iopath.Pool() if reload else None

        def load_all():
            return iopath.load_safetensors(what, method=method, with_stats=True, pool=pool)

        if reload:
            first, _ = load_all()
            del first
        t = time.perf_counter()
        r, stats = load_all()
        if pool is not None:
            out["reused"] = pool.reused
        n = len(r)
        out["from_cache"] = stats.get("from_cache_bytes", 0)
        out["mapped"] = stats.get("mapped_bytes", 0)
        # The engine's method, when it moved any bytes (a load that only
        # mapped read nothing).
        out["methods"] = [stats["method"]] if stats["bytes"] else []
    elif row == "copy":
        import mmap

        import numpy as np

        secs = 0.0
        for p in files:
            size = os.path.getsize(p)
            with open(p, "rb") as f:
                m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
            src = np.frombuffer(m, dtype=np.uint8)
            int(src[::4096].sum())  # map every page (they are cached)
            dst = np.empty(size, dtype=np.uint8)
            dst.fill(1)  # fault every page in
            t = time.perf_counter()
            np.copyto(dst, src)
            secs += time.perf_counter() - t
            del src
            m.close()
        print(json.dumps({"seconds": secs, "tensors": None}))
        return
    else:
        raise SystemExit(f"--one: unknown row {row!r}")
    out["seconds"] = time.perf_counter() - t
    out["tensors"] = n
    print(json.dumps(out))


def available(python, row):
    """Whether `python` can import the row's module."""
    if row not in MODULES:
        return True
    r = subprocess.run([python, "-c", f"import {MODULES[row]}"], capture_output=True)
    return r.returncode == 0


def run_child(python, row, files, cpus):
    """One row in a fresh process pinned to `cpus`: its JSON and peak RSS."""
    import tempfile

    cmd = [python, os.path.abspath(__file__), "--one", row, "--files", ",".join(files)]
    with tempfile.TemporaryFile("w+") as o, tempfile.TemporaryFile("w+") as e:
        p = subprocess.Popen(cmd, stdout=o, stderr=e, text=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        # wait4, not communicate: its rusage is the row's peak RSS.
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        o.seek(0)
        e.seek(0)
        out, err = o.read(), e.read()
    if p.returncode != 0:
        raise RuntimeError(f"{row} failed ({p.returncode}): {err.strip()[-2000:]}")
    got = json.loads(out.strip().splitlines()[-1])
    return got, ru


def run_fio(files, cpus, args):
    """fio's O_DIRECT read of every file: (bytes, seconds)."""
    total, secs = 0, 0.0
    ns = argparse.Namespace(fio_bs=args.fio_bs, fio_depth=args.fio_depth)
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        for p in files:
            size = os.path.getsize(p)
            # A file smaller than a request: requests of its size.
            ns.fio_bs = max(4096, min(args.fio_bs, size // 4096 * 4096))
            got, _ = bs.run_fio(ns, p, size)
            total += got["bytes"]
            secs += got["seconds"]
    finally:
        os.sched_setaffinity(0, old)
    return total, secs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=float, default=1.0, help="model size in GiB [1]")
    ap.add_argument("--tensors", type=int, default=296, help="tensors in the model [296]")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds, >= 1 [5]")
    ap.add_argument("--dir", default="/var/tmp", help="where the model goes (a disk, not tmpfs) [/var/tmp]")
    ap.add_argument("--keep", action="store_true", help="keep the model files")
    ap.add_argument("--cpus", default=None, help="CPUs to pin every row to, e.g. 0,1 [this process's]")
    ap.add_argument("--layouts", default="single,sharded", help="single,sharded")
    ap.add_argument("--cases", default=",".join(CASES), help=",".join(CASES))
    ap.add_argument("--rows", default=",".join(ROWS), help=",".join(ROWS))
    ap.add_argument("--peers-python", default=sys.executable, help="python with the peers installed")
    ap.add_argument("--fio-bs", type=int, default=4 << 20, help="fio block size [4 MiB]")
    ap.add_argument("--fio-depth", type=int, default=16, help="fio queue depth [16]")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.one, args.files.split(","))

    def say(*a):
        print(*a, file=sys.stderr, flush=True)

    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else os.sched_getaffinity(0)
    layouts = [x for x in args.layouts.split(",") if x]
    cases = [c for c in args.cases.split(",") if c]
    rows = [r for r in args.rows.split(",") if r]
    for what, got, allowed in (("--layouts", layouts, ["single", "sharded"]), ("--cases", cases, CASES), ("--rows", rows, ROWS)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            ap.error(f"{what}: unknown {bad}; choose from {','.join(allowed)}")
    if args.rounds < 1:
        ap.error("--rounds: give at least 1")
    notes = []
    python_of = {}
    for r in rows:
        py = args.peers_python if r in PEERS else sys.executable
        if r in PEERS and not (os.path.exists(py) and available(py, r)):
            notes.append(f"{LABELS[r]}: not installed in {py} (scripts/bench-models --install); row dropped")
            continue
        if r == "fio" and not subprocess.run(["sh", "-c", "command -v fio"], capture_output=True).stdout:
            notes.append("fio is not installed (Debian package fio); row dropped")
            continue
        python_of[r] = py
    rows = [r for r in rows if r in python_of]

    import tempfile

    root = tempfile.mkdtemp(prefix="iopath-models-", dir=args.dir)
    say(f"writing {args.size:g} GiB twice (one file, {SHARDS} shards) under {root}")
    model = make_layouts(root, int(args.size * GIB), args.tensors)
    results = {}
    load_before = bs.loadavg()
    try:
        for layout in layouts:
            files = model[layout]
            size = sum(map(os.path.getsize, files))
            for case in cases:
                # Each case's limit, and the reload, only where they mean something.
                case_rows = [r for r in rows if r not in SKIP[case]]
                res = {r: {"gib_per_s": [], "growth": [], "rss": [], "from_cache": [], "mapped": [], "methods": set()} for r in case_rows}
                for rnd in range(args.rounds):
                    k = rnd % len(case_rows)
                    for row in case_rows[k:] + case_rows[:k]:
                        before = set_case(files, case)
                        if row == "fio":
                            b, secs = run_fio(files, cpus, args)
                            gib, rss = b / GIB / secs, None
                        else:
                            got, ru = run_child(python_of[row], row, files, cpus)
                            gib = size / GIB / got["seconds"]
                            rss = ru.ru_maxrss * 1024 if ru else None
                            if "from_cache" in got:
                                res[row]["from_cache"].append(got["from_cache"])
                                res[row]["mapped"].append(got.get("mapped", 0))
                                res[row]["methods"].update(got["methods"])
                        growth = max(0, sum(bs.resident_bytes(p) for p in files) - before)
                        res[row]["gib_per_s"].append(gib)
                        res[row]["growth"].append(growth)
                        res[row]["rss"].append(rss)
                        say(f"{layout} {case} round {rnd + 1}/{args.rounds} {row}: {gib:.3f} GiB/s, cache +{growth >> 20} MiB")
                results[(layout, case)] = (size, res)
    finally:
        for fs in model.values():
            for p in fs:
                bs.drop_cache(p)
        if not args.keep:
            subprocess.run(["rm", "-rf", root])
    load_after = bs.loadavg()
    report(results, args, cpus, notes, load_before, load_after)


def med(xs):
    return statistics.median(xs) if xs else None


def report(results, args, cpus, notes, load_before, load_after):
    print(
        f"{args.size:g} GiB model, one file and {SHARDS} shards; {args.rounds} alternating rounds, "
        f"median (min-max); rows pinned to CPUs {','.join(map(str, sorted(cpus)))}; "
        f"load average {load_before:.2f} before, {load_after:.2f} after"
    )
    out = {"rounds": args.rounds, "cpus": sorted(cpus), "loadavg": [load_before, load_after], "tables": []}
    for (layout, case), (size, res) in results.items():
        limit_row = "copy" if case == "warm" else "fio"
        limit = med(res.get(limit_row, {}).get("gib_per_s", []))
        print()
        print(f"{layout} ({size / GIB:.2f} GiB in {1 if layout == 'single' else SHARDS} file(s)), {case}; ratios to {LABELS[limit_row]}")
        print()
        print("| loader | GiB/s | min-max | vs limit | page-cache growth | peak RSS | from the cache (copied, mapped) |")
        print("|---|---|---|---|---|---|---|")
        table = {"layout": layout, "case": case, "bytes": size, "limit": limit_row, "rows": []}
        for r, v in res.items():
            g = v["gib_per_s"]
            m = med(g)
            vs = f"{m / limit:.2f}x" if limit else "-"
            rss = [x for x in v["rss"] if x]
            rss_s = f"{max(rss) / GIB:.2f} GiB" if rss else "-"
            fc = med(v["from_cache"])
            fc_s = f"{fc / GIB:.2f} GiB" if fc is not None else "-"
            mp = med(v["mapped"])
            if mp:
                fc_s += f", {mp / GIB:.2f} GiB mapped"
            label = LABELS[r] + (f" ({', '.join(sorted(v['methods']))})" if v["methods"] else "")
            print(f"| {label} | {m:.2f} | {min(g):.2f}-{max(g):.2f} | {vs} | {max(v['growth']) >> 20} MiB | {rss_s} | {fc_s} |")
            table["rows"].append({"row": r, "label": LABELS[r], "gib_per_s": g, "median": m, "vs_limit": m / limit if limit else None,
                                  "growth_max": max(v["growth"]), "peak_rss_max": max(rss) if rss else None, "from_cache": v["from_cache"],
                                  "mapped": v["mapped"],
                                  "methods": sorted(v["methods"])})
        peers = {r: med(res[r]["gib_per_s"]) for r in PEERS if r in res}
        best_peer = max(peers, key=peers.get) if peers else None
        fio = med(res["fio"]["gib_per_s"]) if "fio" in res else None
        copy = med(res["copy"]["gib_per_s"]) if "copy" in res else None
        lines = []
        # Each iopath row against the fastest peer and the case's limit.
        for r in ("iopath", "map"):
            io = med(res.get(r, {}).get("gib_per_s", []))
            name = "iopath" if r == "iopath" else "iopath (map)"
            if io and best_peer:
                lines.append(f"{name} / fastest peer ({best_peer}): {io / peers[best_peer]:.2f}x")
                table[f"{r}_vs_fastest_peer"] = io / peers[best_peer]
            if io and fio:
                lines.append(f"{name} / fio: {io / fio:.2f}x")
                table[f"{r}_vs_fio"] = io / fio
        for r in ("reload", "map-reload"):
            if r in res and copy:
                rl = med(res[r]["gib_per_s"]) / copy
                name = "iopath reload" if r == "reload" else "iopath (map) reload"
                lines.append(f"{name} / copy limit: {rl:.2f}x")
                table[f"{r.replace('-', '_')}_vs_copy"] = rl
        if lines:
            print()
            print("; ".join(lines))
        out["tables"].append(table)
    for n in notes:
        print(f"\nnote: {n}")
    out["notes"] = notes
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
