#!/usr/bin/env python3
"""A hybrid-inputs/1 file from a Qwen3-VL checkpoint, pictures and a question, made by transformers.

  python tools/hybrid_input.py --model ~/models/Qwen3-VL-2B-Instruct --image cat.jpg \\
      --prompt "What is in this picture?" -o cat/inputs.safetensors --reference 64

The checkpoint's own processor (AutoProcessor: its chat template with the user turn and the start
of the assistant turn, the image placeholders, the pixel values) makes the prompt; the checkpoint's
vision tower makes the image rows and DeepStack sets; `model.model.get_rope_index` makes the three
position planes and the rope delta. Written in the format of tools/hf_reference.py (see
tests/fixtures/README.md): input_ids I64 [rows], position_ids I64 [3, rows], image_embeds F32
[image_rows, hidden], deepstack F32 [sets, image_rows, hidden]; metadata format, image_token_id,
rope_delta.

--reference N also writes, next to the output:
  reference.safetensors  transformers' f32 run of the same prompt: prefill_logits, greedy_ids (N),
                         decode_logits, and a text control (text_ids = the same question without the
                         pictures, text_logits), the fields `hybrid_prompt_probe --reference` reads
  answer.json            transformers' greedy ids and their text (decoded by the checkpoint's
                         tokenizer, special tokens skipped): up to and including the first
                         <|im_end|>, and all N

Bad input (a missing model file, an unreadable image, a checkpoint that is not Qwen3-VL) is refused
with `error: ...` naming it, exit status 2. Needs torch, transformers (5.x), safetensors, pillow.
Without torchvision the processor is transformers' Qwen3VLProcessor built without its video
processor (which needs torchvision); images and text take the same code either way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as hr  # noqa: E402  (one piece of code per idea: the fixtures' runs and writer)

QWEN3_VL_MODEL_TYPE = "qwen3_vl"
END_OF_TURN = "<|im_end|>"


class InputError(Exception):
    """Bad input: printed as `error: ...`, exit status 2."""


# ---------------------------------------------------------------------------------------------
# Checking what was given
# ---------------------------------------------------------------------------------------------


def check_checkpoint(model_dir: str) -> dict:
    """The checkpoint's config, after checking that every file the run needs is there."""
    if not os.path.isdir(model_dir):
        raise InputError(f"{model_dir}: no such model directory")
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise InputError(f"{cfg_path}: missing (a Hugging Face checkpoint directory has config.json)")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{cfg_path}: not a readable JSON config ({e})") from e
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_path}: expected a JSON object")
    model_type = cfg.get("model_type")
    if model_type != QWEN3_VL_MODEL_TYPE:
        arch = ", ".join(cfg.get("architectures") or []) or "no architectures"
        raise InputError(f"{cfg_path}: model_type {model_type!r} ({arch}): not a Qwen3-VL checkpoint "
                         f"(expected model_type {QWEN3_VL_MODEL_TYPE!r}, Qwen3VLForConditionalGeneration)")
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as e:
            raise InputError(f"{index}: not a safetensors index with a weight_map ({e})") from e
        for shard in shards:
            if not os.path.isfile(os.path.join(model_dir, shard)):
                raise InputError(f"{os.path.join(model_dir, shard)}: missing (listed in {index})")
    elif not os.path.isfile(single):
        raise InputError(f"{model_dir}: no model.safetensors and no model.safetensors.index.json")
    if not (os.path.isfile(os.path.join(model_dir, "tokenizer.json"))
            or os.path.isfile(os.path.join(model_dir, "vocab.json"))):
        raise InputError(f"{os.path.join(model_dir, 'tokenizer.json')}: missing (the processor needs "
                         "the checkpoint's tokenizer)")
    pre = os.path.join(model_dir, "preprocessor_config.json")
    if not os.path.isfile(pre) and not nested_image_processor(model_dir):
        raise InputError(f"{pre}: missing, and no processor_config.json with an image_processor (the "
                         "processor needs the image processor's settings)")
    return cfg


def nested_image_processor(model_dir: str) -> bool:
    """processor_config.json holds the image processor (transformers 5's processor.save_pretrained
    nests it there and writes no preprocessor_config.json); transformers takes it first."""
    path = os.path.join(model_dir, "processor_config.json")
    try:
        with open(path) as f:
            return isinstance(json.load(f).get("image_processor"), dict)
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def load_images(paths: list[str]):
    """The pictures as RGB PIL images; an unreadable file is refused by name."""
    from PIL import Image, UnidentifiedImageError

    images = []
    for p in paths:
        if not os.path.isfile(p):
            raise InputError(f"{p}: no such image file")
        try:
            with Image.open(p) as im:
                im.load()
                images.append(im.convert("RGB"))
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
            raise InputError(f"{p}: cannot read the image ({e})") from e
    return images


