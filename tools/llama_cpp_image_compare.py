#!/usr/bin/env python3
"""Image prompts: time to the first token, ours against llama-mtmd-cli, same checkpoint, same pictures.

  python3 tools/llama_cpp_image_compare.py [--family qwen3-vl|qwen3.5] [--sizes 448x448,1280x720]
                                           [--rounds 2] [--towers q4,bf16] [--threads 2]
                                           [--lock /work/notes/bench.lock]

1. builds llama-mtmd-cli and llama-quantize as tools/llama_cpp_compare.py builds llama-bench (the
   llama.cpp vendored in the PyPI llama-cpp-python sdist, CPU only, -march=native, into --cache,
   default target/llama.cpp; every step kept and resumed);
2. writes one random Hugging Face checkpoint per --family, bf16 shards, with the tiny chat
   checkpoint's tokenizer and template (speed does not depend on the vocabulary's words):
     qwen3-vl  Qwen3-VL-2B-Instruct's geometry, text and tower (tools/random_model_check.py's
               SHAPE_2B: 28 layers of 2048, 16/8 heads of 128; tower depth 24 of 1024, 16 heads of
               64, DeepStack at 5, 11, 17), from transformers' Qwen3VLForConditionalGeneration;
     qwen3.5   `Qwen3_5ForConditionalGeneration` with `bench --shape qwen3.5-2b`'s text
               (tools/llama_cpp_qwen35_compare.py's TEXT: 24 layers [DeltaNet x3, full] x6 of
               2048, vocab 248320, tied) and that shape's tower, the hub Qwen3.5-2B's:
               Qwen3-VL's without DeepStack, depth 27 of 1152, 16 heads of 72, intermediate
               4304 (packs/src/shapes.rs). Its tensors are drawn shard by shard in bf16 under
               transformers' own names and shapes (read off the model built on the meta device),
               so writing it needs ~1 GB of memory, not the 13 GB of a materialized 2.7B model.
   From it:
     theirs  convert_hf_to_gguf.py -> text F16 (or Q8_0 with --text-via q8_0, a smaller
             intermediate when disk is short) -> llama-quantize --pure Q4_0; --mmproj -> F16 tower
     ours    packs build --quant q4, per --towers: "default" (the tower as `packs build` stores
             it: bf16 with bf16 products beside a q4 decoder since issue 36) or --vision-quant K
             ("bf16": with --vision-products bf16, against their F16 tower, like for like);
3. writes a photo-like JPEG per size (gradients and noise, quality 90) and alternates, A B A B,
   --rounds times per size and tower:
     ours    `xdna-vl run PACK --image P --prompt Q --max-tokens 1 --json`: `timings.ttft_ms` (from
             the request to the first token: decode, preprocessing, tower, prefill; the pack is
             already mapped)
     theirs  `llama-mtmd-cli -m Q4_0 --mmproj F16 --image P -p Q -n 1 -v`: from its verbose log's
             timestamps, the prompt's tokenization (preprocessing) to the print after the token
             (model load and tower warm-up excluded, as ours are); its encode time besides
   and prints theirs/ours per case, TTFT and tower alone (medians; targets: qwen3-vl from issue 36,
   TTFT >= 3x with the default pack and the bf16 tower >= 2x their F16 one; qwen3.5 from issue 35,
   TTFT >= 2x at 720p) and one JSON line. --rounds 1 is allowed (a single A B pair: no spread).

Needs torch, transformers 5, safetensors, pillow, gguf, numpy, sentencepiece (the converter imports
it before it reads a tokenizer.json), cmake, a C++ compiler, cargo, about
20 GB of disk and 12 GB of memory while the checkpoint is written. CI runs none of this.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_cpp_compare as base  # noqa: E402  (the build, the lock, run/say)

REPO = base.REPO
say, run = base.say, base.run

CHAT = os.path.join(REPO, "tests", "fixtures", "chat", "Qwen3-VL-tiny")
ASSETS = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
          "video_preprocessor_config.json"]
PROMPT = "Describe this picture."
# Per family: TTFT with the default pack; the bf16 tower against their F16 tower (encode time).
TARGETS = {"qwen3-vl": {"default": ("ttft", 3.0), "bf16": ("tower", 2.0)},
           "qwen3.5": {"default": ("ttft", 2.0)}}
# Models' file stems (with the seed) per family.
STEMS = {"qwen3-vl": "qwen3-vl-2b-vl", "qwen3.5": "qwen3.5-2b-vl"}
# `bench --shape qwen3.5-2b`'s text (packs/src/shapes.rs), as llama_cpp_qwen35_compare.py writes it.
Q35_TEXT = dict(vocab_size=248320, hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
                num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, partial_rotary_factor=0.25,
                rope_theta=10_000_000.0, mrope_section=[11, 11, 10], initializer_range=0.02)
# Its tower: the hub Qwen3.5-2B's (Qwen3-VL's without DeepStack, 27 x 1152, 16 heads of 72).
Q35_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                  num_position_embeddings=2304, initializer_range=0.02)


def parse_size(s: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)[xX](\d+)\s*", s)
    if not m or not (16 <= int(m.group(1)) <= 8192 and 16 <= int(m.group(2)) <= 8192):
        sys.exit(f"--sizes: {s!r} is not WIDTHxHEIGHT with sides 16..8192 (like 1280x720)")
    return int(m.group(1)), int(m.group(2))


# ------------------------------------------------------------------------------------------------
# 2. The checkpoint, their GGUFs, our packs.

def write_assets(ck: str) -> dict:
    """The tiny chat checkpoint's tokenizer, template and processor (the 2B's pixel bounds) into
    `ck`; returns the tiny checkpoint's config (its special ids)."""
    os.makedirs(ck, exist_ok=True)
    for f in ASSETS:
        shutil.copy(os.path.join(CHAT, f), ck)
    with open(os.path.join(CHAT, "preprocessor_config.json")) as f:
        pre = json.load(f)
    pre["size"] = {"shortest_edge": 65536, "longest_edge": 16777216}  # Qwen3-VL-2B-Instruct's
    with open(os.path.join(ck, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f, indent=2)
    with open(os.path.join(CHAT, "config.json")) as f:
        return json.load(f)


def special_ids(chat: dict) -> dict:
    return dict(vision_start=chat["vision_start_token_id"], vision_end=chat["vision_end_token_id"],
                image=chat["image_token_id"], video=chat["video_token_id"])


def write_checkpoint(ck: str, seed: int) -> None:
    import torch
    import hf_reference as hr
    import random_model_check as rmc
    from transformers import Qwen3VLForConditionalGeneration

    geo = rmc.SHAPE_2B
    chat = write_assets(ck)
    spec = dict(dtype="bfloat16", config_spelling="5.x", max_shard_size="1GB", tie_word_embeddings=True,
                text=dict(vocab_size=geo["vocab"], rope_theta=5_000_000.0, rms_norm_eps=1e-6,
                          initializer_range=0.02, **geo["text"]),
                vision=dict(initializer_range=0.02, **geo["vision"]),
                special_ids=special_ids(chat))
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(hr.build_config(spec)).eval()
    hr.save_checkpoint(model, spec, ck)
    del model
    gc.collect()


def draw_q35(name: str, shape: tuple, gen):
    """A random bf16 tensor for `name` (a Qwen3_5ForConditionalGeneration state-dict key): linears
    uniform with std 1/sqrt(fan-in), as packs::random fills them; the text's zero-centred norms
    near 0, the tower's LayerNorms and the gated norm near 1; biases and the DeltaNet's A_log and
    dt_bias small (f32 where hub checkpoints keep them f32). Values only keep activations finite:
    speed does not depend on them."""
    import torch

    def uniform(amp, dtype=torch.bfloat16):
        return ((torch.rand(shape, generator=gen) * 2 - 1) * amp).to(dtype)

    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("A_log", "dt_bias"):
        return uniform(0.02, torch.float32)
    if "linear_attn.norm." in name:
        return 1 + uniform(0.1, torch.float32)
    if name.startswith("model.visual.") and (".norm" in name) and leaf == "weight":
        return 1 + uniform(0.1)
    if leaf == "bias" or "norm" in name:
        return uniform(0.02 if leaf == "bias" else 0.1)
    if name.endswith("embed_tokens.weight") or name.endswith("pos_embed.weight"):
        return uniform(0.1)
    fan_in = 1
    for d in shape[1:]:
        fan_in *= d
    return uniform((3.0 / fan_in) ** 0.5)


def write_checkpoint_q35(ck: str, seed: int) -> None:
    """The qwen3.5 family's checkpoint (module docs), one safetensors shard per tower block and
    per text layer, the config as transformers writes it."""
    import torch
    from safetensors.torch import save_file
    import hf_reference as hr
    from transformers import Qwen3_5ForConditionalGeneration

    chat = write_assets(ck)
    spec = dict(model="qwen3_5", dtype="bfloat16", config_spelling="5.x", tie_word_embeddings=True,
                text=dict(Q35_TEXT), vision=dict(Q35_VISION), special_ids=special_ids(chat))
    cfg = hr.build_config(spec)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Qwen3_5ForConditionalGeneration(cfg).state_dict().items()
                  if k != "lm_head.weight"}  # tied to the embedding
    groups: dict[str, list[str]] = {}
    for k in shapes:
        m = re.match(r"(model\.(?:visual\.blocks|language_model\.layers)\.\d+)\.", k)
        groups.setdefault(m.group(1) if m else "rest", []).append(k)
    gen = torch.Generator().manual_seed(seed)
    index = {}
    for i, (group, keys) in enumerate(groups.items()):
        shard = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: draw_q35(k, shapes[k], gen) for k in keys}, os.path.join(ck, shard),
                  metadata={"format": "pt"})
        index.update({k: shard for k in keys})
        if i % 8 == 0:
            say(f"  shard {i + 1}/{len(groups)} ({group})")
    with open(os.path.join(ck, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f, indent=1)
    cfg.dtype = torch.bfloat16
    cfg.architectures = ["Qwen3_5ForConditionalGeneration"]  # the converter picks its classes by it
    cfg.save_pretrained(ck)


CONVERT = """
import sys
sys.path.insert(0, {src!r})
sys.argv = ["convert_hf_to_gguf.py", {ckpt!r}, "--outfile", {out!r}] + {extra!r}
import convert_hf_to_gguf as convert
try:
    from conversion import base
    text_model = base.TextModel
except ImportError:  # older layouts keep the classes in the script itself
    text_model = convert.TextModel
# The tiny chat tokenizer is not Qwen's: name its pre-tokenizer as Qwen's so the converter does
# not refuse an unknown hash (speed does not depend on it).
text_model.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
convert.main()
"""


def convert(src: str, ckpt: str, out: str, extra: list[str]) -> None:
    if os.path.exists(out):
        say(f"model: kept {out}")
        return
    say(f"model: convert_hf_to_gguf.py {' '.join(extra)} -> {os.path.basename(out)}")
    code = CONVERT.format(src=src, ckpt=ckpt, out=out + ".tmp", extra=extra)
    run([sys.executable, "-c", code], quiet=True)
    os.replace(out + ".tmp", out)


def make_models(cache: str, exes: dict, seed: int, towers: list[str], family: str,
                text_via: str, models_dir: str | None) -> dict[str, str]:
    models = models_dir or os.path.join(cache, "models")
    os.makedirs(models, exist_ok=True)
    stem = os.path.join(models, f"{STEMS[family]}-seed{seed}")
    ck = stem + "-hf"
    if not os.path.exists(os.path.join(ck, "config.json")):
        say(f"model: writing {ck} (random, bf16; a few minutes)")
        (write_checkpoint_q35 if family == "qwen3.5" else write_checkpoint)(ck, seed)
    else:
        say(f"model: kept {ck}")
    src = os.path.join(cache, f"llama_cpp_python-{exes['version']}", "vendor", "llama.cpp")
    out = {"ckpt": ck}
    q4 = stem + "-text-Q4_0.gguf"
    if not os.path.exists(q4):
        # The random checkpoint has no mtp.* layers (hub Qwen3.5 ones do).
        extra = ["--no-mtp"] if family == "qwen3.5" else []
        via = stem + f"-text-{text_via.upper()}.gguf"
        convert(src, ck, via, ["--outtype", text_via] + extra)
        say("model: llama-quantize --pure Q4_0")
        # From Q8_0 this requantizes: other Q4_0 values, the same tensor types and speed.
        requant = ["--allow-requantize"] if text_via == "q8_0" else []
        run([exes["llama-quantize"], "--pure"] + requant + [via, q4 + ".tmp", "Q4_0"], quiet=True)
        os.replace(q4 + ".tmp", q4)
        if text_via == "q8_0":
            os.remove(via)  # only an intermediate when disk is short
    else:
        say(f"model: kept {q4}")
    out["Q4_0"] = q4
    out["mmproj"] = stem + "-mmproj-F16.gguf"
    convert(src, ck, out["mmproj"], ["--outtype", "f16", "--mmproj"])
    for tower in towers:
        pack = f"{stem}-q4-tower-{tower}.pack"
        # A packs binary newer than the pack may write another format version: build again.
        if not os.path.exists(pack) or os.path.getmtime(pack) < os.path.getmtime(packs_exe()):
            cmd = [packs_exe(), "build", ck, "-o", pack + ".tmp", "--quant", "q4", "-q"]
            if tower != "default":
                cmd += ["--vision-quant", tower]
            if tower == "bf16":
                # The 16-bit tower on BF16 dot products (f32 products where the CPU lacks them).
                cmd += ["--vision-products", "bf16"]
            run(cmd, quiet=True)
            os.replace(pack + ".tmp", pack)
        else:
            say(f"model: kept {pack}")
        out[f"pack-{tower}"] = pack
    return out


def target_dir() -> str:
    return os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))


