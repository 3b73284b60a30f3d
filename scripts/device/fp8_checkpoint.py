#!/usr/bin/env python3
"""Convert a BF16 Hugging Face checkpoint directory of a Qwen3.5/3.6 MoE (as
gen_hf_checkpoint.py or transformers' `save_pretrained` writes it) into the
block-FP8 layout of the published `Qwen/Qwen3.6-35B-A3B-FP8`:

- every Linear weight not in `modules_to_not_convert` as `F8_E4M3` with an f32
  `weight_scale_inv` per 128x128 block, quantized by transformers' own
  `Fp8Quantize` op exactly as scripts/make_fp8_fixture.py does (the shared code
  is scripts/fp8_quant.py);
- routed experts stored per expert (`mlp.experts.N.{gate,up,down}_proj.weight`),
  the published layout, whether the input has them fused
  (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I], what
  gen_hf_checkpoint.py writes) or already per expert;
- config.json with the `quantization_config` of the fixture
  (`modules_to_not_convert` spelled with the input's tensor prefix:
  `model.language_model.` for a nested multimodal config, `model.` for a
  text-only one; tensor names and the rest of the config are kept as they are),
  a new `model.safetensors.index.json`, and every other file of the directory
  (tokenizer, generation config, chat template) copied.

Streaming: one input shard at a time (read tensor by tensor from the
memory-mapped file, quantized on the GPU when torch.cuda is available, else on
the CPU), written as one output shard of the same number, so RAM holds about
one output shard (up to ~3.5 GB for 5 GB BF16 shards) plus one input tensor. With
--delete-input each input shard is removed once its FP8 shard is written (and
the input's config.json at the start, so a half-converted input never passes
for a checkpoint), so BF16 input and FP8 output fit together in a tmpfs little
larger than the BF16 model; at the end the input's remaining files are removed.
The output's config.json is written last: its presence means the conversion
finished.

On a GPU the first --cross-check quantized tensors of each shard are also
quantized on the CPU and must be bit-identical (E4M3 bytes and scales).

    python3 scripts/device/fp8_checkpoint.py /dev/shm/m40 /dev/shm/m40-fp8 [--delete-input]

Needs torch, transformers (5.17, scripts/requirements-fixtures.txt: the op is
`Fp8Quantize._quantize_one`), safetensors.
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fp8_quant as fq  # noqa: E402

INDEX = "model.safetensors.index.json"


def text_config(cfg):
    """(the text config, the text model's tensor prefix)."""
    if "text_config" in cfg:
        return cfg["text_config"], "model.language_model."
    return cfg, "model."


def layer_types(tc):
    if tc.get("layer_types"):
        return tc["layer_types"]
    interval = tc.get("full_attention_interval", 4)
    n = tc["num_hidden_layers"]
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]


def input_shards(src):
    """(weight_map of the input or None for a single file, the shard files in order)."""
    if (src / INDEX).exists():
        wm = json.loads((src / INDEX).read_text())["weight_map"]
        return wm, sorted(set(wm.values()))
    if (src / "model.safetensors").exists():
        return None, ["model.safetensors"]
    raise SystemExit(f"{src}: no {INDEX} nor model.safetensors")


