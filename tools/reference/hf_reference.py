#!/usr/bin/env python3
"""Independent HuggingFace reference for Bonsai 2 packs: teacher-forced logits of transformers'
Qwen3_5ForCausalLM, fed the weights of an MLX 2-bit pack folder de-quantised and un-rotated here.

Nothing in this file uses the project's C++ code or its conventions beyond the published pack contract
(shared/spec/FACTS.md sections 3-6). It reads the MLX folder itself:

  model.safetensors   parsed here (header JSON + raw little-endian bytes; numpy only)
  ternary matrices    `.weight` uint32 [N, K/16] (element 16i+j of a row at bits 2j of word i),
                      `.scales` / `.biases` fp16 [N, K/group]; value = code * scale + bias (MLX affine)
  hadamard.json       folded matrices store rows w' = FWHT_n(s * w) / sqrt(n) blockwise; un-rotated
                      here as w = s * FWHT_n(w') / sqrt(n) (H_n symmetric, H_n H_n = n I); the
                      inverse-rotated embedding (stored z = R e) un-rotates with the same formula
  norms               the pack stores 1 + w for input_layernorm, post_attention_layernorm, model.norm,
                      q_norm, k_norm; HF's Qwen3_5RMSNorm computes x * (1 + w): w = stored - 1.
                      linear_attn.norm (the gated RMSNorm) is a raw gain in both.
  A_log, dt_bias, conv1d [C, 1, Kc], in_proj_a/b (bf16)   as stored (HF conventions)

Modes
  (default)                  build the model, run the prompts, write the logits fixture (needs torch)
  --check-effective DIR      compare the weights de-quantised here with make-pack's effective float
                             safetensors (numpy only, no torch): an independent check of the writer
  --tokens-only              print the prompts' token counts (no torch)
  --stats FIXTURE            print a fixture's statistics (finite, logit range, top-2 margins and how many
                             positions fall inside a tie band, argmax diversity); with --compare OTHER,
                             the max |difference| to another fixture of the same prompts (numpy only)

Fixture (safetensors): for prompt i, "p{i}.tokens" I32 [T] and "p{i}.logits" F32 [T, V] where row t
holds the logits after tokens[0..t]; metadata "prompts" = str(n), "names" = JSON list, provenance.

Float64: HF's qwen3_5 code upcasts to float32 in several places (RMSNorm, gated RMSNorm, the gated
delta rule kernels, the eager softmax, RoPE's angles). With --dtype float64 (the default) the model is
run under a torch function mode that turns every requested float32 into float64, so those upcasts
become float64 too and the whole forward is float64 (HF's code and algorithms unchanged). The chunked
(prefill) vs recurrent (cached decode) agreement printed by the run shows whether that held.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import sys
import time

import numpy as np

# --------------------------------------------------------------------------------------------------
# safetensors, read here (numpy has no bfloat16: BF16 is widened by hand)

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64,
              "U32": np.uint32, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16}


def read_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = blob[base + b: base + e]
        shape = tuple(int(s) for s in info["shape"])
        dt = info["dtype"]
        if dt == "BF16":
            u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        elif dt in _ST_DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
        else:
            raise SystemExit(f"{path}: tensor {name}: unsupported dtype {dt}")
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise SystemExit(f"{path}: tensor {name}: {arr.size} elements for shape {shape}")
        out[name] = arr.reshape(shape)
    return out, meta


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# names: GGUF (hadamard.json) -> HF

_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}
_GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def gguf_to_hf(name: str) -> str:
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m and m.group(2) in _GGUF_LAYER:
        return f"model.layers.{int(m.group(1))}.{_GGUF_LAYER[m.group(2)]}"
    raise SystemExit(f"hadamard.json: weight name '{name}' has no HF equivalent known here")


# RMSNorm gains the pack stores as 1 + w (HF keeps w and computes x * (1 + w)).
_ONE_PLUS_NORMS = re.compile(r"(model\.norm|.*\.input_layernorm|.*\.post_attention_layernorm|"
                             r".*\.self_attn\.q_norm|.*\.self_attn\.k_norm)\.weight")
_IGNORED_PREFIXES = ("vision_tower.", "model.visual.", "visual.", "mtp.", "model.mtp.")


# --------------------------------------------------------------------------------------------------
# the MLX pack -> HF float64 weights


def sylvester_hadamard(n: int) -> np.ndarray:
    """H_n with entry (r, c) = (-1)^popcount(r & c), built by doubling."""
    if n <= 0 or n & (n - 1):
        raise SystemExit(f"hadamard block size {n} is not a power of two")
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def dequantise_mlx(words: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, group: int,
                   name: str) -> np.ndarray:
    """MLX affine: element k of row r = code(r, k) * scales[r, k // group] + biases[r, k // group]."""
    if bits != 2:
        raise SystemExit(f"{name}: quantization bits {bits}, expected 2")
    n_rows, n_words = words.shape
    k = n_words * 16
    if scales.shape != (n_rows, k // group) or biases.shape != scales.shape:
        raise SystemExit(f"{name}: scales {scales.shape} / biases {biases.shape} do not fit words {words.shape} "
                         f"(group {group})")
    shifts = (2 * np.arange(16, dtype=np.uint32))[None, None, :]
    codes = ((words[:, :, None] >> shifts) & np.uint32(3)).reshape(n_rows, k)  # element 16i+j <- word i, bits 2j
    if np.any(codes == 3):
        print(f"note: {name}: code 3 present (not ternary)", file=sys.stderr)
    s = np.repeat(scales.astype(np.float64), group, axis=1)
    b = np.repeat(biases.astype(np.float64), group, axis=1)
    return codes.astype(np.float64) * s + b


def unrotate_rows(w: np.ndarray, signs: np.ndarray, block: int) -> np.ndarray:
    """w = s * FWHT_n(w') / sqrt(n), blockwise along the last axis (K)."""
    n_rows, k = w.shape
    if k % block:
        raise SystemExit(f"row width {k} is not a multiple of the Hadamard block {block}")
    h = sylvester_hadamard(block)
    t = (w.reshape(n_rows * (k // block), block) @ h).reshape(n_rows, k) / np.sqrt(block)
    return t * signs[None, :]


class Pack:
    """An MLX pack folder read and turned into HF-named float64 arrays."""

    def __init__(self, folder: str):
        self.folder = folder
        self.config = json.load(open(os.path.join(folder, "config.json")))
        self.text_config = dict(self.config.get("text_config", self.config))
        q = self.config.get("quantization") or self.config.get("quantization_config") or {}
        self.bits = int(q.get("bits", 2))
        self.group = int(q.get("group_size", 128))
        self.st_path = os.path.join(folder, "model.safetensors")
        raw, self.st_meta = read_safetensors(self.st_path)
        hpath = os.path.join(folder, "hadamard.json")
        self.hadamard = json.load(open(hpath)) if os.path.exists(hpath) else None
        self.notes: list[str] = []
        self.weights = self._convert(raw)

    def _signs(self) -> tuple[int, dict[int, np.ndarray]]:
        h = self.hadamard
        checks = {"version": 1, "transform": "normalized-sylvester-walsh-hadamard", "axis": "input-last-dimension"}
        for key, want in checks.items():
            if h.get(key) != want:
                raise SystemExit(f"hadamard.json: {key} = {h.get(key)!r}, expected {want!r}")
        block = int(h["block_size"])
        signs: dict[int, np.ndarray] = {}
        if h["sign_mode"] == "explicit":
            vals = np.asarray(h["sign_values"], dtype=np.float64)
            if not np.all(np.abs(vals) == 1):
                raise SystemExit("hadamard.json: sign_values holds values other than +-1")
            if sum(h["sign_widths"]) != vals.size:
                raise SystemExit("hadamard.json: sign_values length != sum(sign_widths)")
            off = 0
            for wdt in h["sign_widths"]:
                if wdt in signs:
                    raise SystemExit(f"hadamard.json: two sign vectors of width {wdt}")
                signs[int(wdt)] = vals[off: off + wdt]
                off += wdt
        elif h["sign_mode"] != "identity":
            raise SystemExit(f"hadamard.json: sign_mode {h['sign_mode']!r}")
        return block, signs

    def _convert(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prefix = "language_model."
        tensors: dict[str, np.ndarray] = {}
        for name, arr in raw.items():
            n = name[len(prefix):] if name.startswith(prefix) else name
            if n.startswith(_IGNORED_PREFIXES) or name.startswith(_IGNORED_PREFIXES):
                continue
            tensors[n] = arr
        out: dict[str, np.ndarray] = {}
        packed = sorted(n[: -len(".scales")] for n in tensors if n.endswith(".scales"))
        for base in packed:
            w = dequantise_mlx(tensors.pop(base + ".weight"), tensors.pop(base + ".scales"),
                               tensors.pop(base + ".biases"), self.bits, self.group, base)
            out[base + ".weight"] = w
        for n, arr in tensors.items():
            out[n] = arr.astype(np.float64)

        # un-rotation
        if self.hadamard is not None:
            block, signs = self._signs()
            folded = [gguf_to_hf(g) for g in self.hadamard.get("weight_names", [])]
            inverse = [gguf_to_hf(g) for g in self.hadamard.get("inverse_weight_names", [])]
            if len(set(folded + inverse)) != len(folded) + len(inverse):
                raise SystemExit("hadamard.json: duplicate names in weight_names / inverse_weight_names")
            for n in folded + inverse:
                if n not in out or n[: -len(".weight")] not in packed:
                    raise SystemExit(f"hadamard.json names {n}, which is not a packed matrix of the pack")
                k = out[n].shape[1]
                s = signs.get(k, np.ones(k)) if self.hadamard["sign_mode"] == "explicit" else np.ones(k)
                if self.hadamard["sign_mode"] == "explicit" and k not in signs:
                    raise SystemExit(f"hadamard.json: no sign vector of width {k} for {n}")
                out[n] = unrotate_rows(out[n], s, block)
            self.notes.append(f"un-rotated {len(folded)} folded matrices + {len(inverse)} inverse table(s), block {block}")
            # the config's module list must agree with hadamard.json
            mods = (self.config.get("quantization") or {}).get("modules")
            if mods:
                rot = sorted(m["name"] + ".weight" for m in mods if m.get("block"))
                if rot != sorted(folded + inverse):
                    self.notes.append("WARNING: config.json quantization.modules (block != 0) differ from hadamard.json names")
            self.notes.append(f"gdn_v_grouped = {self.hadamard.get('gdn_v_grouped')} (MLX tensors are in HF grouped order)")

        # HF conventions
        for n in list(out):
            if _ONE_PLUS_NORMS.fullmatch(n):
                out[n] = out[n] - 1.0
            elif n.endswith("linear_attn.conv1d.weight"):
                c = out[n]
                kc = int(self.text_config.get("linear_conv_kernel_dim", 4))
                if c.ndim == 3 and c.shape[1:] == (1, kc):
                    pass
                elif c.ndim == 3 and c.shape[1:] == (kc, 1):
                    out[n] = c.transpose(0, 2, 1).copy()
                elif c.ndim == 2 and c.shape[1] == kc:
                    out[n] = c[:, None, :].copy()
                else:
                    raise SystemExit(f"{n}: conv1d shape {c.shape} is not [C,1,{kc}] / [C,{kc},1] / [C,{kc}]")
            elif n.endswith("linear_attn.A_log"):
                if not np.all(np.isfinite(out[n])):
                    raise SystemExit(f"{n}: non-finite A_log")
        return out


# --------------------------------------------------------------------------------------------------
# prompts


def render_chat(template: str, chat: dict) -> str:
    """transformers' apply_chat_template environment (FACTS section 7)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        raise SystemExit("the fixture's chat prompt must not depend on the date (strftime_now called)")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    ctx = {k: v for k, v in chat.items()}
    return env.from_string(template).render(**ctx)


def load_prompts(pack: str, prompts_path: str) -> tuple[list[str], list[str], list[list[int]]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(pack, "tokenizer.json"))
    spec = json.load(open(prompts_path))["prompts"]
    names, texts, ids = [], [], []
    template = None
    for p in spec:
        if "chat" in p:
            if template is None:
                template = open(os.path.join(pack, "chat_template.jinja"), encoding="utf-8").read()
            text = render_chat(template, p["chat"])
        else:
            text = p["text"]
        names.append(p["name"])
        texts.append(text)
        ids.append(tok.encode(text, add_special_tokens=False).ids)
    return names, texts, ids


# --------------------------------------------------------------------------------------------------
# --check-effective


def check_effective(pack: Pack, eff_dir: str) -> int:
    eff, _ = read_safetensors(os.path.join(eff_dir, "model.safetensors"))
    ours = pack.weights
    bad = 0
    missing = sorted(set(ours) - set(eff))
    extra = sorted(set(eff) - set(ours))
    for n in missing:
        print(f"MISSING in effective: {n}")
    for n in extra:
        print(f"EXTRA in effective:   {n}")
    bad += len(missing) + len(extra)
    worst_rel, worst_name = 0.0, ""
    print(f"{'tensor':62s} {'shape':>16s} {'max|ref|':>10s} {'max|diff|':>10s} {'rel':>9s}")
    for n in sorted(set(ours) & set(eff)):
        a, b = ours[n], eff[n].astype(np.float64)
        if a.shape != b.shape:
            print(f"{n:62s} SHAPE ours {a.shape} effective {b.shape}")
            bad += 1
            continue
        d = float(np.max(np.abs(a - b))) if a.size else 0.0
        m = float(np.max(np.abs(a))) if a.size else 0.0
        rel = d / m if m > 0 else d
        if rel > worst_rel:
            worst_rel, worst_name = rel, n
        flag = "" if rel <= 1e-6 else "  <-- MISMATCH"
        if rel > 1e-6:
            bad += 1
        print(f"{n:62s} {str(list(a.shape)):>16s} {m:10.3e} {d:10.3e} {rel:9.2e}{flag}")
    # config: effective config.json vs the pack's text_config
    eff_cfg = json.load(open(os.path.join(eff_dir, "config.json")))
    for key, val in pack.text_config.items():
        if key in eff_cfg and eff_cfg[key] != val:
            print(f"config field {key}: pack {val!r} effective {eff_cfg[key]!r}")
            bad += 1
    print(f"\n{len(set(ours) & set(eff))} tensors compared; worst relative max|diff| {worst_rel:.3e} ({worst_name}); "
          f"{bad} problem(s)")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------------------
# --stats


def fixture_stats(path: str, other: str | None, tie_band: float) -> int:
    t, meta = read_safetensors(path)
    n = int(meta["prompts"])
    names = json.loads(meta["names"])
    print(f"{path}: {n} prompts {names}; dtype {meta.get('dtype')}; device {meta.get('device')}")
    print(f"versions {meta.get('versions')}; checks {meta.get('checks')}")
    all_margins, bad = [], 0
    for i in range(n):
        tok, lg = t[f"p{i}.tokens"], t[f"p{i}.logits"].astype(np.float64)
        if lg.shape[0] != tok.shape[0]:
            print(f"p{i}: {tok.shape[0]} tokens but {lg.shape[0]} logit rows")
            bad += 1
        fin = bool(np.all(np.isfinite(lg)))
        bad += 0 if fin else 1
        top2 = np.sort(lg, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        all_margins.append(margin)
        arg = np.argmax(lg, axis=1)
        std = lg.std(axis=1)
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        ent = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=1)
        print(f"p{i} {names[i]:8s} T={lg.shape[0]:4d} V={lg.shape[1]} finite={fin} logits [{lg.min():.3f}, {lg.max():.3f}] "
              f"row-std {std.mean():.3f}; entropy {ent.mean():.3f} nats (uniform {np.log(lg.shape[1]):.3f}); "
              f"distinct argmax {len(set(arg.tolist()))}; top-2 margin min {margin.min():.2e} median {np.median(margin):.3f}; "
              f"in tie band {int((margin < tie_band).sum())}")
    m = np.concatenate(all_margins)
    qs = np.quantile(m, [0.0, 0.01, 0.05, 0.25, 0.5])
    print(f"all {m.size} positions: top-2 margin quantiles min/1%/5%/25%/50% = " + " / ".join(f"{q:.2e}" for q in qs))
    for band in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2):
        print(f"  margin < {band:.0e}: {int((m < band).sum())} positions")
    if other:
        o, _ = read_safetensors(other)
        worst = 0.0
        for i in range(n):
            if not np.array_equal(o[f"p{i}.tokens"], t[f"p{i}.tokens"]):
                print(f"p{i}: tokens differ from {other}")
                bad += 1
                continue
            worst = max(worst, float(np.max(np.abs(o[f"p{i}.logits"].astype(np.float64) - t[f"p{i}.logits"]))))
        print(f"max |logit difference| to {other}: {worst:.3e}")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------------------
# the HF model


def hf_text_config(text_config: dict):
    """Qwen3_5TextConfig from the pack's text_config, checked field by field after HF's own defaults ran.

    Returns (config, fixes): `fixes` lists every field this script had to add or change for transformers
    (none for make-pack's tiny pack with transformers 5.17)."""
    from transformers import Qwen3_5TextConfig

    tc = dict(text_config)
    fixes: list[str] = []
    cfg = Qwen3_5TextConfig(**tc)
    want_types = text_config.get("layer_types")
    if want_types is not None and list(cfg.layer_types) != list(want_types):
        raise SystemExit(f"layer_types: HF made {cfg.layer_types}, pack says {want_types}")
    rp = cfg.rope_parameters
    want_rp = text_config.get("rope_parameters", {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in want_rp and rp.get(key) != want_rp[key]:
            raise SystemExit(f"rope_parameters.{key}: HF has {rp.get(key)!r}, pack says {want_rp[key]!r}")
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "rms_norm_eps", "vocab_size", "tie_word_embeddings"):
        if key in text_config and getattr(cfg, key) != text_config[key]:
            raise SystemExit(f"{key}: HF has {getattr(cfg, key)!r}, pack says {text_config[key]!r}")
        if key not in text_config:
            fixes.append(f"{key} absent from text_config: HF default {getattr(cfg, key)!r} used")
    return cfg, fixes


class PromoteFloat32:
    """A torch function mode under which every requested float32 becomes float64 (see module doc)."""

    def __new__(cls, torch):
        from torch.overrides import TorchFunctionMode

        f32, f64 = torch.float32, torch.float64
        tensor_float = torch.Tensor.float
        tensor_to = torch.Tensor.to

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = dict(kwargs or {})
                if func is tensor_float:
                    return args[0].to(f64)
                if kwargs.get("dtype") is f32:
                    kwargs["dtype"] = f64
                if func is tensor_to:
                    args = tuple(f64 if a is f32 else a for a in args)
                return func(*args, **kwargs)

        return _Mode()


def build_model(pack: Pack, dtype_name: str, device: str, promote: bool):
    import contextlib

    import torch
    from transformers import Qwen3_5ForCausalLM

    dtype = {"float64": torch.float64, "float32": torch.float32}[dtype_name]
    cfg, fixes = hf_text_config(pack.text_config)
    cfg._attn_implementation = "eager"
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    mode = PromoteFloat32(torch) if promote else contextlib.nullcontext()
    try:
        with mode:
            model = Qwen3_5ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    sd_keys = set(model.state_dict().keys())
    ours = set(pack.weights)
    missing, unexpected = sorted(sd_keys - ours), sorted(ours - sd_keys)
    if missing or unexpected:
        raise SystemExit(f"state dict: missing {missing}, unexpected {unexpected}")
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in pack.weights.items()}
    for k, v in model.state_dict().items():
        if tuple(v.shape) != tuple(sd[k].shape):
            raise SystemExit(f"{k}: model shape {tuple(v.shape)}, pack gives {tuple(sd[k].shape)}")
    res = model.load_state_dict(sd, strict=True)
    if res.missing_keys or res.unexpected_keys:
        raise SystemExit(f"load_state_dict: {res}")
    model.to(dtype)
    if promote:
        rot = model.model.rotary_emb
        if rot.inv_freq.dtype != torch.float64:
            fixes.append(f"rotary inv_freq built as {rot.inv_freq.dtype}")
    model.to(device)
    # everything loaded is what we computed (no tying, no re-initialisation)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if not torch.equal(v.cpu(), sd[k]):
                raise SystemExit(f"{k}: parameter differs from the loaded value after load")
    if model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        raise SystemExit("lm_head is tied to embed_tokens although the pack has an untied head")
    return model, fixes


def run_logits(model, ids: list[int], device: str, promote: bool):
    import contextlib

    import torch

    mode = PromoteFloat32(torch) if promote else contextlib.nullcontext()
    with torch.no_grad(), mode:
        x = torch.tensor([ids], dtype=torch.long, device=device)
        out = model(input_ids=x, use_cache=False)
    return out.logits[0].double().cpu().numpy()


def run_incremental(model, ids: list[int], prefill: int, device: str, promote: bool):
    """Prefill `prefill` tokens with a cache, then feed one token at a time (HF's recurrent GDN path)."""
    import contextlib

    import torch

    mode = PromoteFloat32(torch) if promote else contextlib.nullcontext()
    rows = []
    with torch.no_grad(), mode:
        x = torch.tensor([ids], dtype=torch.long, device=device)
        out = model(input_ids=x[:, :prefill], use_cache=True)
        rows.append(out.logits[0])
        cache = out.past_key_values
        for t in range(prefill, len(ids)):
            out = model(input_ids=x[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0])
    return torch.cat(rows, 0).double().cpu().numpy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", help="MLX pack folder (model.safetensors, config.json, hadamard.json, ...)")
    ap.add_argument("--prompts", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.json"))
    ap.add_argument("--out", help="fixture path (.safetensors)")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--preset", default="", help="provenance: make-pack preset of the pack")
    ap.add_argument("--seed", default="", help="provenance: make-pack seed of the pack")
    ap.add_argument("--check-effective", metavar="DIR", help="compare with make-pack's effective folder (numpy only)")
    ap.add_argument("--tokens-only", action="store_true", help="print the prompts' tokens and exit")
    ap.add_argument("--stats", metavar="FIXTURE", help="print a fixture's statistics and exit (numpy only)")
    ap.add_argument("--compare", metavar="FIXTURE", help="with --stats: max |logit difference| to another fixture")
    ap.add_argument("--tie-band", type=float, default=1e-3, help="with --stats: top-2 margin counted as a tie")
    ap.add_argument("--cross-checks", action="store_true",
                    help="also run stock HF (no promotion) in float32 and float64 and the cached decode path, print diffs")
    a = ap.parse_args()

    t0 = time.time()
    if a.stats:
        return fixture_stats(a.stats, a.compare, a.tie_band)
    if not a.pack:
        ap.error("--pack is required")
    if a.tokens_only:
        names, texts, ids = load_prompts(a.pack, a.prompts)
        for n, t, i in zip(names, texts, ids):
            print(f"{n}: {len(i)} tokens, {len(t)} chars: {i[:24]}{' ...' if len(i) > 24 else ''}")
        print(f"total {sum(len(i) for i in ids)} positions")
        return 0

    pack = Pack(a.pack)
    for note in pack.notes:
        print(note)
    print(f"pack read and converted: {len(pack.weights)} tensors, {time.time() - t0:.1f}s", flush=True)
    if a.check_effective:
        return check_effective(pack, a.check_effective)
    if not a.out:
        ap.error("--out is required to write a fixture")

    import jinja2
    import safetensors
    import tokenizers
    import torch
    import transformers
    from safetensors.numpy import save_file

    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev_name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    versions = {"transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__,
                "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__,
                "safetensors": safetensors.__version__, "python": sys.version.split()[0]}
    print("versions:", json.dumps(versions), "device:", dev_name, flush=True)

    names, texts, ids = load_prompts(a.pack, a.prompts)
    print("prompts:", {n: len(i) for n, i in zip(names, ids)}, "total", sum(len(i) for i in ids), flush=True)

    promote = a.dtype == "float64"
    model, fixes = build_model(pack, a.dtype, device, promote)
    print(f"model built and loaded ({a.dtype}{', float32 upcasts promoted' if promote else ''}); fixes: {fixes}",
          flush=True)
    logits = []
    for n, i in zip(names, ids):
        logits.append(run_logits(model, i, device, promote))
        print(f"  {n}: {len(i)} positions, {time.time() - t0:.1f}s", flush=True)

    checks: dict[str, object] = {}
    if a.cross_checks:
        longest = int(np.argmax([len(i) for i in ids]))
        try:
            inc = run_incremental(model, ids[longest], 37, device, promote)
            checks["chunked_vs_cached_decode_maxabs"] = float(np.max(np.abs(inc - logits[longest])))
            print(f"  cached decode of {names[longest]} done, {time.time() - t0:.1f}s", flush=True)
        except Exception as e:  # report, never lose the fixture over a cross-check
            checks["chunked_vs_cached_decode_error"] = repr(e)
        del model
        for dt, pr in (("float64", False), ("float32", False)):
            try:
                m2, _ = build_model(pack, dt, device, pr)
                other = [run_logits(m2, i, device, pr) for i in ids]
                checks[f"stock_hf_{dt}_vs_fixture_maxabs"] = float(max(np.max(np.abs(o - l)) for o, l in zip(other, logits)))
                del m2
                print(f"  stock HF {dt} done, {time.time() - t0:.1f}s", flush=True)
            except Exception as e:
                checks[f"stock_hf_{dt}_error"] = repr(e)
        print("cross-checks:", json.dumps(checks), flush=True)

    tensors = {}
    for i, (tk, lg) in enumerate(zip(ids, logits)):
        if not np.all(np.isfinite(lg)):
            raise SystemExit(f"prompt {names[i]}: non-finite logits")
        tensors[f"p{i}.tokens"] = np.asarray(tk, dtype=np.int32)
        tensors[f"p{i}.logits"] = np.ascontiguousarray(lg.astype(np.float32))
    meta = {
        "prompts": str(len(ids)),
        "names": json.dumps(names),
        "texts": json.dumps(texts, ensure_ascii=False),
        "logits": "row t of p{i}.logits = next-token logits after tokens[0..t] (teacher-forced, one full-sequence forward)",
        "generator": "tools/reference/hf_reference.py",
        "model_class": "transformers.Qwen3_5ForCausalLM (attn_implementation=eager, use_cache=False)",
        "dtype": a.dtype + (" (HF float32 upcasts promoted to float64)" if promote else ""),
        "stored_dtype": "float32",
        "device": dev_name,
        "versions": json.dumps(versions),
        "pack_preset": a.preset,
        "pack_seed": a.seed,
        "pack_format": "mlx",
        "mlx_model_safetensors_sha256": sha256_file(pack.st_path),
        "hadamard_json_sha256": sha256_file(os.path.join(a.pack, "hadamard.json")) if pack.hadamard else "",
        "tokenizer_json_sha256": sha256_file(os.path.join(a.pack, "tokenizer.json")),
        "prompts_json_sha256": sha256_file(a.prompts),
        "config_fixes": json.dumps(fixes),
        "checks": json.dumps(checks),
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    save_file(tensors, a.out, metadata=meta)
    print(f"wrote {a.out}: {len(ids)} prompts, {sum(len(i) for i in ids)} positions, vocab {logits[0].shape[1]}, "
          f"{os.path.getsize(a.out)} bytes, {time.time() - t0:.1f}s total", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
