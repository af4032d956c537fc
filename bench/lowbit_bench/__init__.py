"""Shared pieces of lowbit's Python benchmarks: one timing helper, one report shape.

    from lowbit_bench import time_fn, measure_ceilings, Report, Row

Benchmarks live beside this package (bench/bench_*.py) and run from the repository root as
`python bench/bench_conversions.py` or `python -m bench.bench_conversions`.
"""
from .report import Report, Row, add_common_args, default_json_path, environment
from .timing import Timing, import_torch_cuda, l2_flush, measure_ceilings, quantile, time_fn, time_graph

__all__ = [
    "Report", "Row", "add_common_args", "default_json_path", "environment",
    "Timing", "l2_flush", "measure_ceilings", "quantile", "time_fn", "time_graph",
]
