#!/usr/bin/env python3
"""The product end to end on random Qwen3-VL geometries, against transformers' greedy answer.

  python3 tools/random_model_check.py --models 6 --seed 1          # needs cargo build --release first

For each model: a random-init Qwen3-VL with a geometry drawn from the seed (head_dim 8..64, query
and key/value heads, a random MRoPE split of head_dim / 2, 1-3 layers, vision depth 1-4 with a
random DeepStack subset, 16..100 position embeddings, tied or untied head, 512 or 640 vocabulary
rows for the tiny tokenizer's 512 tokens, so a model can pick ids no token has; or with --shape 2b
Qwen3-VL-2B-Instruct's geometry) saved as the hub saves it (bf16, sharded, with the tiny chat
checkpoint's tokenizer and template and the hub's image sizes); 0-4 pictures of random sizes and formats (PNG RGB / gray / RGBA, JPEG 4:2:0 / 4:4:4 /
progressive, lossy WebP). Then `packs build --quant bf16` and `xdna-vl run --json --greedy` with
the pictures and a question, against transformers' `generate`-equivalent greedy ids (f32 compute on
the bf16 weights, which is what the bf16 pack computes). A divergence at a step whose top-2 logit
gap is under --tie-gap is reported as a near tie, not a failure. Exit 1 if any answer differs.

  python3 tools/random_model_check.py --turns 2                    # conversations, `xdna-vl chat`
  python3 tools/random_model_check.py --turns 2 --serve            # 4 clients of serve --parallel 4

--turns N makes a conversation of N user turns: the pictures and the question, then follow-ups,
each with one more picture half the time; every earlier turn is answered in the history by the
text of transformers' greedy answer to it, and each turn's reference is transformers' processor
(apply_chat_template on the whole message list, with the generation prompt) and greedy ids on it.
The turns go to `xdna-vl chat --json` on a pipe (one session, its cached prefix reused, its
history holding our own answers: a turn's ids are compared only while every earlier answer was
transformers').
--serve starts `xdna-vl serve PACK --parallel N` (--parallel, default 4) on a free port and asks
from 4 clients at once (the conversation; another question; the pictures reversed; the first
picture, another question and a system message; clients 1 and 3 stream), each client its turns in
order, then every request again alone: each answer must equal its answer alone and transformers'.
serve's answers are compared by their ids (`return_token_ids`), with the prompt rows, the token
count (`usage`) and the finish_reason.

Needs torch, transformers (5.x), safetensors, pillow. CI does not run it.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import hf_reference as hr  # noqa: E402
import hybrid_input as hi  # noqa: E402

CHAT = os.path.join(ROOT, "tests", "fixtures", "chat", "Qwen3-VL-tiny")
ASSETS = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "video_preprocessor_config.json"]
END_OF_TURN = 500  # <|im_end|> in the tiny chat tokenizer
PROMPT = "What is in these pictures? Tell me"
QUESTIONS = ["Which colours are there?", "Compare them, please", "Describe it in a word"]  # --serve's other clients
SYSTEM = "You are a terse assistant."  # --serve's fourth client opens with it
FOLLOW_UPS = ["And now? Tell me more", "What changed since then?", "Say it again, shorter"]  # later turns


# Qwen3-VL-2B-Instruct's geometry (config.json on the hub), for --shape 2b.
SHAPE_2B = dict(
    text=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
              num_key_value_heads=8, head_dim=128, mrope_section=[24, 20, 20]),
    vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, num_position_embeddings=2304,
                deepstack_visual_indexes=[5, 11, 17]),
    tie=True, vocab=151936)


# Qwen3.5-2B's geometry (the text as bench's qwen3.5-2b shape has it, packs/src/shapes.rs; the
# tower at the hub's Qwen3.5 sizes: hidden 1152, depth 27, intermediate 4304, 16 heads of 72, no
# DeepStack), for --family qwen3.5 --shape 2b.
SHAPE_Q35_2B = dict(
    text=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
              layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(24)],
              num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
              linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
              linear_conv_kernel_dim=4, partial_rotary_factor=0.25, mrope_section=[11, 11, 10]),
    vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, num_position_embeddings=2304),
    tie=True, vocab=248320, mix="interval")


def draw_geometry(rng: np.random.Generator) -> dict:
    head_dim = int(rng.choice([8, 16, 32, 64]))
    kv = int(rng.choice([1, 2, 3]))
    heads = kv * int(rng.choice([1, 2, 3, 4]))
    half = head_dim // 2
    cut = sorted(rng.choice(np.arange(1, half), size=2, replace=False).tolist())
    section = [cut[0], cut[1] - cut[0], half - cut[1]]
    depth = int(rng.integers(1, 5))
    v_heads = int(rng.choice([1, 2, 4]))
    v_head_dim = int(rng.choice([8, 16]))
    sets = int(rng.integers(1, min(3, depth) + 1))
    return dict(
        text=dict(hidden_size=int(rng.choice([32, 48, 64, 96])), intermediate_size=int(rng.choice([64, 96, 160])),
                  num_hidden_layers=int(rng.integers(1, 4)), num_attention_heads=heads,
                  num_key_value_heads=kv, head_dim=head_dim, mrope_section=section),
        vision=dict(depth=depth, hidden_size=v_heads * v_head_dim, intermediate_size=int(rng.choice([32, 64, 96])),
                    num_heads=v_heads, num_position_embeddings=int(rng.choice([16, 36, 64, 100])),
                    deepstack_visual_indexes=sorted(rng.choice(depth, size=sets, replace=False).tolist())),
        tie=bool(rng.random() < 0.5), vocab=int(rng.choice([512, 640])))


def draw_qwen35_geometry(rng: np.random.Generator, moe: bool) -> dict:
    """A Qwen3.5 (or, with `moe`, Qwen3.5-MoE / Qwen3.6) geometry: a random mix of Gated DeltaNet
    and full-attention layers (any order, either kind first and last, or full attention only),
    odd head counts, rotary over a quarter of head_dim with a random MRoPE split of it, the linear
    layers' key heads and value heads (a multiple of them), routed experts with a shared one."""
    head_dim = int(rng.choice([32, 64, 128, 256]))
    half = head_dim // 8  # partial_rotary_factor 0.25: rotary head_dim / 4, mrope over its halves
    cut = sorted(rng.choice(np.arange(1, half), size=2, replace=False).tolist())
    section = [cut[0], cut[1] - cut[0], half - cut[1]]
    kv = int(rng.choice([1, 2, 3]))
    layers = int(rng.integers(1, 6))
    # No "linear only": transformers' generate needs an attention layer (its cache's mask sizes).
    mix = str(rng.choice(["random", "interval", "full only"], p=[0.65, 0.25, 0.1]))
    if mix == "interval":
        layers = max(layers, 4)  # every 4th layer full: at least one
        types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    elif mix == "full only":
        types = ["full_attention"] * layers
    else:
        types = [str(rng.choice(["linear_attention", "full_attention"])) for _ in range(layers)]
        if "full_attention" not in types:
            types[int(rng.integers(0, layers))] = "full_attention"
    k_heads = int(rng.choice([1, 2, 3]))
    text = dict(hidden_size=int(rng.choice([32, 48, 64, 96])), num_hidden_layers=layers, layer_types=types,
                num_attention_heads=kv * int(rng.choice([1, 2, 3])), num_key_value_heads=kv, head_dim=head_dim,
                linear_num_key_heads=k_heads, linear_num_value_heads=k_heads * int(rng.choice([1, 2, 3])),
                linear_key_head_dim=int(rng.choice([8, 16, 32])), linear_value_head_dim=int(rng.choice([8, 16, 32])),
                linear_conv_kernel_dim=4, partial_rotary_factor=0.25, mrope_section=section)
    if moe:
        experts = int(rng.integers(2, 9))
        text.update(num_experts=experts, num_experts_per_tok=int(rng.integers(1, min(4, experts) + 1)),
                    moe_intermediate_size=int(rng.choice([16, 32, 48])),
                    shared_expert_intermediate_size=int(rng.choice([16, 32, 64])))
    else:
        text["intermediate_size"] = int(rng.choice([64, 96, 160]))
    v_heads = int(rng.choice([1, 2, 4]))
    # Tower widths off the multiples of 32 too (the hub's Qwen3.5 tower: heads of 72, intermediate 4304).
    vision = dict(depth=int(rng.integers(1, 4)), hidden_size=v_heads * int(rng.choice([8, 12, 16, 24])),
                  intermediate_size=int(rng.choice([32, 40, 64, 72, 96])), num_heads=v_heads,
                  num_position_embeddings=int(rng.choice([16, 36, 64, 100])))
    return dict(text=text, vision=vision, tie=bool(rng.random() < 0.5), vocab=int(rng.choice([512, 640])),
                mix=mix)