# ---------------------------------------------------------------------------------------------
# The processor and the prompt
# ---------------------------------------------------------------------------------------------


def image_only_processor_class():
    from transformers import Qwen3VLProcessor

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        """transformers' Qwen3VLProcessor with no video processor (that one needs torchvision)."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyQwen3VLProcessor


def load_processor(model_dir: str, image_backend: str | None = None):
    """The checkpoint's processor: AutoProcessor, or without torchvision the same Qwen3VLProcessor
    built from the checkpoint's tokenizer, image processor (PIL backend) and chat template.
    `image_backend` ("pil" or "torchvision") picks the image processor's backend (transformers'
    default: torchvision when installed)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, Qwen3VLProcessor
    from transformers.utils import is_torchvision_available

    try:
        if is_torchvision_available() and image_backend is not None:
            proc = AutoProcessor.from_pretrained(
                model_dir, image_processor=AutoImageProcessor.from_pretrained(model_dir, backend=image_backend))
        elif is_torchvision_available():
            proc = AutoProcessor.from_pretrained(model_dir)
        else:
            processor_dict, _ = Qwen3VLProcessor.get_processor_dict(model_dir)
            tok = AutoTokenizer.from_pretrained(model_dir)
            proc = image_only_processor_class()(
                image_processor=AutoImageProcessor.from_pretrained(model_dir, backend=image_backend or "pil"),
                tokenizer=tok,
                video_processor=None, chat_template=processor_dict.get("chat_template") or tok.chat_template)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{model_dir}: transformers cannot load the processor ({e})") from e
    if not isinstance(proc, Qwen3VLProcessor):
        raise InputError(f"{model_dir}: AutoProcessor gave a {type(proc).__name__}, expected a "
                         "Qwen3VLProcessor (are preprocessor_config.json or processor_config.json and the "
                         "tokenizer files there?)")
    if not proc.chat_template:
        raise InputError(f"{model_dir}: no chat template (chat_template.jinja, chat_template.json or "
                         "tokenizer_config.json's chat_template)")
    return proc


def chat_text(processor, prompt: str, n_images: int) -> str:
    """The chat template on one user turn (the pictures, then the question) and the start of the
    assistant turn."""
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": prompt}]
    messages = [{"role": "user", "content": content}]
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode(processor, images, prompt: str) -> hr.Prompt:
    """The processor's ids, pixel values, grids and token types for the prompt."""
    return encode_text(processor, images, chat_text(processor, prompt, len(images)))


def encode_text(processor, images, text: str) -> hr.Prompt:
    """The processor's ids, pixel values, grids and token types for a rendered chat `text` whose
    image placeholders take `images` in order."""
    enc = processor(text=[text], images=images or None, return_tensors="pt")
    ids = enc["input_ids"]
    if ids.shape[0] != 1:
        raise AssertionError(f"expected one sequence, got input_ids {tuple(ids.shape)}")
    pixel_values = enc.get("pixel_values")
    grid = enc.get("image_grid_thw")
    mm = enc.get("mm_token_type_ids")
    if mm is None:
        mm = (ids == processor.image_token_id).to(torch.int32)
    return hr.Prompt(input_ids=ids, pixel_values=None if pixel_values is None else pixel_values.to(torch.float32),
                     image_grid_thw=grid, mm_token_type_ids=mm)


def text_control_ids(processor, prompt: str) -> torch.Tensor:
    """The text control of the reference: the same question with no pictures, chat template applied."""
    return processor.tokenizer(chat_text(processor, prompt, 0), return_tensors="pt")["input_ids"][0]


# ---------------------------------------------------------------------------------------------
# The model's side
# ---------------------------------------------------------------------------------------------


def load_model(model_dir: str):
    from transformers import Qwen3VLForConditionalGeneration

    try:
        return Qwen3VLForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=hr.ATTN_IMPLEMENTATION).eval()
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise InputError(f"{model_dir}: transformers cannot load the model ({e})") from e


