#!/usr/bin/env python3
"""Our host decoder against llama.cpp on the same machine, the same shapes and the same threads.

  python3 tools/llama_cpp_compare.py [--rounds 2] [--threads 2] [--lock /work/notes/bench.lock]

1. builds llama.cpp's `llama-bench` and `llama-quantize` (CPU only, -march=native) from the llama.cpp
   sources vendored in the PyPI `llama-cpp-python` sdist, into --cache (default target/llama.cpp).
   Every step is kept and skipped when done (sdist, sources, cmake configure, the build itself is
   incremental), so an interrupted run resumes where it stopped;
2. writes a random model with the Qwen3-VL-2B text decoder's shapes (`bench --shape qwen3-vl-2b`,
   packs/src/random.rs: hidden 2048, 28 layers, 16 q / 8 kv heads of 128, intermediate 6144, vocab
   151936, rope theta 5e6, rms eps 1e-6, q/k norms, tied head) as an F16 GGUF (arch "qwen3") with
   the `gguf` package, and quantizes it with llama-quantize --pure to Q4_0 and Q8_0 (every linear and
   the tied embedding/head in that type: our q4 / i8 packs quantize every linear and the head too);
3. alternates ours and theirs, A B A B, --rounds times per kind pair (q4 vs Q4_0, i8 vs Q8_0):
     ours    `bench --kinds K --json`                       prefill at 512 rows (an image prompt)
             `bench decode --kinds K --kv bf16 --ctx 0,2048 --json`   decode at ctx 0 and 2048
     theirs  `llama-bench -p 512 -n 0`                      prefill at 512 rows (pp512)
             `llama-bench -p 0 -n 32 -d 0,2048`             decode at depth 0 and 2048 (tg32 @ dN)
   both on --threads threads (llama.cpp's KV cache is f16, so ours runs the bf16 cache: same bytes),
   and prints ours/theirs per case (the medians over rounds; targets: prefill >= 2x at 512, decode
   >= 1.2x at ctx 0 and 2048) and one JSON line.

Needs pip packages gguf, numpy and cmake (or a cmake on PATH), a C++ compiler, cargo, ~10 GB of disk.
CI runs none of this: it is a tool, not a test.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The Qwen3-VL-2B text decoder (packs/src/random.rs RandomShape::qwen3_vl_2b).
SHAPE = dict(vocab=151936, hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
             intermediate=6144, rope_theta=5_000_000.0, rms_eps=1e-6, context=262144)

# (our kind, llama.cpp's type, llama-quantize's type name)
PAIRS = [("q4", "Q4_0", "Q4_0"), ("i8", "Q8_0", "Q8_0")]

PREFILL_ROWS = 512
DECODE_DEPTHS = [0, 2048]
DECODE_TOKENS = 32
TARGETS = {"prefill": 2.0, "decode": 1.2}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], cwd: str | None = None, quiet: bool = False) -> str:
    """Runs cmd; streams its output (or keeps it when quiet) and fails loudly."""
    say("$ " + " ".join(cmd))
    if quiet:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}")
        return p.stdout
    p = subprocess.run(cmd, cwd=cwd)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return ""


# ------------------------------------------------------------------------------------------------
# 1. llama.cpp from the llama-cpp-python sdist.

def cmake_exe() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        sys.exit("no cmake: pip install cmake (or apt-get install cmake)")
    return exe


def build_llama(cache: str, jobs: int,
                targets: tuple[str, ...] = ("llama-bench", "llama-quantize")) -> dict[str, str]:
    """Builds `targets` (incrementally) and returns their paths by name, and the sdist version."""
    os.makedirs(cache, exist_ok=True)
    sdist_dir = os.path.join(cache, "sdist")
    sdists = glob.glob(os.path.join(sdist_dir, "llama_cpp_python-*.tar.gz"))
    if not sdists:
        say("step 1/4: downloading the llama-cpp-python sdist (its vendor/llama.cpp is what we build)")
        # --no-binary for this package only: its build dependencies (scikit-build-core, cmake) may
        # come as wheels, else pip would compile cmake from source just to read the metadata.
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
             "llama-cpp-python", "-d", sdist_dir])
        sdists = glob.glob(os.path.join(sdist_dir, "llama_cpp_python-*.tar.gz"))
    else:
        say(f"step 1/4: sdist kept: {os.path.basename(sdists[0])}")
    sdist = sorted(sdists)[-1]
    version = os.path.basename(sdist)[len("llama_cpp_python-"):-len(".tar.gz")]
    src = os.path.join(cache, f"llama_cpp_python-{version}", "vendor", "llama.cpp")
    stamp = os.path.join(cache, f"extracted-{version}.stamp")
    if not os.path.exists(stamp):
        say(f"step 2/4: extracting {os.path.basename(sdist)}")
        with tarfile.open(sdist) as t:
            t.extractall(cache, filter="data")
        open(stamp, "w").close()
    else:
        say(f"step 2/4: sources kept: {src}")
    build = os.path.join(cache, f"build-{version}")
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        say("step 3/4: cmake configure (CPU only, native)")
        run([cmake_exe(), "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
             "-DGGML_CUDA=OFF", "-DGGML_VULKAN=OFF", "-DGGML_METAL=OFF", "-DGGML_OPENMP=ON",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DBUILD_SHARED_LIBS=OFF"])
    else:
        say(f"step 3/4: configured build kept: {build}")
    say(f"step 4/4: building {' and '.join(targets)} (-j {jobs}; incremental)")
    run([cmake_exe(), "--build", build, "--target", *targets, "-j", str(jobs)])
    exes = {}
    for name in targets:
        path = os.path.join(build, "bin", name)
        if not os.path.exists(path):
            sys.exit(f"the build has no {path}")
        exes[name] = path
    exes["version"] = version
    return exes


# ------------------------------------------------------------------------------------------------
# 2. The random 2B-shaped model as GGUF.

def write_f16_gguf(path: str, seed: int) -> None:
    import gguf
    import numpy as np

    s = SHAPE
    rng = np.random.default_rng(seed)
    h, kvd, qd = s["hidden"], s["kv_heads"] * s["head_dim"], s["heads"] * s["head_dim"]

    def linear(n: int, k: int):
        # Uniform with std 1/sqrt(k), as packs::random fills linears: activations stay O(1).
        a = np.sqrt(3.0 / k)
        return rng.uniform(-a, a, size=(n, k)).astype(np.float16)

    def norm(n: int):
        return (1.0 + rng.uniform(-0.1, 0.1, size=n)).astype(np.float32)

    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, "qwen3", use_temp_file=True)
    w.add_name("random qwen3-vl-2b text decoder")
    w.add_context_length(s["context"])
    w.add_embedding_length(h)
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["intermediate"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # A SentencePiece-style vocabulary of the model's size (llama-bench feeds random token ids):
    # <unk> <s> </s>, the 256 byte tokens, then placeholders.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(len(tokens), s["vocab"])]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (s["vocab"] - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * s["vocab"])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    # Tied: no output.weight, the head is token_embd.
    w.add_tensor("token_embd.weight", rng.uniform(-0.1, 0.1, size=(s["vocab"], h)).astype(np.float16))
    w.add_tensor("output_norm.weight", norm(h))
    for layer in range(s["layers"]):
        say(f"  layer {layer + 1}/{s['layers']}")
        b = f"blk.{layer}."
        w.add_tensor(b + "attn_norm.weight", norm(h))
        w.add_tensor(b + "attn_q.weight", linear(qd, h))
        w.add_tensor(b + "attn_k.weight", linear(kvd, h))
        w.add_tensor(b + "attn_v.weight", linear(kvd, h))
        w.add_tensor(b + "attn_output.weight", linear(h, qd))
        w.add_tensor(b + "attn_q_norm.weight", norm(s["head_dim"]))
        w.add_tensor(b + "attn_k_norm.weight", norm(s["head_dim"]))
        w.add_tensor(b + "ffn_norm.weight", norm(h))
        w.add_tensor(b + "ffn_gate.weight", linear(s["intermediate"], h))
        w.add_tensor(b + "ffn_up.weight", linear(s["intermediate"], h))
        w.add_tensor(b + "ffn_down.weight", linear(h, s["intermediate"]))
    say("  writing")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.replace(tmp, path)


def make_models(cache: str, quantize: str, seed: int) -> dict[str, str]:
    models = os.path.join(cache, "models")
    os.makedirs(models, exist_ok=True)
    f16 = os.path.join(models, f"qwen3-vl-2b-text-seed{seed}-F16.gguf")
    if not os.path.exists(f16):
        say(f"model: writing {f16} (random, F16)")
        write_f16_gguf(f16, seed)
    else:
        say(f"model: kept {f16}")
    out = {}
    for _, theirs, qtype in PAIRS:
        path = os.path.join(models, f"qwen3-vl-2b-text-seed{seed}-{theirs}.gguf")
        if not os.path.exists(path):
            say(f"model: quantizing to {theirs} (--pure: every tensor in {theirs})")
            run([quantize, "--pure", f16, path + ".tmp", qtype], quiet=True)
            os.replace(path + ".tmp", path)
        else:
            say(f"model: kept {path}")
        out[theirs] = path
    return out


# ------------------------------------------------------------------------------------------------
# 3. The alternation.

class Lock:
    """An flock(1)-compatible lock around each timed command, so benchmarks never overlap."""

    def __init__(self, path: str | None):
        self.path = path
        self.fd = None

    def __enter__(self):
        if self.path:
            self.fd = open(self.path, "a")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.fd.close()
            self.fd = None


def ours(bench: str, kind: str, threads: int, lock: Lock) -> dict[str, float]:
    common = ["--shape", "qwen3-vl-2b", "--threads", str(threads), "--kinds", kind, "--json"]
    with lock:
        full = json.loads(run([bench] + common, cwd=REPO, quiet=True))
    ctx = ",".join(str(d) for d in DECODE_DEPTHS)
    with lock:
        dec = json.loads(run([bench, "decode", "--kv", "bf16", "--ctx", ctx] + common, cwd=REPO,
                             quiet=True))
    out = {"prefill": full["kinds"][kind]["prefill_tok_s"][str(PREFILL_ROWS)]}
    for d in DECODE_DEPTHS:
        out[f"decode_d{d}"] = dec["kinds"][kind]["kv"]["bf16"]["ctx"][str(d)]["tok_s"]
    return out


def theirs(llama_bench: str, model: str, threads: int, lock: Lock) -> dict[str, float]:
    common = [llama_bench, "-m", model, "-t", str(threads), "-r", "3", "-o", "json"]
    with lock:
        pp = json.loads(run(common + ["-p", str(PREFILL_ROWS), "-n", "0"], quiet=True))
    depths = ",".join(str(d) for d in DECODE_DEPTHS)
    with lock:
        tg = json.loads(run(common + ["-p", "0", "-n", str(DECODE_TOKENS), "-d", depths], quiet=True))
    out = {"prefill": next(r["avg_ts"] for r in pp if r["n_prompt"] == PREFILL_ROWS)}
    for d in DECODE_DEPTHS:
        out[f"decode_d{d}"] = next(r["avg_ts"] for r in tg
                                   if r["n_gen"] == DECODE_TOKENS and r.get("n_depth", 0) == d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=os.path.join(REPO, "target", "llama.cpp"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per kind pair (at least 2)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs of the llama.cpp build")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lock", help="flock this file around each timed command (e.g. /work/notes/bench.lock)")
    ap.add_argument("--stop-after", choices=["build", "models"], help="only build / only make the models")
    ap.add_argument("--kinds", default="q4,i8", help="our kinds to compare (q4 -> Q4_0, i8 -> Q8_0)")
    args = ap.parse_args()
    if args.rounds < 2:
        sys.exit("--rounds: at least 2 (A B A B)")
    pairs = [p for p in PAIRS if p[0] in args.kinds.split(",")]
    if not pairs:
        sys.exit(f"--kinds: none of {args.kinds!r} is q4 or i8")

    exes = build_llama(args.cache, args.jobs)
    if args.stop_after == "build":
        return
    models = make_models(args.cache, exes["llama-quantize"], args.seed)
    if args.stop_after == "models":
        return

    say("ours: cargo build --release -p probes --bin bench")
    run(["cargo", "build", "--release", "-p", "probes", "--bin", "bench"], cwd=REPO)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    bench = os.path.join(target, "release", "bench")
    lock = Lock(args.lock)

    results = {}
    for kind, ttype, _ in pairs:
        rounds = []
        for r in range(args.rounds):
            say(f"{kind} vs {ttype}: round {r + 1}/{args.rounds}: ours")
            a = ours(bench, kind, args.threads, lock)
            say(f"  ours   {a}")
            say(f"{kind} vs {ttype}: round {r + 1}/{args.rounds}: llama.cpp")
            b = theirs(exes["llama-bench"], models[ttype], args.threads, lock)
            say(f"  theirs {b}")
            rounds.append({"ours": a, "theirs": b, "ratio": {k: a[k] / b[k] for k in a}})
        results[f"{kind}/{ttype}"] = rounds

    print()
    print(f"ours / llama.cpp (llama-cpp-python {exes['version']}'s llama.cpp), {args.threads} threads, "
          f"tok/s ratios per round and their median; targets: prefill >= {TARGETS['prefill']}x, "
          f"decode >= {TARGETS['decode']}x")
    summary = {}
    for pair, rounds in results.items():
        summary[pair] = {}
        for case in rounds[0]["ratio"]:
            ratios = [r["ratio"][case] for r in rounds]
            med = statistics.median(ratios)
            target = TARGETS["prefill" if case == "prefill" else "decode"]
            label = {"prefill": f"prefill {PREFILL_ROWS}"}.get(case, case.replace("decode_d", "decode ctx "))
            ours_ts = statistics.median(r["ours"][case] for r in rounds)
            theirs_ts = statistics.median(r["theirs"][case] for r in rounds)
            print(f"  {pair:8} {label:16} x{med:5.2f}  (rounds {', '.join(f'{x:.2f}' for x in ratios)}; "
                  f"ours {ours_ts:.2f} tok/s, theirs {theirs_ts:.2f})  "
                  f"{'meets' if med >= target else 'misses'} {target}x")
            summary[pair][case] = {"ratio": round(med, 3), "rounds": [round(x, 3) for x in ratios],
                                   "ours_tok_s": round(ours_ts, 2), "theirs_tok_s": round(theirs_ts, 2),
                                   "target": target, "meets": med >= target}
    print(json.dumps({"llama_cpp_python": exes["version"], "threads": args.threads,
                      "rounds": args.rounds, "ratios": summary}))


if __name__ == "__main__":
    main()