def describe(geo: dict) -> str:
    t, v = geo["text"], geo["vision"]
    if "layer_types" in t:
        kinds = "".join("L" if k == "linear_attention" else "F" for k in t["layer_types"])
        moe = (f", {t['num_experts']} experts top-{t['num_experts_per_tok']} (shared {t['shared_expert_intermediate_size']})"
               if "num_experts" in t else "")
        return (f"layers {kinds} ({geo['mix']}), heads {t['num_attention_heads']}/{t['num_key_value_heads']} "
                f"head_dim {t['head_dim']} mrope {t['mrope_section']}, linear heads {t['linear_num_key_heads']}x"
                f"{t['linear_key_head_dim']} / {t['linear_num_value_heads']}x{t['linear_value_head_dim']}{moe}, "
                f"vision depth {v['depth']}, {'tied' if geo['tie'] else 'untied'}, vocab {geo['vocab']}")
    return (f"heads {t['num_attention_heads']}/{t['num_key_value_heads']} head_dim {t['head_dim']} mrope "
            f"{t['mrope_section']} layers {t['num_hidden_layers']}, vision depth {v['depth']} deepstack "
            f"{v['deepstack_visual_indexes']}, {'tied' if geo['tie'] else 'untied'}, vocab {geo['vocab']}")


