#!/usr/bin/env python3
"""Reads a matvec v7 timeline of one decode step (BONSAI_CUDA_MV7_TRACE=<file> bonsai bench ...; round 24) and prints
where the step's time goes, per product shape (medians over the step's launches of that shape, in us).

For launch i: A(i) = its last block's done (the product is complete), W(i) = its first block past griddepcontrol.wait
(its predecessor on the chain is complete). gap = W(i) - A(i-1): the small kernels between two products on the chain;
prod = A(i) - W(i): the product once its input is ready. Its parts, per block then the median over blocks, after W(i):
staged (the activations in shared memory), full0 / full_last (its first / last stage's bytes landed; negative = before
the input was ready), done. 'start' / 'issued' are the blocks' first instruction and first copy issue, after A(i-1).

Round 36: the fused FFN's launches (one a layer) are traced too, as shape 'ffn fused' (slots 0-23 as v7's, its stages
both phases'), and a second table gives their own events after W: last_a (phase A's last stage consumed), polled (the
group barrier passed), site (the chunk's digits ready), full_b (phase B's first stage seen).

Round 37: the chain's small kernels (K < 0: the sites, the conv + a / b pair, the delta step; three events a block in
slots 0 / 2 / 5) are traced too. The launches are taken in the order of their W (the chain's order: the backend may
trace a held launch after the one that follows it); products keep their gap over the previous product, and a third table
splits each product's gap into its chain kernels: for each, entry = its W - the previous launch's done (the launch
boundary: the predecessor's completion reaching the waiting blocks) and work = its done - its W; then the product's own
entry after the last of them."""
import statistics
import sys

SLOTS = dict(start=0, issued=1, cwait=2, staged=3, pwait=4, done=5, stages=6, full0=8, empty0=16)
FFN_SLOTS = dict(last_a=24, polled=25, site=26, full_b=27)
NAMES = {(5120, 16384): "qkv+z", (6144, 5120): "gdn_out", (5120, 34816): "gate+up", (17408, 5120): "ffn_down",
         (5120, 248320): "head", (5120, 52224): "ffn fused"}
CHAIN = {1: "addnorm site", 2: "addnorm site (parts)", 3: "row site", 4: "conv + a/b", 5: "delta step"}


def read(path):
    launches = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if p[0] == "launch":
                launches.append(dict(K=int(p[2]), N=int(p[3]), rows=[]))
            else:
                launches[-1]["rows"].append([int(v) for v in p])
    return launches


def chain_table(chain, split):
    """The chain kernels' own medians, and each product's gap split into them (us)."""
    if not chain:
        return
    print("chain kernels (medians over launches, us): entry = W - the previous launch's done, work = done - W")
    print(f"{'kernel':22s} {'n':>4s} {'entry':>8s} {'work':>8s} {'start':>8s}")
    for name, d in sorted(chain.items(), key=lambda kv: -sum(kv[1]["work"])):
        print(f"{name:22s} {len(d['work']):4d} " +
              " ".join(f"{statistics.median(d[k]):8.2f}" for k in ("entry", "work", "start")))
    print("each product's gap, split (medians over its launches, us): the chain kernels since the previous product, "
          "then its own entry")
    for name, ds in split.items():
        seqs = {}
        for seq, parts, own in ds:
            seqs.setdefault(seq, []).append((parts, own))
        for seq, runs in seqs.items():
            cells = []
            for i, k in enumerate(seq):
                ent = statistics.median(r[0][i][0] for r in runs)
                wrk = statistics.median(r[0][i][1] for r in runs)
                cells.append(f"{k} {ent:.2f} + {wrk:.2f}")
            own = statistics.median(r[1] for r in runs)
            print(f"  {name:10s} x{len(runs):<3d} " + " | ".join(cells + [f"own entry {own:.2f}"]))


