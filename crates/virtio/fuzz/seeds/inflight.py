#!/usr/bin/env python3
"""Writes the inflight seeds of the vhost_user_stream fuzz target.

Usage (from anywhere):
    crates/virtio/fuzz/seeds/inflight.py           # (re)write the seeds
    crates/virtio/fuzz/seeds/inflight.py --check   # and decode each with
        `cargo +nightly fuzz fmt` (honours CARGO_TARGET_DIR as scripts/fuzz
        does) to show it is the input described below

The other seeds of corpus/vhost_user_stream/ were taken from short fuzz
runs, which rarely spell out GET_INFLIGHT_FD / SET_INFLIGHT_FD with a
record that names heads in flight. These are written by hand instead, one
file per case, named corpus/vhost_user_stream/inflight-<case>:

- a queue restarted from a record with a head in flight (without and with
  ACCESS_PLATFORM), stopped and started again on the same connection;
- a crash after the used index moved (the record's used_idx behind the
  ring's, last_batch_head set);
- two queues, each with its own heads in flight in its own region;
- hostile records (all 0x01, all 0xff) and SET_INFLIGHT_FD refusals: a
  region one byte too small for two queues, an offset past the end, an
  empty file, a pipe, a socket and an eventfd instead of a memfd, and
  GET_INFLIGHT_FD with shapes the device does not have (3 queues, queues
  of 39);
- a record replaced on a live connection, and again after RESET_OWNER.

An input is the target's `Input` in the byte format of the `arbitrary`
crate (1.x): integers little-endian, bool one byte, Option a bool then the
value, Vec each element after a 1 byte and a 0 byte at the end (the last
field of `Input` runs to the end of the data), an enum variant a u32 `x`
with `(x * variants) >> 32` its index. The variants and field order are
read from the target's source, so a reordered enum still gets the right
bytes; --check shows the decoded inputs.
"""

import hashlib
import os
import re
import struct
import subprocess
import sys

FUZZ = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "vhost_user_stream"
SOURCE = os.path.join(FUZZ, "fuzz_targets", TARGET + ".rs")
CORPUS = os.path.join(FUZZ, "corpus", TARGET)

# The spec's split-ring inflight layout for the target's queues of 8
# (inflight.rs in crates/virtio/src/device): a 16-byte QueueRegionSplit
# header, 16 bytes per descriptor, each queue padded to 64 bytes.
QUEUE_SIZE = 8
REGION = (16 + 16 * QUEUE_SIZE + 63) // 64 * 64


def parse_types(src):
    """{name: ('struct', [(field, type)]) | ('enum', [(variant, fields)])}
    for the types deriving Arbitrary in the target."""
    types = {}
    for m in re.finditer(r"#\[derive\([^)]*Arbitrary[^)]*\)\]\s*(struct|enum)\s+(\w+)\s*\{", src):
        kind, name = m.group(1), m.group(2)
        body, depth, i = [], 1, m.end()
        while depth:
            c = src[i]
            depth += {"{": 1, "}": -1}.get(c, 0)
            body.append(c)
            i += 1
        body = "".join(body[:-1])
        body = "\n".join(l for l in body.splitlines() if not l.strip().startswith("//"))
        if kind == "struct":
            types[name] = ("struct", re.findall(r"(\w+)\s*:\s*([\w<>]+)\s*,", body))
        else:
            variants = []
            for v in re.finditer(r"(\w+)\s*(\{[^}]*\}|\([^)]*\))?\s*,", body):
                inner = v.group(2) or ""
                if inner.startswith("{"):
                    fields = re.findall(r"(\w+)\s*:\s*([\w<>]+)", inner)
                elif inner.startswith("("):
                    fields = [("0", inner[1:-1].strip())]
                else:
                    fields = []
                variants.append((v.group(1), fields))
            types[name] = ("enum", variants)
    return types


TYPES = parse_types(open(SOURCE).read())
INTS = {"u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q"}