def convert_shard(path, op, qcfg, inter, dev, cross_check):
    """The FP8 tensors of one input shard (on the CPU) and how many are FP8."""
    skip = qcfg["modules_to_not_convert"]
    out, n_fp8, checked = {}, 0, 0
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for key in f.keys():
            t = f.get_tensor(key)
            fused = key.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
            if fused or (t.ndim == 2 and fq.is_quantized(key, skip)):
                t = t.to(dev)
            for name, v in fq.unfuse_experts(key, t, inter):
                if v.ndim == 2 and fq.is_quantized(name, skip):
                    q = fq.quantize_one(op, name, v)
                    q = {k: x.cpu() for k, x in q.items()}
                    if dev != "cpu" and checked < cross_check:
                        ref = fq.quantize_one(op, name, v.cpu())
                        for k, x in ref.items():
                            assert torch.equal(x.view(torch.uint8), q[k].view(torch.uint8)), (
                                f"{k}: GPU and CPU quantization differ"
                            )
                        checked += 1
                    out.update(q)
                    n_fp8 += 1
                else:
                    out[name] = v.cpu()
            del t
    return out, n_fp8, checked


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="BF16 checkpoint directory")
    ap.add_argument("dst", type=Path, help="FP8 checkpoint directory to write (must not exist or be empty)")
    ap.add_argument("--delete-input", action="store_true", help="remove each input shard once converted")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--cross-check", type=int, default=2, metavar="N",
                    help="on a GPU, tensors per shard also quantized on the CPU and compared (default 2)")
    a = ap.parse_args()
    src, dst = a.src, a.dst
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    if transformers.__version__ != "5.17.0":
        print(f"note: transformers {transformers.__version__}; the fixture generator pins 5.17.0", file=sys.stderr)

    cfg = json.loads((src / "config.json").read_text())
    if "quantization_config" in cfg:
        raise SystemExit(f"{src}/config.json already has a quantization_config")
    tc, prefix = text_config(cfg)
    inter = tc["moe_intermediate_size"]
    qcfg = fq.quantization_config(layer_types(tc), prefix)
    weight_map, shards = input_shards(src)
    if weight_map is not None and f"{prefix}embed_tokens.weight" not in weight_map:
        raise SystemExit(f"{src}: no {prefix}embed_tokens.weight (prefix guessed from config.json)")
    if dst.exists() and any(dst.iterdir()):
        raise SystemExit(f"{dst} exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    op = fq.quantizer(qcfg)
    if a.delete_input:
        (src / "config.json").unlink()

    print(f"{src} -> {dst}: {len(shards)} shards, quantizing on {dev} "
          f"(transformers {transformers.__version__}, torch {torch.__version__})", flush=True)
    t0 = time.time()
    new_map, total, n_fp8, n_checked, bytes_in = {}, 0, 0, 0, 0
    for i, shard in enumerate(shards):
        ts = time.time()
        size_in = (src / shard).stat().st_size
        out, n, checked = convert_shard(src / shard, op, qcfg, inter, dev, a.cross_check)
        fname = shard if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(out, str(dst / fname), metadata={"format": "pt"})
        for k, v in out.items():
            new_map[k] = fname
            total += v.numel() * v.element_size()
        del out
        if a.delete_input:
            (src / shard).unlink()
        n_fp8 += n
        n_checked += checked
        bytes_in += size_in
        print(f"  {shard}: {size_in / 1e9:.2f} GB -> {fname}: {(dst / fname).stat().st_size / 1e9:.2f} GB, "
              f"{n} FP8 tensors, {time.time() - ts:.1f} s", flush=True)

    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(new_map.items()))}
    (dst / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    copied = []
    for p in sorted(src.iterdir()):
        if p.is_file() and p.name not in (INDEX, "config.json") and not p.name.endswith(".safetensors"):
            shutil.copy(p, dst / p.name)
            copied.append(p.name)
    cfg["quantization_config"] = qcfg
    tmp = dst / "config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2) + "\n")
    os.replace(tmp, dst / "config.json")
    if a.delete_input:
        for name in copied + [INDEX]:
            (src / name).unlink(missing_ok=True)
        try:
            src.rmdir()
        except OSError:
            print(f"note: {src} still holds files it did not convert", file=sys.stderr)

    checked = f" ({n_checked} also quantized on the CPU: bit-identical)" if dev != "cpu" else ""
    print(f"done in {time.time() - t0:.1f} s on {dev}: {n_fp8} FP8 tensors{checked}, "
          f"{bytes_in / 1e9:.2f} GB -> {total / 1e9:.2f} GB of tensors; copied {copied}")


if __name__ == "__main__":
    main()
