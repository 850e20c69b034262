"""Time to a ready model: from checkpoint files to a transformers model whose
first forward pass has run.

Writes a Llama-style model of about --size bytes with transformers' own
save_pretrained (bf16, tied embeddings, --shards shards and their
model.safetensors.index.json) on a disk file system. For each page-cache
case

    cold       every shard dropped from the page cache (fsync + POSIX_FADV_DONTNEED)
    warm       every shard read into the page cache first
    half-warm  every other shard cached

runs each row --rounds times, alternating (the row order rotates every
round), each in a fresh process pinned to --cpus:

    transformers            AutoModelForCausalLM.from_pretrained(dir, dtype=torch.bfloat16)
    iopath                  iopath.from_pretrained(AutoModelForCausalLM, dir, dtype=torch.bfloat16)
    iopath (map)            the same with method="map": cached shards' tensors
                            are views of the files

A row is timed from just before the call (torch, transformers' modelling
code and iopath already imported) to the end of the model's first forward
pass over --tokens tokens; the call and the forward pass are also reported
apart, the process's CPU time over the same span (every thread), and the
whole process's wall time (Python start-up and the imports included).
Every row's logits must be equal, bit for bit, to the first row's, or the
run stops. Reported: seconds, median (min-max), and each row's speed
against transformers' (its median seconds over the row's).
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models as bm  # noqa: E402  (set_case: the page-cache cases)
import bench_safetensors as bs  # noqa: E402

GIB = 1 << 30
ROWS = ["transformers", "iopath", "map"]
LABELS = {
    "transformers": "transformers from_pretrained",
    "iopath": "iopath.from_pretrained",
    "map": 'iopath.from_pretrained, method="map"',
}
CASES = ["cold", "warm", "half-warm"]


def write_model(path, size, shards):
    """A bf16 Llama-style checkpoint of about `size` bytes in `shards`
    shards, written by transformers; returns the shard paths."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, vocab = 1024, 4096, 32000
    # Per layer: q and o (hidden^2 each), k and v (a quarter each: 4 of 16
    # heads), the MLP (3 x hidden x inter), two norms; bf16.
    per_layer = 2 * (2 * hidden * hidden + 2 * hidden * hidden // 4 + 3 * hidden * inter + 2 * hidden)
    layers = max(1, round((size - 2 * vocab * hidden) / per_layer))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    # save_pretrained fills a shard while the next tensor fits: a larger
    # limit until it writes exactly `shards` files.
    limit = -(-total // shards)
    while True:
        subprocess.run(["rm", "-rf", path])
        model.save_pretrained(path, max_shard_size=limit)
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        if len(files) <= shards:
            break
        limit += limit // 50
    for p in files:
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    return files


def one(row, path, tokens):
    """Runs one row once in this (fresh) process; prints JSON."""
    import torch

    # transformers imports its modelling code on first use: imported here,
    # before the clock starts, for every row alike.
    import transformers.modeling_utils  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    from transformers import AutoModelForCausalLM

    import iopath

    ids = torch.arange(tokens).reshape(1, tokens) * 37 % 32000
    c0 = time.process_time()
    t0 = time.perf_counter()
    if row == "transformers":
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    else:
        method = "map" if row == "map" else "auto"
        model = iopath.from_pretrained(AutoModelForCausalLM, path, dtype=torch.bfloat16, method=method)
    t1 = time.perf_counter()
    with torch.no_grad():
        logits = model(ids).logits
    t2 = time.perf_counter()
    cpu = time.process_time() - c0
    digest = hashlib.sha256(logits.float().numpy().tobytes()).hexdigest()
    print(json.dumps({"ready": t2 - t0, "call": t1 - t0, "forward": t2 - t1, "cpu": cpu, "logits": digest}))


def run_child(row, path, tokens, cpus):
    """One row in a fresh process pinned to `cpus`: its JSON and its wall
    time."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one", row, "--path", path, "--tokens", str(tokens)]
    t = time.perf_counter()
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus)
    )
    out, err = p.communicate()
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{row} failed ({p.returncode}): {err.strip()[-2000:]}")
    got = json.loads(out.strip().splitlines()[-1])
    got["wall"] = wall
    return got


def med(xs):
    return statistics.median(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=float, default=1.0, help="model size in GiB [1]")
    ap.add_argument("--shards", type=int, default=8, help="shards [8]")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, >= 1 [3]")
    ap.add_argument("--tokens", type=int, default=1, help="tokens in the first forward pass [1]")
    ap.add_argument("--dir", default="/var/tmp", help="where the model goes (a disk, not tmpfs) [/var/tmp]")
    ap.add_argument("--model", help="use this checkpoint directory (written by a previous --keep) instead")
    ap.add_argument("--keep", action="store_true", help="keep the model files")
    ap.add_argument("--cpus", default=None, help="CPUs to pin every row to, e.g. 0,1 [this process's]")
    ap.add_argument("--cases", default=",".join(CASES), help=",".join(CASES))
    ap.add_argument("--rows", default=",".join(ROWS), help=",".join(ROWS))
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.one, args.path, args.tokens)

    def say(*a):
        print(*a, file=sys.stderr, flush=True)

    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else os.sched_getaffinity(0)
    cases = [c for c in args.cases.split(",") if c]
    rows = [r for r in args.rows.split(",") if r]
    for what, got, allowed in (("--cases", cases, CASES), ("--rows", rows, ROWS)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            ap.error(f"{what}: unknown {bad}; choose from {','.join(allowed)}")
    if args.rounds < 1:
        ap.error("--rounds: give at least 1")

    import tempfile

    root = None
    if args.model:
        path = args.model
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    else:
        root = tempfile.mkdtemp(prefix="iopath-ready-", dir=args.dir)
        path = os.path.join(root, "llama")
        say(f"writing a {args.size:g} GiB bf16 Llama-style model in {args.shards} shards under {path}")
        files = write_model(path, int(args.size * GIB), args.shards)
    size = sum(map(os.path.getsize, files))
    results = {}
    digest = None
    load_before = bs.loadavg()
    try:
        for case in cases:
            res = {r: [] for r in rows}
            for rnd in range(args.rounds):
                k = rnd % len(rows)
                for row in rows[k:] + rows[:k]:
                    bm.set_case(files, case)
                    got = run_child(row, path, args.tokens, cpus)
                    if digest is None:
                        digest = got["logits"]
                    elif got["logits"] != digest:
                        raise SystemExit(f"{case} round {rnd + 1} {row}: logits differ from the first row's")
                    res[row].append(got)
                    say(
                        f"{case} round {rnd + 1}/{args.rounds} {row}: ready {got['ready']:.2f} s "
                        f"(call {got['call']:.2f}, forward {got['forward']:.2f}, CPU {got['cpu']:.2f}; process {got['wall']:.2f})"
                    )
            results[case] = res
    finally:
        for p in files:
            bs.drop_cache(p)
        if root and not args.keep:
            subprocess.run(["rm", "-rf", root])
    report(results, size, len(files), args, cpus, load_before, bs.loadavg())


def report(results, size, nfiles, args, cpus, load_before, load_after):
    print(
        f"time to a ready model (files to the end of a first forward pass over {args.tokens} token(s)): "
        f"{size / GIB:.2f} GiB bf16 Llama-style checkpoint written by transformers, {nfiles} shards; "
        f"{args.rounds} alternating rounds, each row a fresh process, median (min-max); logits equal in every row; "
        f"rows pinned to CPUs {','.join(map(str, sorted(cpus)))}; load average {load_before:.2f} before, {load_after:.2f} after"
    )
    out = {"bytes": size, "shards": nfiles, "rounds": args.rounds, "cpus": sorted(cpus), "tables": []}
    for case, res in results.items():
        base = med([g["ready"] for g in res["transformers"]]) if "transformers" in res else None
        print()
        print(f"{case}; speed against transformers' from_pretrained (its median seconds / the row's)")
        print()
        print("| loader | ready (s) | min-max | vs transformers | the call (s) | first forward (s) | CPU (s) | process (s) |")
        print("|---|---|---|---|---|---|---|---|")
        table = {"case": case, "rows": []}
        for r, got in res.items():
            ready = [g["ready"] for g in got]
            m = med(ready)
            vs = f"{base / m:.2f}x" if base else "-"
            print(
                f"| {LABELS[r]} | {m:.2f} | {min(ready):.2f}-{max(ready):.2f} | {vs} | "
                f"{med([g['call'] for g in got]):.2f} | {med([g['forward'] for g in got]):.2f} | "
                f"{med([g['cpu'] for g in got]):.2f} | {med([g['wall'] for g in got]):.2f} |"
            )
            table["rows"].append({"row": r, "label": LABELS[r], "runs": got, "median": m, "vs_transformers": base / m if base else None})
        out["tables"].append(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
