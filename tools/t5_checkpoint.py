#!/usr/bin/env python3
"""A tiny random Qwen3-VL saved the way transformers 5 saves a fine-tune, and transformers' greedy
answer about one picture: what `packs build` must carry the tower of (tests/fixtures/t5-checkpoint).

  python3 tools/t5_checkpoint.py --out tests/fixtures/t5-checkpoint

writes
  <out>/Qwen3-VL-t5/   exactly what transformers 5 writes, nothing edited by hand:
      model.save_pretrained (bf16, as fine-tunes are saved): config.json, generation_config.json,
      model.safetensors;
      processor.save_pretrained (Qwen3VLProcessor: the tiny chat checkpoint's tokenizer and chat
      template, a Qwen2VLImageProcessor and a Qwen3VLVideoProcessor): processor_config.json (the
      image and video processors nested under image_processor / video_processor, the resize
      limits as size.shortest_edge / size.longest_edge), tokenizer.json, tokenizer_config.json,
      chat_template.jinja; and no preprocessor_config.json
  <out>/answer.json    transformers' greedy ids and their text for the prompt (tools/hybrid_input.py's
                       format): the picture tests/fixtures/chat/picture-2.png, then the question
  <out>/case.json      the spec, the seed and why it was chosen, the image processor transformers
                       builds from the saved files (its size, mean, std, ...), the picture's grid,
                       which files were written, the versions

The image processor's size (min 16384, max 65536 pixels) resizes the 64x96 picture to 128x160
(20 image tokens); transformers' class defaults (3136 / 1003520) would keep it at 64x96 (6), so a
reader that misses the nested settings gets another prompt. The reference runs transformers' PIL
image backend (`Qwen2VLImageProcessorPil`, the one the Rust preprocessing follows bit for bit) on
the settings loaded from the saved directory; case.json also records whether the torchvision backend
(AutoProcessor's default when torchvision is installed) gives the same ids.

The model seed is the first from --seed whose answer ends with <|im_end|> at a step in
[--min-answer, --steps - 2], with a top-2 logit gap of at least --min-gap at every one of --steps
greedy steps and no token three times in a row; the logits are transformers' f32 run on the bf16
weights (what an f32 pack of the checkpoint computes). Everything is seeded.

Needs torch, torchvision (transformers 5 builds and saves Qwen3VLProcessor with its video processor),
transformers 5.x, safetensors, pillow. CI does not run it.
"""

from __future__ import annotations

import argparse
import copy
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
CHAT_MODEL = os.path.join(CHAT, "Qwen3-VL-tiny")
PICTURE = os.path.join(CHAT, "picture-2.png")
MODEL_DIR = "Qwen3-VL-t5"
END_OF_TURN = "<|im_end|>"

# Small enough to commit (about 300 KB of bf16 weights), with every part the pack carries: a
# tied head, GQA, interleaved MRoPE, two vision blocks and two DeepStack sets.
SPEC = dict(
    description="transformers-5 save of a tiny random Qwen3-VL: hidden 64, 2 layers, heads 2/1, head_dim 32, "
    "mrope [6,5,5], tied head, vocab 512 (the tiny chat tokenizer); vision hidden 16, 2 blocks, "
    "DeepStack [0, 1]; bf16",
    seed=7001,
    dtype="bfloat16",
    config_spelling="5.x",
    max_shard_size=None,
    tie_word_embeddings=True,
    text=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=32, rope_theta=1_000_000.0,
              mrope_section=[6, 5, 5], rms_norm_eps=1e-6, initializer_range=0.1),
    vision=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, num_position_embeddings=64,
                deepstack_visual_indexes=[0, 1], initializer_range=0.1),
)
# The image processor's settings (Qwen3-VL's mean and std; resize limits that enlarge the picture).
IMAGE_PROCESSOR = dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5],
                       image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 128 * 128, "longest_edge": 256 * 256})


