#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer targets into tests/fuzz/corpus/<target>/.

Seeds are small, well-formed inputs in each target's input format (see the comment at the top of
each fuzz_*.cpp) plus one of each malformation the decoder must reject, so the fuzzer starts from
inputs that reach every branch. Deterministic: re-running rewrites the same files. Regression
inputs for bugs the fuzzer found are listed in REGRESSIONS and kept under the same directories.

    python3 tests/fuzz/make_corpus.py
"""
import math
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")

HEADER = 24  # u64 count, u32 status, u32 reporter, u32 source, u32 round
INDEX = {0: ("<I", 4), 1: ("<Q", 8)}  # variant bit 0
VALUE = {0: "f32", 1: "f16", 2: "bf16"}  # (variant >> 1) % 3


def value_bytes(kind, x):
    if kind == "f32":
        return struct.pack("<f", x)
    if kind == "f16":
        return struct.pack("<e", x)
    bits = struct.unpack("<I", struct.pack("<f", x))[0]  # bf16: the top half, round to nearest even
    if math.isnan(x):
        return struct.pack("<H", 0x7FFF)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.pack("<H", (bits >> 16) & 0xFFFF)


def value_size(kind):
    return 4 if kind == "f32" else 2


def message(variant, k, entries, count=None, status=0):
    """A Top-k message of capacity k holding (index, value) entries."""
    fmt, isz = INDEX[variant & 1]
    kind = VALUE[(variant >> 1) % 3]
    n = len(entries) if count is None else count
    out = struct.pack("<QIIII", n, status, 0, 0, 0)
    idx = b"".join(struct.pack(fmt, i) for i, _ in entries) + b"\0" * (isz * (k - len(entries)))
    val = b"".join(value_bytes(kind, v) for _, v in entries) + b"\0" * (value_size(kind) * (k - len(entries)))
    return out + idx + val


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def decode_seeds():
    t = "fuzz_sparse_decode"
    for variant in range(6):
        tag = f"i{'64' if variant & 1 else '32'}_{VALUE[(variant >> 1) % 3]}"
        lo, span = 100, 1000
        pre = struct.pack("<BHH", variant, lo, span - 1)
        good = [(100, 1.5), (107, -2.0), (512, 65504.0), (1099, 1e-3)]
        write(t, f"ok_{tag}", pre + message(variant, 6, good))
        write(t, f"ok_full_{tag}", pre + message(variant, 4, good))
        write(t, f"ok_empty_{tag}", pre + message(variant, 3, []))
        write(t, f"ok_inf_{tag}", pre + message(variant, 2, [(150, math.inf), (151, -math.inf)]))
        write(t, f"bad_count_{tag}", pre + message(variant, 4, good, count=5))
        write(t, f"bad_index_high_{tag}", pre + message(variant, 4, [(100, 1.0), (1100, 1.0)]))
        write(t, f"bad_index_low_{tag}", pre + message(variant, 4, [(99, 1.0)]))
        write(t, f"bad_duplicate_{tag}", pre + message(variant, 4, [(200, 1.0), (200, 2.0)]))
        write(t, f"bad_order_{tag}", pre + message(variant, 4, [(300, 1.0), (200, 2.0)]))
        write(t, f"bad_nan_{tag}", pre + message(variant, 4, [(200, 1.0), (201, math.nan)]))
        write(t, f"bad_status_{tag}", pre + message(variant, 4, good, status=2))
    # A 64-bit index whose low 32 bits are in range: must be rejected, never truncated.
    write(t, "bad_index_wide_i64_f32", struct.pack("<BHH", 1, 0, 999) + message(1, 2, [(1 << 32 | 5, 1.0)]))


def merge_seeds():
    t = "fuzz_sparse_merge"
    for variant in range(6):
        tag = f"i{'64' if variant & 1 else '32'}_{VALUE[(variant >> 1) % 3]}"
        kind = VALUE[(variant >> 1) % 3]
        lo, span, k = 10, 5000, 4
        a = [(10, 3.0), (20, -1.0), (30, 0.25), (4000, 7.0)]
        b = [(20, 1.0), (25, -8.0), (30, 0.3333), (5009, 2.0)]
        pre = struct.pack("<BBHHB", variant, 0, lo, span - 1, k - 1)
        write(t, f"raw_{tag}", pre + message(variant, k, a) + message(variant, k, b))
        write(t, f"raw_disjoint_{tag}", pre + message(variant, k, a[:2]) + message(variant, k, [(40, 9.0)]))
        write(t, f"raw_cancel_{tag}", pre + message(variant, k, [(50, math.inf)]) + message(variant, k, [(50, -math.inf)]))
        # Built mode: [count u8][count x (gap u16, value)] per list.
        def built(entries):
            return struct.pack("<B", len(entries)) + b"".join(struct.pack("<H", g) + value_bytes(kind, v) for g, v in entries)
        pre = struct.pack("<BBHHB", variant, 1, lo, span - 1, 7)
        write(t, f"built_{tag}", pre + built([(0, 1.0), (3, -2.0), (0, 4.0), (9, 0.5)]) + built([(1, 3.0), (2, -2.0), (5, 65000.0)]))
        write(t, f"built_ties_{tag}", pre + built([(0, 1.0)] * 8) + built([(0, -1.0)] * 8))


def oktopk_seeds():
    """OkTopK blocks: capacity == count, announced ahead (fuzz_oktopk_block.cpp's input format)."""
    t = "fuzz_oktopk_block"
    for variant in range(6):
        tag = f"i{'64' if variant & 1 else '32'}_{VALUE[(variant >> 1) % 3]}"
        lo, span = 100, 1000
        good = [(100, 1.5), (107, -2.0), (512, 65504.0), (1099, 1e-3)]
        def pre(announced, cap=8):
            return struct.pack("<BHHHH", variant, lo, span - 1, announced, cap)
        write(t, f"ok_{tag}", pre(4) + message(variant, 4, good))
        write(t, f"ok_empty_{tag}", pre(0) + message(variant, 0, []))
        write(t, f"bad_over_cap_{tag}", pre(4, cap=3) + message(variant, 4, good))
        write(t, f"bad_header_count_{tag}", pre(4) + message(variant, 4, good, count=3))
        write(t, f"bad_short_{tag}", pre(4) + message(variant, 4, good)[:-1])
        write(t, f"bad_index_{tag}", pre(2) + message(variant, 2, [(100, 1.0), (1100, 1.0)]))
        write(t, f"bad_order_{tag}", pre(2) + message(variant, 2, [(300, 1.0), (200, 2.0)]))
        write(t, f"bad_nan_{tag}", pre(2) + message(variant, 2, [(200, 1.0), (201, math.nan)]))
        write(t, f"bad_status_{tag}", pre(4) + message(variant, 4, good, status=2))


LAYOUT_SEEDS = {
    "one_row": "w\t4\t4\n",
    "comments_crlf": "# header\r\n# name\tshape\tnumel\r\nconv.weight\t64x3x7x7\t9408\r\nconv.bias\t64\t64\r\n",
    "no_final_newline": "a\t2x3\t6\nb\t5\t5",
    "bad_columns": "a\t2x3\n",
    "bad_extra_column": "a\t2\t2\textra\n",
    "bad_numel": "a\t2x3\t7\n",
    "bad_digit": "a\t2xq\t2\n",
    "bad_empty_dim": "a\t2x\t2\n",
    "bad_empty_name": "\t2\t2\n",
    "bad_zero": "a\t0\t0\n",
    "bad_overflow": "a\t4294967296x4294967296\t0\n",
    "bad_only_comments": "# nothing\n\n",
}


def layout_seeds():
    t = "fuzz_layout_tsv"
    for name, text in LAYOUT_SEEDS.items():
        write(t, name, text.encode())
    for f in ("alexnet.tsv", "vgg16.tsv"):  # two real layouts, small enough to mutate quickly
        shutil.copy(os.path.join(ROOT, "bench", "layouts", f), os.path.join(CORPUS, t, f))


# Inputs the fuzzer found that exposed a bug (kept after the fix; each also has a unit test).
REGRESSIONS = {
    # Two tensors of 2^63 elements: the pool's element count wrapped to 0 and the layout was
    # accepted (fixed in Layout::validate; unit test E13 in tests/test_errors.cpp).
    ("fuzz_layout_tsv", "regression_total_overflow"):
        b"a\t9223372036854775808\t9223372036854775808\nb\t9223372036854775808\t9223372036854775808\n",
}


def regressions():
    for (target, name), data in REGRESSIONS.items():
        write(target, name, data)


if __name__ == "__main__":
    for d in ("fuzz_sparse_decode", "fuzz_sparse_merge", "fuzz_oktopk_block", "fuzz_layout_tsv"):
        shutil.rmtree(os.path.join(CORPUS, d), ignore_errors=True)
    decode_seeds()
    merge_seeds()
    oktopk_seeds()
    layout_seeds()
    regressions()
    for d in sorted(os.listdir(CORPUS)):
        print(d, len(os.listdir(os.path.join(CORPUS, d))), "seeds")