def model_class(family: str):
    if family == "qwen3.5":
        from transformers import Qwen3_5ForConditionalGeneration as cls
    elif family == "qwen3.5-moe":
        from transformers import Qwen3_5MoeForConditionalGeneration as cls
    else:
        from transformers import Qwen3VLForConditionalGeneration as cls
    return cls


def draw_pictures(rng: np.random.Generator, out: str, count: int | None = None, first: int = 0) -> list[str]:
    """`count` pictures (0-4 drawn when None) of random sizes and formats, named from `first` on."""
    paths = []
    for i in range(first, first + (int(rng.integers(0, 5)) if count is None else count)):
        h, w = int(rng.integers(20, 260)), int(rng.integers(20, 260))
        im = hr.synthetic_image(h, w, str(rng.choice(["gradient", "checker", "noise"])), rng)
        kind = str(rng.choice(["png", "gray", "rgba", "jpeg420", "jpeg444", "progressive", "webp"]))
        ext = {"jpeg420": "jpg", "jpeg444": "jpg", "progressive": "jpg", "webp": "webp"}.get(kind, "png")
        path = os.path.join(out, f"picture-{i}-{kind}.{ext}")
        q = int(rng.integers(30, 100))
        if kind == "gray":
            im.convert("L").save(path)
        elif kind == "rgba":
            im = im.convert("RGBA")
            im.putalpha(Image.fromarray((rng.random((h, w)) * 255).astype(np.uint8)))
            im.save(path)
        elif kind == "jpeg420":
            im.save(path, quality=q, subsampling=2)
        elif kind == "jpeg444":
            im.save(path, quality=q, subsampling=0)
        elif kind == "progressive":
            im.save(path, quality=q, progressive=True)
        elif kind == "webp":
            im.save(path, quality=q)
        else:
            im.save(path)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
# Conversations and transformers' answers
# ---------------------------------------------------------------------------------------------

# A conversation is its user turns, each (pictures, question), maybe after a system message
# (None, text); the assistant turns between them are transformers' answers (their text), so every
# turn's prompt is fixed by the reference alone.


def conversations(rng: np.random.Generator, pictures: list[str], out: str, turns: int, clients: int) -> list:
    """The model's conversation (its pictures and PROMPT, then follow-ups, each later turn with one
    more picture half the time), and for --serve variants of it: another question, the pictures
    in reverse order, the first picture only with another question after a system message."""
    later = []
    for t in range(1, turns):
        extra = draw_pictures(rng, out, count=1, first=len(pictures) + t - 1) if rng.random() < 0.5 else []
        later.append((extra, FOLLOW_UPS[(t - 1) % len(FOLLOW_UPS)]))
    variants = [(pictures, PROMPT), (pictures, QUESTIONS[0]), (pictures[::-1], QUESTIONS[1]),
                (pictures[:1], QUESTIONS[2])]
    convs = [[first] + later for first in variants[:clients]]
    if clients > 3:
        convs[3].insert(0, (None, SYSTEM))
    return convs