def make_processor():
    """Qwen3VLProcessor as a fine-tuning script holds it: the chat checkpoint's tokenizer and
    template, transformers' default (torchvision) image processor, the video processor."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tok = AutoTokenizer.from_pretrained(CHAT_MODEL)
    with open(os.path.join(CHAT_MODEL, "chat_template.jinja")) as f:
        template = f.read()
    video = {k: copy.deepcopy(v) for k, v in IMAGE_PROCESSOR.items()}
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**copy.deepcopy(IMAGE_PROCESSOR)),
                            tokenizer=tok, video_processor=Qwen3VLVideoProcessor(**video),
                            chat_template=template)


def image_processor_facts(ip) -> dict:
    """What the image processor transformers built will do (the values a pack must carry)."""
    size = dict(ip.size)
    return dict(type=type(ip).__name__, min_pixels=int(size["shortest_edge"]), max_pixels=int(size["longest_edge"]),
                patch_size=ip.patch_size, merge_size=ip.merge_size, temporal_patch_size=ip.temporal_patch_size,
                image_mean=[float(x) for x in ip.image_mean], image_std=[float(x) for x in ip.image_std],
                rescale_factor=float(ip.rescale_factor), do_resize=bool(ip.do_resize),
                do_rescale=bool(ip.do_rescale), do_normalize=bool(ip.do_normalize),
                do_convert_rgb=bool(ip.do_convert_rgb), resample=int(ip.resample))


def acceptable(ids: list[int], gaps: list[float], end_id: int, args) -> bool:
    if end_id not in ids:
        return False
    k = ids.index(end_id)
    return (args.min_answer <= k <= args.steps - 2 and min(gaps) >= args.min_gap
            and hr.longest_run(ids[: k + 1]) <= 2)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", required=True, help=f"output directory ({MODEL_DIR}/, answer.json, case.json)")
    ap.add_argument("--prompt", default="Describe this picture.", help="the question about the picture")
    ap.add_argument("--steps", type=int, default=16, help="greedy steps of the reference")
    ap.add_argument("--min-answer", type=int, default=4, help="fewest tokens before <|im_end|>")
    ap.add_argument("--min-gap", type=float, default=0.01, help="smallest top-2 gap on a greedy step")
    ap.add_argument("--seed", type=int, default=SPEC["seed"], help="first model seed to try")
    ap.add_argument("--attempts", type=int, default=2000, help="model seeds to try")
    args = ap.parse_args(argv)
    import transformers
    from transformers import Qwen3VLForConditionalGeneration
    from transformers.utils import is_torchvision_available

    if not transformers.__version__.startswith("5."):
        raise SystemExit(f"error: transformers {transformers.__version__}: this fixture is what transformers 5 writes")
    if not is_torchvision_available():
        raise SystemExit("error: needs torchvision (transformers 5 builds and saves Qwen3VLProcessor with its "
                         "video processor)")
    torch.use_deterministic_algorithms(True)
    ck_dir = os.path.join(args.out, MODEL_DIR)
    os.makedirs(ck_dir, exist_ok=True)
    for f in os.listdir(ck_dir):
        os.remove(os.path.join(ck_dir, f))

    # 1. The processor, saved as transformers 5 saves it, then loaded back from that directory.
    make_processor().save_pretrained(ck_dir)
    processor_files = sorted(os.listdir(ck_dir))
    processor = hi.load_processor(ck_dir, image_backend="pil")
    default_processor = hi.load_processor(ck_dir)  # AutoProcessor as is: the torchvision backend
    facts = image_processor_facts(processor.image_processor)
    if facts != {**image_processor_facts(default_processor.image_processor), "type": facts["type"]}:
        raise AssertionError("the PIL and torchvision image processors were built with other settings")
    images = hi.load_images([PICTURE])
    prompt = hi.encode(processor, images, args.prompt)
    default_prompt = hi.encode(default_processor, images, args.prompt)
    end_id = processor.tokenizer.convert_tokens_to_ids(END_OF_TURN)

    # 2. The model seed: transformers' f32 run on the bf16 weights.
    spec = copy.deepcopy(SPEC)
    spec["special_ids"] = dict(vision_start=processor.vision_start_token_id, vision_end=processor.vision_end_token_id,
                               image=processor.image_token_id, video=processor.video_token_id)
    cfg = hr.build_config(spec)
    for attempt in range(args.attempts):
        seed = args.seed + attempt
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(cfg).eval()
        hr.randomize_norms(model, torch.Generator().manual_seed(seed + 1))
        model = model.to(torch.bfloat16).to(torch.float32)
        with torch.no_grad():
            _, prefill, ids, decode = hr.run_pixel_path(model, prompt, cfg.image_token_id, args.steps)
        gaps = hi.step_margins(dict(prefill_logits=prefill, decode_logits=decode))
        if acceptable(ids.tolist(), gaps, end_id, args):
            break
    else:
        raise SystemExit(f"error: no seed in {args.seed}..{args.seed + args.attempts - 1} answers with "
                         f"<|im_end|> in [{args.min_answer}, {args.steps - 2}] with top-2 gaps >= {args.min_gap}")
    spec["seed"] = seed
    model.to(torch.bfloat16).save_pretrained(ck_dir)

    # 3. The reference, from the saved directory as a user would load it.
    made = hi.make(ck_dir, [PICTURE], args.prompt, args.steps, processor=processor)
    if made.reference["greedy_ids"].tolist() != ids.tolist():
        raise AssertionError("the reloaded checkpoint answers otherwise than the model that was saved")
    with torch.no_grad():
        model = hi.load_model(ck_dir)
        _, _, default_ids, _ = hr.run_pixel_path(model, default_prompt, cfg.image_token_id, args.steps)
    answer = made.answer
    with open(os.path.join(args.out, "answer.json"), "w") as f:
        json.dump(dict(prompt=args.prompt, **answer), f, indent=2, ensure_ascii=False)
        f.write("\n")
    grid = [int(v) for v in prompt.image_grid_thw[0]]
    pixel_diff = float((default_prompt.pixel_values - prompt.pixel_values).abs().max())
    case = dict(
        spec=spec, prompt=args.prompt, picture=os.path.relpath(PICTURE, args.out), steps=args.steps,
        seed=seed, attempt=attempt,
        seed_rule=f"first seed from {args.seed} whose greedy answer ends with <|im_end|> at a step in "
        f"[{args.min_answer}, {args.steps - 2}], every top-2 gap >= {args.min_gap}, no token thrice in a row",
        files=sorted(os.listdir(ck_dir)), processor_files=processor_files,
        image_processor=facts, image_grid_thw=grid, image_tokens=grid[0] * grid[1] * grid[2] // facts["merge_size"] ** 2,
        prompt_tokens=int(prompt.input_ids.shape[1]), greedy_ids=ids.tolist(),
        end_of_turn_step=ids.tolist().index(end_id), min_top2_gap=round(min(gaps), 6),
        torchvision_backend=dict(same_ids=default_ids.tolist() == ids.tolist(),
                                 max_abs_pixel_value_difference=round(pixel_diff, 6)),
        versions=dict(transformers=transformers.__version__, torch=torch.__version__,
                      attn_implementation=hr.ATTN_IMPLEMENTATION))
    with open(os.path.join(args.out, "case.json"), "w") as f:
        json.dump(case, f, indent=2)
        f.write("\n")
    a = answer["answer"]
    print(f"{ck_dir}: {', '.join(case['files'])}")
    print(f"seed {seed} (attempt {attempt}); {case['prompt_tokens']} prompt tokens, {case['image_tokens']} image "
          f"(grid {grid}); answer {a['greedy_ids']} {a['text']!r}; smallest top-2 gap {min(gaps):.4f}; "
          f"torchvision backend: same ids {case['torchvision_backend']['same_ids']}, pixel values up to "
          f"{pixel_diff:.4g} apart")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