def main():
    ls = read(sys.argv[1])
    # The chain's order: every launch by its first block past the wait.
    ls = [L for L in ls if any(r[SLOTS["start"]] for r in L["rows"])]
    ls.sort(key=lambda L: min(r[SLOTS["cwait"]] for r in L["rows"] if r[SLOTS["start"]]))
    per = {}
    ffn = {k: [] for k in FFN_SLOTS}
    chain, split = {}, {}
    pending = []  # the chain kernels since the last product: (name, entry, work)
    prev_done = prev_any = None
    total_gap = total_prod = 0.0
    for L in ls:
        rows = [r for r in L["rows"] if r[SLOTS["start"]]]
        done = max(r[SLOTS["done"]] for r in rows)
        w = min(r[SLOTS["cwait"]] for r in rows)
        if L["K"] < 0:
            name = CHAIN.get(-L["K"], f"chain {-L['K']}")
            if prev_any is not None:
                d = chain.setdefault(name, {"entry": [], "work": [], "start": []})
                d["entry"].append((w - prev_any) / 1e3)
                d["work"].append((done - w) / 1e3)
                d["start"].append((min(r[0] for r in rows) - prev_any) / 1e3)
                pending.append((name, (w - prev_any) / 1e3, (done - w) / 1e3))
            prev_any = done
            continue
        name = NAMES.get((L["K"], L["N"]), f"K{L['K']}xN{L['N']}")
        d = per.setdefault(name, {k: [] for k in ("gap", "prod", "start", "issued", "staged", "full0", "full_last",
                                                   "done_med", "stagger", "stages")})
        med = lambda f: statistics.median(f(r) for r in rows)  # noqa: E731
        last = lambda r: r[SLOTS["full0"] + min(r[SLOTS["stages"]], 8) - 1]  # noqa: E731
        if prev_done is not None:
            seq = tuple(p[0] for p in pending)
            split.setdefault(name, []).append((seq, [(p[1], p[2]) for p in pending], (w - prev_any) / 1e3))
            d["gap"].append((w - prev_done) / 1e3)
            d["start"].append((med(lambda r: r[0]) - prev_done) / 1e3)
            d["issued"].append((med(lambda r: r[SLOTS["issued"]]) - prev_done) / 1e3)
            total_gap += (w - prev_done) / 1e3
        d["prod"].append((done - w) / 1e3)
        total_prod += (done - w) / 1e3
        d["staged"].append((med(lambda r: r[SLOTS["staged"]]) - w) / 1e3)
        d["full0"].append((med(lambda r: r[SLOTS["full0"]]) - w) / 1e3)
        d["full_last"].append((med(last) - w) / 1e3)
        d["done_med"].append((med(lambda r: r[SLOTS["done"]]) - w) / 1e3)
        d["stagger"].append((med(lambda r: r[0]) - min(r[0] for r in rows)) / 1e3)
        d["stages"].append(med(lambda r: r[SLOTS["stages"]]))
        if name == "ffn fused":
            for k, slot in FFN_SLOTS.items():
                seen = [r[slot] for r in rows if r[slot]]
                if seen:
                    ffn[k].append((statistics.median(seen) - w) / 1e3)
        prev_done = prev_any = done
        pending = []
    span = (max(max(r[SLOTS["done"]] for r in L["rows"] if r[0]) for L in ls) -
            min(min(r[0] for r in L["rows"] if r[0]) for L in ls)) / 1e3
    print(f"{len(ls)} traced launches, first start to last done {span:.1f} us: products (W->A) {total_prod:.1f} us, "
          f"between products (A->W) {total_gap:.1f} us")
    keys = ("gap", "start", "issued", "prod", "staged", "full0", "full_last", "done_med", "stagger", "stages")
    print(f"{'shape':10s} {'n':>4s} " + " ".join(f"{k:>9s}" for k in keys))
    for name, d in sorted(per.items(), key=lambda kv: -sum(kv[1]["prod"])):
        vals = [statistics.median(d[k]) if d[k] else float("nan") for k in keys]
        print(f"{name:10s} {len(d['prod']):4d} " + " ".join(f"{v:9.2f}" for v in vals))
    if ffn["last_a"]:
        print("ffn fused, its own events after W (medians over blocks, then over launches, us):")
        print("  " + " ".join(f"{k:>9s}" for k in FFN_SLOTS))
        print("  " + " ".join(f"{statistics.median(ffn[k]) if ffn[k] else float('nan'):9.2f}" for k in FFN_SLOTS))
    chain_table(chain, split)


if __name__ == "__main__":
    main()