def user_message(pictures: list[str], question: str) -> dict:
    return {"role": "user", "content": [{"type": "image", "image": p} for p in pictures]
            + [{"type": "text", "text": question}]}


@dataclass
class Answer:
    ids: list[int]  # transformers' greedy ids, --steps of them
    gaps: list[float]  # the top-2 logit gap of every step
    stopped: list[int]  # ids up to and including the first <|im_end|>
    text: str  # the text of `stopped` (decode, special tokens skipped): the next turn's history
    rows: int  # prompt rows


def reference(model, processor, messages: list[dict], steps: int) -> Answer:
    """transformers on a whole message list: processor.apply_chat_template (with the generation
    prompt), the processor on its text and pictures, greedy ids on the model's cache."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pictures = [c["image"] for m in messages if isinstance(m["content"], list)
                for c in m["content"] if c["type"] == "image"]
    prompt = hi.encode_text(processor, hi.load_images(pictures), text)
    with torch.no_grad():
        _, prefill, ids, decode = hr.run_pixel_path(model, prompt, model.config.image_token_id, steps)
    ids = ids.tolist()
    stopped = hi.up_to_end_of_turn(ids, END_OF_TURN)
    return Answer(ids, hi.step_margins(dict(prefill_logits=prefill, decode_logits=decode)), stopped,
                  decode_text(processor.tokenizer, stopped), int(prompt.input_ids.shape[1]))


def decode_text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def references(model, processor, conversation, steps: int) -> list[tuple[list[dict], Answer]]:
    """Each user turn's prompt (the messages so far, earlier turns answered by transformers'
    text) and transformers' answer to it."""
    messages, turns = [], []
    for pictures, question in conversation:
        if pictures is None:
            messages = messages + [{"role": "system", "content": question}]
            continue
        messages = messages + [user_message(pictures, question)]
        answer = reference(model, processor, messages, steps)
        turns.append((messages, answer))
        messages = messages + [{"role": "assistant", "content": answer.text}]
    return turns


# ---------------------------------------------------------------------------------------------
# Verdicts: ids where the product gives them, else text and token count
# ---------------------------------------------------------------------------------------------


def judge(ours: list[int], ref: Answer, tie_gap: float) -> str:
    """Our ids against transformers': the same up to our stop (ours may stop at <|im_end|>, where
    transformers runs on), or a near tie where the first difference has a top-2 gap < tie_gap."""
    n = len(ours)
    if ours == ref.ids[:n] and (n == len(ref.ids) or (n > 0 and ref.ids[n - 1] == END_OF_TURN)):
        return "same"
    step = next((i for i, (a, b) in enumerate(zip(ours, ref.ids)) if a != b), n)
    return "near tie" if step < len(ref.gaps) and ref.gaps[step] < tie_gap else "different"


def report(label: str, verdict: str, ref: Answer, ours: str) -> str:
    print(f"  {label}: {ref.rows} prompt rows, transformers {ref.ids} {ref.text!r}\n"
          f"    {'ours':>{len(label) - 2}}  {ours}  -> {verdict.upper()} (smallest top-2 gap {min(ref.gaps):.4f})")
    return verdict


# ---------------------------------------------------------------------------------------------
# The product's front ends
# ---------------------------------------------------------------------------------------------


