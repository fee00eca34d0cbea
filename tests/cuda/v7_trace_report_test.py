#!/usr/bin/env python3
"""v7_trace_report.py on a synthetic timeline with known answers (round 37): two layers of qkv+z -> conv + a/b -> delta
step -> gdn_out -> AddNorm site -> fused FFN -> AddNorm site (parts), written out of order (the backend traces a held
launch after the one that follows it), chain kernels in v7's slots 0 / 2 / 5 as the backend writes them. Checks the
order by W, each product's gap, the chain kernels' entry and work, and the gap's split. Run by ctest (trace_report)."""
import contextlib
import importlib.util
import io
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def row(start, w, done):
    r = [0] * 32
    r[0], r[1], r[2], r[3], r[5], r[6], r[8] = start, start + 10, w, w + 10, done, 2, w + 100
    return r


def build(path):
    L, t = [], 1_000_000  # ns
    def add(K, N, n, start, w, done):
        L.append((K, N, [row(start, w, done) for _ in range(n)]))
    for _ in range(2):
        add(5120, 16384, 4, t, t + 500, t + 8000); t += 8000          # qkv+z: W 0.5 after its site
        add(-4, 0, 3, t - 2000, t + 1500, t + 3000); t += 3000        # conv + a/b: entry 1.5, work 1.5
        add(-5, 0, 5, t - 1000, t + 1800, t + 5000); t += 5000        # delta step: entry 1.8, work 3.2
        add(6144, 5120, 4, t - 500, t + 2000, t + 7000); t += 7000    # gdn_out: own entry 2.0
        add(-1, 0, 5, t - 500, t + 1500, t + 4000); t += 4000         # AddNorm site: 1.5 + 2.5
        add(5120, 52224, 4, t - 500, t + 2000, t + 30000); t += 30000 # fused FFN: own entry 2.0
        add(-2, 0, 5, t - 500, t + 1500, t + 6000); t += 6000         # AddNorm site over partials: 1.5 + 4.5
    for i in (2, 9):  # in each layer the delta step traced after gdn_out
        L[i], L[i + 1] = L[i + 1], L[i]
    with open(path, "w") as f:
        for i, (K, N, rows) in enumerate(L):
            f.write(f"launch {i} {K} {N} {len(rows)}\n")
            for r in rows:
                f.write(" ".join(map(str, r)) + "\n")


def main():
    spec = importlib.util.spec_from_file_location("report", os.path.join(HERE, "v7_trace_report.py"))
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.txt")
        build(path)
        sys.argv = ["v7_trace_report.py", path]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            report.main()
    text = out.getvalue()
    expect = [
        "14 traced launches",
        # products: gap = W - the previous product's done
        ("gdn_out ", "    10.00"),   # 1.5 + 1.5 + 1.8 + 3.2 + 2.0
        ("ffn fused", "     6.00"),  # 1.5 + 2.5 + 2.0
        ("qkv+z ", "     6.50"),     # 1.5 + 4.5 + 0.5
        "conv + a/b 1.50 + 1.50 | delta step 1.80 + 3.20 | own entry 2.00",
        "addnorm site 1.50 + 2.50 | own entry 2.00",
        "addnorm site (parts) 1.50 + 4.50 | own entry 0.50",
    ]
    bad = []
    for e in expect:
        if isinstance(e, tuple):
            hit = [ln for ln in text.splitlines() if ln.startswith(e[0]) and e[1] in ln[:30]]
            if not hit:
                bad.append(f"product line '{e[0].strip()}' with gap {e[1].strip()}")
        elif e not in text:
            bad.append(e)
    if bad:
        print(text)
        print("MISSING:", *bad, sep="\n  ")
        return 1
    print("trace report: 7 checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