def enc(ty, value, last=False):
    """The bytes `arbitrary` decodes as `value` of type `ty` (a Rust type
    name; `last`: the last field of the top-level struct)."""
    if ty in INTS:
        return struct.pack(INTS[ty], value)
    if ty == "bool":
        return bytes([1 if value else 0])
    m = re.fullmatch(r"Option<(.+)>", ty)
    if m:
        return b"\0" if value is None else b"\1" + enc(m.group(1), value)
    m = re.fullmatch(r"Vec<(.+)>", ty)
    if m:
        out = b"".join(b"\1" + enc(m.group(1), v) for v in value)
        return out if last else out + b"\0"
    kind, shape = TYPES[ty]
    if kind == "struct":
        return b"".join(
            enc(t, value[f], last and i == len(shape) - 1) for i, (f, t) in enumerate(shape)
        )
    # An enum value: "Variant" or ("Variant", {field: value}).
    name, fields = (value, {}) if isinstance(value, str) else value
    names = [v for v, _ in shape]
    idx = names.index(name)
    out = struct.pack("<I", ((idx << 32) + len(names) - 1) // len(names))
    for f, t in shape[idx][1]:
        out += enc(t, fields[f])
    return out


def record(queues):
    """An inflight record: {queue: {"used": u16, "last": u16,
    "heads": {head: counter}}} (version 1); other queues zeros (fresh).
    Trailing zeros are left out (the target's memfd is zeroed)."""
    out = bytearray(2 * REGION)
    for q, r in queues.items():
        base = q * REGION
        struct.pack_into("<QHHHH", out, base, 0, 1, QUEUE_SIZE, r.get("last", 0), r.get("used", 0))
        for head, counter in r.get("heads", {}).items():
            at = base + 16 + 16 * head
            out[at] = 1
            struct.pack_into("<Q", out, at + 8, counter)
    return bytes(out).rstrip(b"\0")


def set_inflight(mmap_size=2 * REGION, offset_page=0, num_queues=2, pages=1, data=b"", fd=None):
    return ("SetInflight", {
        "mmap_size": mmap_size, "offset_page": offset_page, "num_queues": num_queues,
        "queue_size": QUEUE_SIZE, "pages": pages, "bytes": list(data), "fd": fd,
    })


def prelude(data, iommu=False, event_idx=True):
    """The target's set-up: vring 0 of 8 started on a 4-page region with
    one request (head 0: readable 64 bytes, then writable 64) available,
    INFLIGHT_SHMFD negotiated and `data` given back as the record."""
    return {"iommu": iommu, "event_idx": event_idx, "fill": 0, "inflight": list(data)}


def restart(idx=0):
    """Stop the vring (its worker returns) and start it again: the record
    is recovered a second time on the same connection."""
    return [("VringEnable", {"idx": idx, "on": False}), ("VringEnable", {"idx": idx, "on": True}),
            ("Kick", {"idx": idx})]


def desc(addr, length, flags, nxt):
    return list(struct.pack("<QIHH", addr, length, flags, nxt))


def second_vring():
    """Vring 1 on the prelude's region: descriptor table at 0x1800,
    available ring at 0x1c00 (head 0 available), used ring at 0x2800;
    head 0 reads 64 bytes at 0x3200 and writes 64 at 0x3300."""
    table = desc(0x3200, 64, 1, 1) + desc(0x3300, 64, 2, 0)
    return [
        ("Poke", {"region": 0, "at": 0x1800, "bytes": table}),
        ("Poke", {"region": 0, "at": 0x1c00, "bytes": [0, 0, 1, 0, 0, 0]}),
        ("VringNum", {"idx": 1, "num": QUEUE_SIZE}),
        ("VringAddr", {"idx": 1, "desc": 0x180, "used": 0x280, "avail": 0x1c0, "iova": False}),
        ("VringBase", {"idx": 1, "base": 0, "get": False}),
        ("VringKick", {"idx": 1, "fd": "Event"}),
        ("VringCall", {"idx": 1, "fd": "Event"}),
        ("VringEnable", {"idx": 1, "on": True}),
        ("Kick", {"idx": 1}),
    ]


# No prelude: negotiate INFLIGHT_SHMFD and REPLY_ACK, then the messages.
NEGOTIATE = ["SetOwner", ("SetProtocolFeatures", {"bits": (1 << 12) | (1 << 3)})]
HEAD0 = record({0: {"heads": {0: 0}}})

CASES = {
    # Head 0 in flight: resubmitted at start, then the queue restarts.
    "restart-q0": (prelude(HEAD0), [("Kick", {"idx": 0})] + restart()),
    "restart-q0-iommu": (prelude(HEAD0, iommu=True), [("Kick", {"idx": 0})] + restart()),
    # The last back end died after moving the used index from 0xffff to 0
    # (the ring's) and before updating the record: head 0
    # (last_batch_head) is done, head 3 is resubmitted.
    "used-moved": (
        prelude(record({0: {"used": 0xFFFF, "last": 0, "heads": {0: 0, 3: 1}}})),
        [("Kick", {"idx": 0})] + restart(),
    ),
    # Queue 1's heads in its own region (queue 0 fresh), oldest first 1, 0.
    "two-queues": (prelude(record({1: {"heads": {0: 5, 1: 4}}})), second_vring() + restart(1)),
    "hostile-ones": (prelude(bytes([1] * 2 * REGION)), [("Kick", {"idx": 0})] + restart()),
    "hostile-ff": (prelude(bytes([0xff] * 2 * REGION)), restart()),
    # The record replaced on a live connection, then reset.
    "replace": (None, NEGOTIATE + [
        ("GetInflight", {"num_queues": 2, "queue_size": QUEUE_SIZE}),
        set_inflight(data=HEAD0),
        ("GetInflight", {"num_queues": 1, "queue_size": QUEUE_SIZE}),
        "ResetOwner",
        set_inflight(data=record({1: {"heads": {7: 0}}})),
    ]),
    # Refusals (each ends the connection).
    "too-small-for-two": (None, NEGOTIATE + [set_inflight(mmap_size=2 * REGION - 1)]),
    "offset-past-end": (None, NEGOTIATE + [set_inflight(offset_page=1)]),
    "empty-file": (None, NEGOTIATE + [set_inflight(pages=0)]),
    "pipe": (None, NEGOTIATE + [set_inflight(fd="Pipe")]),
    "socket": (None, NEGOTIATE + [set_inflight(fd="Socket")]),
    "eventfd": (None, NEGOTIATE + [set_inflight(fd="Event")]),
    "three-queues": (None, NEGOTIATE + [
        ("GetInflight", {"num_queues": 3, "queue_size": QUEUE_SIZE}),
    ]),
    "queue-too-big": (None, NEGOTIATE + [("GetInflight", {"num_queues": 2, "queue_size": 39})]),
}


def main():
    os.makedirs(CORPUS, exist_ok=True)
    written = []
    for case, (pre, msgs) in CASES.items():
        data = enc("Input", {"reply_ack": True, "prelude": pre, "msgs": msgs}, last=True)
        path = os.path.join(CORPUS, "inflight-" + case)
        with open(path, "wb") as f:
            f.write(data)
        written.append((path, case, msgs))
        print(f"{os.path.relpath(path)}: {len(data)} bytes, sha1 {hashlib.sha1(data).hexdigest()[:12]}")
    if "--check" not in sys.argv[1:]:
        return
    target_args = []
    if os.environ.get("CARGO_TARGET_DIR"):
        target_args = ["--target-dir", os.environ["CARGO_TARGET_DIR"] + "/fuzz-virtio"]
    for path, case, msgs in written:
        out = subprocess.run(
            ["cargo", "+nightly", "fuzz", "fmt", *target_args, TARGET, path],
            cwd=FUZZ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True,
        ).stdout
        # The messages: the names at the top indentation of `msgs`.
        decoded = re.findall(r"^ {8}(\w+)", out.split("\n    msgs: [", 1)[-1], re.M)
        want = [m if isinstance(m, str) else m[0] for m in msgs]
        if decoded != want:
            sys.exit(f"{case}: decoded messages {decoded}, wanted {want}\n{out}")
        print(f"{case}: decodes to {len(want)} messages as written")


if __name__ == "__main__":
    main()
