"""The `lowbit` command line (also `python -m lowbit`).

    lowbit info [--json]
    lowbit quantize MODEL_DIR OUT_DIR --format FORMAT [options]          (compressed-tensors)
    lowbit quantize MODEL_DIR OUT_DIR --format nvfp4 --convention modelopt (ModelOpt NVFP4)
    lowbit quantize IN.safetensors OUT.safetensors --format FORMAT [options] (lowbit's own names)
    lowbit dequantize IN.safetensors OUT.safetensors [--dtype auto|bf16|f16|f32]
    lowbit convert-gpt-oss IN.safetensors OUT.safetensors [--layout LAYOUT] [--no-verify]

`quantize` of a model directory or index (or of one file with --convention compressed-tensors)
writes a Hugging Face model directory in the compressed-tensors convention (docs/checkpoints.md). Into OUT.safetensors (--convention lowbit)
it replaces every 2-D F32/F16/BF16 tensor W whose last dimension K is a multiple of the block by

    W.qdata        packed codes: uint8 [M, K/2] (4-bit formats) or float8 [M, K] (8-bit formats)
    W.scale        block scales in the chosen layout (float32, UE8M0 or E4M3)
    W.zero         uint4: uint8 zero points, same layout as W.scale
    W.global_amax  nvfp4: float32 [1] per-tensor amax

and records each one under the "lowbit" key of the safetensors __metadata__ (a JSON object:
{"version": 1, "producer": ..., "tensors": {"W": {"format", "block", "layout", "row_align",
"nibble_order", "rounding", "scale_dtype", "zero_scale", "shape", "dtype", "qdata", "scale", "zero",
"global_amax", "format_kwargs"}}}), enough
for `lowbit dequantize` or any loader to reverse it. Every other tensor is copied unchanged and
the table says why. See lowbit/checkpoint/__init__.py for the full description.

Errors print one line on stderr and exit with status 1 (2 for bad usage). Files (docs/cli.md):
the input must be a regular file; every output (OUT and --report) is checked before any work
starts: its directory must exist, it must differ from the input and from the other output, and an
existing one must be a regular file and is only replaced with --force (keeping its permission
bits). Outputs are written under an exclusive temporary name beside them and renamed into place
once complete; SIGINT, SIGTERM and SIGHUP remove the temporary files (exit status 128 + signal).
SIGKILL cannot be caught: it can leave a hidden temporary file ".OUT.*.tmp" beside OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Optional, Sequence

EXIT_ERROR = 1
EXIT_USAGE = 2

from ._cli_output import GPT_OSS_EPILOG as _GPT_OSS_EPILOG, QUANTIZE_EPILOG as _QUANTIZE_EPILOG
from ._cli_output import Progress, _fmt_float, _shape, human_bytes, render_table  # noqa: F401


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors."""

    def error(self, message: str):  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_USAGE)


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {v}")
    return v