def check_run(args, pack: str, turns) -> list[str]:
    """`xdna-vl run --json`: one user turn, our greedy ids."""
    [(messages, ref)] = turns
    pictures, question = messages[0]["content"], messages[0]["content"][-1]["text"]
    cmd = [args.xdna_vl, "run", pack, "--json", "--greedy", "--threads", "1", "--max-tokens", str(args.steps),
           "--drafts", args.drafts, "--prompt", question]
    for c in pictures[:-1]:
        cmd += ["--image", c["image"]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return [report("run", "failed", ref, r.stderr.strip())]
    ours = json.loads(r.stdout)
    return [report("run", judge(ours["ids"], ref, args.tie_gap), ref, f"{ours['ids']} {ours['text']!r}")]


def check_chat(args, pack: str, turns) -> list[str]:
    """`xdna-vl chat --json` on a pipe: the turns one after another on one session (the cached
    prefix of the earlier turns reused), its history holding our own answers; each answer's ids
    and prompt rows against transformers'. A later turn is compared only while every earlier
    answer was transformers' (else the histories differ)."""
    lines = []
    for messages, _ in turns:
        content = messages[-1]["content"]
        lines += [f"/image {c['image']}" for c in content[:-1]] + [content[-1]["text"]]
    cmd = [args.xdna_vl, "chat", pack, "--json", "--greedy", "--threads", "1", "--max-tokens", str(args.steps),
           "--drafts", args.drafts]
    r = subprocess.run(cmd, input=("\n".join(lines) + "\n").encode(), capture_output=True)
    stderr = r.stderr.decode()
    answers = [json.loads(line) for line in r.stdout.decode().splitlines() if line.startswith("{")]
    verdicts = []
    for t, (_, ref) in enumerate(turns):
        label = f"chat turn {t + 1}"
        if r.returncode != 0 or t >= len(answers):
            verdicts.append(report(label, "failed", ref, stderr.strip()[-500:]))
            break
        ours = answers[t]
        verdict = judge(ours["ids"], ref, args.tie_gap)
        if verdict == "same" and ours["prompt_tokens"] != ref.rows:
            verdict = "different"
        verdicts.append(report(label, verdict, ref, f"{ours['ids']} {ours['text']!r} (prompt "
                                                    f"{ours['prompt_tokens']} rows, {ours['reused_tokens']} reused)"))
        if verdict != "same":
            break  # the next turn's history is our answer, not transformers'
    return verdicts


def data_url(path: str) -> str:
    mime = {"jpg": "jpeg"}.get(path.rsplit(".", 1)[1], path.rsplit(".", 1)[1])
    with open(path, "rb") as f:
        return f"data:image/{mime};base64," + base64.b64encode(f.read()).decode()


def openai_messages(messages: list[dict]) -> list[dict]:
    """transformers' message list as /v1/chat/completions takes it: pictures as data URLs."""
    out = []
    for m in messages:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        out.append({"role": m["role"], "content": [
            {"type": "image_url", "image_url": {"url": data_url(c["image"])}} if c["type"] == "image" else c
            for c in m["content"]]})
    return out


@contextlib.contextmanager
def serving(args, pack: str, log_path: str):
    """`xdna-vl serve PACK --parallel N` on a free port until the block ends (killed even on
    failure); yields its address once it listens."""
    log = open(log_path, "w")
    proc = subprocess.Popen([args.xdna_vl, "serve", pack, "--port", "0", "--parallel", str(args.parallel),
                             "--threads", "1", "--max-tokens", str(args.steps), "--drafts", args.drafts],
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            with open(log_path) as f:
                m = re.search(r"listening on (http://\S+)", f.read())
            if m:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path) as f:
                    raise RuntimeError(f"xdna-vl serve did not start: {f.read().strip()[-500:]}")
            time.sleep(0.1)
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def ask(base: str, messages: list[dict], steps: int, stream: bool) -> tuple[str, list[int], int, int, str]:
    """One greedy /v1/chat/completions request, streamed (SSE, with the usage chunk) or not:
    text, ids (`return_token_ids`), completion and prompt tokens, finish."""
    body = {"model": "m", "messages": openai_messages(messages), "temperature": 0, "max_tokens": steps,
            "return_token_ids": True}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            if not stream:
                doc = json.load(r)
                choice = doc["choices"][0]
                return (choice["message"]["content"] or "", choice["token_ids"], doc["usage"]["completion_tokens"],
                        doc["usage"]["prompt_tokens"], choice["finish_reason"])
            text, ids, finish, usage = "", None, None, None
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    text += choice.get("delta", {}).get("content") or ""
                    finish = choice.get("finish_reason") or finish
                    ids = choice.get("token_ids", ids)
            return text, ids, usage["completion_tokens"], usage["prompt_tokens"], finish
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read().decode(errors='replace')}") from e


