#!/usr/bin/env python3
"""One line per JSON record of benchmarks' output (stdin or files): the shape and the headline
figures, for reading a run's results at a glance."""
import json
import sys

KEYS = ("variant", "memra_us", "peer_us", "ratio", "memra_kernel_us", "peer_kernel_us", "kernel_ratio",
        "frac_of_copy", "kernel_frac_of_copy", "memra_tok_s", "peer_tok_s", "roofline_tok_s",
        "frac_of_roofline", "max_rel_err", "max_rel_err_ref", "memra_error")
files = sys.argv[1:] or ["-"]
for f in files:
    for line in (sys.stdin if f == "-" else open(f)):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        figs = " ".join(f"{k}={r[k]:.4g}" if isinstance(r.get(k), float) else f"{k}={r[k]}"
                        for k in KEYS if r.get(k) is not None)
        print(r.get("bench"), json.dumps(r.get("shape"), separators=(",", ":")), figs)
