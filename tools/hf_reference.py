#!/usr/bin/env python3
"""Reference fixtures for xdna-vl, computed by Hugging Face transformers.

For each case this builds a random-init Qwen3-VL checkpoint from a small config, saves it with
`save_pretrained` (hub tensor names), runs a prompt made of random text ids and synthetic images
through `Qwen3VLForConditionalGeneration`, and writes, under <out>/<case>/:

  checkpoint/                 config.json + model.safetensors (or shards + index)
  inputs.safetensors          format hybrid-inputs/1: what the language model consumed
                              input_ids I64 [rows], position_ids I64 [3, rows],
                              image_embeds F32 [image_rows, hidden], deepstack F32 [sets, image_rows, hidden]
                              metadata: format, image_token_id, rope_delta
  reference.safetensors       f32 run: prefill_logits F32 [rows, vocab], greedy_ids I64 [N],
                              decode_logits F32 [N-1, vocab], text_ids I64 [trows], text_logits F32 [trows, vocab]
  reference-i8.safetensors    the same runs with the pack kinds' exact integer arithmetic (see QuantLinear)
  reference-q4.safetensors
  case.json                   the case spec, image grids and the measured summary numbers

CI does not run this script; it needs torch, transformers (5.x), safetensors and pillow.
Everything is seeded: the same versions give the same files.

  python tools/hf_reference.py --out tests/fixtures            # every committed preset + README
  python tools/hf_reference.py --list                          # the presets
  python tools/hf_reference.py --out /tmp/fx --case odd --name odd-4l \\
      --override text.num_hidden_layers=4 --override 'images=[[64,64],[64,96],[96,64]]' \\
      --override 'prompt=[3,"image",2,"image","image",5]'
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

FORMAT_INPUTS = "hybrid-inputs/1"
ATTN_IMPLEMENTATION = "eager"  # explicit f32 softmax, the formula of REFERENCE.md
Q4_GROUP = 32

# ---------------------------------------------------------------------------------------------
# Presets. `text` / `vision` go to Qwen3VLTextConfig / Qwen3VLVisionConfig (rope fields are
# spelled here as rope_theta + mrope_section and mapped to the 5.x `rope_parameters`).
# `prompt` is a list of segments: an int n = n random text ids, "image" = vision_start, the next
# image's tokens, vision_end. `images` = [height, width] in pixels per image (multiples of 32 keep
# the size as given: patch 16 x merge 2).
# ---------------------------------------------------------------------------------------------

PRESETS: dict[str, dict] = {
    "hd128": dict(
        description="Qwen3-VL head geometry: head_dim 128, mrope [24,20,20] interleaved, GQA 2/1, "
        "2 layers, tied head, one 96x128 image (12 image rows), 3 DeepStack sets",
        seed=1001,
        dtype="float32",
        config_spelling="5.x",
        max_shard_size=None,
        tie_word_embeddings=True,
        text=dict(
            vocab_size=1024,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=128,
            rope_theta=5_000_000.0,
            mrope_section=[24, 20, 20],
            rms_norm_eps=1e-6,
            initializer_range=0.08,
        ),
        vision=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1, 2],
            initializer_range=0.08,
        ),
        images=[[96, 128]],
        image_kinds=["gradient"],
        prompt=[17, "image", 19],
        text_rows=24,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=2,
        max_attempts=200,
    ),
    "odd": dict(
        description="odd geometry: head_dim 32, heads 3 / kv 1, mrope [6,5,5], 3 layers, untied head, "
        "two images (64x64: 2x2 rows, 96x64: 3x2 rows), 2 DeepStack sets",
        seed=2002,
        dtype="float32",
        config_spelling="5.x",
        max_shard_size=None,
        tie_word_embeddings=False,
        text=dict(
            vocab_size=512,
            hidden_size=96,
            intermediate_size=224,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=32,
            rope_theta=10_000.0,
            mrope_section=[6, 5, 5],
            rms_norm_eps=1e-6,
            initializer_range=0.1,
        ),
        vision=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0, 2],
            initializer_range=0.1,
        ),
        images=[[64, 64], [96, 64]],
        image_kinds=["noise", "checker"],
        prompt=[5, "image", 4, "image", 9],
        text_rows=13,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=2,
        max_attempts=200,
    ),
    "bf16-sharded": dict(
        description="bf16 checkpoint in shards with the transformers-4.57 hub config spelling "
        "(text_config.rope_scaling + rope_theta); head_dim 32, heads 4 / kv 2, mrope [8,4,4], 2 layers, "
        "tied head, one 64x128 image (2x4 rows), 2 DeepStack sets; reference in f32 from the bf16 values",
        seed=3003,
        dtype="bfloat16",
        config_spelling="4.57",
        max_shard_size="500KB",
        tie_word_embeddings=True,
        text=dict(
            vocab_size=768,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=1_000_000.0,
            mrope_section=[8, 4, 4],
            rms_norm_eps=1e-6,
            initializer_range=0.08,
        ),
        vision=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[1, 2],
            initializer_range=0.08,
        ),
        images=[[64, 128]],
        image_kinds=["gradient"],
        prompt=[9, "image", 14],
        text_rows=11,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=2,
        max_attempts=200,
    ),
    # Not committed (about 8.5 GB of f32 weights): Qwen3-VL-2B-Instruct's shapes. Use with
    # e.g. --override text.num_hidden_layers=2 to keep it small.
    "2b-shapes": dict(
        description="Qwen3-VL-2B-Instruct shapes, random weights",
        seed=4004,
        dtype="bfloat16",
        config_spelling="4.57",
        max_shard_size="2GB",
        tie_word_embeddings=True,
        special_ids=dict(image=151655, video=151656, vision_start=151652, vision_end=151653),
        text=dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=5_000_000.0,
            mrope_section=[24, 20, 20],
            rms_norm_eps=1e-6,
            initializer_range=0.02,
        ),
        vision=dict(
            depth=24,
            hidden_size=1024,
            intermediate_size=4096,
            num_heads=16,
            num_position_embeddings=2304,
            deepstack_visual_indexes=[5, 11, 17],
            initializer_range=0.02,
        ),
        images=[[128, 160]],
        image_kinds=["gradient"],
        prompt=[12, "image", 10],
        text_rows=16,
        greedy=8,
        min_margin=0.0,
        min_margin_quant=0.0,
        max_attempts=1,
    ),
}
COMMITTED = ["hd128", "odd", "bf16-sharded"]

# Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`, model_type qwen3_vl_moe): `model="moe"`; the
# text config gains num_experts, num_experts_per_tok, moe_intermediate_size, decoder_sparse_step,
# mlp_only_layers. `expert_layout="hub"` rewrites the saved fused expert tensors in the hub's
# (transformers 4.57) orientation, [E, H, 2I] and [E, I, H], and spells num_local_experts as
# num_experts, as the hub's Qwen3-VL-30B-A3B does; transformers loads it back transposed.
# `tie_router_rows` = [[layer, a, b], ...] zeroes router rows a and b, so experts a and b have logit
# exactly 0 in every row, whatever the summation order (equal rows are not enough: torch's F.linear
# gives two equal weight rows different last bits in most rows), and torch.topk's tie-breaking
# decides wherever the two straddle the k-th place. hidden != 2 * moe_intermediate and
# hidden != moe_intermediate keep the two orientations apart (transformers takes a tensor of the
# 5.x shape as it is).
PRESETS.update({
    "moe-top2": dict(
        description="Qwen3-VL-MoE: 6 experts, top-2, expert intermediate 32, 3 layers with layer 1 dense "
        "(mlp_only_layers), head_dim 32, heads 3 / kv 1, mrope [6,5,5], untied head, two images, "
        "2 DeepStack sets (after the sparse layer 0 and the dense layer 1); 5.x layout, bf16 in one file",
        model="moe",
        seed=5005,
        dtype="bfloat16",
        config_spelling="5.x",
        expert_layout="5.x",
        max_shard_size=None,
        tie_word_embeddings=False,
        text=dict(
            vocab_size=320,
            hidden_size=96,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=32,
            rope_theta=10_000.0,
            mrope_section=[6, 5, 5],
            rms_norm_eps=1e-6,
            initializer_range=0.1,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        ),
        vision=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1],
            initializer_range=0.1,
        ),
        images=[[64, 64], [96, 64]],
        image_kinds=["noise", "checker"],
        prompt=[5, "image", 4, "image", 9],
        text_rows=13,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=2,
        max_attempts=200,
    ),
    "moe-top4": dict(
        description="Qwen3-VL-MoE: 6 experts, top-4, expert intermediate 96, 2 sparse layers, router "
        "rows 1 and 4 of layer 0 zero (a tie in every row there), head_dim 32, heads 2 / kv 1, mrope [8,4,4], "
        "tied head, one image, 2 DeepStack sets; bf16 in shards, the hub's expert orientation and 4.57 config",
        model="moe",
        seed=6010,
        dtype="bfloat16",
        config_spelling="4.57",
        expert_layout="hub",
        max_shard_size="200KB",
        tie_word_embeddings=True,
        tie_router_rows=[[0, 1, 4]],
        text=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            rope_theta=1_000_000.0,
            mrope_section=[8, 4, 4],
            rms_norm_eps=1e-6,
            initializer_range=0.1,
            num_experts=6,
            num_experts_per_tok=4,
            moe_intermediate_size=96,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        ),
        vision=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1],
            initializer_range=0.08,
        ),
        images=[[64, 128]],
        image_kinds=["gradient"],
        prompt=[9, "image", 14],
        text_rows=11,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=5,  # a tied 64-wide head loops easily; 5 keeps the search short
        max_attempts=200,
    ),
})
MOE_COMMITTED = ["moe-top2", "moe-top4"]

# Qwen3.5 (`Qwen3_5ForConditionalGeneration`, model_type qwen3_5): `model="qwen3_5"`. The text
# config gains layer_types (or full_attention_interval), the linear (Gated DeltaNet) head counts
# and dims, linear_conv_kernel_dim and partial_rotary_factor; mrope_section covers only the
# rotated quarter of head_dim. Norms are zero-centred (x * (1 + w)) and start at 0: they are drawn
# non-zero here so a forward that drops the +1 or the weight is caught. Prompts over 64 rows make
# transformers' chunked delta rule cross a chunk boundary.
PRESETS.update({
    "q35-odd": dict(
        description="Qwen3.5 dense: 5 layers linear/full/linear/full/linear, full heads 3 / kv 1, head_dim 32 "
        "(rotary 8, mrope [2,1,1]), linear key heads 3 x 16, value heads 6 x 32, conv 4, untied head, "
        "two images, 84-row prompt (crosses transformers' 64-row chunk); f32, 5.x config",
        model="qwen3_5",
        mtp=True,
        seed=8008,
        dtype="float32",
        config_spelling="5.x",
        max_shard_size=None,
        tie_word_embeddings=False,
        text=dict(
            vocab_size=512,
            hidden_size=96,
            intermediate_size=160,
            num_hidden_layers=5,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention",
                         "linear_attention"],
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=32,
            linear_num_key_heads=3,
            linear_num_value_heads=6,
            linear_key_head_dim=16,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            partial_rotary_factor=0.25,
            rope_theta=10_000.0,
            mrope_section=[2, 1, 1],
            rms_norm_eps=1e-6,
            initializer_range=0.1,
        ),
        vision=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            initializer_range=0.1,
        ),
        images=[[64, 64], [96, 64]],
        image_kinds=["noise", "checker"],
        prompt=[30, "image", 20, "image", 22],
        text_rows=70,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=2,
        max_attempts=200,
    ),
    "q35-hd256": dict(
        description="Qwen3.5 dense at the hub's attention geometry: head_dim 256 (rotary 64, mrope [11,11,10]), "
        "heads 2 / kv 1, 4 layers by full_attention_interval 4 (linear x3, full), linear key heads 2 x 32, "
        "value heads 4 x 32, tied head, one image; bf16 in shards",
        model="qwen3_5",
        mtp=True,
        seed=9009,
        dtype="bfloat16",
        config_spelling="interval",
        max_shard_size="300KB",
        tie_word_embeddings=True,
        text=dict(
            vocab_size=384,
            hidden_size=128,
            intermediate_size=192,
            num_hidden_layers=4,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=256,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            partial_rotary_factor=0.25,
            rope_theta=10_000_000.0,
            mrope_section=[11, 11, 10],
            rms_norm_eps=1e-6,
            initializer_range=0.08,
        ),
        vision=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            initializer_range=0.08,
        ),
        images=[[64, 128]],
        image_kinds=["gradient"],
        prompt=[9, "image", 14],
        text_rows=11,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=2,
        max_attempts=200,
    ),
})
PRESETS.update({
    "q35-moe": dict(
        description="Qwen3.5 MoE (qwen3_5_moe, Qwen3.6's architecture): layers linear/full/linear, every layer "
        "routed (6 experts, top-2, expert intermediate 32) plus a shared expert (intermediate 64) behind its "
        "sigmoid gate; full heads 3 / kv 1, head_dim 64 (rotary 16, mrope [3,3,2]), linear key heads 2 x 32, "
        "value heads 4 x 32; untied head, one image; bf16 in shards, the per-expert tensors save_pretrained writes",
        model="qwen3_5_moe",
        seed=9109,
        dtype="bfloat16",
        config_spelling="5.x",
        max_shard_size="400KB",
        tie_word_embeddings=False,
        text=dict(
            vocab_size=320,
            hidden_size=96,
            num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=64,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            partial_rotary_factor=0.25,
            rope_theta=10_000_000.0,
            mrope_section=[3, 3, 2],
            rms_norm_eps=1e-6,
            initializer_range=0.1,
        ),
        vision=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            initializer_range=0.1,
        ),
        images=[[64, 96]],
        image_kinds=["checker"],
        prompt=[12, "image", 15],
        text_rows=13,
        greedy=8,
        min_margin=0.01,
        min_margin_quant=0.02,
        max_repeat=2,
        max_attempts=200,
    ),
})
# The MTP head of a MoE checkpoint (issue 35): its layer's MLP is routed like the model's. Small
# (the committed files stay a few hundred KB): 2 layers, 4 experts top-2 (intermediate 32, q4's
# group); the model's experts per expert (save_pretrained), the head's fused (its own state_dict,
# as hub checkpoints hold it). The head's gate_up [4, 64, 64] is square (transformers' rule reads
# it as it is, the 5.x orientation it has); its down [4, 64, 32] tells the orientations apart.
PRESETS["q35-moe-mtp"] = {
    **copy.deepcopy(PRESETS["q35-moe"]),
    "description": "Qwen3.5 MoE with its MTP head: layers linear/full, every layer and the head's routed "
    "(4 experts, top-2, expert intermediate 32) plus a shared expert (intermediate 32) behind its sigmoid "
    "gate; full heads 2 / kv 1, head_dim 32 (rotary 8, mrope [2,1,1]), linear key heads 2 x 16, value heads "
    "2 x 16; untied head, one image; bf16; the model's experts per expert, the head's fused",
    "mtp": True,
    "seed": 9209,
    "max_shard_size": None,
    "images": [[64, 96]],
    "prompt": [10, "image", 8],
    "text_rows": 9,
}
PRESETS["q35-moe-mtp"]["text"].update(
    vocab_size=192, hidden_size=64, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
    num_attention_heads=2, head_dim=32, linear_num_value_heads=2, linear_key_head_dim=16,
    linear_value_head_dim=16, num_experts=4, shared_expert_intermediate_size=32, rope_theta=10_000.0,
    mrope_section=[2, 1, 1])
PRESETS["q35-moe-mtp"]["vision"].update(depth=1, hidden_size=16, intermediate_size=32, num_heads=1,
                                        num_position_embeddings=16, patch_size=8)
Q35_COMMITTED = ["q35-odd", "q35-hd256", "q35-moe", "q35-moe-mtp"]


def is_qwen3_5(spec: dict) -> bool:
    return spec.get("model") in ("qwen3_5", "qwen3_5_moe")


# ---------------------------------------------------------------------------------------------
# The pack kinds' exact arithmetic (issue 2, "Quant kinds"). Every op below is an f32 elementwise
# op or an exact integer dot product (float64 matmul of integer codes: |acc| < 2^53).
# ---------------------------------------------------------------------------------------------


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """Round half away from zero, exactly: trunc, then compare the (exact) fractional part."""
    t = torch.trunc(v)
    f = v - t
    return t + torch.sign(v) * (f.abs() >= 0.5).to(v.dtype)


def quantize_rows(x: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric quantization: s = max|x| / qmax (f32), codes clamp(round(x / s)). Zero row: 0, 0."""
    x = x.to(torch.float32)
    s = x.abs().amax(dim=-1, keepdim=True) / float(qmax)
    zero = s == 0
    v = x / torch.where(zero, torch.ones_like(s), s)
    codes = torch.clamp(round_half_away(v), -qmax, qmax)
    codes = torch.where(zero, torch.zeros_like(codes), codes)
    return codes, s.squeeze(-1)


