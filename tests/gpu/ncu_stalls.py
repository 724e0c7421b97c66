#!/usr/bin/env python3
"""Sums Nsight Compute's per-instruction stall samples (the source page exported as CSV by
tests/gpu/ncu_source.sh) for one kernel: the share of samples by stall reason and by opcode, the
instructions with the most samples, and optionally the share of address ranges named on the
command line (to split a loop into its phases by reading the SASS beside it).

  ncu_stalls.py SASS_CSV [--kernel N] [--top K] [--range HEX=NAME ...]

A range starts at the low 20 bits of its address (as the SASS listing prints them) and runs to the
next range's start; samples are every warp's, producer and consumer alike, so a phase's share is
of the whole kernel's samples. ncu's CSV lists each profiled kernel twice, the same rows under the
same name: with ncu_source.sh's products, kernels 0, 2, 4 and 6 are qkv, o, gate/up and down.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(path):
    """Yields (kernel name line, rows as dicts) for each kernel in the CSV."""
    blocks, current = [], None
    with open(path, newline="") as f:
        for line in f:
            if line.startswith('"Kernel Name"'):
                current = [line]
                blocks.append(current)
            elif current is not None:
                current.append(line)
    for block in blocks:
        rows = list(csv.reader(block[1:]))
        header = rows[0]
        yield block[0].strip(), [dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)]


def number(row, column):
    value = row.get(column, "")
    return float(value) if value not in ("", None) else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--kernel", type=int, default=0, help="which kernel of the file (0 first)")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--range", action="append", default=[], metavar="HEX=NAME")
    args = parser.parse_args()
    found = list(kernels(args.csv))
    if not found or args.kernel >= len(found):
        sys.exit(f"{args.csv}: no kernel {args.kernel} (it holds {len(found)})")
    name, rows = found[args.kernel]
    if not rows or SAMPLES not in rows[0]:
        sys.exit(f"{args.csv}: no '{SAMPLES}' column (was SourceCounters collected?)")
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(number(r, SAMPLES) for r in rows)
    if total <= 0:
        sys.exit(f"{args.csv}: no samples")
    print(name[:200])
    print(f"instructions {len(rows)}, samples {total:.0f}")
    by_reason = collections.Counter({c[6:]: sum(number(r, c) for r in rows) for c in reasons})
    print("by reason: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_reason.most_common(10)))
    by_opcode = collections.Counter()
    for r in rows:
        words = r.get("Source", "").split()
        opcode = words[1] if words and words[0].startswith("@") and len(words) > 1 else (
            words[0] if words else "")
        by_opcode[opcode.split(".")[0]] += number(r, SAMPLES)
    print("by opcode: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_opcode.most_common(12)))
    if args.range:
        cuts = sorted((int(c.split("=")[0], 16), c.split("=", 1)[1]) for c in args.range)
        share = collections.Counter()
        for r in rows:
            low = int(r["Address"], 16) & 0xFFFFF
            owner = "(before the first range)"
            for start, label in cuts:
                if low >= start:
                    owner = label
            share[owner] += number(r, SAMPLES)
        for _, label in cuts:
            print(f"  {label:32s} {share[label] / total:6.1%}")
    print(f"top {args.top} instructions (share of samples, times executed, top reasons):")
    for r in sorted(rows, key=lambda r: -number(r, SAMPLES))[: args.top]:
        top = sorted(((number(r, c), c[6:]) for c in reasons), reverse=True)[:3]
        print(f"  {int(r['Address'], 16) & 0xFFFFF:05x} {number(r, SAMPLES) / total:6.2%} "
              f"{r.get('Instructions Executed', ''):>10} {r.get('Source', '').strip()[:56]:56s} "
              + " ".join(f"{n} {v / total:.2%}" for v, n in top if v))


if __name__ == "__main__":
    main()