def hybrid_inputs(model, prompt: hr.Prompt) -> hr.HybridInputs:
    """Planes and rope delta from get_rope_index; image rows and DeepStack sets from the vision tower."""
    ids = prompt.input_ids
    rows = ids.shape[1]
    hidden = model.config.text_config.hidden_size
    sets = len(model.config.vision_config.deepstack_visual_indexes)
    with torch.no_grad():
        if prompt.pixel_values is None:
            pos = torch.arange(rows).view(1, 1, -1).expand(3, 1, -1)
            delta = 0
            image_embeds = torch.zeros(0, hidden)
            deepstack = torch.zeros(sets, 0, hidden)
        else:
            pos, d = model.model.get_rope_index(ids, mm_token_type_ids=prompt.mm_token_type_ids,
                                                image_grid_thw=prompt.image_grid_thw)
            delta = int(d.reshape(-1)[0].item())
            feats = model.model.get_image_features(prompt.pixel_values, prompt.image_grid_thw, return_dict=True)
            image_embeds = torch.cat(feats.pooler_output).to(torch.float32)
            deepstack = torch.stack([torch.cat(per_image).to(torch.float32)
                                     for per_image in feats.deepstack_features])
    image_rows = int((ids[0] == model.config.image_token_id).sum())
    if image_embeds.shape[0] != image_rows:
        raise AssertionError(f"the vision tower gave {image_embeds.shape[0]} rows for {image_rows} image tokens")
    return hr.HybridInputs(input_ids=ids[0].clone(), position_ids=pos[:, 0, :].clone().to(torch.long),
                           image_embeds=image_embeds.contiguous(), deepstack=deepstack.contiguous(),
                           rope_delta=delta)


def write_inputs(path: str, inputs: hr.HybridInputs, image_token_id: int) -> None:
    meta = {"format": hr.FORMAT_INPUTS, "image_token_id": str(image_token_id),
            "rope_delta": str(inputs.rope_delta)}
    hr.save_safetensors(path, dict(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                   image_embeds=inputs.image_embeds, deepstack=inputs.deepstack), meta)


def reference_run(model, prompt: hr.Prompt, inputs: hr.HybridInputs, text_ids: torch.Tensor,
                  steps: int) -> dict:
    """transformers' own path for `steps` greedy tokens (tools/hf_reference.py's run), checked
    against the hybrid inputs: the inputs the language model consumed are the ones written, and the
    decoder fed by hand from them gives the same prompt logits."""
    image_token_id = model.config.image_token_id
    with torch.no_grad():
        consumed, prefill, ids, decode = hr.run_pixel_path(model, prompt, image_token_id, steps)
        for name in ("input_ids", "position_ids", "image_embeds", "deepstack"):
            if not torch.equal(getattr(consumed, name), getattr(inputs, name)):
                raise AssertionError(f"{name}: what the language model consumed differs from the file")
        if consumed.rope_delta != inputs.rope_delta:
            raise AssertionError(f"rope_delta {consumed.rope_delta} != {inputs.rope_delta}")
        hand_prefill, _, _ = hr.run_hybrid_path(model, inputs, image_token_id, 1)
        diff = hr.max_abs(hand_prefill, prefill)
        if diff > 1e-5:
            raise AssertionError(f"the hand-fed decoder differs from the pixel path by {diff:.3e}")
        text_logits = hr.run_text(model, text_ids)
    return dict(prefill_logits=prefill, greedy_ids=ids, decode_logits=decode, text_ids=text_ids,
                text_logits=text_logits)


def write_reference(path: str, ref: dict, meta: dict) -> None:
    tensors = {k: v.contiguous().to(torch.long if k.endswith("ids") else torch.float32) for k, v in ref.items()}
    hr.save_safetensors(path, tensors, meta)


def up_to_end_of_turn(ids: list[int], end_id: int | None) -> list[int]:
    """The ids up to and including the first end-of-turn token (all of them when there is none)."""
    if end_id is not None and end_id in ids:
        return ids[: ids.index(end_id) + 1]
    return list(ids)


