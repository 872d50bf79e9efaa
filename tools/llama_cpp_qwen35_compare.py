#!/usr/bin/env python3
"""Our host decoder against llama.cpp on a random Qwen3.5-2B-shaped text model (or, with --model
moe, a reduced Qwen3.5-35B-A3B / Qwen3.6 one), same machine and threads.

  python3 tools/llama_cpp_qwen35_compare.py [--rounds 2] [--threads 2] [--lock /work/notes/bench.lock]
  python3 tools/llama_cpp_qwen35_compare.py --model moe --kinds q4   # qwen3.5-35b-a3b-reduced

1. builds llama-bench and llama-quantize as tools/llama_cpp_compare.py does (the llama.cpp vendored
   in the llama-cpp-python sdist, into --cache, default target/llama.cpp; kept and resumed). Its
   0.3.36 knows the `qwen35` architecture (src/llama-arch.cpp LLM_ARCH_QWEN35, conversion/qwen.py
   Qwen3_5TextModel);
2. writes a random Hugging Face checkpoint with the text geometry of `bench --shape qwen3.5-2b`
   (packs/src/shapes.rs: hidden 2048, 24 layers [linear x3, full] x6, intermediate 6144, 8 / 2
   heads of 256, rotary 64 (partial 0.25), MRoPE [11, 11, 10], DeltaNet 16 key / 16 value heads of
   128, conv 4, vocab 248320, tied, theta 1e7), bf16, as `Qwen3_5ForCausalLM`, with a byte-level
   tokenizer (256 tokens; the converter pads the vocabulary to 248320). The real Qwen3.5 tokenizer
   is not needed for speed, so its pre-tokenizer check is answered "qwen35" (the converter would
   refuse an unknown hash). Then llama.cpp's own convert_hf_to_gguf.py makes an F16 GGUF and
   llama-quantize --pure makes Q4_0 and Q8_0 (llama-quantize falls back where a tensor's rows do
   not fit the block, e.g. the conv's 4 taps);
3. alternates ours and theirs, A B A B, --rounds times per pair (q4 vs Q4_0, i8 vs Q8_0):
     ours    `bench --shape qwen3.5-2b --kinds K --prefill-rows 512 --json`   prefill at 512 rows
             `bench decode --shape qwen3.5-2b --kinds K --kv bf16 --ctx 0 --json`   decode at ctx 0
     theirs  `llama-bench -p 512 -n 0` (pp512) and `llama-bench -p 0 -n 32` (tg32)
   and prints ours/theirs per case (medians over rounds; targets: decode >= 1.2x, prefill >= 2x)
   and one JSON line. Our 512-row prefill is an image prompt (bench's steps.rs), theirs text:
   the same rows through the same layers.

--model moe: the geometry of `bench --shape qwen3.5-35b-a3b-reduced` (packs/src/shapes.rs:
Qwen3.5-35B-A3B's layers, 4 of its 40 [linear x3, full]: hidden 2048, 16 / 2 heads of 256, DeltaNet
16 key / 32 value heads of 128, 256 experts top-8 of intermediate 512 with a shared expert of 512
and its sigmoid gate, untied head) as `Qwen3_5MoeForCausalLM`, the experts fused as transformers 5
saves them (`mlp.experts.gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`). It is ~8.5 GB in bf16,
so the converter writes Q8_0 straight away (`--outtype q8_0`, no F16), the checkpoint is deleted
after, and Q4_0 is `llama-quantize --allow-requantize --pure` of that Q8_0 (values differ from a
quantization of F16; speed does not depend on them). Per layer and token both read the bytes of
the full model's layer, so the ratios are the full model's but for the share of the embedding and
head.

Needs torch, safetensors, tokenizers (transformers' dependencies), gguf, numpy, cmake, a C++
compiler, cargo, ~25 GB of disk. CI runs none of this: it is a tool, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_cpp_compare as base  # noqa: E402  (the build, the lock, run/say)

REPO = base.REPO
say, run = base.say, base.run

SHAPE_NAME = "qwen3.5-2b"
MOE = False
TEXT = dict(
    vocab_size=248320, hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
    linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=262144,
    full_attention_interval=4,
)
PAIRS = [("q4", "Q4_0", "Q4_0"), ("i8", "Q8_0", "Q8_0")]
PREFILL_ROWS = 512
DECODE_TOKENS = 32
TARGETS = {"prefill": 2.0, "decode": 1.2}


def use_moe() -> None:
    """The reduced Qwen3.5-35B-A3B of `bench --shape qwen3.5-35b-a3b-reduced`."""
    global SHAPE_NAME, MOE
    SHAPE_NAME, MOE = "qwen3.5-35b-a3b-reduced", True
    del TEXT["intermediate_size"]
    TEXT.update(num_hidden_layers=4, num_attention_heads=16, linear_num_value_heads=32,
                num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                shared_expert_intermediate_size=512, norm_topk_prob=True)


def layer_types() -> list[str]:
    n, every = TEXT["num_hidden_layers"], TEXT["full_attention_interval"]
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]


def config() -> dict:
    return {
        "architectures": ["Qwen3_5MoeForCausalLM" if MOE else "Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_moe_text" if MOE else "qwen3_5_text",
        **TEXT,
        "layer_types": layer_types(),
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": not MOE,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0,
                            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                            "mrope_interleaved": True},
        "bos_token_id": None, "eos_token_id": 2, "pad_token_id": None,
        "torch_dtype": "bfloat16",
    }


def write_tokenizer(out: str) -> None:
    """A byte-level BPE of the 256 byte tokens and a few merges (llama.cpp refuses a BPE
    vocabulary without merges; speed does not depend on it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    merges = [("t", "h"), ("e", "r"), ("i", "n"), ("a", "n")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 262144}, f)


