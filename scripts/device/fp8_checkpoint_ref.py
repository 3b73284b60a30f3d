#!/usr/bin/env python3
"""transformers' greedy tokens on an FP8 checkpoint directory written by
fp8_checkpoint.py (text-only Qwen3_5MoeForCausalLM), to compare with
`qwasi generate --model DIR --prompt-tokens ... --logprobs 2 --json`: loaded as
scripts/make_fp8_fixture.py's reference is (FineGrainedFP8Config(dequantize=True):
fp8 -> bf16 weights), computed in float32 without a cache (a model of only GDN
layers has nothing transformers' cache can count). Needs the model's size in
f32 in RAM (2 layers at full width: ~11 GB).

    python3 scripts/device/fp8_checkpoint_ref.py DIR 9707,11,1879,374,264 6 > ref.json
"""
import json
import sys
import time

import torch
from transformers import FineGrainedFP8Config, Qwen3_5MoeForCausalLM

d, prompt, n = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
t0 = time.time()
m = Qwen3_5MoeForCausalLM.from_pretrained(d, dtype=torch.bfloat16, quantization_config=FineGrainedFP8Config(dequantize=True),
                                          attn_implementation="eager", experts_implementation="eager")
print(f"loaded in {time.time() - t0:.1f} s; dtypes {sorted({str(v.dtype) for v in m.state_dict().values()})}", file=sys.stderr)
m = m.float().eval()
ids, out = list(prompt), []
with torch.no_grad():
    for _ in range(n):
        lp = torch.log_softmax(m(torch.tensor([ids]), use_cache=False).logits[0, -1].float(), -1)
        t = int(lp.argmax())
        top = torch.topk(lp, 2)
        out.append({"token": t, "logprob": float(lp[t]),
                    "top": [[int(i), float(v)] for v, i in zip(top.values, top.indices)]})
        ids.append(t)
print(json.dumps({"tokens": [o["token"] for o in out], "logprobs": out}))