def quantize_q4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q4: groups of 32 along K; m = value of largest magnitude (first on ties); s = bf16(m / -8);
    codes clamp(round(w / s), -8, 7) with the rounded scale. Returns codes f32 [N, K], scales bf16 [N, G]."""
    n, k = w.shape
    if k % Q4_GROUP != 0:
        raise ValueError(f"q4 needs K % {Q4_GROUP} == 0, got a weight of shape {tuple(w.shape)}")
    g = w.to(torch.float32).reshape(n, k // Q4_GROUP, Q4_GROUP)
    idx = g.abs().argmax(dim=-1, keepdim=True)  # first maximal index on ties (documented)
    m = torch.gather(g, -1, idx)
    s_bf16 = (m / -8.0).to(torch.bfloat16)  # round to nearest even
    s = s_bf16.to(torch.float32)
    zero = s == 0
    v = g / torch.where(zero, torch.ones_like(s), s)
    codes = torch.clamp(round_half_away(v), -8, 7)
    codes = torch.where(zero, torch.zeros_like(codes), codes)
    return codes.reshape(n, k), s_bf16.squeeze(-1)


class QuantLinear(torch.nn.Module):
    """A bias-free linear layer doing a pack kind's arithmetic on f32 inputs."""

    def __init__(self, weight: torch.Tensor, kind: str):
        super().__init__()
        w = weight.detach().to(torch.float32)
        self.kind = kind
        self.out_features, self.in_features = w.shape
        if kind == "i8":
            codes, scales = quantize_rows(w, 127)
            self.register_buffer("codes", codes.to(torch.int8))
            self.register_buffer("scales", scales)  # f32 [N]
        elif kind == "q4":
            codes, scales = quantize_q4(w)
            self.register_buffer("codes", codes.to(torch.int8))
            self.register_buffer("scales", scales)  # bf16 [N, K/32]
        else:
            raise ValueError(f"unknown quant kind {kind!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        a_codes, s_a = quantize_rows(x.reshape(-1, shape[-1]), 127)
        a = a_codes.to(torch.float64)
        w = self.codes.to(torch.float64)
        if self.kind == "i8":
            acc = (a @ w.T).to(torch.float32)
            y = (acc * s_a[:, None]) * self.scales[None, :]
        else:
            s = self.scales.to(torch.float32)
            total = torch.zeros(a.shape[0], self.out_features, dtype=torch.float32)
            for gi in range(self.in_features // Q4_GROUP):  # ascending groups, f32 ops one by one
                sl = slice(gi * Q4_GROUP, (gi + 1) * Q4_GROUP)
                acc_g = (a[:, sl] @ w[:, sl].T).to(torch.float32)
                total = total + acc_g * s[None, :, gi]
            y = total * s_a[:, None]
        return y.reshape(*shape[:-1], self.out_features)


class QuantExperts(torch.nn.Module):
    """`Qwen3VLMoeTextExperts` with each expert's gate, up and down as QuantLinear (the pack stores
    them as three ordinary linears): the same loop, experts ascending, weighted outputs added with
    index_add_ from zero."""

    def __init__(self, experts, kind: str):
        super().__init__()
        inter = experts.intermediate_dim
        self.num_experts = experts.num_experts
        self.act_fn = experts.act_fn
        gu, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
        self.gate = torch.nn.ModuleList(QuantLinear(gu[e, :inter], kind) for e in range(self.num_experts))
        self.up = torch.nn.ModuleList(QuantLinear(gu[e, inter:], kind) for e in range(self.num_experts))
        self.down = torch.nn.ModuleList(QuantLinear(down[e], kind) for e in range(self.num_experts))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            top_k_pos, token_idx = torch.where(top_k_index.T == e)
            if token_idx.numel() == 0:
                continue
            x = hidden_states[token_idx]
            h = self.act_fn(self.gate[e](x)) * self.up[e](x)
            h = self.down[e](h) * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, h.to(final.dtype))
        return final


@contextlib.contextmanager
def recurrent_prefill(model):
    """Qwen3.5: transformers prefills with the chunked delta rule and decodes with the recurrent
    one. Within the block the prefill runs the recurrent form too (what the pack's decoder runs),
    so a quantized reference and the pack sum in the same order and do not flip activation codes
    (the chunked order moved an i8 top-1 to 0.95 on q35-hd256)."""
    if not is_qwen3_5_model(model):
        yield model
        return
    import transformers.models.qwen3_5.modeling_qwen3_5 as m

    chunked = m.torch_chunk_gated_delta_rule

    def recurrent(*args, chunk_size=64, **kwargs):
        return m.torch_recurrent_gated_delta_rule(*args, **kwargs)

    m.torch_chunk_gated_delta_rule = recurrent
    try:
        yield model
    finally:
        m.torch_chunk_gated_delta_rule = chunked


@contextlib.contextmanager
def quantized_text_decoder(model, kind: str):
    with recurrent_prefill(model), quantized_layers(model, kind) as qmodel:
        yield qmodel


@contextlib.contextmanager
def quantized_layers(model, kind: str):
    """Within the block, the seven projections of every text layer and the head are QuantLinear
    (from the model's f32 values; a tied head from the f32 embedding) and the embedding is rounded
    to bf16. The original modules are put back afterwards (no copy of the model is made)."""
    lm = model.model.language_model
    swapped = []  # (parent, attribute, original)
    try:
        for layer in lm.layers:
            sparse = hasattr(layer.mlp, "experts")
            if sparse:  # the router stays f32 (as in the pack)
                swapped.append((layer.mlp, "experts", layer.mlp.experts))
                layer.mlp.experts = QuantExperts(layer.mlp.experts, kind)
            mlp = () if sparse else ((layer.mlp, ("gate_proj", "up_proj", "down_proj")),)
            if sparse and hasattr(layer.mlp, "shared_expert"):  # its sigmoid gate stays f32
                mlp = ((layer.mlp.shared_expert, ("gate_proj", "up_proj", "down_proj")),)
            if hasattr(layer, "self_attn"):
                mixer = ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),)
            else:  # Gated DeltaNet: its five linears; conv, A_log, dt_bias and the norm stay f32
                mixer = ((layer.linear_attn, ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                              "out_proj")),)
            for parent, names in mixer + mlp:
                for name in names:
                    lin = getattr(parent, name)
                    assert lin.bias is None, f"{name} has a bias; the pack kinds have none"
                    swapped.append((parent, name, lin))
                    setattr(parent, name, QuantLinear(lin.weight, kind))
        swapped.append((model, "lm_head", model.lm_head))
        model.lm_head = QuantLinear(model.lm_head.weight, kind)
        emb = lm.embed_tokens
        swapped.append((emb, "weight", emb.weight))
        emb.weight = torch.nn.Parameter(emb.weight.detach().to(torch.bfloat16).to(torch.float32),
                                        requires_grad=False)
        yield model
    finally:
        for parent, name, original in reversed(swapped):
            setattr(parent, name, original)


