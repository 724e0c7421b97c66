"""What the CLI's exit tests (bad_flag_exit_test.py, bad_model_exit_test.py, doc_file_test.py)
share: finding the programs under test, the line a refusal is judged by, and the verdict line of
each case and of the run."""
import os
import sys


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
