"""Short summary of benchmark JSON reports: one line per (op, shape).

    python bench/lowbit_bench/summary.py out/bench_conversions.json [more.json ...]

Columns: lowbit's median us, its rate and fraction of the measured ceiling, then
anchor_us / lowbit_us for torch eager, torch.compile and the best peer kernel (> 1: lowbit
faster), and the checks. Needs only the standard library.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional


def _f(v: Optional[float], w: int, p: int) -> str:
    return "-".rjust(w) if v is None else f"{v:{w}.{p}f}"


def summarize(report: Dict[str, Any]) -> List[str]:
    env = report.get("env", {})
    c = report.get("ceilings", {}) or {}
    lines = [f"== {report.get('bench')}: {env.get('device')} torch {env.get('torch')} lowbit {env.get('lowbit')}"
             + (f"; copy {c['copy_tbs']:.2f} TB/s" if c.get("copy_tbs") else "")]
    groups: Dict[tuple, Dict[str, Any]] = {}
    for r in report.get("rows", []):
        key = (r.get("op"), r.get("shape"))
        g = groups.setdefault(key, {"lowbit_us": None, "rate": None, "frac": None, "unit": r.get("rate_unit"),
                                    "eager": None, "compile": None, "peer": None, "peer_name": "",
                                    "check": r.get("check", ""), "errors": []})
        if r.get("lowbit_us") is not None:
            g["lowbit_us"], g["rate"], g["frac"] = r["lowbit_us"], r.get("rate"), r.get("frac_ceiling")
        anchor, ratio = r.get("anchor", ""), r.get("ratio")
        if anchor == "torch_eager":
            g["eager"] = ratio
        elif anchor == "torch_compile":
            g["compile"] = ratio
        elif anchor.startswith("peer:") and ratio is not None and (g["peer"] is None or ratio < g["peer"]):
            g["peer"], g["peer_name"] = ratio, anchor[5:]
        if r.get("error"):
            e = " ".join(str(r["error"]).split())
            e = f"{anchor}: {e}" if not e.startswith("lowbit") else e
            if e not in g["errors"]:
                g["errors"].append(e)
    lines.append(f"{'op':30s} {'shape':11s} {'lowbit us':>10s} {'rate':>7s} {'%ceil':>6s} "
                 f"{'x eager':>8s} {'x compile':>9s} {'x peer':>7s}  check / errors")
    for (op, shape), g in groups.items():
        pct = None if g["frac"] is None else 100 * g["frac"]
        tail = g["check"] or ""
        if g["peer_name"]:
            tail = (tail + f" peer={g['peer_name']}").strip()
        if g["errors"]:
            tail = (tail + " | " + "; ".join(g["errors"]))[:160]
        lines.append(f"{str(op)[:30]:30s} {str(shape)[:11]:11s} {_f(g['lowbit_us'], 10, 1)} {_f(g['rate'], 7, 2)} "
                     f"{_f(pct, 6, 1)} {_f(g['eager'], 8, 2)} {_f(g['compile'], 9, 2)} {_f(g['peer'], 7, 2)}  {tail}")
    return lines


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__.strip())
        return 2
    rc = 0
    for p in paths:
        try:
            with open(p) as f:
                rep = json.load(f)
        except Exception as ex:  # noqa: BLE001
            print(f"== {p}: unreadable ({type(ex).__name__}: {ex})")
            rc = 1
            continue
        print("\n".join(summarize(rep)))
    return rc


if __name__ == "__main__":
    sys.exit(main())
