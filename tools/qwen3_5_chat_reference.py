#!/usr/bin/env python3
"""A tiny random Qwen3.5 chat checkpoint and transformers' answers on it: the whole chain (pack,
template, tokenizer, pictures through the Rust tower, the hybrid decoder) is checked against
`Qwen3_5ForConditionalGeneration.generate`.

  python tools/qwen3_5_chat_reference.py           # writes tests/fixtures/chat-qwen3_5/
  python tools/qwen3_5_chat_reference.py --check   # makes it again in memory, compares answer.json

writes
  tests/fixtures/chat-qwen3_5/Qwen3.5-tiny/   config.json + model.safetensors (f32; layers
      linear/full/linear, linear first and last), and the tokenizer, chat template and processor
      files of tests/fixtures/chat/Qwen3-VL-tiny (the same special ids: <|image_pad|> 510, ...)
  tests/fixtures/chat-qwen3_5/answer.json     greedy ids from model.generate(do_sample=False,
      eos <|im_end|>, 12 new tokens) for: a text question, the two pictures with a question, and a
      chat (a picture and a question, then a second turn on the whole history)

The seed is the first (from --seed up) whose greedy steps all have a top-2 logit gap of at least
--min-gap (the ids are then stable against last-bit differences). CI does not run this.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import hf_reference as hr  # noqa: E402
import hybrid_input as hi  # noqa: E402

CHAT = os.path.join(ROOT, "tests", "fixtures", "chat")
SOURCE = os.path.join(CHAT, "Qwen3-VL-tiny")
OUT = os.path.join(ROOT, "tests", "fixtures", "chat-qwen3_5")
MODEL = "Qwen3.5-tiny"
COPIED = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json",
          "video_preprocessor_config.json"]
PICTURES = ["picture-1.png", "picture-2.png"]
MAX_NEW_TOKENS = 12

SPEC = dict(
    model="qwen3_5",
    dtype="float32",
    config_spelling="5.x",
    max_shard_size=None,
    tie_word_embeddings=True,
    special_ids=dict(vision_start=507, vision_end=508, image=510, video=511),
    text=dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        partial_rotary_factor=0.25,
        rope_theta=10_000_000.0,
        mrope_section=[3, 3, 2],
        rms_norm_eps=1e-6,
        initializer_range=0.1,
    ),
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=64,
                initializer_range=0.1),
)


def user(*items) -> dict:
    content = []
    for it in items:
        content.append({"type": "image", "image": it[1]} if isinstance(it, tuple) else {"type": "text", "text": it})
    return {"role": "user", "content": content}


def write_checkpoint(seed: int, out_dir: str) -> None:
    from transformers import Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(hr.build_config(SPEC)).eval()
    hr.randomize_norms(model, torch.Generator().manual_seed(seed + 1))
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir)
    gen = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    for f in COPIED:
        shutil.copy(os.path.join(SOURCE, f), os.path.join(out_dir, f))


def answers(model_dir: str) -> tuple[dict, float]:
    from PIL import Image
    from transformers import Qwen3_5ForConditionalGeneration

    processor = hi.load_processor(model_dir)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=hr.ATTN_IMPLEMENTATION).eval()
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pictures = {n: Image.open(os.path.join(CHAT, n)).convert("RGB") for n in PICTURES}

    def run(messages):
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        names = [c["image"] for m in messages if isinstance(m["content"], list)
                 for c in m["content"] if c["type"] == "image"]
        enc = processor(text=[text], images=[pictures[n] for n in names] or None, return_tensors="pt")
        kw = dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        if enc.get("mm_token_type_ids") is not None:
            kw["mm_token_type_ids"] = enc["mm_token_type_ids"]
        if enc.get("pixel_values") is not None:
            kw.update(pixel_values=enc["pixel_values"].to(torch.float32), image_grid_thw=enc["image_grid_thw"])
        model.model.rope_deltas = None
        out = model.generate(**kw, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=eos,
                             pad_token_id=eos, temperature=None, top_p=None, top_k=None,
                             output_scores=True, return_dict_in_generate=True)
        top = torch.stack([s[0] for s in out.scores]).topk(2, dim=-1).values
        gap = float((top[:, 0] - top[:, 1]).min())
        ids = out.sequences[0, enc["input_ids"].shape[1]:].tolist()
        answer = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return dict(messages=messages, prompt_rows=int(enc["input_ids"].shape[1]), greedy_ids=ids,
                    answer=answer, min_top2_gap=round(gap, 6))

    with torch.no_grad():
        runs = {"text": run([user("What is a pack?")]),
                "two_images": run([user(("image", "picture-1.png"), ("image", "picture-2.png"),
                                        "Describe these pictures.")])}
        turn1 = [user(("image", "picture-1.png"), "What is this?")]
        runs["chat_turn1"] = run(turn1)
        runs["chat"] = run(turn1 + [{"role": "assistant", "content": runs["chat_turn1"]["answer"]},
                                    user("And the colours?")])
    return runs, min(r["min_top2_gap"] for r in runs.values())


def make(seed: int, min_gap: float, attempts: int, model_dir: str) -> dict:
    import transformers

    for s in range(seed, seed + attempts):
        write_checkpoint(s, model_dir)
        runs, gap = answers(model_dir)
        print(f"seed {s}: smallest top-2 gap {gap:.4f}", flush=True)
        if gap >= min_gap:
            return {"model": f"tests/fixtures/chat-qwen3_5/{MODEL}", "seed": s, "spec": SPEC,
                    "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                    "max_new_tokens": MAX_NEW_TOKENS, "runs": runs}
    raise SystemExit(f"error: no seed in {seed}..{seed + attempts} with every top-2 gap >= {min_gap}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=11000)
    ap.add_argument("--min-gap", type=float, default=0.01)
    ap.add_argument("--attempts", type=int, default=100)
    ap.add_argument("--check", action="store_true", help="make it in a temporary directory and compare")
    args = ap.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    if args.check:
        import tempfile

        with open(os.path.join(OUT, "answer.json")) as f:
            committed = json.load(f)
        with tempfile.TemporaryDirectory() as tmp:
            doc = make(committed["seed"], args.min_gap, 1, os.path.join(tmp, MODEL))
        same = doc["runs"] == committed["runs"]
        print("answer.json: " + ("same" if same else "DIFFERS"))
        return 0 if same else 1
    os.makedirs(OUT, exist_ok=True)
    doc = make(args.seed, args.min_gap, args.attempts, os.path.join(OUT, MODEL))
    for n in PICTURES:
        shutil.copy(os.path.join(CHAT, n), os.path.join(OUT, n))
    with open(os.path.join(OUT, "answer.json"), "w") as f:
        f.write(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: (v["greedy_ids"], v["answer"]) for k, v in doc["runs"].items()}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