# ---------------------------------------------------------------------------------------------
# Case construction
# ---------------------------------------------------------------------------------------------


def special_ids(spec: dict) -> dict:
    if "special_ids" in spec:
        return dict(spec["special_ids"])
    v = spec["text"]["vocab_size"]
    # Same relative layout as the hub ids (151652 start, 151653 end, 151655 image, 151656 video).
    return dict(vision_start=v - 6, vision_end=v - 5, image=v - 3, video=v - 2)


def build_config(spec: dict):
    if spec.get("model") == "qwen3_5_moe":
        from transformers import Qwen3_5MoeConfig as Qwen3VLConfig
    elif is_qwen3_5(spec):
        from transformers import Qwen3_5Config as Qwen3VLConfig
    elif spec.get("model") == "moe":
        from transformers import Qwen3VLMoeConfig as Qwen3VLConfig
    else:
        from transformers import Qwen3VLConfig

    text = dict(spec["text"])
    theta = text.pop("rope_theta")
    section = text.pop("mrope_section")
    text["rope_parameters"] = dict(
        rope_type="default", rope_theta=theta, mrope_section=list(section), mrope_interleaved=True
    )
    if "partial_rotary_factor" in text:
        text["rope_parameters"]["partial_rotary_factor"] = text.pop("partial_rotary_factor")
    text["tie_word_embeddings"] = spec["tie_word_embeddings"]
    vision = dict(spec["vision"])
    vision.setdefault("patch_size", 16)
    vision.setdefault("spatial_merge_size", 2)
    vision.setdefault("temporal_patch_size", 2)
    vision["out_hidden_size"] = text["hidden_size"]
    ids = special_ids(spec)
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["vision_start"],
        vision_end_token_id=ids["vision_end"],
        tie_word_embeddings=spec["tie_word_embeddings"],
    )


def randomize_norms(model, gen: torch.Generator) -> None:
    """Norm weights start at 1; make them 1 + N(0, 0.1^2) so a forward that drops them is caught."""
    lm = model.model.language_model
    norms = [lm.norm]
    gated = []  # Qwen3.5's RMSNormGated: a plain weight (starts at 1), not zero-centred
    for layer in lm.layers:
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        if hasattr(layer, "self_attn"):
            norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
        else:
            gated.append(layer.linear_attn.norm)
    # Zero-centred norms (Qwen3.5: x * (1 + w)) start at 0, the others at 1.
    base = 0.0 if is_qwen3_5_model(model) else 1.0
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(base + 0.1 * torch.randn(norm.weight.shape, generator=gen))
        for norm in gated:
            norm.weight.copy_(1.0 + 0.1 * torch.randn(norm.weight.shape, generator=gen))


def is_qwen3_5_model(model) -> bool:
    return model.config.model_type in ("qwen3_5", "qwen3_5_moe")


def rewrite_config_457(path: str) -> None:
    """transformers 4.57 hub spelling: text_config.rope_scaling with rope_theta beside it."""
    with open(path) as f:
        cfg = json.load(f)
    text = cfg["text_config"]
    rp = text.pop("rope_parameters")
    text["rope_theta"] = rp["rope_theta"]
    text["rope_scaling"] = dict(
        rope_type=rp.get("rope_type", "default"),
        mrope_section=list(rp["mrope_section"]),
        mrope_interleaved=bool(rp.get("mrope_interleaved", True)),
    )
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def synthetic_image(height: int, width: int, kind: str, rng: np.random.Generator) -> Image.Image:
    yy, xx = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    if kind == "gradient":
        rgb = np.stack([xx, yy, 1 - 0.5 * (xx + yy)], axis=-1)
        rgb = rgb + 0.08 * rng.standard_normal(rgb.shape)
    elif kind == "checker":
        cells = ((np.floor(yy * 6) + np.floor(xx * 6)) % 2)[..., None]
        rgb = cells * np.array([0.9, 0.2, 0.4]) + (1 - cells) * np.array([0.1, 0.7, 0.8])
        rgb = rgb + 0.05 * rng.standard_normal(rgb.shape)
    elif kind == "noise":
        rgb = rng.random((height, width, 3))
    else:
        raise ValueError(f"unknown image kind {kind!r} (gradient, checker, noise)")
    return Image.fromarray((np.clip(rgb, 0, 1) * 255).round().astype(np.uint8), "RGB")


def image_processor(vision: dict):
    try:  # transformers 5.x: the PIL backend under its own name (the default one needs torchvision)
        from transformers import Qwen2VLImageProcessorPil as Qwen2VLImageProcessor
    except ImportError:
        from transformers import Qwen2VLImageProcessor

    patch, merge = vision.get("patch_size", 16), vision.get("spatial_merge_size", 2)
    unit = (patch * merge) ** 2
    return Qwen2VLImageProcessor(
        patch_size=patch,
        merge_size=merge,
        temporal_patch_size=vision.get("temporal_patch_size", 2),
        image_mean=[0.5, 0.5, 0.5],  # Qwen3-VL's preprocessor values
        image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": unit, "longest_edge": 4096 * unit},  # keep small images as given
    )


