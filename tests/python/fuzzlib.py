"""Seeded random-call fuzzer over lowbit's public Python API (NumPy inputs, CPU reference).

Every call i of a run is generated from np.random.default_rng([seed, i]) alone, so a finding is
reproduced by its (seed, index):

    python tests/python/fuzzlib.py --seed 1 --replay 1234      # prints the call and its verdict

A call is a valid call (random odd shapes, every format / layout / dtype) or a mutated one
(wrong dtypes or shapes, negative / huge integers, floats where integers are expected,
NaN / Inf, read-only outputs, misaligned, Fortran-ordered, strided or stride-0 views, bool
arrays, None, strings). Oracles:

  a) a call succeeds or raises lowbit's own error (ValueError / NotImplementedError) whose
     message names an argument ("op: argument 'name': ...");
  b) a refused call changes none of its array arguments (snapshots before and after);
  c) a successful call's result equals the independent NumPy reference (npref.py and the
     decoders of fuzzlib_checks.py), or, for a mutated storage (Fortran, strided, misaligned), the result of the
     same call on contiguous copies; a read-only array is never written;
  d) no crash: the calls run in a worker process; a signal or a sanitizer report ends the worker,
     the finding is recorded and the run goes on from the next call (run_api_fuzz).

Categories of findings: see CATEGORIES. The first calls of every run are the fixed repros of
KNOWN (the defects listed when the fuzzer was written), then random calls.

This file is the entry point (worker, runner, command line) and re-exports its parts, so
`import fuzzlib` gives every name: fuzzlib_core (categories, Call, snapshots, run_call),
fuzzlib_checks (decoders, checks, random inputs), fuzzlib_specs (Spec, mutate),
fuzzlib_gen_formats and fuzzlib_gen_ops (the generators of valid calls, make_call) and
fuzzlib_known (the fixed repros, get_call).
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
import traceback

from fuzzlib_core import (  # noqa: F401
    ARG_RE, _arrays, BF16, Call, CATEGORIES, changed, describe, E2M1, E4M3, E5M2, E8M0, F32, FLOAT_IN,
    FORMAT_INFO, HERE, LAYOUT_NAMES, lowbit_errors, NF4, run_call, _same, SANITIZER_RE, snapshot
)
from fuzzlib_checks import (  # noqa: F401
    check_dequantized, check_roundtrip, compare, decode, element_values, grouped_to_layout,
    grouped_unlayout, huge_view, layout_offsets, _MEMMAPS, misaligned_copy, odd_dim, out_tolerance,
    pick, quant_error_bound, rand_x, readonly, readonly_memmap, reversed_view, _round_to, round_up,
    same_bytes, scale_values, STORAGE, stored_dims, strided_copy, to_layout, unlayout, unpack
)
from fuzzlib_specs import (  # noqa: F401
    CHOICE_BAD, _compare_results, EPS_BAD, _hashable_in, INT_BAD, _metamorphic, mutate, mutate_indptr,
    Spec
)
from fuzzlib_gen_formats import (  # noqa: F401
    CAST_DT, check_quantized, FMAX, gen_cast, gen_convert_layout, gen_convert_raw, gen_dequantize,
    gen_interleave, gen_quantize, gen_quantize_special, gen_scale_shape, gen_transcode, _lb,
    random_format_kwargs, reference_quantize, scale_shape_formula, _valid_qt
)
from fuzzlib_gen_ops import (  # noqa: F401
    _e2m1_codes, gen_amax, gen_dual_gemm, gen_entry, gen_format, gen_group_gemm, gen_group_prepack,
    gen_moe, gen_nf4k, gen_nf4k_dequant, gen_prepack, GENERATORS, make_call, _WEIGHTS
)
from fuzzlib_known import (  # noqa: F401
    _check_nonneg, _finite_blocks_check, get_call, _known_calls, known_count, _nf4_inf_check,
    _race_m_indptr, _sqnr_check
)


# ---------------------------------------------------------------------------------------------
# Worker (one process, many calls) and the runner that restarts it after a crash

def worker(seed, start, stop, deadline, out=sys.stdout):
    """Runs calls [start, stop) until the wall-clock deadline; one line per call on `out`:
    "B i" before it, "F {json}" per finding; "DONE n" at the end."""
    import faulthandler

    faulthandler.enable()
    errors = lowbit_errors()
    known = _known_calls()

    def one(i):
        try:
            call = get_call(seed, i, known)
            return call.describe(), run_call(call, errors)
        except Exception as e:  # noqa: BLE001 - a fuzzer bug: report it, go on
            return f"call {i}", [("harness_error", f"{type(e).__name__}: {e} | {traceback.format_exc(limit=3)[-300:]}")]

    return serve(start, stop, deadline, len(known), one, out)


def serve(start, stop, deadline, n_known, one, out):
    """A worker's loop (this file's and fuzzfiles.py's): items [start, stop), the n_known fixed ones
    whatever the deadline, one(i) -> (description, findings) each; "B i" before an item, "F {json}"
    per finding, "DONE n" at the end. Returns n."""
    i = start
    while i < stop and (i < n_known or time.time() < deadline):
        out.write(f"B {i}\n")
        out.flush()
        desc, findings = one(i)
        for cat, msg in findings:
            out.write("F " + json.dumps({"i": i, "cat": cat, "msg": msg, "call": desc}) + "\n")
        i += 1
    out.write(f"DONE {i}\n")
    out.flush()
    return i


class Summary:
    def __init__(self):
        self.calls = 0
        self.findings = []  # dicts: i, cat, msg, call
        self.restarts = 0

    def by_category(self):
        out = {}
        for f in self.findings:
            out.setdefault(f["cat"], []).append(f)
        return out

    def report(self, seed, limit=6):
        lines = [f"{self.calls} calls (seed {seed}), {len(self.findings)} findings, {self.restarts} worker restarts"]
        for cat, fs in sorted(self.by_category().items()):
            lines.append(f"  {cat} ({len(fs)}): {CATEGORIES.get(cat, '')}")
            seen = set()
            shown = 0
            for f in fs:
                key = (f["call"].split("(")[0], f["msg"][:40])
                if key in seen:
                    continue
                seen.add(key)
                lines.append(f"    #{f['i']} {f['call'][:200]}")
                lines.append(f"        -> {f['msg'][:300]}")
                shown += 1
                if shown >= limit:
                    break
        return "\n".join(lines)



def fail_message(run, category, seed, unit, key, call_width):
    """The failure text of a fuzz test (test_fuzz.py, test_fuzz_files.py) for the findings of
    `category` in a run of `unit` ("calls", "files"): their count, then the first 25 that differ
    by key(finding), each call (call_width characters at most) and message."""
    fs = run.by_category().get(category, [])
    lines = [f"{len(fs)} findings of category {category!r} ({CATEGORIES[category]}) in {run.calls} {unit}, "
             f"seed {seed}:"]
    seen = set()
    for f in fs:
        k = key(f)
        if k in seen:
            continue
        seen.add(k)
        lines.append(f"  #{f['i']} {f['call'][:call_width]}\n      -> {f['msg'][:300]}")
        if len(seen) >= 25:
            break
    return "\n".join(lines)

def _worker_cmd(script, seed, start, stop, deadline):
    return [sys.executable, script, "--worker", "--seed", str(seed), "--start", str(start),
            "--stop", str(stop), "--deadline", repr(deadline)]


def run_api_fuzz(seed=0, seconds=60.0, calls=None, **kw):
    """Runs the API fuzzer in worker processes for `seconds` (or exactly `calls` calls, the known
    repros included); returns a Summary."""
    kw.setdefault("min_items", known_count())
    return run_fuzz(os.path.abspath(__file__), _describe_index, seed, seconds, calls, **kw)


def run_fuzz(script, describe_fn, seed=0, seconds=60.0, calls=None, call_timeout=180.0, env=None,
             max_restarts=500, log=None, min_items=0):
    """Runs `script --worker` processes for `seconds` (or exactly `calls` items); returns a
    Summary. A worker that dies is a finding (crash / sanitizer) and a new worker goes on after
    the item that killed it."""
    _describe_index = describe_fn  # noqa: N806
    summ = Summary()
    deadline = time.time() + (seconds if calls is None else 10 ** 7)
    stop = calls if calls is not None else 1 << 62
    start = 0
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    while start < stop and (start < min_items or time.time() < deadline) and summ.restarts <= max_restarts:
        p = subprocess.Popen(_worker_cmd(script, seed, start, stop, deadline), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env)
        cur, done, stray = None, None, []
        buf = b""
        last = time.time()
        while True:
            r, _, _ = select.select([p.stdout], [], [], 1.0)
            if r:
                chunk = os.read(p.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                buf += chunk
                last = time.time()
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    if line.startswith("B "):
                        cur = int(line[2:])
                        stray = []
                    elif line.startswith("F "):
                        summ.findings.append(json.loads(line[2:]))
                        if log:
                            log(summ.findings[-1])
                    elif line.startswith("DONE "):
                        done = int(line[5:])
                    else:
                        stray.append(line)
                        if SANITIZER_RE.search(line) and cur is not None and not any(
                                f["i"] == cur and f["cat"] == "sanitizer" for f in summ.findings):
                            summ.findings.append({"i": cur, "cat": "sanitizer", "msg": line.strip()[:300],
                                                  "call": _describe_index(seed, cur)})
            elif time.time() - last > call_timeout:
                p.kill()
                summ.findings.append({"i": cur, "cat": "hang", "msg": f"no progress for {call_timeout:.0f} s",
                                      "call": _describe_index(seed, cur)})
                break
        rc = p.wait()
        if done is not None:
            summ.calls += done - start
            start = done
            break_now = True
        else:
            summ.restarts += 1
            if cur is None:
                summ.findings.append({"i": start, "cat": "harness_error", "msg": f"worker exited {rc}: "
                                      + " | ".join(stray[-5:])[:500], "call": "-"})
                break
            text = "\n".join(stray)
            m = SANITIZER_RE.search(text)
            if not any(f["i"] == cur and f["cat"] in ("sanitizer", "hang") for f in summ.findings):
                cat = "sanitizer" if m else "crash"
                how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
                key = [s.strip() for s in stray if re.search(r"Fatal Python error|ERROR|runtime error|SUMMARY|Bus error", s)]
                tail = key[:3] or [s for s in stray if s.strip() and not s.lstrip().startswith("#")][-3:]
                summ.findings.append({"i": cur, "cat": cat, "msg": f"worker died ({how}): "
                                      + " | ".join(tail)[:400], "call": _describe_index(seed, cur)})
            summ.calls += cur + 1 - start
            start = cur + 1
            break_now = False
        if break_now:
            break
    return summ


def _describe_index(seed, i):
    try:
        return get_call(seed, i).describe()
    except Exception as e:  # noqa: BLE001
        return f"call {i} ({type(e).__name__})"


def env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


def env_float(name, default):
    v = os.environ.get(name)
    return float(v) if v not in (None, "") else default


def _replay_call(seed, i):
    call = get_call(seed, i)
    print(f"#{i} {call.describe()}  (expect {call.expect})")
    fs = run_call(call)
    for cat, msg in fs:
        print(f"  {cat}: {msg}")
    if not fs:
        print("  ok")


def cli(argv, doc, count, worker_fn, replay_fn, run_fn):
    """The command line of a fuzzer (this file: API calls; fuzzfiles.py: files; `count` names its
    items, "calls" or "files"): --worker (a worker process of run_fuzz), --replay I (replay_fn(seed,
    I) prints item I and its findings), else a run (run_fn(seed, seconds, count)), its report and
    (--json FILE) the findings. Exit status 1 when there are findings."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--seed", type=int, default=env_int("LOWBIT_FUZZ_SEED", 0))
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--stop", type=int, default=1 << 62)
    ap.add_argument("--deadline", type=float, default=0.0)
    ap.add_argument("--replay", type=int, action="append", default=[])
    ap.add_argument(f"--{count}", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", metavar="FILE", help="write the findings as JSON")
    a = ap.parse_args(argv)
    if a.worker:
        worker_fn(a.seed, a.start, a.stop, a.deadline or time.time() + 3600)
        return 0
    if a.replay:
        for i in a.replay:
            replay_fn(a.seed, i)
        return 0
    s = run_fn(a.seed, a.seconds, getattr(a, count))
    print(s.report(a.seed, limit=20))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({count: s.calls, "seed": a.seed, "findings": s.findings}, fh, indent=1)
    return 1 if s.findings else 0


def main(argv=None):
    return cli(argv, __doc__, "calls", worker, _replay_call, run_api_fuzz)


if __name__ == "__main__":
    raise SystemExit(main())
