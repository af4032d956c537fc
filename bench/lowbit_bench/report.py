"""The one report shape of lowbit's Python benchmarks.

One row per (op, shape, anchor): lowbit's time beside the anchor's time from the same run.

    op        what was timed (e.g. "ptgq_fp8_g128_f32_row")
    shape     input shape, e.g. "16384x7168"
    lowbit    lowbit's median time, us
    anchor    what lowbit is compared with: "torch_eager", "torch_compile", a peer kernel
    anchor    the anchor's median time, us
    x         ratio anchor_us / lowbit_us: > 1 means lowbit is faster
    rate      lowbit's rate: TB/s (bytes read + written / time) or TFLOP/s
    %ceil     lowbit's rate as a fraction of the ceiling measured in the same process
              (device copy bandwidth for TB/s, bf16 GEMM for TFLOP/s)
    check     correctness checks done outside the timed region ("ok", or what failed)

The table is printed fixed-width; the JSON file (--json, default $OUT/<bench>.json when $OUT
is set) holds every row with p10/p90, bytes, the timing mode and notes, plus the device name,
torch and CUDA versions, lowbit's build info and the ceilings. The JSON is rewritten after
every row, so a run cut short still leaves its results.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
from typing import Any, Dict, List, Optional

__all__ = ["Row", "Report", "add_common_args", "default_json_path", "environment"]


@dataclasses.dataclass
class Row:
    op: str
    shape: str
    lowbit_us: Optional[float] = None
    anchor: str = ""
    anchor_us: Optional[float] = None
    ratio: Optional[float] = None  # anchor_us / lowbit_us (> 1: lowbit faster)
    rate: Optional[float] = None  # lowbit's TB/s or TFLOP/s
    rate_unit: str = "TB/s"
    frac_ceiling: Optional[float] = None  # rate / measured ceiling
    ceiling: str = ""  # which ceiling: "copy_tbs", "bf16_tflops", ...
    anchor_rate: Optional[float] = None
    bytes: Optional[int] = None
    flops: Optional[float] = None
    lowbit_p10_us: Optional[float] = None
    lowbit_p90_us: Optional[float] = None
    anchor_p10_us: Optional[float] = None
    anchor_p90_us: Optional[float] = None
    timing: str = ""  # "device" or "host" (see timing.time_fn)
    check: str = ""
    note: str = ""
    error: str = ""

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def default_json_path(bench: str) -> Optional[str]:
    out = os.environ.get("OUT")
    return os.path.join(out, f"{bench}.json") if out else None


def add_common_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments every benchmark takes."""
    p.add_argument("--json", default=None, help="write the report here (default: $OUT/<bench>.json when $OUT is set)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before timing (default 5)")
    p.add_argument("--iters", type=int, default=30, help="timed calls per measurement (default 30)")
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between timed calls")
    p.add_argument("--quick", action="store_true", help="fewer iterations and shapes (smoke run)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting new measurements after this many seconds (rows left are marked skipped)")
    return p


def _version(mod_name: str) -> Optional[str]:
    try:
        mod = __import__(mod_name)
        return str(getattr(mod, "__version__", "unknown"))
    except Exception:  # noqa: BLE001
        return None