def random_text_ids(rng: np.random.Generator, n: int, vocab: int, specials: dict) -> list[int]:
    """Random ids from the low part of the vocabulary, never a special id."""
    hi = min(specials.values()) - 8 if specials else vocab
    hi = min(hi, vocab)
    return [int(t) for t in rng.integers(0, hi, size=n)]


@dataclass
class Prompt:
    input_ids: torch.Tensor  # [1, rows]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    mm_token_type_ids: torch.Tensor  # [1, rows]


def build_prompt(spec: dict, cfg, rng: np.random.Generator) -> Prompt:
    specials = special_ids(spec)
    vocab = spec["text"]["vocab_size"]
    images = [synthetic_image(h, w, spec["image_kinds"][i % len(spec["image_kinds"])], rng)
              for i, (h, w) in enumerate(spec["images"])]
    pixel_values = grid = None
    if images:
        out = image_processor(spec["vision"])(images=images, return_tensors="pt")
        pixel_values, grid = out["pixel_values"].to(torch.float32), out["image_grid_thw"]
    merge = cfg.vision_config.spatial_merge_size
    ids: list[int] = []
    next_image = 0
    for seg in spec["prompt"]:
        if seg == "image":
            if grid is None or next_image >= grid.shape[0]:
                raise ValueError(f"prompt has more images than `images` ({len(spec['images'])})")
            t, h, w = (int(v) for v in grid[next_image])
            ids += [specials["vision_start"]] + [specials["image"]] * (t * h * w // merge**2)
            ids += [specials["vision_end"]]
            next_image += 1
        elif isinstance(seg, int):
            ids += random_text_ids(rng, seg, vocab, specials)
        else:
            raise ValueError(f"prompt segment {seg!r}: expected an int or \"image\"")
    if next_image != len(images):
        raise ValueError(f"prompt uses {next_image} images, `images` lists {len(images)}")
    input_ids = torch.tensor([ids], dtype=torch.long)
    mm = (input_ids == specials["image"]).to(torch.int32)
    return Prompt(input_ids, pixel_values, grid, mm)


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


@dataclass
class HybridInputs:
    input_ids: torch.Tensor  # [rows] i64
    position_ids: torch.Tensor  # [3, rows] i64
    image_embeds: torch.Tensor  # [image_rows, hidden] f32
    deepstack: torch.Tensor  # [sets, image_rows, hidden] f32
    rope_delta: int


def run_pixel_path(model, prompt: Prompt, image_token_id: int, greedy: int):
    """transformers' own path: full forward with pixel values, then greedy decode with the cache.
    A pre-hook on the language model captures exactly what it consumed."""
    captured = {}

    def hook(_module, _args, kwargs):
        captured.update(kwargs)

    lm = model.model.language_model
    handle = lm.register_forward_pre_hook(hook, with_kwargs=True)
    model.model.rope_deltas = None
    try:
        kw = dict(input_ids=prompt.input_ids, mm_token_type_ids=prompt.mm_token_type_ids)
        if prompt.pixel_values is not None:
            kw.update(pixel_values=prompt.pixel_values, image_grid_thw=prompt.image_grid_thw)
        out = model(**kw, use_cache=True)
        first = {k: captured[k] for k in ("inputs_embeds", "position_ids", "visual_pos_masks",
                                          "deepstack_visual_embeds") if k in captured}
    finally:
        handle.remove()
    prefill = out.logits[0].detach().clone()
    cache = out.cache
    ids = [int(prefill[-1].argmax())]
    decode = []
    for _ in range(greedy - 1):
        out = model(input_ids=torch.tensor([[ids[-1]]]), cache=cache, use_cache=True)
        cache = out.cache
        decode.append(out.logits[0, -1].detach().clone())
        ids.append(int(decode[-1].argmax()))

    rows = prompt.input_ids.shape[1]
    emb = first["inputs_embeds"][0].detach()
    pos = first["position_ids"]
    if pos is None:  # text-only prompt: the language model counts 0..rows-1 itself
        pos = torch.arange(rows).view(1, 1, -1).expand(3, 1, -1)
    if pos.shape[0] == 4:  # Qwen3.5 prepends the text positions (the mask's) to the three planes
        pos = pos[1:]
    mask = prompt.input_ids[0] == image_token_id
    sets = first.get("deepstack_visual_embeds") or []
    hidden = emb.shape[-1]
    n_sets = len(getattr(model.config.vision_config, "deepstack_visual_indexes", None) or [])
    if sets:
        deepstack = torch.stack([s.detach().to(torch.float32) for s in sets])
        vmask = first["visual_pos_masks"][0]
        assert torch.equal(vmask, mask), "visual_pos_masks differ from the image-token rows"
    else:
        deepstack = torch.zeros(n_sets, int(mask.sum()) if n_sets == 0 else 0, hidden)
    inputs = HybridInputs(
        input_ids=prompt.input_ids[0].clone(),
        position_ids=pos[:, 0, :].clone().to(torch.long),
        image_embeds=emb[mask].clone().to(torch.float32),
        deepstack=deepstack.contiguous(),
        rope_delta=int(model.model.rope_deltas.item()) if model.model.rope_deltas is not None else 0,
    )
    dec = torch.stack(decode) if decode else torch.zeros(0, prefill.shape[-1])
    return inputs, prefill, torch.tensor(ids, dtype=torch.long), dec


def run_hybrid_path(model, inputs: HybridInputs, image_token_id: int, greedy: int,
                    forced_ids: list[int] | None = None):
    """The decoder fed by hand from the saved inputs: embedding rows for text, image_embeds at the
    image rows, the saved planes and DeepStack sets; decode rotates by slot + rope_delta on all
    three planes. `forced_ids` replays given tokens instead of the argmax (for cross-checks)."""
    lm = model.model.language_model
    ids = inputs.input_ids
    rows = ids.shape[0]
    mask = ids == image_token_id
    emb = lm.embed_tokens(ids).detach().clone()
    emb[mask] = inputs.image_embeds
    kw = {}
    if int(mask.sum()) > 0 and inputs.deepstack.shape[0] > 0:
        kw = dict(visual_pos_masks=mask[None], deepstack_visual_embeds=list(inputs.deepstack))
    out = lm(inputs_embeds=emb[None], position_ids=inputs.position_ids[:, None, :], use_cache=True, **kw)
    prefill = model.lm_head(out.last_hidden_state)[0].detach().clone()
    cache = out.cache
    ids_out = [int(prefill[-1].argmax())] if forced_ids is None else [forced_ids[0]]
    decode = []
    for i in range(greedy - 1):
        tok = torch.tensor([ids_out[-1]])
        pos = torch.full((3, 1, 1), rows + i + inputs.rope_delta, dtype=torch.long)
        out = lm(inputs_embeds=lm.embed_tokens(tok)[None], position_ids=pos, cache=cache, use_cache=True)
        cache = out.cache
        decode.append(model.lm_head(out.last_hidden_state)[0, -1].detach().clone())
        ids_out.append(int(decode[-1].argmax()) if forced_ids is None else forced_ids[i + 1])
    dec = torch.stack(decode) if decode else torch.zeros(0, prefill.shape[-1])
    return prefill, torch.tensor(ids_out, dtype=torch.long), dec


def plain_forward(sd: dict, tc, ids: torch.Tensor, embeds: torch.Tensor, planes: torch.Tensor,
                  image_rows: torch.Tensor, deepstack: torch.Tensor) -> torch.Tensor:
    """The decoder written from REFERENCE.md alone (no transformers module), on one sequence:
    `embeds` [rows, hidden], `planes` [3, rows], DeepStack set l added to `image_rows` after layer l.
    Returns the logits of every row. Used to check that the fixtures follow the documented rules."""
    pre = "model.language_model."
    d, nh, nkv = tc.head_dim, tc.num_attention_heads, tc.num_key_value_heads
    rp = tc.rope_parameters
    sec = list(rp["mrope_section"])
    eps = tc.rms_norm_eps

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    j = torch.arange(d // 2)
    plane = torch.zeros(d // 2, dtype=torch.long)  # interleaved rule
    plane[(j % 3 == 1) & (j < 3 * sec[1])] = 1
    plane[(j % 3 == 2) & (j < 3 * sec[2])] = 2
    inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = planes[plane].T.to(torch.float32) * inv  # [rows, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(x):  # [heads, rows, d], rotate-half pairing
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    rows = embeds.shape[0]
    h = embeds.clone()
    causal = torch.full((rows, rows), float("-inf")).triu(1)
    for li in range(tc.num_hidden_layers):
        p = f"{pre}layers.{li}."
        n = rms(h, sd[p + "input_layernorm.weight"])
        q = (n @ sd[p + "self_attn.q_proj.weight"].T).view(rows, nh, d).transpose(0, 1)
        k = (n @ sd[p + "self_attn.k_proj.weight"].T).view(rows, nkv, d).transpose(0, 1)
        v = (n @ sd[p + "self_attn.v_proj.weight"].T).view(rows, nkv, d).transpose(0, 1)
        q = rot(rms(q, sd[p + "self_attn.q_norm.weight"]))
        k = rot(rms(k, sd[p + "self_attn.k_norm.weight"]))
        r = nh // nkv
        k, v = k.repeat_interleave(r, 0), v.repeat_interleave(r, 0)
        att = torch.softmax(q @ k.transpose(1, 2) * d**-0.5 + causal, -1) @ v
        h = h + att.transpose(0, 1).reshape(rows, nh * d) @ sd[p + "self_attn.o_proj.weight"].T
        n = rms(h, sd[p + "post_attention_layernorm.weight"])
        if p + "mlp.gate.weight" in sd:  # sparse: softmax, top-k, renormalize, weighted experts
            probs = torch.softmax(n @ sd[p + "mlp.gate.weight"].T, -1)
            w, idx = torch.topk(probs, tc.num_experts_per_tok, dim=-1)
            w = w / w.sum(-1, keepdim=True)
            gu, dn = sd[p + "mlp.experts.gate_up_proj"], sd[p + "mlp.experts.down_proj"]
            inter = tc.moe_intermediate_size
            out = torch.zeros_like(h)
            for r in range(rows):
                for j in range(idx.shape[1]):
                    e = int(idx[r, j])
                    g, u = n[r] @ gu[e, :inter].T, n[r] @ gu[e, inter:].T
                    out[r] += w[r, j] * ((torch.nn.functional.silu(g) * u) @ dn[e].T)
            h = h + out
        else:
            g = n @ sd[p + "mlp.gate_proj.weight"].T
            u = n @ sd[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(g) * u) @ sd[p + "mlp.down_proj.weight"].T
        if li < deepstack.shape[0] and image_rows.numel():
            h[image_rows] = h[image_rows] + deepstack[li]
    head = sd.get("lm_head.weight", sd[pre + "embed_tokens.weight"])
    return rms(h, sd[pre + "norm.weight"]) @ head.T


def check_plain_forward(model, inputs: HybridInputs, ref: dict, image_token_id: int) -> float:
    """Max abs difference between plain_forward and the f32 reference over the prompt rows and the
    decode steps (the decode steps are rows appended at positions slot + rope_delta)."""
    sd = {k: v.detach().to(torch.float32) for k, v in model.state_dict().items()}
    emb_w = sd["model.language_model.embed_tokens.weight"]
    ids = torch.cat([inputs.input_ids, ref["greedy_ids"][:-1]])
    rows = inputs.input_ids.shape[0]
    embeds = emb_w[ids].clone()
    mask = torch.zeros(ids.shape[0], dtype=torch.bool)
    mask[:rows] = inputs.input_ids == image_token_id
    embeds[mask] = inputs.image_embeds
    extra = torch.arange(rows, ids.shape[0]) + inputs.rope_delta
    planes = torch.cat([inputs.position_ids, extra.expand(3, -1)], 1)
    logits = plain_forward(sd, model.config.text_config, ids, embeds, planes,
                           mask.nonzero().squeeze(-1), inputs.deepstack)
    want = torch.cat([ref["prefill_logits"], ref["decode_logits"]])
    text = plain_forward(sd, model.config.text_config, ref["text_ids"], emb_w[ref["text_ids"]],
                         torch.arange(ref["text_ids"].shape[0]).expand(3, -1),
                         torch.zeros(0, dtype=torch.long), inputs.deepstack[:0])
    return max(max_abs(logits, want), max_abs(text, ref["text_logits"]))



def check_recurrent_prefill(model, inputs: HybridInputs, prefill: torch.Tensor, image_token_id: int) -> float:
    """Qwen3.5: the prompt fed one row at a time (the recurrent delta rule and the conv update, as
    decode runs) against transformers' chunked prefill; returns the largest logit difference."""
    lm = model.model.language_model
    ids = inputs.input_ids
    mask = ids == image_token_id
    emb = lm.embed_tokens(ids).detach().clone()
    emb[mask] = inputs.image_embeds
    cache, rows_out = None, []
    for r in range(ids.shape[0]):
        pos = inputs.position_ids[:, None, r:r + 1]
        out = lm(inputs_embeds=emb[None, r:r + 1], position_ids=pos, cache=cache, use_cache=True)
        cache = out.cache
        rows_out.append(model.lm_head(out.last_hidden_state)[0, -1])
    return max_abs(torch.stack(rows_out), prefill)


def run_text(model, text_ids: torch.Tensor) -> torch.Tensor:
    model.model.rope_deltas = None
    out = model(input_ids=text_ids[None], use_cache=False)
    return out.logits[0].detach().clone()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def top1_agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    return int((a.argmax(-1) == b.argmax(-1)).sum()), int(a.shape[0])


def longest_run(ids: list[int]) -> int:
    best = run = 1 if ids else 0
    for a, b in zip(ids, ids[1:]):
        run = run + 1 if a == b else 1
        best = max(best, run)
    return best


def greedy_margin(logits: torch.Tensor) -> float:
    """Smallest gap between the top two logits over the given rows."""
    top = logits.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def apply_override(spec: dict, item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep:
        raise SystemExit(f"error: --override {item!r}: expected KEY=JSON")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string
    node = spec
    parts = key.split(".")
    for p in parts[:-1]:
        if p not in node or not isinstance(node[p], dict):
            raise SystemExit(f"error: --override {item!r}: no section {p!r}")
        node = node[p]
    node[parts[-1]] = value


def save_checkpoint(model, spec: dict, ck_dir: str) -> None:
    if spec["dtype"] == "bfloat16":
        model = copy.deepcopy(model).to(torch.bfloat16)
    kw = {}
    if spec.get("max_shard_size"):
        kw["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(ck_dir, **kw)
    gen = os.path.join(ck_dir, "generation_config.json")
    if os.path.exists(gen):
        # Only defaults (no bos/eos/sampling): nothing a decoder could use.
        with open(gen) as f:
            keys = set(json.load(f)) - {"_from_model_config", "transformers_version", "use_cache",
                                         "output_attentions", "output_hidden_states"}
        if not keys:
            os.remove(gen)
    if spec["config_spelling"] == "4.57":
        rewrite_config_457(os.path.join(ck_dir, "config.json"))
    if spec["config_spelling"] == "interval":
        rewrite_config_interval(os.path.join(ck_dir, "config.json"))
    if spec.get("expert_layout") == "hub":
        rewrite_experts_hub(ck_dir)


class Mtp(torch.nn.Module):
    """Qwen3.5's multi-token-prediction head as hub checkpoints carry it (`mtp.*`; transformers
    ignores it, vLLM's `Qwen3_5MultiTokenPredictor` runs it): for row j, the embedding of the next
    token and the model's final (normed) hidden state of row j, each RMS-normed (zero-centred),
    concatenated [embedding | hidden], `fc` to hidden, one full-attention decoder layer at row j's
    positions, `norm`; the head gives the logits of the token after the next. The layer is the
    model's own kind (vLLM builds it from the model's decoder layer): in a Qwen3.5-MoE model its
    MLP is transformers' `Qwen3_5MoeSparseMoeBlock` (router, experts, shared expert behind its
    sigmoid gate), whose experts `state_dict` gives fused as `mlp.experts.gate_up_proj` [E, 2I, H]
    and `mlp.experts.down_proj` [E, H, I] (the hub's MTP layout; vLLM loads them untransposed)."""

    def __init__(self, text_config):
        super().__init__()
        if text_config.model_type == "qwen3_5_moe_text":
            from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
                Qwen3_5MoeDecoderLayer as DecoderLayer, Qwen3_5MoeRMSNorm as RMSNorm)
        else:
            from transformers.models.qwen3_5.modeling_qwen3_5 import (
                Qwen3_5DecoderLayer as DecoderLayer, Qwen3_5RMSNorm as RMSNorm)

        h, eps = text_config.hidden_size, text_config.rms_norm_eps
        full = text_config.layer_types.index("full_attention")
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = RMSNorm(h, eps=eps)
        self.layers = torch.nn.ModuleList([DecoderLayer(text_config, full)])
        self.norm = RMSNorm(h, eps=eps)

    def randomize(self, gen: torch.Generator, std: float) -> None:
        with torch.no_grad():
            for name, t in self.named_parameters():
                if name.endswith("norm.weight") or "layernorm" in name or "_norm." in name:
                    t.copy_(0.1 * torch.randn(t.shape, generator=gen))  # zero-centred norms
                else:
                    t.copy_(std * torch.randn(t.shape, generator=gen))

    def forward(self, embeds, hidden, position_embeddings):
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        x = self.fc(x)
        n = x.shape[0]
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]  # eager attention adds it
        x = self.layers[0](x[None], position_embeddings=position_embeddings, attention_mask=causal,
                           cache=None)[0]
        return self.norm(x)


def add_mtp(spec: dict, model, ck_dir: str) -> Mtp:
    """Random `mtp.*` weights written beside the checkpoint's shards (an extra file in the index)."""
    from safetensors.torch import save_file

    mtp = Mtp(model.config.text_config).eval()
    mtp.randomize(torch.Generator().manual_seed(int(spec["seed"]) + 5), spec["text"]["initializer_range"])
    dtype = torch.bfloat16 if spec["dtype"] == "bfloat16" else torch.float32
    tensors = {f"mtp.{k}": v.detach().to(dtype).contiguous() for k, v in mtp.state_dict().items()}
    save_file(tensors, os.path.join(ck_dir, "model-mtp.safetensors"), metadata={"format": "pt"})
    index = os.path.join(ck_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            doc = json.load(f)
    else:  # one file: an index over it and the MTP file
        from safetensors import safe_open

        with safe_open(os.path.join(ck_dir, "model.safetensors"), "pt") as st:
            doc = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in st.keys()}}
    doc["weight_map"].update({k: "model-mtp.safetensors" for k in tensors})
    with open(index, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    cfg_path = os.path.join(ck_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["text_config"]["mtp_num_hidden_layers"] = 1
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    # The reference runs the head as saved (bf16 values in f32).
    mtp.load_state_dict({k: v.to(torch.float32) for k, v in
                         ((k[4:], t) for k, t in tensors.items())})
    return mtp


def mtp_reference(model, mtp: Mtp, inputs: "HybridInputs", ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """The MTP head's logits, teacher-forced, for every prompt row and greedy decode row but the
    last: row j sees the model's final hidden state of row j and the embedding row j + 1 was fed
    with (image rows: their image embedding), at row j's positions (vLLM's convention)."""
    lm = model.model.language_model
    rows = inputs.input_ids.shape[0]
    mask = inputs.input_ids == image_token_id
    emb = lm.embed_tokens(inputs.input_ids).detach().clone()
    emb[mask] = inputs.image_embeds
    fed = torch.cat([emb, lm.embed_tokens(ids[:-1])])  # prompt rows, then the fed greedy ids
    extra = torch.arange(len(ids) - 1) + rows + inputs.rope_delta
    planes = torch.cat([inputs.position_ids, extra.view(1, -1).expand(3, -1)], 1)
    out = lm(inputs_embeds=fed[None], position_ids=planes[:, None, :])
    hidden = out.last_hidden_state[0]  # final-normed
    n = fed.shape[0]
    nxt = torch.cat([fed[1:], lm.embed_tokens(ids[-1:])])  # the embedding fed after each row
    pos = planes[:, None, :]
    cos, sin = lm.rotary_emb(hidden[None], pos)
    x = mtp(nxt, hidden, (cos, sin))
    logits = model.lm_head(x)
    assert logits.shape[0] == n, logits.shape
    return logits


def rewrite_config_interval(path: str) -> None:
    """Qwen3.5 with the layer kinds given by full_attention_interval instead of layer_types (the
    config's default rule: every interval-th layer full)."""
    with open(path) as f:
        cfg = json.load(f)
    text = cfg["text_config"]
    kinds = text.pop("layer_types")
    interval = 4
    assert kinds == ["linear_attention" if (i + 1) % interval else "full_attention"
                     for i in range(len(kinds))], kinds
    text["full_attention_interval"] = interval
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def rewrite_experts_hub(ck_dir: str) -> None:
    """The hub's (4.57) orientation of the fused expert tensors, [E, H, 2I] and [E, I, H], and its
    spelling num_experts for 5.x's num_local_experts."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    for f in sorted(os.listdir(ck_dir)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(ck_dir, f)
        with safe_open(path, "pt") as st:
            meta = st.metadata()
            tensors = {k: st.get_tensor(k) for k in st.keys()}
        if not any(".mlp.experts." in k for k in tensors):
            continue
        tensors = {k: (v.transpose(1, 2).contiguous() if ".mlp.experts." in k else v)
                   for k, v in tensors.items()}
        save_file(tensors, path, metadata=meta)
    path = os.path.join(ck_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    text = cfg["text_config"]
    text["num_experts"] = text.pop("num_local_experts")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def tie_router_rows(model, spec: dict) -> None:
    """Router rows a and b zeroed: experts a and b get logit 0 (and equal softmax) in every row."""
    with torch.no_grad():
        for layer, a, b in spec.get("tie_router_rows", []):
            gate = model.model.language_model.layers[layer].mlp.gate.weight
            gate[a].zero_()
            gate[b].zero_()


def check_reloaded(model, spec: dict, fresh) -> None:
    """The reference runs on the checkpoint as saved: same text weights, same rope semantics."""
    rp = model.config.text_config.rope_parameters
    want = spec["text"]
    assert list(rp["mrope_section"]) == list(want["mrope_section"]), rp
    assert float(rp["rope_theta"]) == float(want["rope_theta"]), rp
    assert rp.get("mrope_interleaved", True), rp
    ref = fresh.state_dict()
    for name, t in model.state_dict().items():
        if name not in ref:
            continue
        src = ref[name].to(torch.bfloat16) if spec["dtype"] == "bfloat16" else ref[name]
        assert torch.equal(t, src.to(torch.float32)), f"reloaded {name} differs from the saved model"
    if spec["tie_word_embeddings"]:
        assert torch.equal(model.lm_head.weight, model.model.language_model.embed_tokens.weight)


def compute_references(model, spec: dict, name: str, attempt: int, quant: bool):
    """One prompt draw: the f32 pixel-path reference, its cross-checks, and the i8/q4 references."""
    specials = special_ids(spec)
    image_token_id = specials["image"]
    rng = np.random.default_rng(int(spec["seed"]) + 2 + 7919 * attempt)
    prompt = build_prompt(spec, model.config, rng)
    text_ids = torch.tensor(random_text_ids(rng, spec["text_rows"], spec["text"]["vocab_size"], specials))
    greedy = int(spec["greedy"])

    summary: dict = dict(case=name, description=spec["description"])
    routed: dict[int, list] = {}  # sparse layer -> [(router logits, chosen experts)] per call
    hooks = []
    for li, layer in enumerate(model.model.language_model.layers):
        if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts"):
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda _m, _i, out, li=li: routed.setdefault(li, []).append((out[0].detach(), out[2].detach()))))
    with torch.no_grad():
        inputs, prefill, ids, decode = run_pixel_path(model, prompt, image_token_id, greedy)
    for h in hooks:
        h.remove()
    if spec.get("tie_router_rows"):
        # The tie must decide something: rows whose two tied experts are not both in or both out.
        equal = split = 0
        for layer, a, b in spec["tie_router_rows"]:
            for logits, chosen in routed[layer]:
                equal += int((logits[:, a] == logits[:, b]).sum())
                split += int(((chosen == a).any(-1) != (chosen == b).any(-1)).sum())
        summary["router_tie_rows_equal"], summary["router_tie_rows_split"] = equal, split
        assert split > 0, f"no routed row splits the tied experts ({summary})"
    with torch.no_grad():

        # The saved inputs are what the language model consumed: planes from get_rope_index,
        # image rows and sets from the vision tower, and the hand-fed decoder gives the same logits.
        if prompt.pixel_values is not None:
            pos, delta = model.model.get_rope_index(
                prompt.input_ids, mm_token_type_ids=prompt.mm_token_type_ids,
                image_grid_thw=prompt.image_grid_thw)
            pos = pos[1:] if pos.shape[0] == 4 else pos
            assert torch.equal(pos[:, 0, :], inputs.position_ids), "captured planes != get_rope_index"
            assert int(delta.item()) == inputs.rope_delta
            feats = model.model.get_image_features(prompt.pixel_values, prompt.image_grid_thw,
                                                   return_dict=True)
            assert torch.equal(torch.cat(feats.pooler_output), inputs.image_embeds)
            for s, per_image in enumerate(getattr(feats, "deepstack_features", None) or []):
                assert torch.equal(torch.cat(per_image), inputs.deepstack[s])
        h_prefill, h_ids, h_decode = run_hybrid_path(model, inputs, image_token_id, greedy)
        summary["hybrid_vs_pixel_prefill_max_abs"] = max_abs(h_prefill, prefill)
        summary["hybrid_vs_pixel_decode_max_abs"] = max_abs(h_decode, decode)
        assert torch.equal(h_ids, ids), f"hand-fed greedy ids {h_ids.tolist()} != {ids.tolist()}"
        assert summary["hybrid_vs_pixel_prefill_max_abs"] <= 1e-5, summary
        assert summary["hybrid_vs_pixel_decode_max_abs"] <= 1e-5, summary

        text_logits = run_text(model, text_ids)
        refs = {"f32": dict(prefill_logits=prefill, greedy_ids=ids, decode_logits=decode,
                            text_ids=text_ids, text_logits=text_logits)}
        if is_qwen3_5_model(model):
            summary["recurrent_vs_chunked_max_abs"] = check_recurrent_prefill(model, inputs, prefill, image_token_id)
            # Two orders of the same f32 sums: 1.9e-4 measured on q35-odd; the contract allows 1e-3.
            assert summary["recurrent_vs_chunked_max_abs"] <= 1e-3, summary
        else:
            summary["plain_forward_max_abs"] = check_plain_forward(model, inputs, refs["f32"], image_token_id)
            assert summary["plain_forward_max_abs"] <= 1e-4, summary

        if quant:
            for kind in ("i8", "q4"):
                with quantized_text_decoder(model, kind) as qmodel:
                    q_prefill, q_ids, q_decode = run_hybrid_path(qmodel, inputs, image_token_id, greedy)
                    refs[kind] = dict(prefill_logits=q_prefill, greedy_ids=q_ids, decode_logits=q_decode,
                                      text_ids=text_ids, text_logits=run_text(qmodel, text_ids))
                    # Quantization cost against f32 (reported, not gated): the decode rows are
                    # compared on the f32 greedy ids (teacher forcing).
                    _, _, q_forced = run_hybrid_path(qmodel, inputs, image_token_id, greedy,
                                                     forced_ids=ids.tolist())
                    a_p = top1_agreement(q_prefill, prefill)
                    a_d = top1_agreement(q_forced, decode)
                    a_t = top1_agreement(refs[kind]["text_logits"], text_logits)
                    cos = torch.nn.functional.cosine_similarity(q_prefill, prefill, dim=-1)
                    summary[f"{kind}_vs_f32"] = dict(
                        prefill_top1=f"{a_p[0]}/{a_p[1]}", decode_top1_forced=f"{a_d[0]}/{a_d[1]}",
                        text_top1=f"{a_t[0]}/{a_t[1]}", prefill_max_abs=round(max_abs(q_prefill, prefill), 4),
                        prefill_cosine_min=round(float(cos.min()), 5),
                        greedy_ids_equal=bool(torch.equal(q_ids, ids)))

    return prompt, text_ids, inputs, refs, summary


def generate_case(name: str, spec: dict, out_root: str, quant: bool = True) -> dict:
    if spec.get("model") == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForConditionalGeneration as Qwen3VLForConditionalGeneration
    elif is_qwen3_5(spec):
        from transformers import Qwen3_5ForConditionalGeneration as Qwen3VLForConditionalGeneration
    elif spec.get("model") == "moe":
        from transformers import Qwen3VLMoeForConditionalGeneration as Qwen3VLForConditionalGeneration
    else:
        from transformers import Qwen3VLForConditionalGeneration

    case_dir = os.path.join(out_root, name)
    if os.path.isdir(case_dir):
        shutil.rmtree(case_dir)
    ck_dir = os.path.join(case_dir, "checkpoint")
    os.makedirs(ck_dir)

    seed = int(spec["seed"])
    torch.manual_seed(seed)
    cfg = build_config(spec)
    fresh = Qwen3VLForConditionalGeneration(cfg).eval()
    randomize_norms(fresh, torch.Generator().manual_seed(seed + 1))
    tie_router_rows(fresh, spec)
    save_checkpoint(fresh, spec, ck_dir)
    mtp = add_mtp(spec, fresh, ck_dir) if spec.get("mtp") else None

    model = Qwen3VLForConditionalGeneration.from_pretrained(
        ck_dir, dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION
    ).eval()
    check_reloaded(model, spec, fresh)
    del fresh

    # Greedy decoding is only comparable when the top two logits of every greedy step are apart,
    # and only informative when it does not loop on one token: redraw the prompt (images and text
    # ids) until the smallest gap clears `min_margin` (f32 reference) and `min_margin_quant` (i8/q4
    # references) and no greedy sequence repeats a token more than `max_repeat` times in a row.
    want = float(spec.get("min_margin", 0.0))
    want_q = float(spec.get("min_margin_quant", 0.0)) if quant else 0.0
    max_run = int(spec.get("max_repeat", 1 << 30))
    for attempt in range(int(spec.get("max_attempts", 1))):
        prompt, text_ids, inputs, refs, summary = compute_references(model, spec, name, attempt, quant)
        margins = {k: greedy_margin(torch.cat([r["prefill_logits"][-1:], r["decode_logits"]]))
                   for k, r in refs.items()}
        runs = {k: longest_run(r["greedy_ids"].tolist()) for k, r in refs.items()}
        ok = (margins["f32"] >= want and all(m >= want_q for k, m in margins.items() if k != "f32")
              and all(n <= max_run for n in runs.values()))
        print(f"   attempt {attempt}: greedy margins "
              + ", ".join(f"{k} {m:.4f}" for k, m in margins.items())
              + "; longest repeat " + ", ".join(f"{k} {n}" for k, n in runs.items()), flush=True)
        if ok:
            break
    else:
        raise SystemExit(f"error: case {name}: no prompt with greedy margins >= {want} / {want_q} and "
                         f"repeats <= {max_run} in {spec.get('max_attempts', 1)} attempts; lower "
                         "min_margin / min_margin_quant, raise max_repeat or max_attempts")
    summary["prompt_attempt"] = attempt
    specials = special_ids(spec)
    image_token_id = specials["image"]
    greedy = int(spec["greedy"])

    # Files
    meta_in = {"format": FORMAT_INPUTS, "image_token_id": str(image_token_id),
               "rope_delta": str(inputs.rope_delta)}
    save_safetensors(os.path.join(case_dir, "inputs.safetensors"),
                     dict(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                          image_embeds=inputs.image_embeds, deepstack=inputs.deepstack), meta_in)
    import transformers

    for kind, ref in refs.items():
        fname = "reference.safetensors" if kind == "f32" else f"reference-{kind}.safetensors"
        meta = {"description": spec["description"], "case": name, "kind": kind,
                "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                "attn_implementation": ATTN_IMPLEMENTATION}
        tensors = {k: v.contiguous().to(torch.long if k.endswith("ids") else torch.float32)
                   for k, v in ref.items()}
        save_safetensors(os.path.join(case_dir, fname), tensors, meta)
        lg = torch.cat([ref["prefill_logits"], ref["decode_logits"], ref["text_logits"]])
        summary[f"{kind}_logits_abs_max"] = round(float(lg.abs().max()), 4)
        summary[f"{kind}_prefill_abs_max"] = round(float(ref["prefill_logits"].abs().max()), 4)
        summary[f"{kind}_prefill_min"] = round(float(ref["prefill_logits"].min()), 4)
        summary[f"{kind}_prefill_max"] = round(float(ref["prefill_logits"].max()), 4)
        greedy_rows = torch.cat([ref["prefill_logits"][-1:], ref["decode_logits"]])
        summary[f"{kind}_greedy_min_margin"] = round(greedy_margin(greedy_rows), 5)
        summary[f"{kind}_greedy_ids"] = ref["greedy_ids"].tolist()

    if mtp is not None:
        with torch.no_grad():
            mtp_logits = mtp_reference(model, mtp, inputs, refs["f32"]["greedy_ids"], image_token_id)
        save_safetensors(os.path.join(case_dir, "reference-mtp.safetensors"),
                         dict(mtp_logits=mtp_logits.contiguous().to(torch.float32)),
                         {"case": name, "kind": "mtp", "transformers_version": transformers.__version__,
                          "torch_version": torch.__version__,
                          "rule": "row j: hidden j (final-normed) + embedding fed at row j+1, positions of row j"})
        summary["mtp_rows"] = int(mtp_logits.shape[0])

    tc = model.config.text_config
    summary.update(
        rows=int(inputs.input_ids.shape[0]), image_rows=int(inputs.image_embeds.shape[0]),
        sets=int(inputs.deepstack.shape[0]), hidden=int(tc.hidden_size), vocab=int(tc.vocab_size),
        layers=int(tc.num_hidden_layers), heads=int(tc.num_attention_heads),
        kv_heads=int(tc.num_key_value_heads), head_dim=int(tc.head_dim),
        intermediate=int(getattr(tc, "intermediate_size", 0) or 0), mrope_section=list(spec["text"]["mrope_section"]),
        rope_theta=float(spec["text"]["rope_theta"]), tied=bool(spec["tie_word_embeddings"]),
        dtype=spec["dtype"], config_spelling=spec["config_spelling"],
        shards=sorted(f for f in os.listdir(ck_dir) if f.endswith(".safetensors")),
        image_grid_thw=prompt.image_grid_thw.tolist() if prompt.image_grid_thw is not None else [],
        rope_delta=inputs.rope_delta, text_rows=int(text_ids.shape[0]), greedy=greedy,
        special_ids=specials,
    )
    if is_qwen3_5(spec):
        summary.update(layer_types=list(tc.layer_types), linear_key_heads=int(tc.linear_num_key_heads),
                       linear_value_heads=int(tc.linear_num_value_heads),
                       linear_key_head_dim=int(tc.linear_key_head_dim),
                       linear_value_head_dim=int(tc.linear_value_head_dim),
                       partial_rotary_factor=float(tc.rope_parameters["partial_rotary_factor"]))
    if spec.get("model") == "qwen3_5_moe":
        summary.update(num_experts=int(tc.num_experts), top_k=int(tc.num_experts_per_tok),
                       moe_intermediate=int(tc.moe_intermediate_size),
                       shared_expert_intermediate=int(tc.shared_expert_intermediate_size))
    if spec.get("model") == "moe":
        summary.update(num_experts=int(tc.num_experts), top_k=int(tc.num_experts_per_tok),
                       moe_intermediate=int(tc.moe_intermediate_size),
                       mlp_only_layers=list(tc.mlp_only_layers), expert_layout=spec["expert_layout"])
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump(dict(spec=spec, summary=summary), f, indent=2)
        f.write("\n")
    return summary


def save_safetensors(path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file with a byte-stable header (safetensors' own writer orders the metadata
    differently from run to run): metadata keys sorted, tensors in the given order, 8-byte aligned."""
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    header: dict = {"__metadata__": {k: str(metadata[k]) for k in sorted(metadata)}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        arr = t.detach().cpu().contiguous().numpy()
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


TOPK_SHAPES = [(4, 2), (6, 4), (8, 2), (8, 4), (16, 4), (60, 4), (128, 8), (128, 2), (128, 1), (40, 17), (5, 5)]


def write_topk_ties(out_root: str, cases: int = 64, seed: int = 7007) -> str:
    """torch.topk (largest, sorted) on rows drawn from a few levels, so most rows hold ties:
    `values_{n}_{k}` F32 [cases, n] and `indices_{n}_{k}` I64 [cases, k] per shape. The decoder's
    routing must pick the same experts in the same order."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for n, k in TOPK_SHAPES:
        rows = []
        for _ in range(cases):
            levels = torch.rand(int(torch.randint(1, n + 1, (1,), generator=gen)), generator=gen)
            rows.append(levels[torch.randint(0, levels.numel(), (n,), generator=gen)])
        values = torch.softmax(torch.stack(rows).log(), -1)  # probabilities, ties kept bit-equal
        tensors[f"values_{n}_{k}"] = values.contiguous()
        tensors[f"indices_{n}_{k}"] = torch.topk(values, k, dim=-1).indices.contiguous()
    path = os.path.join(out_root, "moe-topk", "ties.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_safetensors(path, tensors, {"description": "torch.topk(values, k) on tie-heavy rows",
                                     "torch_version": torch.__version__})
    return path


def dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def write_readme(out_root: str, summaries: list[dict]) -> None:
    import transformers

    lines = [
        "# Reference fixtures from transformers",
        "",
        "Generated by `tools/hf_reference.py` (torch + transformers; CI does not run it). Regenerate with",
        "",
        "```",
        "python tools/hf_reference.py --out tests/fixtures        # the committed cases + this README",
        "python tools/hf_reference.py --help                      # presets, --case, --override KEY=JSON",
        "```",
        "",
        "Other geometries (head counts, sections, several images, the 2B shapes) come from a preset plus",
        "overrides, e.g. `--case odd --name odd3 --override text.num_attention_heads=4",
        "--override 'images=[[64,64],[64,96],[96,64]]' --override 'prompt=[\"image\",3,\"image\",2,\"image\",5]'`;",
        "`--case 2b-shapes` has Qwen3-VL-2B-Instruct's shapes (not committed; ~8.5 GB of f32 weights).",
        "",
        f"Versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"attention `{ATTN_IMPLEMENTATION}`, numpy {np.__version__}. Seeded: the same versions give the same files.",
        "",
        "## Files per case (`<case>/`)",
        "",
        "- `checkpoint/`: `Qwen3VLForConditionalGeneration` random init (`initializer_range` 0.08–0.1; the",
        "  text RMSNorm weights set to 1 + N(0, 0.1²) so a forward that drops them is caught), written by",
        "  `save_pretrained` (hub tensor names). `generation_config.json` is removed (defaults only).",
        "- `inputs.safetensors`, format `hybrid-inputs/1`: exactly what the language model consumed in the",
        "  pixel forward (captured by a pre-hook on `model.model.language_model`):",
        "  `input_ids` I64 [rows]; `position_ids` I64 [3, rows] (t, h, w planes; equal to `get_rope_index`);",
        "  `image_embeds` F32 [image_rows, hidden] (all images, prompt order); `deepstack` F32",
        "  [sets, image_rows, hidden]; metadata `format`, `image_token_id`, `rope_delta` (strings).",
        "  Image rows are the rows whose id is `image_token_id`.",
        "- `reference.safetensors` (f32), `reference-i8.safetensors`, `reference-q4.safetensors`:",
        "  `prefill_logits` F32 [rows, vocab] (every prompt row); `greedy_ids` I64 [8] (argmax after the",
        "  prompt, then 7 greedy decode steps; step i feeds `greedy_ids[i]` at cache slot rows + i, rotary",
        "  position rows + i + rope_delta); `decode_logits` F32 [7, vocab] (logits after feeding",
        "  `greedy_ids[0..7]`); `text_ids` I64 [trows] (random text ids, no image tokens) and `text_logits`",
        "  F32 [trows, vocab] (plain forward, positions 0..trows-1). Metadata: `description`, `case`, `kind`,",
        "  `transformers_version`, `torch_version`, `attn_implementation`.",
        "- `case.json`: the preset that made the case, the image grids and the summary numbers below.",
        "",
        "Every step is seeded and the files are written with sorted headers: two runs give identical",
        "bytes. The prompt (images and text ids) is redrawn until the top-two logit gap of every greedy",
        "step is >= 0.01 in the f32 reference and >= 0.02 in the i8 / q4 references (greedy ids stable",
        "against last-bit differences) and no greedy sequence repeats a token more than twice in a row",
        "(`prompt_attempt` in `case.json`).",
        "",
        "The f32 reference is transformers' own path (`pixel_values`, `image_grid_thw`, `mm_token_type_ids`,",
        "then decode steps on the returned cache). The script checks that the decoder fed by hand from",
        "`inputs.safetensors` (embedding rows for text, `image_embeds` at the image rows, the saved planes,",
        "the DeepStack sets added after layers 0..sets-1) reproduces those logits, that the saved planes",
        "equal `get_rope_index` and the saved rows equal `get_image_features`, and that a plain-torch",
        "decoder written from ../shared/docs/REFERENCE.md alone (interleaved planes, rotate-half, GQA,",
        "DeepStack after the layer, decode at slot + rope_delta) reproduces every prompt row, decode step",
        "and text-control row (differences shown below).",
        "",
        "The i8 / q4 references run the same inputs through the decoder fed by hand, with the seven",
        "projections of every text layer and the head replaced by the pack kinds' exact arithmetic",
        "(issue 2: per-row int8 activations with s_a = max|x|/127 and round half away from zero; i8",
        "per-row weight scales, `(acc * s_a) * s_w`; q4 groups of 32 with bf16 scale `bf16(m / -8)`,",
        "`sum += acc_g * s[n, g]` in ascending groups, then `sum * s_a`; integer dots exact), the text",
        "embedding rows rounded to bf16, and the head quantized from the checkpoint's f32 values (tied:",
        "from the f32 embedding). `image_embeds` / `deepstack` stay f32 as saved. Their greedy ids are",
        "the quantized model's own.",
        "",
        "## Cases",
        "",
        "| case | geometry | prompt | checkpoint |",
        "|---|---|---|---|",
    ]
    for s in summaries:
        geo = (f"hidden {s['hidden']}, {s['layers']} layers, heads {s['heads']}/{s['kv_heads']}, "
               f"head_dim {s['head_dim']}, inter {s['intermediate']}, vocab {s['vocab']}, "
               f"mrope {s['mrope_section']}, theta {s['rope_theta']:g}, {'tied' if s['tied'] else 'untied'}")
        grids = ", ".join(f"{g[1]}x{g[2]} patches" for g in s["image_grid_thw"])
        pr = (f"{s['rows']} rows, {s['image_rows']} image rows ({grids}), {s['sets']} DeepStack sets, "
              f"rope_delta {s['rope_delta']}; text control {s['text_rows']} rows")
        ck = f"{s['dtype']}, {len(s['shards'])} file(s), config spelling {s['config_spelling']}"
        lines.append(f"| `{s['case']}` | {geo} | {pr} | {ck} |")
    lines += ["", "Special ids: vision_start = vocab-6, vision_end = vocab-5, image = vocab-3, video = vocab-2;",
              "text ids are drawn from [0, vocab - 14) (never a special id).", "",
              "## Measured (by the generator)", "",
              "| case | prefill logits f32 [min, max] | max abs logit (all rows) f32 / i8 / q4 | hand-fed vs pixel path; "
              "plain decoder vs reference | min top-2 gap on greedy steps f32 / i8 / q4 | size |",
              "|---|---|---|---|---|---|"]
    def qs_of(s: dict, kind: str) -> str:
        v = s.get(f"{kind}_vs_f32")
        if not v:
            return "-"
        return (f"{v['prefill_top1']}, {v['decode_top1_forced']}, {v['text_top1']}; max abs "
                f"{v['prefill_max_abs']}, cos >= {v['prefill_cosine_min']}")

    for s in summaries:
        lines.append(
            f"| `{s['case']}` | [{s['f32_prefill_min']}, {s['f32_prefill_max']}] | {s['f32_logits_abs_max']} / "
            f"{s.get('i8_logits_abs_max', '-')} / {s.get('q4_logits_abs_max', '-')} | "
            f"{s['hybrid_vs_pixel_prefill_max_abs']:.1e}; {s['plain_forward_max_abs']:.1e} | "
            f"{s['f32_greedy_min_margin']} / {s.get('i8_greedy_min_margin', '-')} / "
            f"{s.get('q4_greedy_min_margin', '-')} | {s['size_kb']} KB |")
    lines += ["", "Quantization cost against the f32 reference (reported, not gated; tiny random models are a",
              "worst case for 4-bit). Top-1 agreement on the prompt rows, the decode steps (the quantized",
              "model teacher-forced on the f32 greedy ids) and the text control; max abs difference and the",
              "smallest cosine over the prompt rows:", "",
              "| case | i8 | q4 |", "|---|---|---|"]
    for s in summaries:
        lines.append(f"| `{s['case']}` | {qs_of(s, 'i8')} | {qs_of(s, 'q4')} |")
    lines.append("")
    with open(os.path.join(out_root, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description="Generate Qwen3-VL reference fixtures (checkpoint, hybrid inputs, f32/i8/q4 "
        "reference logits) with transformers.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Presets: " + ", ".join(PRESETS) + f" (default: {', '.join(COMMITTED)}).\n"
        "--override KEY=JSON sets a preset field, dotted for text./vision. fields, e.g.\n"
        "  --override text.num_attention_heads=4 --override 'text.mrope_section=[8,4,4]'\n"
        "  --override 'images=[[64,64],[96,64]]' --override 'prompt=[4,\"image\",3,\"image\",6]'",
    )
    ap.add_argument("--out", default="tests/fixtures", help="output root (default tests/fixtures)")
    ap.add_argument("--case", action="append", choices=sorted(PRESETS), help="preset(s) to generate")
    ap.add_argument("--name", help="output directory name (one --case only)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=JSON",
                    help="set a preset field (repeatable; see below)")
    ap.add_argument("--no-quant", action="store_true", help="skip reference-i8/q4")
    ap.add_argument("--no-readme", action="store_true", help="do not write <out>/README.md")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--list", action="store_true", help="print the presets as JSON and exit")
    ap.add_argument("--qwen3-5", action="store_true",
                    help=f"generate the committed Qwen3.5 cases ({', '.join(Q35_COMMITTED)}) instead")
    ap.add_argument("--moe", action="store_true",
                    help=f"generate the committed MoE cases ({', '.join(MOE_COMMITTED)}) instead")
    args = ap.parse_args(argv)

    if args.list:
        print(json.dumps(PRESETS, indent=2))
        return 0
    cases = args.case or (MOE_COMMITTED if args.moe else Q35_COMMITTED if args.qwen3_5 else COMMITTED)
    if args.name and len(cases) != 1:
        print("error: --name needs exactly one --case", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)

    if args.moe and args.case is None:
        print("== moe-topk:", write_topk_ties(args.out), flush=True)
    summaries = []
    for case in cases:
        spec = copy.deepcopy(PRESETS[case])
        for item in args.override:
            apply_override(spec, item)
        if args.override:
            spec["description"] += " [overrides: " + "; ".join(args.override) + "]"
        name = args.name or case
        print(f"== {name}", flush=True)
        s = generate_case(name, spec, args.out, quant=not args.no_quant)
        s["size_kb"] = math.ceil(dir_size(os.path.join(args.out, name)) / 1024)
        print(json.dumps(s, indent=1), flush=True)
        summaries.append(s)
    if not args.no_readme and args.case is None and not args.override and not args.moe and not args.qwen3_5:
        write_readme(args.out, summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
