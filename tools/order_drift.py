#!/usr/bin/env python3
"""How far two transformers runs that differ only in the order of the attention's sums drift apart,
on the committed fixtures' quantized references (REFERENCE.md, "The numerics contract": a quantized
probe's bound comes from this drift, not from one kernel's luck).

Per case and pack kind (i8, q4) the quantization-aware decoder of tools/hf_reference.py runs twice on
the fixture's checkpoint: with `attn_implementation="eager"` (the fixtures' own: scores by matmul,
softmax, then probabilities times V) and with `"sdpa"` (PyTorch's fused CPU attention: blocks of keys
with an online softmax, the order xdna-vl's tiled kernel also takes). Everything else, the weights,
the quantized linears and their sums, is the same code. It reports, for the prompt arm (the hybrid
prefill rows) and the text arm (text-only rows), the largest |Δlogit| between the two runs and their
top-1 agreement, and checks that the eager run reproduces the committed reference bit for bit (so the
drift is measured on the very logits the probe compares against).

  python tools/order_drift.py                       # every case with quantized references
  python tools/order_drift.py --case odd --case hd128

Needs torch, transformers (5.x) and safetensors; CI does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as hf  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


def model_class(spec: dict):
    if spec.get("model") == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForConditionalGeneration as cls
    elif hf.is_qwen3_5(spec):
        from transformers import Qwen3_5ForConditionalGeneration as cls
    elif spec.get("model") == "moe":
        from transformers import Qwen3VLMoeForConditionalGeneration as cls
    else:
        from transformers import Qwen3VLForConditionalGeneration as cls
    return cls


def load_inputs(path: str) -> tuple[hf.HybridInputs, int]:
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        inputs = hf.HybridInputs(
            input_ids=f.get_tensor("input_ids"),
            position_ids=f.get_tensor("position_ids"),
            image_embeds=f.get_tensor("image_embeds"),
            deepstack=f.get_tensor("deepstack"),
            rope_delta=int(meta["rope_delta"]),
        )
    return inputs, int(meta["image_token_id"])


def arms(model, kind: str, inputs, image_token_id: int, text_ids) -> dict:
    with torch.no_grad(), hf.quantized_text_decoder(model, kind) as q:
        prefill, _, _ = hf.run_hybrid_path(q, inputs, image_token_id, 1)
        return dict(prompt=prefill, text=hf.run_text(q, text_ids))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", help="fixture case (default: every one with reference-q4)")
    args = ap.parse_args()
    cases = args.case or sorted(
        c for c in os.listdir(FIXTURES) if os.path.exists(os.path.join(FIXTURES, c, "reference-q4.safetensors"))
    )
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    results = []
    for case in cases:
        root = os.path.join(FIXTURES, case)
        spec = json.load(open(os.path.join(root, "case.json")))["spec"]
        inputs, image_token_id = load_inputs(os.path.join(root, "inputs.safetensors"))
        models = {
            impl: model_class(spec).from_pretrained(
                os.path.join(root, "checkpoint"), dtype=torch.float32, attn_implementation=impl
            ).eval()
            for impl in ("eager", "sdpa")
        }
        for kind in ("i8", "q4"):
            with safe_open(os.path.join(root, f"reference-{kind}.safetensors"), "pt") as f:
                ref = dict(prompt=f.get_tensor("prefill_logits"), text=f.get_tensor("text_logits"))
                text_ids = f.get_tensor("text_ids")
            runs = {impl: arms(m, kind, inputs, image_token_id, text_ids) for impl, m in models.items()}
            for arm in ("prompt", "text"):
                eager, sdpa = runs["eager"][arm], runs["sdpa"][arm]
                agree, rows = hf.top1_agreement(eager, sdpa)
                row = dict(
                    case=case,
                    kind=kind,
                    arm=arm,
                    rows=rows,
                    eager_vs_committed=hf.max_abs(eager, ref[arm]),
                    sdpa_vs_committed=hf.max_abs(sdpa, ref[arm]),
                    eager_vs_sdpa=hf.max_abs(eager, sdpa),
                    top1_agreement=agree / rows,
                )
                results.append(row)
                print(json.dumps(row), flush=True)
    worst = {}
    for r in results:
        key = r["kind"]
        worst[key] = max(worst.get(key, 0.0), r["eager_vs_sdpa"])
    print(json.dumps(dict(worst_eager_vs_sdpa=worst,
                          torch=torch.__version__, transformers=__import__("transformers").__version__)))


if __name__ == "__main__":
    main()
