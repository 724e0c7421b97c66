#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel durations (gpu__time_duration.sum, --csv) by kernel name.

usage: ncu_summary.py NCU.csv [STEPS_PER_RUN]

The bench brackets STEPS_PER_RUN (default 2) decode steps of each run in turn. A step starts with
the token embedding gather (the first kernel of CudaModelRunner's step), so the rows are cut into
steps there and grouped into runs. Prints, per run, each kernel's count, total and mean
microseconds, and the run's total per step: the GPU time of a step with no gaps between kernels
(ncu runs them one at a time).
"""
import csv
import re
import sys
from collections import OrderedDict


def short_name(full):
    name = full.replace("(anonymous namespace)::", "").replace("lazyattn::", "")
    name = re.sub(r"\(.*$", "", name)  # drop the parameter list
    return re.sub(r"^void ", "", name)


def is_step_start(full):
    # The token embedding gather into the fp32 residual (EmbeddingGatherToF32Cuda).
    return re.search(r"GatherToF32Kernel<(__nv_)?bfloat16", full) is not None


def main(path, steps_per_run):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages start with ==
    steps = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = {"ns": value / 1e3, "nsecond": value / 1e3, "us": value, "usecond": value,
              "ms": value * 1e3, "msecond": value * 1e3}.get(unit, value / 1e3)
        if is_step_start(r["Kernel Name"]) or not steps:
            steps.append([])
        # The grid tells apart launches of one kernel on different shapes (cuBLASLt's GEMMs).
        steps[-1].append((f'{short_name(r["Kernel Name"])} {r.get("Grid Size", "")}', us))
    for i in range(0, len(steps), steps_per_run):
        run = steps[i:i + steps_per_run]
        kernels = OrderedDict()
        for step in run:
            for name, us in step:
                count, total = kernels.get(name, (0, 0.0))
                kernels[name] = (count + 1, total + us)
        total = sum(t for _, t in kernels.values())
        print(f"run {i // steps_per_run}: {len(run)} steps, {sum(len(s) for s in run)} kernels, "
              f"{total / len(run):.1f} us a step")
        for name, (count, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
            print(f"  {t / len(run):9.1f} us/step {count // len(run):5d} x {t / count:8.2f} us  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