def packs_exe() -> str:
    return os.path.join(target_dir(), "release", "packs")


def picture(cache: str, w: int, h: int) -> str:
    import numpy as np
    from PIL import Image

    path = os.path.join(cache, "pictures", f"photo-{w}x{h}.jpg")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = np.random.default_rng(w * 10007 + h)
        yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
        rgb = np.stack([xx, yy, 1 - 0.5 * (xx + yy)], axis=-1) + 0.08 * rng.standard_normal((h, w, 3))
        Image.fromarray((np.clip(rgb, 0, 1) * 255).astype(np.uint8)).save(path, quality=90)
    return path


# ------------------------------------------------------------------------------------------------
# 3. The alternation.

def ours(pack: str, pic: str, threads: int, lock) -> dict[str, float]:
    xdna = os.path.join(target_dir(), "release", "xdna-vl")
    cmd = [xdna, "run", pack, "--image", pic, "--prompt", PROMPT, "--max-tokens", "1", "--json",
           "--greedy", "--threads", str(threads), "--ctx", "16384"]
    with lock:
        r = json.loads(run(cmd, quiet=True))
    t = r["timings"]
    return {"ttft_s": t["ttft_ms"] / 1e3, "tower_s": t["tower_ms"] / 1e3,
            "image_tokens": r["image_tokens"]}