def _size(s: str) -> int:
    units = {"": 1, "B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "KIB": 1024, "MIB": 1024 ** 2,
             "GIB": 1024 ** 3}
    t = s.strip().upper()
    num = t.rstrip("KMGIB")
    try:
        v = int(float(num) * units[t[len(num):]])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size such as 5GB, 500MB or a byte count, got {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {s!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    from .checkpoint import FORMAT_ALIASES, FORMATS, LAYOUTS

    p = _Parser(prog="lowbit", description="lowbit: low-precision formats for LLM checkpoints.",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    pi = sub.add_parser("info", help="version, build options, CUDA device and the ops it runs",
                        description="Prints the lowbit version, whether the CUDA kernels are compiled in, "
                                    "the CUDA device (if usable) and which ops run on it.")
    pi.add_argument("--json", action="store_true", help="print lowbit.build_info() as JSON")

    pq = sub.add_parser("quantize", help="quantize a model directory or a safetensors checkpoint",
                        description="Quantizes the 2-D F32/F16/BF16 weights of a Hugging Face model directory "
                                    "(or an index, or one safetensors file) into packed codes + scales and "
                                    "prints a per-tensor error table.",
                        epilog=_QUANTIZE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    pq.add_argument("input", metavar="IN", help="a model directory, a model.safetensors.index.json or a "
                                                ".safetensors file")
    pq.add_argument("output", metavar="OUT", help="a directory (compressed-tensors) or OUT.safetensors (lowbit)")
    pq.add_argument("--format", "-f", required=True, choices=list(FORMATS) + list(FORMAT_ALIASES),
                    metavar="FORMAT", help="{" + ",".join(FORMATS) + "}")
    pq.add_argument("--convention", choices=["compressed-tensors", "gpt-oss", "modelopt", "lowbit"],
                    help="tensor names and metadata of the output (default: compressed-tensors for a model "
                         "directory or index, lowbit for a .safetensors file; modelopt: NVFP4 in NVIDIA "
                         "ModelOpt's naming with hf_quant_config.json)")
    pq.add_argument("--no-default-excludes", action="store_true",
                    help="also quantize embeddings, lm_head, norms, routers and biases where eligible")
    pq.add_argument("--max-shard-size", type=_size, default=5 * 1024 ** 3, metavar="SIZE",
                    help="compressed-tensors: largest output shard, e.g. 5GB (default), 500MB, bytes")
    pq.add_argument("--group-size", type=_positive_int, metavar="N",
                    help="elements per scale for fp8_e4m3/fp8_e5m2/int4/uint4 (default 128) and nf4 (default 64); "
                         "fixed 16 for nvfp4 and 32 for the MX formats")
    pq.add_argument("--rounding", choices=["rceil", "floor"],
                    help="MX scale rule: rceil (NVIDIA, default) or floor (OCP spec, torchao)")
    pq.add_argument("--scale-layout", default="row_major", choices=list(LAYOUTS),
                    help="layout of the stored scales (default row_major)")
    pq.add_argument("--nibble-order", choices=["low", "high"],
                    help="4-bit formats: element 2i in the low (default) or high (bitsandbytes) nibble")
    pq.add_argument("--scale-dtype", choices=["float32", "ue8m0"],
                    help="fp8_e4m3/fp8_e5m2/int4: float32 (default) or power-of-two UE8M0 scales")
    pq.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto (default): CUDA when lowbit has kernels, a device is usable and torch is "
                         "installed; else the CPU reference")
    pq.add_argument("--include", action="append", default=[], metavar="REGEX",
                    help="quantize only tensors whose name matches (re.search; repeatable)")
    pq.add_argument("--exclude", action="append", default=[], metavar="REGEX",
                    help="never quantize tensors whose name matches (repeatable)")
    pq.add_argument("--min-size", type=_positive_int, default=0, metavar="N",
                    help="copy tensors with fewer than N elements unchanged (default 0)")
    _common_output_args(pq)

    pd = sub.add_parser("dequantize", help="turn a lowbit-quantized checkpoint back into float tensors",
                        description="Inverse of `lowbit quantize` (and of convert-gpt-oss): dequantizes every "
                                    "tensor listed in the \"lowbit\" metadata and copies the rest.")
    pd.add_argument("input", metavar="IN.safetensors")
    pd.add_argument("output", metavar="OUT.safetensors")
    pd.add_argument("--dtype", default="auto", choices=["auto", "bf16", "f16", "f32"],
                    help="output dtype (default auto: the original dtype recorded in the metadata)")
    _common_output_args(pd)

    pg = sub.add_parser("convert-gpt-oss", help="convert gpt-oss MXFP4 experts to lowbit's kernel layout",
                        description="Converts gpt-oss MXFP4 expert tensors (*_blocks / *_scales) into "
                                    "lowbit's layout and verifies the conversion bit for bit.",
                        epilog=_GPT_OSS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    pg.add_argument("input", metavar="IN.safetensors")
    pg.add_argument("output", metavar="OUT.safetensors")
    pg.add_argument("--layout", default="row_major", choices=list(LAYOUTS),
                    help="layout of the converted scales (default row_major; blocked128x4 = cuBLAS/CUTLASS)")
    pg.add_argument("--no-verify", action="store_true", help="skip the bit-exact decode check")
    _common_output_args(pg)
    return p


def _common_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", metavar="FILE.json", help="also write the table as JSON to FILE.json")
    p.add_argument("--force", action="store_true",
                   help="replace OUT (and FILE.json) if it exists (a regular file only; its permission bits "
                        "are kept)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_const", const=True, default=None,
                   help="always show progress (rate, time left) on stderr (default: only on a terminal)")
    g.add_argument("--no-progress", dest="progress", action="store_const", const=False)
    g.add_argument("--quiet", "-q", action="store_true", help="no progress and no table")


# ---------------------------------------------------------------------------------------------
# Output helpers


def _progress_for(args, input_path: str) -> Progress:
    if args.quiet:
        return Progress(False)
    enabled = args.progress
    if enabled is None:
        enabled = sys.stderr.isatty()
    return Progress(enabled)


def _write_report(path: Optional[str], command: str, reports, summary, overwrite: bool = True) -> None:
    if not path:
        return
    from .safetensors_io import write_text_atomic

    doc = {"command": command, "summary": summary, "tensors": [r.as_dict() for r in reports]}
    write_text_atomic(path, json.dumps(doc, indent=1), what="--report file", overwrite=overwrite)


def _warn(prog: str):
    def warn(message: str) -> None:
        sys.stderr.write(f"{prog}: warning: {message}\n")
        sys.stderr.flush()
    return warn


def _directory_mode(args) -> bool:
    """quantize into a model directory (compressed-tensors) rather than one lowbit file."""
    if getattr(args, "command", None) != "quantize":
        return False
    if args.convention is None:
        src = str(args.input)
        to_dir = (os.path.isdir(src) or src.endswith(".index.json")) and not str(args.output).endswith(".safetensors")
        args.convention = "compressed-tensors" if to_dir else "lowbit"
    return args.convention in ("compressed-tensors", "gpt-oss", "modelopt")


def check_paths(args) -> None:
    """Checks the input and every output path before any work starts (see docs/cli.md)."""
    from .checkpoint import CheckpointError
    from .safetensors_io import check_input_path, check_output_path, same_file

    if _directory_mode(args):
        from .checkpoint.model_dir import check_output_dir

        if not os.path.exists(args.input):
            raise CheckpointError(f"{args.input}: no such file or directory")
        if os.path.exists(args.output) and same_file(args.input, args.output):
            raise CheckpointError(f"{args.output}: the output is the input")
        check_output_dir(args.output, overwrite=args.force)
        if args.report:
            check_output_path(args.report, "--report file", overwrite=args.force)
        return
    check_input_path(args.input, "input")
    if same_file(args.input, args.output):
        raise CheckpointError(f"{args.output}: the output is the input file {args.input}")
    check_output_path(args.output, "output", overwrite=args.force)
    if args.report:
        for other, what in ((args.input, "input"), (args.output, "output")):
            if same_file(args.report, other):
                raise CheckpointError(f"--report {args.report}: the report would replace the {what} file {other}")
        check_output_path(args.report, "--report file", overwrite=args.force)


def _print_skipped(reports, out) -> None:
    skipped = [r for r in reports if r.action == "copied"]
    if not skipped:
        return
    rows = [[r.name, _shape(r.shape), r.dtype, human_bytes(r.bytes_before), r.reason] for r in skipped]
    print(f"\ncopied unchanged ({len(skipped)}):", file=out)
    print(render_table(["tensor", "shape", "dtype", "bytes", "reason"], rows,
                       [False, True, False, True, False]), file=out)


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_info(args) -> int:
    import lowbit
    from .checkpoint import cuda_status

    info = dict(lowbit.build_info())
    try:
        import torch

        torch_line = f"{torch.__version__} (CUDA {'available' if torch.cuda.is_available() else 'not available'})"
        torch_version: Optional[str] = torch.__version__
    except ImportError:
        torch_line, torch_version = "not installed", None
    usable, why = cuda_status()
    if args.json:
        doc = dict(info)
        doc["torch"] = torch_version
        doc["quantize_device"] = "cuda" if usable else "cpu"
        print(json.dumps(doc, indent=1, default=str))
        return 0
    rt = int(info.get("cuda_runtime_version") or 0)
    rt_s = f"CUDA runtime {rt // 1000}.{(rt % 1000) // 10}" if rt else "no CUDA runtime"
    print(f"lowbit {info.get('version', getattr(lowbit, '__version__', '?'))}")
    print(f"  CUDA kernels compiled in : {'yes' if info.get('cuda_built') else 'no'} ({rt_s})")
    if info.get("device_count"):
        print(f"  CUDA device              : {info.get('device_name', '?')} (sm_{info.get('sm', '?')}), "
              f"{info['device_count']} usable")
    else:
        print("  CUDA device              : none usable")
    ops = list(info.get("cuda_ops") or [])
    print(f"  ops on the device        : {', '.join(ops) if ops and info.get('device_count') else 'none (CPU reference for every op)'}")
    print(f"  torch                    : {torch_line}")
    print(f"  quantize --device auto   : {'cuda, ' + why if usable else 'cpu (' + why + ')'}")
    return 0


def cmd_quantize(args) -> int:
    from .checkpoint import Selection, make_config, quantize_checkpoint

    cfg = make_config(args.format, group_size=args.group_size, rounding=args.rounding,
                      layout=args.scale_layout, nibble_order=args.nibble_order, scale_dtype=args.scale_dtype)
    sel = Selection(include=args.include, exclude=args.exclude, min_size=args.min_size,
                    default_excludes=not args.no_default_excludes)
    prog = _progress_for(args, args.input)
    if _directory_mode(args):
        from .checkpoint.quantize_model import quantize_model

        reports, summary = quantize_model(args.input, args.output, cfg, sel, device=args.device, progress=prog,
                                          overwrite=args.force, warn=_warn("lowbit quantize"),
                                          max_shard_bytes=args.max_shard_size, convention=args.convention)
    else:
        if os.path.isdir(args.input) or str(args.input).endswith(".index.json"):
            from .checkpoint import CheckpointError

            raise CheckpointError(f"{args.input}: --convention lowbit reads one .safetensors file; a model "
                                  f"directory or index is quantized into a directory (compressed-tensors)")
        reports, summary = quantize_checkpoint(args.input, args.output, cfg, sel, device=args.device,
                                               progress=prog, overwrite=args.force, warn=_warn("lowbit quantize"))
    _write_report(args.report, "quantize", reports, summary, overwrite=args.force)
    if args.quiet:
        return 0
    out = sys.stdout
    where = f"; {summary['scheme']}, {summary['shards']} shard(s)" if "scheme" in summary else ""
    print(f"{summary['input']} -> {summary['output']}  ({cfg.describe()}; device {summary['device']}{where})",
          file=out)
    q = [r for r in reports if r.action == "quantized"]
    rows = [[r.name, _shape(r.shape), r.dtype, r.fmt, human_bytes(r.bytes_before), human_bytes(r.bytes_after),
             f"{r.bytes_before / r.bytes_after:.2f}x" if r.bytes_after else "-",
             _fmt_float(r.sqnr_db, ".2f"), _fmt_float(r.max_abs_err, ".3g")] for r in q]
    qb = sum(r.bytes_before for r in q)
    qa = sum(r.bytes_after for r in q)
    if q:
        sig_noise = _total_sqnr(q)
        rows.append(["total quantized", f"{len(q)} tensors", "", "", human_bytes(qb), human_bytes(qa),
                     f"{qb / qa:.2f}x" if qa else "-", _fmt_float(sig_noise, ".2f"),
                     _fmt_float(_max_err(q), ".3g")])
        print(render_table(["tensor", "shape", "dtype", "format", "before", "after", "ratio", "SQNR dB",
                            "max abs err"], rows, [False, True, False, False, True, True, True, True, True]),
              file=out)
    else:
        print("no tensor was quantized", file=out)
    _print_skipped(reports, out)
    print(f"\nfile: {human_bytes(summary['file_bytes_in'])} -> {human_bytes(summary['file_bytes_out'])}; "
          f"{summary['quantized']} quantized, {summary['copied']} copied; {summary['seconds']:.1f} s", file=out)
    return 0


def _max_err(q) -> Optional[float]:
    """Largest max abs err of the tensors: nan when any is nan."""
    from .checkpoint import nanmax

    m: Optional[float] = None
    for r in q:
        m = nanmax(m, r.max_abs_err)
    return m


def _total_sqnr(q) -> Optional[float]:
    """SQNR of all quantized tensors together: total signal energy over total noise energy."""
    from .checkpoint import _sqnr

    sig = sum(r.extra.get("signal_energy", 0.0) for r in q)
    noise = sum(r.extra.get("noise_energy", 0.0) for r in q)
    return _sqnr(sig, noise)


def cmd_dequantize(args) -> int:
    from .checkpoint import dequantize_checkpoint

    prog = _progress_for(args, args.input)
    reports, summary = dequantize_checkpoint(args.input, args.output, dtype=args.dtype, progress=prog,
                                             overwrite=args.force, warn=_warn("lowbit dequantize"))
    _write_report(args.report, "dequantize", reports, summary, overwrite=args.force)
    if args.quiet:
        return 0
    out = sys.stdout
    print(f"{summary['input']} -> {summary['output']}", file=out)
    d = [r for r in reports if r.action == "dequantized"]
    rows = [[r.name, _shape(r.shape), r.fmt, r.dtype, human_bytes(r.bytes_before), human_bytes(r.bytes_after)]
            for r in d]
    if rows:
        print(render_table(["tensor", "shape", "from", "to", "before", "after"], rows,
                           [False, True, False, False, True, True]), file=out)
    print(f"\n{summary['dequantized']} dequantized, {len(reports) - len(d)} copied; "
          f"file {human_bytes(summary['file_bytes_out'])}; {summary['seconds']:.1f} s", file=out)
    return 0


def cmd_convert_gpt_oss(args) -> int:
    from .checkpoint import convert_gpt_oss

    prog = _progress_for(args, args.input)
    reports, summary = convert_gpt_oss(args.input, args.output, layout=args.layout, verify=not args.no_verify,
                                       progress=prog, overwrite=args.force)
    _write_report(args.report, "convert-gpt-oss", reports, summary, overwrite=args.force)
    if args.quiet:
        return 0
    out = sys.stdout
    print(f"{summary['input']} -> {summary['output']}  (mxfp4, scales {summary['layout']})", file=out)
    c = [r for r in reports if r.action == "converted"]
    rows = [[r.name, str(r.extra["experts"]), str(r.extra["rows"]), str(r.extra["K"]),
             _shape((r.extra["experts"], r.extra["rows"], r.extra["K"] // 2)), human_bytes(r.bytes_before),
             human_bytes(r.bytes_after), str(r.extra["nan_blocks"]), _fmt_float(r.max_abs, ".4g"),
             r.extra["verified"]] for r in c]
    print(render_table(["tensor", "experts", "rows", "K", "qdata", "before", "after", "NaN blocks", "max |w|",
                        "check"], rows, [False, True, True, True, True, True, True, True, True, False]), file=out)
    _print_skipped(reports, out)
    print(f"\n{summary['converted']} converted ({'verified bit-exact' if summary['verified'] else 'not verified'}), "
          f"{summary['copied']} copied; file {human_bytes(summary['file_bytes_out'])}; "
          f"{summary['seconds']:.1f} s", file=out)
    return 0


class Interrupted(KeyboardInterrupt):
    """Raised by the SIGINT / SIGTERM / SIGHUP handlers of a command."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    from .safetensors_io import remove_temporary_files

    remove_temporary_files()  # first, in case the exception meets code that does not unwind
    raise Interrupted(signum)


_HANDLED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def _install_handlers() -> dict:
    """Routes SIGINT, SIGTERM and SIGHUP to _on_signal for the run of a command; returns the
    previous handlers. A signal the caller ignores (SIG_IGN, e.g. SIGHUP under nohup) stays
    ignored; nothing is installed outside the main thread, where Python cannot."""
    old = {}
    if threading.current_thread() is not threading.main_thread():
        return old
    for sig in _HANDLED_SIGNALS:
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue
            old[sig] = signal.signal(sig, _on_signal)
        except (ValueError, OSError):
            pass
    return old


def _restore_handlers(old: dict) -> None:
    for sig, handler in old.items():
        try:
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_COMMANDS = {"info": cmd_info, "quantize": cmd_quantize, "dequantize": cmd_dequantize,
             "convert-gpt-oss": cmd_convert_gpt_oss}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already printed)
        return int(e.code or 0)
    if args.version:
        import lowbit

        print(f"lowbit {lowbit.__version__}")
        return 0
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"lowbit {args.command}"
    old_handlers = _install_handlers()
    try:
        return _run(prog, args)
    finally:
        _restore_handlers(old_handlers)


def _run(prog: str, args) -> int:
    try:
        if args.command != "info":
            check_paths(args)
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt as e:
        from .safetensors_io import remove_temporary_files

        remove_temporary_files()
        signum = e.signum if isinstance(e, Interrupted) else int(signal.SIGINT)
        try:
            sys.stderr.write(f"\n{prog}: interrupted by {_signal_name(signum)}; temporary files removed\n")
        except (OSError, ValueError):
            pass
        return 128 + signum
    except BrokenPipeError:
        return EXIT_ERROR
    except FileNotFoundError as e:
        sys.stderr.write(f"{prog}: error: {e.filename or e}: no such file\n")
    except IsADirectoryError as e:
        sys.stderr.write(f"{prog}: error: {e.filename or e}: is a directory\n")
    except PermissionError as e:
        sys.stderr.write(f"{prog}: error: {e.filename or e}: permission denied\n")
    except OSError as e:
        sys.stderr.write(f"{prog}: error: {_one_line(e.strerror or str(e))}"
                         f"{': ' + str(e.filename) if e.filename else ''}\n")
    except MemoryError:
        sys.stderr.write(f"{prog}: error: out of memory\n")
    except Exception as e:  # lowbit's argument errors, malformed files, anything unexpected
        if os.environ.get("LOWBIT_TRACEBACK"):
            raise
        from .checkpoint import CheckpointError
        from .safetensors_io import SafetensorsError

        known = isinstance(e, (CheckpointError, SafetensorsError, ValueError, TypeError, RuntimeError))
        msg = _one_line(str(e)) or type(e).__name__
        if not known:
            msg = f"{type(e).__name__}: {msg} (set LOWBIT_TRACEBACK=1 for the traceback)"
        sys.stderr.write(f"{prog}: error: {msg}\n")
    return EXIT_ERROR


def _one_line(s: str) -> str:
    return " ".join(s.split())


if __name__ == "__main__":
    raise SystemExit(main())
