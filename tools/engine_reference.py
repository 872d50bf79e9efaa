#!/usr/bin/env python3
"""The engine's reference fixtures, made by transformers on the tiny chat checkpoint.

  python tools/engine_reference.py            # writes tests/fixtures/engine/
  python tools/engine_reference.py --check    # makes them again in memory, compares with what is committed

For each message set (text only, one image, two images in one turn, a system message, a three-turn
chat with an image in the first turn) `cases.json` holds what transformers' Qwen3VLProcessor makes
of it on tests/fixtures/chat/Qwen3-VL-tiny:
  - `text`: `processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`
    with the checkpoint's own template, and `text_no_generation_prompt` (the same without it);
  - `ids`: `processor(text=[text], images=...)["input_ids"]` (the image pads expanded);
  - `grids`: `image_grid_thw`; `planes` (3 x rows) and `rope_delta` from `model.model.get_rope_index`;
  - `real_template_text`: the same messages rendered by transformers with the Qwen3-VL Instruct
    template committed beside this (qwen3-vl-instruct.chat_template.jinja), so a Rust rendering
    of a real checkpoint's template can be checked byte for byte.
`runs` holds greedy ids from `model.generate(do_sample=False, eos_token_id=<|im_end|>)` for a
text-only question, for the two-picture question, and for a chat: turn 1 (a picture and a
question), its answer decoded as transformers decodes it (special tokens skipped), and turn 2 on
the whole history.

`images.safetensors` holds, per picture, the processor's `pixel_values` and `image_grid_thw` and the
tower's `image_embeds` and DeepStack sets (`model.model.get_image_features`), so the engine's image
path can be tested with transformers' rows while the Rust tower is being built.

CI does not run this; it needs torch, transformers (5.x), safetensors, pillow (no torchvision).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import hf_reference as hr  # noqa: E402
import hybrid_input as hi  # noqa: E402

CHAT = os.path.join(ROOT, "tests", "fixtures", "chat")
MODEL = os.path.join(CHAT, "Qwen3-VL-tiny")
OUT = os.path.join(ROOT, "tests", "fixtures", "engine")
REAL_TEMPLATE = os.path.join(OUT, "qwen3-vl-instruct.chat_template.jinja")
PICTURES = ["picture-1.png", "picture-2.png"]
END_OF_TURN = "<|im_end|>"
MAX_NEW_TOKENS = 12


def user(*items) -> dict:
    """A user turn: strings are text items, `("image", name)` a picture."""
    content = []
    for it in items:
        if isinstance(it, tuple):
            content.append({"type": "image", "image": it[1]})
        else:
            content.append({"type": "text", "text": it})
    return {"role": "user", "content": content}


def case_messages(chat_answer: str) -> dict[str, list[dict]]:
    return {
        "text": [user("What is a pack?")],
        "one_image": [user(("image", "picture-1.png"), "What is in this picture?")],
        "two_images": [user(("image", "picture-1.png"), ("image", "picture-2.png"), "Describe these pictures.")],
        "system": [{"role": "system", "content": "You are a terse assistant."}, user("Say hello.")],
        "chat": [user(("image", "picture-1.png"), "What is this?"),
                 {"role": "assistant", "content": chat_answer},
                 user("And the colours?")],
    }


def images_of(messages: list[dict]) -> list[str]:
    names = []
    for m in messages:
        if isinstance(m["content"], list):
            names += [c["image"] for c in m["content"] if c["type"] == "image"]
    return names


def encode(processor, model, messages, pictures):
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    names = images_of(messages)
    imgs = [pictures[n] for n in names]
    enc = processor(text=[text], images=imgs or None, return_tensors="pt")
    ids = enc["input_ids"]
    mm = enc.get("mm_token_type_ids")
    if mm is None:
        mm = (ids == model.config.image_token_id).to(torch.int32)
    grid = enc.get("image_grid_thw")
    if grid is None:
        rows = ids.shape[1]
        planes = torch.arange(rows).view(1, -1).expand(3, -1)
        delta = 0
    else:
        pos, d = model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid)
        planes = pos[:, 0, :]
        delta = int(d.reshape(-1)[0])
    return text, enc, mm, planes, delta


def greedy(model, enc, mm, eos: int) -> list[int]:
    kw = dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], mm_token_type_ids=mm)
    if enc.get("pixel_values") is not None:
        kw.update(pixel_values=enc["pixel_values"].to(torch.float32), image_grid_thw=enc["image_grid_thw"])
    model.model.rope_deltas = None
    out = model.generate(**kw, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=eos,
                         pad_token_id=eos, temperature=None, top_p=None, top_k=None,
                         output_scores=True, return_dict_in_generate=True)
    top = torch.stack([s[0] for s in out.scores]).topk(2, dim=-1).values
    gap = float((top[:, 0] - top[:, 1]).min())
    return out.sequences[0, enc["input_ids"].shape[1]:].tolist(), round(gap, 6)


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def make() -> tuple[dict, dict]:
    from PIL import Image

    torch.use_deterministic_algorithms(True)
    processor = hi.load_processor(MODEL)
    model = hi.load_model(MODEL)
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids(END_OF_TURN)
    with open(REAL_TEMPLATE) as f:
        real_template = f.read()
    pictures = {n: Image.open(os.path.join(CHAT, n)).convert("RGB") for n in PICTURES}

    runs = {}
    with torch.no_grad():
        # Chat turn 1: its answer becomes the assistant message of the "chat" case.
        turn1 = [user(("image", "picture-1.png"), "What is this?")]
        _, enc, mm, _, _ = encode(processor, model, turn1, pictures)
        turn1_ids, gap = greedy(model, enc, mm, eos)
        answer = decode(tok, turn1_ids)
        runs["chat_turn1"] = {"case": None, "messages": turn1, "greedy_ids": turn1_ids, "answer": answer,
                              "min_top2_gap": gap}

        cases = {}
        for name, messages in case_messages(answer).items():
            text, enc, mm, planes, delta = encode(processor, model, messages, pictures)
            no_gen = processor.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
            real = processor.apply_chat_template(messages, chat_template=real_template,
                                                 add_generation_prompt=True, tokenize=False)
            grid = enc.get("image_grid_thw")
            cases[name] = {
                "messages": messages,
                "images": images_of(messages),
                "text": text,
                "text_no_generation_prompt": no_gen,
                "ids": enc["input_ids"][0].tolist(),
                "grids": [] if grid is None else grid.tolist(),
                "planes": planes.tolist(),
                "rope_delta": delta,
                "real_template_text": real,
            }
            if name in ("text", "two_images", "chat"):
                ids, gap = greedy(model, enc, mm, eos)
                runs[name] = {"case": name, "greedy_ids": ids, "answer": decode(tok, ids), "min_top2_gap": gap}

        tensors, meta = {}, {"format": "engine-images/1", "model": "Qwen3-VL-tiny"}
        for i, n in enumerate(PICTURES):
            enc = processor.image_processor(images=[pictures[n]], return_tensors="pt")
            pv = enc["pixel_values"].to(torch.float32)
            grid = enc["image_grid_thw"]
            feats = model.model.get_image_features(pv, grid, return_dict=True)
            tensors[f"{i}.pixel_values"] = pv.contiguous()
            tensors[f"{i}.grid"] = grid[0].to(torch.long).contiguous()
            tensors[f"{i}.image_embeds"] = feats.pooler_output[0].to(torch.float32).contiguous()
            tensors[f"{i}.deepstack"] = torch.stack([s[0].to(torch.float32) for s in feats.deepstack_features]).contiguous()
            meta[f"{i}.name"] = n

    import transformers

    doc = {
        "model": "tests/fixtures/chat/Qwen3-VL-tiny",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "end_of_turn_id": eos,
        "max_new_tokens": MAX_NEW_TOKENS,
        "cases": cases,
        "runs": runs,
    }
    return doc, (tensors, meta)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = ap.parse_args(argv)
    doc, (tensors, meta) = make()
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    cases_path = os.path.join(OUT, "cases.json")
    images_path = os.path.join(OUT, "images.safetensors")
    if args.check:
        with open(cases_path) as f:
            same = f.read() == text
        tmp = images_path + ".check"
        hr.save_safetensors(tmp, tensors, meta)
        with open(tmp, "rb") as a, open(images_path, "rb") as b:
            same_images = a.read() == b.read()
        os.remove(tmp)
        print(f"cases.json {'identical' if same else 'DIFFERS'}; images.safetensors "
              f"{'identical' if same_images else 'DIFFERS'}")
        return 0 if same and same_images else 1
    os.makedirs(OUT, exist_ok=True)
    with open(cases_path, "w") as f:
        f.write(text)
    hr.save_safetensors(images_path, tensors, meta)
    for name, c in doc["cases"].items():
        print(f"{name}: {len(c['ids'])} ids, grids {c['grids']}, rope_delta {c['rope_delta']}")
    for name, r in doc["runs"].items():
        print(f"run {name}: {r['greedy_ids']} {r['answer']!r} (smallest top-2 gap {r['min_top2_gap']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