def check_serve(args, pack: str, convs, log_path: str) -> list[str]:
    """`xdna-vl serve --parallel N`: every conversation from its own client at once (each client
    asks its turns in order, the history holding transformers' answers; odd clients stream), then
    each turn again alone. Ids (`return_token_ids`), prompt rows and finish; the answer at once
    must be the answer alone, both transformers'."""
    def client(c: int):
        return [ask(base, messages, args.steps, stream=c % 2 == 1) for messages, _ in convs[c]]

    with serving(args, pack, log_path) as base:
        with concurrent.futures.ThreadPoolExecutor(len(convs)) as pool:
            together = list(pool.map(client, range(len(convs))))
        alone = [client(c) for c in range(len(convs))]
    verdicts = []
    for c, turns in enumerate(convs):
        for t, (_, ref) in enumerate(turns):
            (text, ids, tokens, rows, finish), single = together[c][t], alone[c][t]
            verdict = judge(ids, ref, args.tie_gap)
            if verdict == "same" and tokens != len(ids):
                verdict = "different"
            want_finish = "stop" if ref.stopped[-1:] == [END_OF_TURN] else "length"
            if verdict == "same" and (rows != ref.rows or finish != want_finish):
                verdict = "different"
            if single != together[c][t]:
                verdict = "different"  # not the answer it gets alone: a product bug, near tie or not
            verdicts.append(report(f"serve client {c} turn {t + 1}", verdict, ref,
                                   f"{ids} {text!r} ({tokens} tokens, {rows} prompt rows, {finish})"
                                   + ("" if single == together[c][t] else f"; alone {single!r}")))
    return verdicts


