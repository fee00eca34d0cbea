#!/usr/bin/env python3
"""Fails (exit 1) when the committed HF fixture no longer matches what make-pack writes.

The fixture records the sha256 of the MLX pack files it was computed from. If make-pack's tiny model
changes (weights, tokenizer, contract), every gate against the fixture would fail with a confusing
logit mismatch; this check says plainly that the fixture is stale and how to regenerate it.

  check_fixture_fresh.py BONSAI_BINARY FIXTURE WORKDIR
"""
import hashlib
import json
import os
import struct
import subprocess
import sys


def metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    binary, fixture, work = sys.argv[1:4]
    meta = metadata(fixture)
    preset, seed = meta["pack_preset"], meta["pack_seed"]
    subprocess.run([binary, "make-pack", "--preset", preset, "--seed", seed, "--format", "mlx", "-o", work],
                   check=True, stdout=subprocess.DEVNULL)
    folder = os.path.join(work, f"{preset}-mlx")
    stale = []
    for key, name in (("mlx_model_safetensors_sha256", "model.safetensors"), ("hadamard_json_sha256", "hadamard.json"),
                      ("tokenizer_json_sha256", "tokenizer.json")):
        got = sha256(os.path.join(folder, name))
        if got != meta[key]:
            stale.append(f"{name}: fixture was made from {meta[key][:16]}..., make-pack now writes {got[:16]}...")
    if stale:
        print(f"{fixture} is stale: make-pack --preset {preset} --seed {seed} no longer writes the pack it was made from:")
        for s in stale:
            print("  " + s)
        print("regenerate it with tools/reference/hf_reference.py (see tools/reference/README.md)")
        return 1
    print(f"{fixture}: fresh ({preset} seed {seed}, 3 files match)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