def answer(tokenizer, ids: list[int], margins: list[float]) -> dict:
    """transformers' greedy ids and their text, stopped at <|im_end|> and in full."""
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end_id is None or end_id == tokenizer.unk_token_id:
        end_id = None
    stopped = up_to_end_of_turn(ids, end_id)

    def text(t: list[int]) -> str:
        return tokenizer.decode(t, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    return {"end_of_turn": END_OF_TURN, "end_of_turn_id": end_id,
            "answer": {"greedy_ids": stopped, "text": text(stopped),
                       "stop": "im_end" if end_id is not None and end_id in stopped else "steps"},
            "all": {"greedy_ids": list(ids), "text": text(ids)},
            "greedy_top2_gaps": [round(m, 6) for m in margins]}


def step_margins(ref: dict) -> list[float]:
    """The top-2 logit gap of every greedy step (after the prompt, then after each fed token)."""
    rows = torch.cat([ref["prefill_logits"][-1:], ref["decode_logits"]])
    top = rows.topk(2, dim=-1).values
    return [float(v) for v in top[:, 0] - top[:, 1]]


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


@dataclass
class Made:
    prompt: hr.Prompt
    inputs: hr.HybridInputs
    image_token_id: int
    reference: dict | None
    answer: dict | None


def make(model_dir: str, image_paths: list[str], prompt_text: str, steps: int | None,
         model=None, processor=None) -> Made:
    """Everything the tool writes, in memory. `model` / `processor` may be given (already loaded)."""
    check_checkpoint(model_dir)
    images = load_images(image_paths)
    processor = processor or load_processor(model_dir)
    prompt = encode(processor, images, prompt_text)
    model = model or load_model(model_dir)
    cfg = model.config
    if processor.image_token_id != cfg.image_token_id:
        raise InputError(f"{model_dir}: the tokenizer's <|image_pad|> is id {processor.image_token_id}, "
                         f"config.json's image_token_id is {cfg.image_token_id}")
    inputs = hybrid_inputs(model, prompt)
    ref = ans = None
    if steps is not None:
        ref = reference_run(model, prompt, inputs, text_control_ids(processor, prompt_text), steps)
        ans = answer(processor.tokenizer, ref["greedy_ids"].tolist(), step_margins(ref))
    return Made(prompt, inputs, int(cfg.image_token_id), ref, ans)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description="Write a hybrid-inputs/1 file (and optionally a transformers reference) for a "
        "Qwen3-VL checkpoint, pictures and a question.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", required=True, metavar="DIR", help="Hugging Face Qwen3-VL checkpoint directory")
    ap.add_argument("--image", action="append", default=[], metavar="FILE",
                    help="a picture (repeatable; in prompt order, before the question)")
    ap.add_argument("--prompt", required=True, metavar="TEXT", help="the question")
    ap.add_argument("-o", "--output", required=True, metavar="FILE", help="the hybrid-inputs/1 file to write")
    ap.add_argument("--reference", type=int, metavar="N",
                    help="also write reference.safetensors (N greedy steps, f32) and answer.json next to it")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args(argv)
    if args.reference is not None and args.reference < 1:
        print(f"error: --reference {args.reference}: needs at least 1 greedy step", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    try:
        made = make(args.model, args.image, args.prompt, args.reference)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    write_inputs(args.output, made.inputs, made.image_token_id)
    inp = made.inputs
    grids = [] if made.prompt.image_grid_thw is None else made.prompt.image_grid_thw.tolist()
    print(f"{args.output}: {inp.input_ids.shape[0]} rows, {inp.image_embeds.shape[0]} image rows "
          f"(grids t,h,w {grids}), {inp.deepstack.shape[0]} DeepStack sets, rope_delta {inp.rope_delta}")
    if made.reference is not None:
        import transformers

        ref_path = os.path.join(out_dir, "reference.safetensors")
        meta = {"description": f"transformers f32 greedy run of {args.prompt!r} on {len(args.image)} picture(s)",
                "case": os.path.basename(os.path.normpath(args.model)), "kind": "f32",
                "prompt": args.prompt, "images": json.dumps([os.path.basename(p) for p in args.image]),
                "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                "attn_implementation": hr.ATTN_IMPLEMENTATION}
        write_reference(ref_path, made.reference, meta)
        ans_path = os.path.join(out_dir, "answer.json")
        with open(ans_path, "w") as f:
            json.dump(dict(prompt=args.prompt, **made.answer), f, indent=2, ensure_ascii=False)
            f.write("\n")
        a = made.answer["answer"]
        gap = min(made.answer["greedy_top2_gaps"])
        print(f"{ref_path}: {args.reference} greedy steps, text control "
              f"{made.reference['text_ids'].shape[0]} rows; smallest top-2 gap {gap:.4g}")
        print(f"{ans_path}: transformers' answer ({len(a['greedy_ids'])} tokens, stop: {a['stop']}): "
              f"{a['text']!r}")
        if gap < 1e-3:
            print(f"note: a greedy step has a top-2 gap of {gap:.3g}: another arithmetic may pick the "
                  "other token there", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
