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

import os
import shutil
import sys
import tempfile

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

    def one(i):
        desc = f"case {i}"
        try:
            case = get_case(seed, i)
            desc = case.describe()
            return desc, run_any(case, i)
        except Exception as e:  # noqa: BLE001
            return desc, [("harness_error", f"{type(e).__name__}: {e} | {traceback.format_exc(limit=4)[-400:]}")]

    fuzzlib.serve(start, stop, deadline, len(KNOWN_FILES), one, out)


def describe_index(seed, i):
    try:
        return get_case(seed, i).describe()
    except Exception as e:  # noqa: BLE001
        return f"case {i} ({type(e).__name__})"


def run_file_fuzz(seed=0, seconds=60.0, files=None, **kw):
    kw.setdefault("min_items", len(KNOWN_FILES))
    return fuzzlib.run_fuzz(os.path.abspath(__file__), describe_index, seed, seconds, files, **kw)


def replay(seed, i):
    case = get_case(seed, i)
    print(f"#{i} {case.describe()}")
    for cat, msg in run_any(case, i) or [("ok", "")]:
        print(f"  {cat}: {msg}")


def main(argv=None):
    return fuzzlib.cli(argv, __doc__, "files", worker, replay, run_file_fuzz)


if __name__ == "__main__":
    raise SystemExit(main())