ENCODED = re.compile(r"mtmd batch encoding done in (\d+) ms|image slice encoded in (\d+) ms")
DECODED = re.compile(r"image decoded \(batch \d+/\d+\) in (\d+) ms")
STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")


def stamp(line: str) -> float | None:
    """The seconds of llama.cpp's log timestamp (`M.SS.mmm.uuu`, from the process start)."""
    m = STAMP.match(line)
    if not m:
        return None
    mi, se, ms, us = (int(g) for g in m.groups())
    return mi * 60 + se + ms / 1e3 + us / 1e6


def theirs(exes: dict, models: dict, pic: str, threads: int, lock) -> dict[str, float]:
    """llama-mtmd-cli's time to the first token, read off its verbose log's timestamps: from the
    prompt's tokenization (the picture's preprocessing, `image_tokens->nx`) to the performance
    print after the one token (`llama_perf_context_print`); the model's load and the tower's
    warm-up before are not counted, as ours are not. Also the encode and the image rows' decode."""
    cmd = [exes["llama-mtmd-cli"], "-m", models["Q4_0"], "--mmproj", models["mmproj"],
           "--image", pic, "-p", PROMPT, "-n", "1", "--temp", "0", "-t", str(threads),
           "-c", "16384", "--no-warmup", "--perf", "-v", "--log-timestamps"]
    say("$ " + " ".join(cmd))
    with lock:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace")
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        sys.exit(f"llama-mtmd-cli failed ({p.returncode})")
    lines = p.stdout.splitlines()
    t0 = next((stamp(x) for x in lines if "image_tokens->nx" in x), None)
    t1 = next((stamp(x) for x in lines if "llama_perf_context_print" in x), None)
    enc = sum(int(a or b) for a, b in ENCODED.findall(p.stdout))
    dec = sum(int(m) for m in DECODED.findall(p.stdout))
    if t0 is None or t1 is None or enc == 0:
        sys.stderr.write(p.stdout[-4000:])
        sys.exit("could not read llama-mtmd-cli's timings (its log format changed?)")
    return {"ttft_s": t1 - t0, "tower_s": enc / 1e3, "image_decode_s": dec / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example: python3 tools/llama_cpp_image_compare.py "
                                        "--sizes 1280x720 --towers q4 --rounds 2")
    ap.add_argument("--cache", default=os.path.join(REPO, "target", "llama.cpp"))
    ap.add_argument("--family", choices=sorted(STEMS), default="qwen3-vl",
                    help="the random checkpoint's family and shape (module docs)")
    ap.add_argument("--text-via", choices=["f16", "q8_0"], default="f16",
                    help="the converter's text output that llama-quantize makes Q4_0 from")
    ap.add_argument("--models-dir", help="the checkpoint, GGUFs and packs (default: CACHE/models; "
                    "a tmpfs when disk is short)")
    ap.add_argument("--sizes", default="448x448,1280x720,1920x1080")
    ap.add_argument("--towers", default="default,bf16,q4",
                    help="our q4 packs' towers: default (as packs build makes it), bf16 (with bf16 "
                         "products), q4, i8, f32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per case")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs of the llama.cpp build")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lock", help="flock this file around each timed command")
    ap.add_argument("--stop-after", choices=["build", "models"])
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("--rounds: at least 1 (A B)")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    towers = [t.strip() for t in args.towers.split(",")]
    for t in towers:
        if t not in ("default", "q4", "bf16", "i8", "f32"):
            sys.exit(f"--towers: {t!r} is not one of default, q4, bf16, i8, f32")

    exes = base.build_llama(args.cache, args.jobs, ("llama-mtmd-cli", "llama-quantize"))
    if args.stop_after == "build":
        return
    say("ours: cargo build --release -p packs -p xdna-vl")
    run(["cargo", "build", "--release", "-p", "packs", "-p", "xdna-vl"], cwd=REPO)
    models = make_models(args.cache, exes, args.seed, towers, args.family, args.text_via,
                         args.models_dir)
    if args.stop_after == "models":
        return
    lock = base.Lock(args.lock)

    results = []
    for (w, h) in sizes:
        pic = picture(args.cache, w, h)
        for tower in towers:
            rounds = []
            for r in range(args.rounds):
                say(f"{w}x{h}, our {tower} tower: round {r + 1}/{args.rounds}")
                a = ours(models[f"pack-{tower}"], pic, args.threads, lock)
                b = theirs(exes, models, pic, args.threads, lock)
                say(f"  ours {a}  theirs {b}")
                rounds.append({"ours": a, "theirs": b, "ratio": b["ttft_s"] / a["ttft_s"],
                               "tower_ratio": b["tower_s"] / a["tower_s"]})
            results.append({"size": f"{w}x{h}", "tower": tower, "rounds": rounds,
                            "median_ratio": statistics.median(r["ratio"] for r in rounds),
                            "median_tower_ratio": statistics.median(r["tower_ratio"] for r in rounds)})

    print()
    print(f"{args.family}: time to the first token, llama-mtmd-cli (Q4_0 + F16 mmproj, "
          f"llama-cpp-python {exes['version']}) / ours (q4 pack), {args.threads} threads; "
          f"higher is better for us")
    for res in results:
        rs = res["rounds"]
        what, target = TARGETS[args.family].get(res["tower"], (None, None))

        def secs(side: str, key: str) -> str:
            return ", ".join("%.2f" % r[side][key] for r in rs)

        print(f"  {res['size']:>10} tower {res['tower']:>4}: ours {secs('ours', 'ttft_s')} s "
              f"(tower {secs('ours', 'tower_s')}), theirs {secs('theirs', 'ttft_s')} s "
              f"(encode {secs('theirs', 'tower_s')}): TTFT x{res['median_ratio']:.2f}, tower "
              f"x{res['median_tower_ratio']:.2f}" + (f" (target: {what} x{target})" if target else ""))
    print(json.dumps({"family": args.family, "threads": args.threads, "llama_cpp": exes["version"],
                      "results": results}))


if __name__ == "__main__":
    main()
