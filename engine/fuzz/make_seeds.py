#!/usr/bin/env python3
"""Writes small valid GGUF files to seed the `gguf` fuzz target.

    python3 engine/fuzz/make_seeds.py MODEL.gguf OUT_DIR

A prefix of a real model never parses (the default model's header and metadata alone are
1.78 MB, over any useful -max_len), so each seed keeps the model's metadata with every
array cut to 8 items, and its first 0, 3, 12 or 30 tensor infos with shrunken shapes and
patterned data. Seeds are 2-5 KB; pass -max_len=70000 to the fuzzer.
"""
import pathlib
import struct
import sys

# GGUF metadata value types -> struct codes (8 = string, 9 = array).
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
# Tensor types this project reads -> (values per block, bytes per block).
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34)}
ALIGN = 32


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, code):
        (v,) = struct.unpack_from("<" + code, self.data, self.pos)
        self.pos += struct.calcsize("<" + code)
        return v

    def string(self):
        n = self.take("Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, kind):
        if kind == 8:
            return self.string()
        if kind == 9:
            item = self.take("I")
            return item, [self.value(item) for _ in range(self.take("Q"))]
        return self.take(SCALARS[kind])


def string(s):
    return struct.pack("<Q", len(s)) + s


def value(kind, v):
    if kind == 8:
        return string(v)
    if kind == 9:
        item, items = v
        items = items[:8]
        return struct.pack("<IQ", item, len(items)) + b"".join(value(item, x) for x in items)
    return struct.pack("<" + SCALARS[kind], v)


def read_header(path):
    with open(path, "rb") as f:
        r = Reader(f.read(8 << 20))
    if r.data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        kind = r.take("I")
        kvs.append((key, kind, r.value(kind)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        kind = r.take("I")
        r.take("Q")  # offset: recomputed
        tensors.append((name, dims, kind))
    return version, kvs, tensors


def seed(version, kvs, tensors, rows):
    infos, data = b"", b""
    for name, dims, kind in tensors:
        per_block, block_bytes = BLOCKS.get(kind, (1, 4))
        shape = [per_block if per_block > 1 else 8] + ([rows] if len(dims) > 1 else [])
        count = shape[0] * (shape[1] if len(shape) > 1 else 1)
        size = count // per_block * block_bytes
        infos += string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", kind if kind in BLOCKS else 0, len(data))
        data += bytes((i * 7) & 0xFF for i in range(size))
        data += b"\0" * (-len(data) % ALIGN)
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    out += b"".join(string(k) + struct.pack("<I", t) + value(t, v) for k, t, v in kvs)
    out += infos
    out += b"\0" * (-len(out) % ALIGN)
    return out + data


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    version, kvs, tensors = read_header(sys.argv[1])
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for n, rows in [(0, 1), (3, 2), (12, 2), (30, 1)]:
        data = seed(version, kvs, tensors[:n], rows)
        (out / f"seed-{n}-tensors.gguf").write_bytes(data)
        print(f"seed-{n}-tensors.gguf: {len(data)} bytes")


if __name__ == "__main__":
    main()