def write_checkpoint(out: str, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    h, t = TEXT["hidden_size"], TEXT
    key_dim = t["linear_num_key_heads"] * t["linear_key_head_dim"]
    value_dim = t["linear_num_value_heads"] * t["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim

    def uniform(shape, amp):
        return ((torch.rand(shape, generator=g) * 2 - 1) * amp).to(torch.bfloat16)

    def linear(n, k):
        # std 1/sqrt(k), as packs::random fills linears.
        return uniform((n, k), (3.0 / k) ** 0.5)

    def norm(n):
        # Qwen3.5's norms are zero-centred (x * (1 + w)): w near 0.
        return uniform((n,), 0.1)

    os.makedirs(out, exist_ok=True)
    shard, shards, index = {}, 0, {}

    def flush():
        nonlocal shard, shards
        if shard:
            name = f"model-{shards:05d}.safetensors"
            save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
            for k in shard:
                index[k] = name
            shards += 1
            shard = {}

    shard["model.embed_tokens.weight"] = uniform((t["vocab_size"], h), 0.1)
    shard["model.norm.weight"] = norm(h)
    if MOE:
        shard["lm_head.weight"] = linear(t["vocab_size"], h)
    flush()
    for i, kind in enumerate(layer_types()):
        say(f"  layer {i + 1}/{t['num_hidden_layers']} ({kind})")
        p = f"model.layers.{i}."
        shard[p + "input_layernorm.weight"] = norm(h)
        shard[p + "post_attention_layernorm.weight"] = norm(h)
        if MOE:
            e, i = t["num_experts"], t["moe_intermediate_size"]
            si = t["shared_expert_intermediate_size"]
            shard[p + "mlp.gate.weight"] = linear(e, h)
            shard[p + "mlp.experts.gate_up_proj"] = uniform((e, 2 * i, h), (3.0 / h) ** 0.5)
            shard[p + "mlp.experts.down_proj"] = uniform((e, h, i), (3.0 / i) ** 0.5)
            shard[p + "mlp.shared_expert.gate_proj.weight"] = linear(si, h)
            shard[p + "mlp.shared_expert.up_proj.weight"] = linear(si, h)
            shard[p + "mlp.shared_expert.down_proj.weight"] = linear(h, si)
            shard[p + "mlp.shared_expert_gate.weight"] = linear(1, h)
        else:
            shard[p + "mlp.gate_proj.weight"] = linear(t["intermediate_size"], h)
            shard[p + "mlp.up_proj.weight"] = linear(t["intermediate_size"], h)
            shard[p + "mlp.down_proj.weight"] = linear(h, t["intermediate_size"])
        if kind == "linear_attention":
            a = p + "linear_attn."
            nv = t["linear_num_value_heads"]
            shard[a + "in_proj_qkv.weight"] = linear(conv_dim, h)
            shard[a + "in_proj_z.weight"] = linear(value_dim, h)
            shard[a + "in_proj_b.weight"] = linear(nv, h)
            shard[a + "in_proj_a.weight"] = linear(nv, h)
            shard[a + "conv1d.weight"] = uniform((conv_dim, 1, t["linear_conv_kernel_dim"]), 0.5)
            shard[a + "A_log"] = uniform((nv,), 0.02).float()
            shard[a + "dt_bias"] = uniform((nv,), 0.02)
            shard[a + "norm.weight"] = (1 + uniform((t["linear_value_head_dim"],), 0.1).float())
            shard[a + "out_proj.weight"] = linear(h, value_dim)
        else:
            s = p + "self_attn."
            hd = t["head_dim"]
            shard[s + "q_proj.weight"] = linear(2 * t["num_attention_heads"] * hd, h)
            shard[s + "k_proj.weight"] = linear(t["num_key_value_heads"] * hd, h)
            shard[s + "v_proj.weight"] = linear(t["num_key_value_heads"] * hd, h)
            shard[s + "o_proj.weight"] = linear(h, t["num_attention_heads"] * hd)
            shard[s + "q_norm.weight"] = norm(hd)
            shard[s + "k_norm.weight"] = norm(hd)
        flush()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
    write_tokenizer(out)


CONVERT = """
import sys
sys.path.insert(0, {src!r})
# --no-mtp: the random checkpoint has no mtp.* layers (hub checkpoints do; transformers ignores
# them, and so does our pack).
sys.argv = ["convert_hf_to_gguf.py", {ckpt!r}, "--outtype", {outtype!r}, "--no-mtp", "--outfile",
            {out!r}]
import convert_hf_to_gguf as convert
from conversion import base
# The random checkpoint's byte-level tokenizer is not Qwen3.5's: name its pre-tokenizer as the
# real one's so the converter does not refuse an unknown hash (speed does not depend on it).
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
convert.main()
"""


def make_models(cache: str, src: str, quantize: str, seed: int) -> dict[str, str]:
    models = os.path.join(cache, "models")
    os.makedirs(models, exist_ok=True)
    stem = os.path.join(models, f"{SHAPE_NAME}-text-seed{seed}")
    ckpt = stem + "-hf"
    if MOE:
        return make_moe_models(stem, ckpt, src, quantize, seed)
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        say(f"model: writing {ckpt} (random, bf16)")
        write_checkpoint(ckpt, seed)
    else:
        say(f"model: kept {ckpt}")
    f16 = stem + "-F16.gguf"
    if not os.path.exists(f16):
        say("model: llama.cpp's convert_hf_to_gguf.py -> F16")
        run([sys.executable, "-c", CONVERT.format(src=src, ckpt=ckpt, out=f16 + ".tmp",
                                                  outtype="f16")], quiet=True)
        os.replace(f16 + ".tmp", f16)
    else:
        say(f"model: kept {f16}")
    out = {}
    for _, theirs, qtype in PAIRS:
        path = f"{stem}-{theirs}.gguf"
        if not os.path.exists(path):
            say(f"model: quantizing to {theirs} (--pure)")
            run([quantize, "--pure", f16, path + ".tmp", qtype], quiet=True)
            os.replace(path + ".tmp", path)
        else:
            say(f"model: kept {path}")
        out[theirs] = path
    return out


def make_moe_models(stem: str, ckpt: str, src: str, quantize: str, seed: int) -> dict[str, str]:
    """--model moe: Q8_0 from the converter, the checkpoint deleted, Q4_0 requantized from Q8_0
    (module docs: the bf16 checkpoint is ~8.5 GB)."""
    import shutil

    q8, q4 = f"{stem}-Q8_0.gguf", f"{stem}-Q4_0.gguf"
    if not os.path.exists(q8):
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            say(f"model: writing {ckpt} (random, bf16, ~8.5 GB)")
            write_checkpoint(ckpt, seed)
        say("model: llama.cpp's convert_hf_to_gguf.py -> Q8_0")
        run([sys.executable, "-c", CONVERT.format(src=src, ckpt=ckpt, out=q8 + ".tmp",
                                                  outtype="q8_0")], quiet=True)
        os.replace(q8 + ".tmp", q8)
        shutil.rmtree(ckpt)
    else:
        say(f"model: kept {q8}")
    if not os.path.exists(q4):
        say("model: requantizing Q8_0 to Q4_0 (--allow-requantize --pure)")
        run([quantize, "--allow-requantize", "--pure", q8, q4 + ".tmp", "Q4_0"], quiet=True)
        os.replace(q4 + ".tmp", q4)
    else:
        say(f"model: kept {q4}")
    return {"Q8_0": q8, "Q4_0": q4}


def ours(bench: str, kind: str, threads: int, pack_dir: str, lock) -> dict[str, float]:
    common = ["--shape", SHAPE_NAME, "--threads", str(threads), "--kinds", kind, "--json",
              "--pack-dir", pack_dir]
    with lock:
        full = json.loads(run([bench, "--prefill-rows", str(PREFILL_ROWS)] + common, cwd=REPO,
                              quiet=True))
    with lock:
        dec = json.loads(run([bench, "decode", "--kv", "bf16", "--ctx", "0", "--steps", "16"]
                             + common, cwd=REPO, quiet=True))
    return {"prefill": full["kinds"][kind]["prefill_tok_s"][str(PREFILL_ROWS)],
            "decode": dec["kinds"][kind]["kv"]["bf16"]["ctx"]["0"]["tok_s"]}


def theirs(llama_bench: str, model: str, threads: int, lock) -> dict[str, float]:
    common = [llama_bench, "-m", model, "-t", str(threads), "-r", "3", "-o", "json"]
    with lock:
        pp = json.loads(run(common + ["-p", str(PREFILL_ROWS), "-n", "0"], quiet=True))
    with lock:
        tg = json.loads(run(common + ["-p", "0", "-n", str(DECODE_TOKENS)], quiet=True))
    return {"prefill": next(r["avg_ts"] for r in pp if r["n_prompt"] == PREFILL_ROWS),
            "decode": next(r["avg_ts"] for r in tg if r["n_gen"] == DECODE_TOKENS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=os.path.join(REPO, "target", "llama.cpp"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per kind pair (at least 2)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pack-dir", default=os.path.join(REPO, "target", "bench"),
                    help="bench's --pack-dir (our random packs)")
    ap.add_argument("--bench", help="our bench binary (default: cargo build it)")
    ap.add_argument("--lock", help="flock this file around each timed command")
    ap.add_argument("--stop-after", choices=["build", "models"])
    ap.add_argument("--llama-build", help="use this llama.cpp build (with bin/llama-bench and "
                    "bin/llama-quantize) instead of building one into --cache")
    ap.add_argument("--llama-src", help="with --llama-build: the llama.cpp sources it was built "
                    "from (for convert_hf_to_gguf.py)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model of the same kinds of "
                    "layers, to check the conversion path in seconds (no timing)")
    ap.add_argument("--kinds", default="q4,i8")
    ap.add_argument("--model", choices=["2b", "moe"], default="2b",
                    help="Qwen3.5-2B's geometry, or a reduced Qwen3.5-35B-A3B's (module docs)")
    args = ap.parse_args()
    if args.model == "moe":
        use_moe()
    if args.rounds < 2:
        sys.exit("--rounds: at least 2 (A B A B)")
    pairs = [p for p in PAIRS if p[0] in args.kinds.split(",")]
    if not pairs:
        sys.exit(f"--kinds: none of {args.kinds!r} is q4 or i8")

    if args.llama_build:
        if not args.llama_src:
            sys.exit("--llama-build needs --llama-src")
        exes = {n: os.path.join(args.llama_build, "bin", n) for n in ["llama-bench", "llama-quantize"]}
        exes["version"] = os.path.basename(os.path.normpath(args.llama_build))
        src = args.llama_src
    else:
        exes = base.build_llama(args.cache, args.jobs)
        src = os.path.join(args.cache, f"llama_cpp_python-{exes['version']}", "vendor", "llama.cpp")
    if args.stop_after == "build":
        return
    if args.smoke:
        global SHAPE_NAME
        SHAPE_NAME = "qwen3.5-smoke"
        TEXT.update(vocab_size=1024, hidden_size=256, num_hidden_layers=4, intermediate_size=512)
    models = make_models(args.cache, src, exes["llama-quantize"], args.seed)
    if args.smoke:
        for path in models.values():
            run([exes["llama-bench"], "-m", path, "-t", str(args.threads), "-r", "1", "-p", "64",
                 "-n", "4"])
        return
    if args.stop_after == "models":
        return
    bench = args.bench
    if bench is None:
        run(["cargo", "build", "--release", "-p", "probes", "--bin", "bench"], cwd=REPO)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
        bench = os.path.join(target, "release", "bench")
    lock = base.Lock(args.lock)

    results = {}
    for kind, ttype, _ in pairs:
        rounds = []
        for r in range(args.rounds):
            say(f"{kind} vs {ttype}: round {r + 1}/{args.rounds}: ours")
            a = ours(bench, kind, args.threads, args.pack_dir, lock)
            say(f"  ours   {a}")
            say(f"{kind} vs {ttype}: round {r + 1}/{args.rounds}: llama.cpp")
            b = theirs(exes["llama-bench"], models[ttype], args.threads, lock)
            say(f"  theirs {b}")
            rounds.append({"ours": a, "theirs": b, "ratio": {k: a[k] / b[k] for k in a}})
        results[f"{kind}/{ttype}"] = rounds

    print()
    print(f"ours / llama.cpp (llama-cpp-python {exes['version']}'s llama.cpp), {SHAPE_NAME}, "
          f"{args.threads} threads; targets: prefill >= {TARGETS['prefill']}x, decode >= "
          f"{TARGETS['decode']}x")
    summary = {}
    for pair, rounds in results.items():
        summary[pair] = {}
        for case in rounds[0]["ratio"]:
            ratios = [r["ratio"][case] for r in rounds]
            med = statistics.median(ratios)
            target = TARGETS[case]
            ours_ts = statistics.median(r["ours"][case] for r in rounds)
            theirs_ts = statistics.median(r["theirs"][case] for r in rounds)
            label = f"prefill {PREFILL_ROWS}" if case == "prefill" else "decode ctx 0"
            print(f"  {pair:8} {label:14} x{med:5.2f}  (rounds {', '.join(f'{x:.2f}' for x in ratios)}; "
                  f"ours {ours_ts:.2f} tok/s, theirs {theirs_ts:.2f})  "
                  f"{'meets' if med >= target else 'misses'} {target}x")
            summary[pair][case] = {"ratio": round(med, 3), "rounds": [round(x, 3) for x in ratios],
                                   "ours_tok_s": round(ours_ts, 2),
                                   "theirs_tok_s": round(theirs_ts, 2), "target": target,
                                   "meets": med >= target}
    print(json.dumps({"llama_cpp_python": exes["version"], "shape": SHAPE_NAME,
                      "threads": args.threads, "rounds": args.rounds, "ratios": summary}))


if __name__ == "__main__":
    main()
