"""What delta encoding and error feedback save over repeated releases (they
only act across rounds).

A repeated release: every party re-measures the same marginals R times with fresh
noise (a continual release of an unchanged table, the simplest multi-round case), and
sends its quantised noisy counts each time. Measured with FedForge's own codecs
(:mod:`synth.compress`, :mod:`synth.mechanism`; a study of lossy codecs, not the release path), on
Adult's rows split IID over K parties, the 2-way marginals of every pair with ``income``:

* ``full``: each release sends the b-bit codes (b no coarser than a party's noise std,
  the runtime's rule); masked words cost m = b + ceil(log2 K) bits.
* ``delta``: from the second release on, each party sends its codes minus its previous
  codes (signed, :func:`synth.compress.to_ring`); the masked sum of deltas needs
  m = ceil(log2(2·max|Σ delta| + 1)) bits, measured on the actual deltas.
* ``error feedback``: at a coarse width (``--coarse-bits``, default 3), the mean of the R
  decoded aggregates against the mean of the noisy aggregates, with and without
  :class:`synth.compress.ErrorFeedbackQuantizer` (the residual is carried into the next
  release).

Prints payload bits per cell and bytes per release for each, and the error of the
release mean. This is a codec measurement, not a bus run: the bytes are the packed sizes
(:func:`synth.compress.packed_size`) that the runtime would publish.

Usage::

    python bench/synth_codec.py --quick --json /tmp/codec.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="R = 5 releases (default 10)")
    ap.add_argument("--releases", type=int, default=None)
    ap.add_argument("--parties", type=int, default=10)
    ap.add_argument("--epsilon", type=float, default=1.0, help="per release")
    ap.add_argument("--coarse-bits", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from parties.data import load_table
    from synth.accounting import cdp_rho
    from synth.compress import ErrorFeedbackQuantizer, QuantSpec, dequantize, packed_size, quantize
    from synth.domain import encode, infer_schema, marginals
    from synth.mechanism import measure_party
    from synth.split import party_split

    R = args.releases or (5 if args.quick else 10)
    K = args.parties
    frame, _ = load_table("adult")
    frame = frame.drop(columns=["education"])
    schema = infer_schema(frame, binning="uniform")
    codes = encode(frame, schema)
    cliques = [(a, "income") for a in schema.names if a != "income"]
    parts = party_split(len(codes), K, seed=args.seed)
    counts = [np.concatenate([m.ravel() for m in marginals(codes[p], schema.domain,
                                                           cliques).values()])
              for p in parts]
    n = counts[0].size
    rho = cdp_rho(args.epsilon, 1e-9)
    sigma2 = len(cliques) / (2 * rho)  # central, per cell, per release
    sigma2_p = sigma2 / K
    # (a codec study of lossy per-party quantisation; FedForge's release path no longer
    # rounds noisy values: it sums exact integers, synth.protocol)
    pad = math.ceil(6 * math.sqrt(sigma2_p))
    h_min, h_max = float(-pad), float(max(len(p) for p in parts) + pad)
    b = int(min(24, max(4, math.ceil(math.log2((h_max - h_min) / math.sqrt(sigma2_p) + 1)))))
    spec = QuantSpec(bits=b, h_min=h_min, h_max=h_max)
    logk = math.ceil(math.log2(K)) if K > 1 else 0
    rng = np.random.default_rng(args.seed)
    noisy = [[measure_party(c, mu=sigma2_p / 2.0, rng=rng).astype(np.float64)
              for c in counts] for _ in range(R)]
    q = [[quantize(x, spec) for x in rel] for rel in noisy]
    # delta: the aggregate of signed deltas, and the ring width it needs
    widths = []
    for r in range(1, R):
        s = sum(q[r][k].astype(np.int64) - q[r - 1][k].astype(np.int64) for k in range(K))
        widths.append(math.ceil(math.log2(2 * int(np.abs(s).max()) + 1)))
    m_full = b + logk
    m_delta = max(widths) if widths else m_full
    bytes_full = R * K * packed_size(n, m_full)
    bytes_delta = K * packed_size(n, m_full) + (R - 1) * K * packed_size(n, m_delta)
    # error feedback at a coarse width
    cspec = QuantSpec(bits=args.coarse_bits, h_min=h_min, h_max=h_max)
    truth_mean = np.mean([sum(rel) for rel in noisy], axis=0)
    plain = np.mean([sum(dequantize(quantize(x, cspec), cspec) for x in rel) for rel in noisy],
                    axis=0)
    efq = [ErrorFeedbackQuantizer(cspec) for _ in range(K)]
    fed = np.mean([sum(dequantize(efq[k].encode(rel[k]), cspec) for k in range(K))
                   for rel in noisy], axis=0)
    err_plain = float(np.abs(plain - truth_mean).mean())
    err_ef = float(np.abs(fed - truth_mean).mean())
    doc = {
        "settings": {"releases": R, "parties": K, "epsilon_per_release": args.epsilon,
                     "cells": n, "cliques": len(cliques), "sigma_party": math.sqrt(sigma2_p),
                     "bits": b, "coarse_bits": args.coarse_bits},
        "ring_bits_full": m_full, "ring_bits_delta": m_delta,
        "bytes_full": bytes_full, "bytes_delta": bytes_delta,
        "delta_saving": 1 - bytes_delta / bytes_full,
        "bytes_naive_float32": R * K * 4 * n,
        "ef_mean_abs_error": err_ef, "plain_mean_abs_error": err_plain,
        "ef_step": cspec.step,
    }
    print(f"{R} releases of {len(cliques)} 2-way marginals ({n} cells), K = {K}, "
          f"eps {args.epsilon:g} each: sigma_party {math.sqrt(sigma2_p):.1f} counts, b = {b}")
    print(f"full vectors: m = {m_full} bits/cell, {bytes_full:,} B; deltas after the first: "
          f"m = {m_delta} bits/cell, {bytes_delta:,} B (saving {doc['delta_saving']:.1%}); "
          f"naive float32 {doc['bytes_naive_float32']:,} B")
    print(f"{args.coarse_bits}-bit codes (step {cspec.step:.0f} counts): mean abs error of the "
          f"release mean {err_plain:.2f} without error feedback, {err_ef:.2f} with it")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