def environment() -> Dict[str, Any]:
    """Device, library versions and lowbit's build info (whatever can be had)."""
    env: Dict[str, Any] = {
        "python": platform.python_version(),
        "host": platform.node(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "argv": sys.argv,
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["triton"] = _version("triton")
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["device"] = props.name
            env["sm"] = f"{props.major}{props.minor}"
            env["sms"] = props.multi_processor_count
            env["memory_gib"] = round(props.total_memory / 2**30, 1)
            env["l2_bytes"] = int(getattr(props, "L2_cache_size", 0) or 0)
        else:
            env["device"] = None
    except Exception as ex:  # noqa: BLE001
        env["torch"] = None
        env["torch_error"] = f"{type(ex).__name__}: {ex}"
    try:
        import lowbit

        env["lowbit"] = getattr(lowbit, "__version__", "unknown")
        try:
            env["lowbit_build"] = dict(lowbit.build_info())
        except Exception as ex:  # noqa: BLE001
            env["lowbit_build"] = f"build_info failed: {type(ex).__name__}: {ex}"
    except Exception as ex:  # noqa: BLE001
        env["lowbit"] = None
        env["lowbit_error"] = f"{type(ex).__name__}: {ex}"
    return env


def _fmt(v: Optional[float], width: int, prec: int) -> str:
    if v is None:
        return "-".rjust(width)
    if abs(v) >= 10 ** (width - prec - 2):
        return f"{v:{width}.0f}"
    return f"{v:{width}.{prec}f}"


def _cut(s: str, width: int) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= width else s[: width - 2] + ".."


class Report:
    """Collects rows, prints them as one fixed-width table and writes one JSON file."""

    COLUMNS = (
        ("op", 30), ("shape", 11), ("lowbit us", 10), ("anchor", 22), ("anchor us", 10),
        ("x", 7), ("rate", 7), ("%ceil", 6), ("check", 0),
    )

    def __init__(self, bench: str, json_path: Optional[str] = None, meta: Optional[Dict[str, Any]] = None,
                 ceilings: Optional[Dict[str, Any]] = None, env: Optional[Dict[str, Any]] = None):
        self.bench = bench
        self.json_path = json_path if json_path is not None else default_json_path(bench)
        self.meta: Dict[str, Any] = dict(meta or {})
        self.ceilings: Dict[str, Any] = dict(ceilings or {})
        self.env: Dict[str, Any] = env if env is not None else environment()
        self.rows: List[Row] = []
        self._printed_header = False

    # -- rows ---------------------------------------------------------------------------------
    def add(self, row: Row, *, echo: bool = True) -> Row:
        """Adds a row, completing ratio / rate / fraction of ceiling where the inputs allow."""
        if row.ratio is None and row.lowbit_us and row.anchor_us:
            row.ratio = row.anchor_us / row.lowbit_us
        if row.rate is None and row.lowbit_us:
            if row.flops is not None:
                row.rate = row.flops / (row.lowbit_us * 1e-6) / 1e12
                row.rate_unit = "TFLOP/s"
            elif row.bytes is not None:
                row.rate = row.bytes / (row.lowbit_us * 1e-6) / 1e12
                row.rate_unit = "TB/s"
        if row.anchor_rate is None and row.anchor_us:
            if row.flops is not None:
                row.anchor_rate = row.flops / (row.anchor_us * 1e-6) / 1e12
            elif row.bytes is not None:
                row.anchor_rate = row.bytes / (row.anchor_us * 1e-6) / 1e12
        if not row.ceiling:
            row.ceiling = "bf16_tflops" if row.rate_unit == "TFLOP/s" else "copy_tbs"
        ceil = self.ceilings.get(row.ceiling)
        if row.frac_ceiling is None and row.rate is not None and ceil:
            row.frac_ceiling = row.rate / ceil
        self.rows.append(row)
        if echo:
            self.print_row(row)
        self.write_json()
        return row

    # -- printing -----------------------------------------------------------------------------
    def header_lines(self) -> List[str]:
        e = self.env
        c = self.ceilings
        lines = [
            f"# {self.bench}: device {e.get('device')} (sm{e.get('sm')}), torch {e.get('torch')} "
            f"CUDA {e.get('torch_cuda')}, lowbit {e.get('lowbit')}",
        ]
        if c:
            parts = []
            if c.get("copy_tbs"):
                parts.append(f"copy {c['copy_tbs']:.2f} TB/s")
            if c.get("bf16_tflops"):
                parts.append(f"bf16 GEMM {c['bf16_tflops']:.0f} TFLOP/s")
            if c.get("fp8_tflops"):
                parts.append(f"fp8 GEMM {c['fp8_tflops']:.0f} TFLOP/s")
            lines.append("# ceilings (this process): " + (", ".join(parts) if parts else "none measured"))
        for k, v in self.meta.items():
            lines.append(f"# {k}: {v}")
        return lines

    def table_header(self) -> str:
        cells = []
        for name, w in self.COLUMNS:
            if w == 0:
                cells.append(name)
            elif name in ("op", "shape", "anchor"):
                cells.append(name.ljust(w))
            else:
                cells.append(name.rjust(w))
        return " ".join(cells)

    def format_row(self, r: Row) -> str:
        check = r.check
        if r.error:
            check = (check + " " if check else "") + "ERROR " + r.error
        if r.note and not r.error:
            check = (check + " " if check else "") + f"({r.note})"
        pct = None if r.frac_ceiling is None else 100.0 * r.frac_ceiling
        cells = [
            _cut(r.op, 30).ljust(30),
            _cut(r.shape, 11).ljust(11),
            _fmt(r.lowbit_us, 10, 1),
            _cut(r.anchor, 22).ljust(22),
            _fmt(r.anchor_us, 10, 1),
            _fmt(r.ratio, 7, 2),
            _fmt(r.rate, 7, 2),
            _fmt(pct, 6, 1),
            _cut(check, 90),
        ]
        return " ".join(cells).rstrip()

    def print_row(self, r: Row) -> None:
        if not self._printed_header:
            self._printed_header = True
            for line in self.header_lines():
                print(line)
            print(self.table_header())
        print(self.format_row(r), flush=True)

    def print_table(self, title: Optional[str] = None) -> None:
        """The whole table again (the end of a long log is what gets read)."""
        print()
        if title:
            print(title)
        for line in self.header_lines():
            print(line)
        print(self.table_header())
        for r in self.rows:
            print(self.format_row(r))
        print("# x = anchor us / lowbit us (> 1: lowbit faster); rate = lowbit TB/s (read + written) or "
              "TFLOP/s; %ceil = rate / ceiling measured above", flush=True)

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        return {
            "bench": self.bench,
            "env": self.env,
            "ceilings": self.ceilings,
            "meta": self.meta,
            "rows": [r.as_dict() for r in self.rows],
        }

    def write_json(self) -> None:
        if not self.json_path:
            return
        d = os.path.dirname(os.path.abspath(self.json_path))
        os.makedirs(d, exist_ok=True)
        tmp = self.json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1, default=str)
        os.replace(tmp, self.json_path)
