"""Mutation fuzzer of lowbit's safetensors reader and command line.

Case i of a run is generated from np.random.default_rng([seed, i]) alone: a small valid
checkpoint (written with lowbit's writer; float tensors, or a lowbit-quantized checkpoint made
by `lowbit quantize`), one mutation of its bytes, its header JSON or its "lowbit" metadata, then

  * the reader (SafetensorsFile + every tensor read) in-process: it returns or raises
    SafetensorsError; a mutation that makes the file invalid (duplicate names, overlapping or
    out-of-range offsets, nested JSON, ...) must be refused;
  * the command line (lowbit.cli.main, in-process): exit status 0, or non-zero with one line on
    stderr and no traceback; a file the reader must refuse, or an inconsistent "lowbit" entry,
    must not be accepted; nothing is written in the output directory except the named output
    (no temporary file left), the input is unchanged;
  * every CLI_EVERY-th case also as `python -m lowbit ...` in a subprocess (signals, hangs).

The first cases are fixed scenarios of KNOWN_FILES (paths that are not regular files, --report
clashes, existing outputs, signals, truncation while reading, large headers). A case that kills
the worker (SIGSEGV / SIGBUS, sanitizer report) is recorded and the run goes on
(fuzzlib.run_fuzz).

    python tests/python/fuzzfiles.py --seed 1 --replay 17

This file is the entry point (worker, runner, command line) and re-exports its parts, so
`import fuzzfiles` gives every name: fuzzfiles_cases (checkpoints, mutations, run_case) and
fuzzfiles_scenarios (the fixed scenarios, KNOWN_FILES).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fuzzlib  # noqa: E402
from fuzzfiles_cases import (  # noqa: E402, F401
    Case, check_dir, check_nan_table, cli_argv, CLI_EVERY, CLI_FORMATS, float_checkpoint,
    fuzzlib_itemsize, join, judge_cli, _listing, _lowbit_env, make_case, mutate_bytes, mutate_header,
    mutate_lowbit_meta, quantized_checkpoint, run_case, run_cli_inprocess, run_reader, sha, split
)
from fuzzfiles_scenarios import (  # noqa: E402, F401
    _cli, _edit_lowbit, KNOWN_FILES, _quantized, sc_duplicate_names, sc_existing_output, sc_input_fifo,
    sc_large_header, sc_nan_table, sc_nested_json, sc_null_global_amax, sc_output_fifo,
    sc_output_symlink_devnull, sc_report_is_input, sc_report_is_output, sc_report_missing_dir,
    sc_report_tmp_symlink, sc_shared_qdata, sc_sighup, sc_sigterm, sc_truncated_while_reading,
    _signal_case, _small_input
)


class KnownCase:
    def __init__(self, note, fn):
        self.note, self.fn = note, fn

    def describe(self):
        return f"scenario: {self.note}"


def get_case(seed, i):
    if i < len(KNOWN_FILES):
        return KnownCase(*KNOWN_FILES[i])
    return make_case(seed, i - len(KNOWN_FILES))


def run_any(case, i):
    if isinstance(case, KnownCase):
        d = tempfile.mkdtemp(prefix="lowbit-fuzz-sc-")
        try:
            return case.fn(d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return run_case(case, subprocess_cli=CLI_EVERY > 0 and i % CLI_EVERY == 0)


def worker(seed, start, stop, deadline, out=sys.stdout):
    import faulthandler
    import traceback

    faulthandler.enable()
    i = start
    while i < stop and (i < len(KNOWN_FILES) or time.time() < deadline):
        out.write(f"B {i}\n")
        out.flush()
        desc = f"case {i}"
        try:
            case = get_case(seed, i)
            desc = case.describe()
            findings = run_any(case, i)
        except Exception as e:  # noqa: BLE001
            findings = [("harness_error", f"{type(e).__name__}: {e} | {traceback.format_exc(limit=4)[-400:]}")]
        for cat, msg in findings:
            out.write("F " + json.dumps({"i": i, "cat": cat, "msg": msg, "call": desc}) + "\n")
        i += 1
    out.write(f"DONE {i}\n")
    out.flush()


def describe_index(seed, i):
    try:
        return get_case(seed, i).describe()
    except Exception as e:  # noqa: BLE001
        return f"case {i} ({type(e).__name__})"


def run_file_fuzz(seed=0, seconds=60.0, files=None, **kw):
    kw.setdefault("min_items", len(KNOWN_FILES))
    return fuzzlib.run_fuzz(os.path.abspath(__file__), describe_index, seed, seconds, files, **kw)


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=fuzzlib.env_int("LOWBIT_FUZZ_SEED", 0))
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--stop", type=int, default=1 << 62)
    ap.add_argument("--deadline", type=float, default=0.0)
    ap.add_argument("--replay", type=int, action="append", default=[])
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.seed, a.start, a.stop, a.deadline or time.time() + 3600)
        return 0
    if a.replay:
        for i in a.replay:
            case = get_case(a.seed, i)
            print(f"#{i} {case.describe()}")
            for cat, msg in run_any(case, i) or [("ok", "")]:
                print(f"  {cat}: {msg}")
        return 0
    s = run_file_fuzz(a.seed, a.seconds, a.files)
    print(s.report(a.seed, limit=20))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"files": s.calls, "seed": a.seed, "findings": s.findings}, fh, indent=1)
    return 1 if s.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
