"""What the CLI's exit tests (bad_flag_exit_test.py, bad_model_exit_test.py, doc_file_test.py,
input_files_test.py) share: finding the programs under test, the line a refusal is judged by, the
verdict line of each case and of the run, and the memory limit of a child."""
import argparse
import os
import resource
import shutil
import sys
import tempfile


def programs(bin_dir, names):
    """The paths of `names` in `bin_dir`, or None (after saying which is missing)."""
    paths = [os.path.join(bin_dir, n) for n in names]
    for p in paths:
        if not os.access(p, os.X_OK):
            print(f"{p} is missing: build it first", file=sys.stderr)
            return None
    return paths


def last_line(stderr):
    """The last line of a child's stderr: where the CLI prints why it refused (CliFail)."""
    stderr = stderr.strip()
    return stderr.splitlines()[-1] if stderr else ""


def report(ok, label, rc, last, width=160):
    """Prints one case's verdict; returns 1 for a failure, 0 otherwise (to add up)."""
    print(f"{'ok  ' if ok else 'FAIL'} {label} exit {rc}: {last[:width]}")
    return 0 if ok else 1


def finish(failures):
    """The test's exit code: 1 when any case failed (said on stderr), else 0."""
    if failures:
        print(f"{failures} failures", file=sys.stderr)
        return 1
    return 0


def limit_memory():
    """A child's preexec_fn: 4 GiB of address space, so a regression that reads /dev/zero dies
    (and fails its test) instead of exhausting the machine."""
    n = 4 << 30
    resource.setrlimit(resource.RLIMIT_AS, (n, n))


def main_with_lazyattn(prefix, run_cases):
    """A test's main(): `--bin-dir BUILD/bin`, then run_cases(lazyattn, tmp) with the lazyattn
    program and a fresh folder (removed after); its return value is the exit code."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    found = programs(args.bin_dir, ["lazyattn"])
    if found is None:
        return 1
    lazyattn, = found
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        return run_cases(lazyattn, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