def run_one(index: int, seed: int, work: str, args) -> list[str]:
    """One random model: its checkpoint, pack and pictures, transformers' answers to its
    conversation(s), and the product's verdict on each answer."""
    rng = np.random.default_rng([seed, index])
    if args.family == "qwen3-vl":
        geo = draw_geometry(rng) if args.shape == "random" else SHAPE_2B
    elif args.shape == "2b":
        if args.family != "qwen3.5":
            raise SystemExit("--shape 2b: Qwen3-VL-2B's or Qwen3.5-2B's geometry (--family qwen3-vl or qwen3.5)")
        geo = SHAPE_Q35_2B
    else:
        geo = draw_qwen35_geometry(rng, moe=args.family == "qwen3.5-moe")
    out = os.path.join(work, f"model-{index}")
    ck = os.path.join(out, "checkpoint")
    os.makedirs(ck)
    for f in ASSETS:
        shutil.copy(os.path.join(CHAT, f), ck)
    with open(os.path.join(CHAT, "preprocessor_config.json")) as f:
        pre = json.load(f)
    pre["size"] = {"shortest_edge": 65536, "longest_edge": 16777216}  # Qwen3-VL-2B-Instruct's
    with open(os.path.join(ck, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f, indent=2)
    with open(os.path.join(CHAT, "config.json")) as f:
        chat = json.load(f)
    model_kind = {"qwen3.5": "qwen3_5", "qwen3.5-moe": "qwen3_5_moe"}.get(args.family, "dense")
    spelling = "interval" if geo.get("mix") == "interval" else "5.x"  # full_attention_interval, no layer_types
    spec = dict(model=model_kind, dtype="bfloat16", config_spelling=spelling, max_shard_size="100KB" if args.shape == "random" else "1GB", tie_word_embeddings=geo["tie"],
                text=dict(vocab_size=geo["vocab"], rope_theta=5_000_000.0, rms_norm_eps=1e-6, initializer_range=0.1,
                          **geo["text"]),
                vision=dict(initializer_range=0.1, **geo["vision"]),
                special_ids=dict(vision_start=chat["vision_start_token_id"], vision_end=chat["vision_end_token_id"],
                                 image=chat["image_token_id"], video=chat["video_token_id"]))
    cls = model_class(args.family)
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = cls(hr.build_config(spec)).eval()
    hr.randomize_norms(model, torch.Generator().manual_seed(int(rng.integers(0, 2**31))))
    hr.save_checkpoint(model, spec, ck)
    if args.drafts.startswith("mtp"):
        # Random mtp.* weights as hub checkpoints carry (transformers ignores them).
        hr.add_mtp(dict(spec, seed=int(rng.integers(0, 2**31))), model, ck)
    del model  # the 2B shape holds 8.5 GB of f32 weights: one copy at a time
    gc.collect()
    # f32 compute on the bf16 values, as the bf16 pack computes
    model = cls.from_pretrained(ck, dtype=torch.float32, attn_implementation=hr.ATTN_IMPLEMENTATION).eval()
    pictures = draw_pictures(rng, out)
    # The PIL image processor, the one the Rust preprocessing reproduces (vision/README.md): with
    # torchvision installed AutoProcessor takes the torchvision one, 1-2 levels off on resized
    # pixels, enough to flip a near tie (README: random_model_check).
    processor = hi.load_processor(ck, image_backend="pil")
    convs = [references(model, processor, conv, args.steps)
             for conv in conversations(rng, pictures, out, args.turns, 4 if args.serve else 1)]
    del model
    gc.collect()

    pack = os.path.join(out, "model-bf16.pack")
    subprocess.run([args.packs, "build", ck, "-o", pack, "--quant", "bf16", "-q"], check=True,
                   stdout=subprocess.DEVNULL)
    names = [os.path.basename(c["image"]) for m, _ in convs[0] for c in m[-1]["content"][:-1]]
    print(f"model {index}: {describe(geo)}; {args.turns} turn(s), {len(names)} pictures "
          f"({', '.join(names) or 'text only'})")
    if args.serve:
        return check_serve(args, pack, convs, os.path.join(out, "serve.log"))
    if args.turns > 1:
        return check_chat(args, pack, convs[0])
    return check_run(args, pack, convs[0])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", type=int, default=6, help="random models to check")
    ap.add_argument("--seed", type=int, default=1, help="draws every geometry, weight and picture")
    ap.add_argument("--shape", choices=["random", "2b"], default="random",
                    help="random geometries, or the 2B model's of the family (Qwen3-VL-2B-Instruct's, Qwen3.5-2B's: about 4 GB of bf16 shards per model, minutes)")
    ap.add_argument("--family", choices=["qwen3-vl", "qwen3.5", "qwen3.5-moe"], default="qwen3-vl",
                    help="Qwen3-VL, Qwen3.5 (hybrid Gated DeltaNet) or Qwen3.5-MoE / Qwen3.6 geometries")
    ap.add_argument("--steps", type=int, default=10, help="greedy steps to compare")
    ap.add_argument("--tie-gap", type=float, default=1e-3, help="a divergence under this top-2 gap is a near tie")
    ap.add_argument("--packs", default=os.path.join(ROOT, "target", "release", "packs"))
    ap.add_argument("--xdna-vl", default=os.path.join(ROOT, "target", "release", "xdna-vl"))
    ap.add_argument("--turns", type=int, default=1,
                    help="user turns per conversation: 1 is `xdna-vl run`; more go through `xdna-vl chat` "
                         "(or --serve), each earlier turn answered in the history by transformers' text")
    ap.add_argument("--serve", action="store_true",
                    help="ask `xdna-vl serve --parallel N` from 4 clients at once (the model's conversation "
                         "and variants of it), then each alone")
    ap.add_argument("--parallel", type=int, default=4, help="--serve: serve's --parallel (1 reuses the cached prefix)")
    ap.add_argument("--drafts", default="off", help="xdna-vl's --drafts (N prompt-lookup drafts, or mtp[:N] with the "
                                                    "Qwen3.5 families: random mtp.* weights are added; the ids must not change)")
    ap.add_argument("--keep", help="keep the models and pictures under this directory")
    args = ap.parse_args(argv)
    if args.turns < 1 or args.parallel < 1:
        ap.error("--turns and --parallel must be at least 1")
    for exe in (args.packs, args.xdna_vl):
        if not os.path.isfile(exe):
            print(f"error: {exe} not found; run `cargo build --release -p packs -p xdna-vl` first", file=sys.stderr)
            return 2
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the machine is shared: run this under nice, OMP_NUM_THREADS=1
    import transformers

    transformers.utils.logging.disable_progress_bar()
    work = args.keep or tempfile.mkdtemp(prefix="random-model-check-")
    os.makedirs(work, exist_ok=True)
    try:
        per_model = [run_one(i, args.seed, work, args) for i in range(args.models)]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    verdicts = [v for vs in per_model for v in vs]
    counts = {v: verdicts.count(v) for v in sorted(set(verdicts))}
    print(f"{len(per_model)} models, {len(verdicts)} answers: {counts}")
    return 0 if all(v in ("same", "near tie") for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
