#!/usr/bin/env python3
"""`xdna-vl serve --parallel N` against llama.cpp's `llama-server --parallel N`: one random
2B-shaped Qwen3-VL checkpoint, its one tokenizer and chat template, the same threads and the same
greedy requests; A B A B; ratios.

    cargo build --release -p xdna-vl
    python3 tools/serve_compare.py --rounds 2 --threads 2 --parallel 4 --clients 1,4 \
        --requests 2 --tokens 48 --lock /work/notes/bench.lock

1. builds `llama-server` (CPU only, -march=native) from the llama.cpp that the PyPI
   `llama-cpp-python` sdist vendors, as tools/llama_cpp_compare.py builds llama-bench (same cache,
   `--cache`, default target/llama.cpp; its own build directory: the server is configured in);
2. the model is tools/llama_cpp_image_compare.py's random checkpoint (Qwen3-VL-2B's geometry,
   the tiny chat tokenizer and template; `--cache`/models/qwen3-vl-2b-vl-seed1-*, written by that
   script when missing): theirs its text converted and `llama-quantize --pure Q4_0`, ours its
   `packs build --quant q4` pack served with `--assets` the checkpoint directory. One tokenizer
   and one template (llama-server `--jinja` runs the GGUF's copy of it): every request's prompt
   has the same tokens on both sides, which is checked (`usage.prompt_tokens`);
3. for each round and each client count C: starts one server on a free loopback port, sends one
   warm-up request, lets C clients each send `--requests` chat completions of `--tokens` greedy
   tokens (llama.cpp with `ignore_eos`; ours stops only at an end-of-turn id: the tokenizer's 512
   ids among the model's 151936 make one rare on random weights), checks that every answer has
   exactly `--tokens` tokens, and measures the aggregate completion tokens per second (usage
   counts over wall time); then the other server.

Prints per round and client count ours / theirs tok/s and the ratio, and each server's aggregate
at C clients against its own at 1 client, then one JSON line. Everything runs on 127.0.0.1 and
stops by itself; each server's log is kept in `--cache`/serve-compare-{ours,theirs}.log. Needs
what llama_cpp_compare.py needs (gguf, numpy, cmake, a C++ compiler) and a built xdna-vl
(`--xdna-vl`, default $CARGO_TARGET_DIR or target/, release/xdna-vl); writing a missing
checkpoint needs what llama_cpp_image_compare.py needs.

The proof that both sides run (2026-12-07, 2-vCPU Zen 4 at load 6.8-7.9 from other benchmarks,
so not a measurement; PERF.md, "serve against llama-server"):

    python3 tools/serve_compare.py --rounds 1 --clients 1,4 --requests 1 --tokens 16 \
        --cache /work/main/target/llama.cpp --xdna-vl $CARGO_TARGET_DIR/release/xdna-vl
    round 1, 1 clients: ours 6.42 tok/s, llama-server 1.52 tok/s, x4.22 (prompts of [28] tokens, ...)
    round 1, 4 clients: ours 8.62 tok/s, llama-server 1.68 tok/s, x5.13 (prompts of [28] tokens, ...)

The measurement is the first command above, on a quiet machine.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_cpp_compare as lcc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_server(cache: str, jobs: int) -> str:
    """llama-server from the same sdist llama_cpp_compare builds llama-bench from."""
    exes = lcc.build_llama(cache, jobs)  # the sdist, the sources, llama-quantize
    version = exes["version"]
    src = os.path.join(cache, f"llama_cpp_python-{version}", "vendor", "llama.cpp")
    build = os.path.join(cache, f"build-server-{version}")
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        lcc.say("server: cmake configure (CPU only, native, the server on)")
        lcc.run([lcc.cmake_exe(), "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                 "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DGGML_VULKAN=OFF", "-DGGML_METAL=OFF",
                 "-DGGML_OPENMP=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
                 "-DBUILD_SHARED_LIBS=OFF"])
    lcc.say(f"server: building llama-server (-j {jobs}; incremental)")
    lcc.run([lcc.cmake_exe(), "--build", build, "--target", "llama-server", "-j", str(jobs)])
    path = os.path.join(build, "bin", "llama-server")
    if not os.path.exists(path):
        sys.exit(f"the build has no {path}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, path: str, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server on port {port} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"the server on port {port} was not ready in {seconds} s")


def target_dir() -> str:
    return os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))


def checkpoint_models(cache: str, seed: int) -> dict:
    """The image comparison's checkpoint directory, its Q4_0 text GGUF and our q4 pack of it."""
    stem = os.path.join(cache, "models", f"qwen3-vl-2b-vl-seed{seed}")
    out = {"ckpt": stem + "-hf", "Q4_0": stem + "-text-Q4_0.gguf",
           "pack": stem + "-q4-tower-default.pack"}
    if not all(os.path.exists(p) for p in out.values()):
        import llama_cpp_image_compare as lci  # torch and transformers, only to write them
        exes = lcc.build_llama(cache, os.cpu_count() or 2)
        made = lci.make_models(cache, exes, seed, ["default"])
        out = {"ckpt": made["ckpt"], "Q4_0": made["Q4_0"], "pack": made["pack-default"]}
    return out


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def question(client: int, request: int) -> list:
    return [{"role": "user", "content": f"Client {client} asks question {request}."}]


def load(port: int, clients: int, requests: int, tokens: int, extra: dict,
         prompt_tokens: dict) -> float:
    """C clients, each `requests` completions one after another: completion tokens/s in all.
    Every answer must have `tokens` tokens; each request's prompt tokens go to `prompt_tokens`."""
    total = [0]
    errors = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for j in range(requests):
            body = {"messages": question(i, j), "max_tokens": tokens, "temperature": 0, **extra}
            try:
                r = post(port, body)
            except Exception as e:  # counted, and the run fails below
                errors.append(repr(e))
                return
            n = r["usage"]["completion_tokens"]
            if n != tokens:
                errors.append(f"client {i} request {j}: {n} completion tokens, not {tokens} "
                              f"(finish_reason {r['choices'][0].get('finish_reason')!r})")
                return
            with lock:
                total[0] += n
                prompt_tokens[(i, j)] = r["usage"]["prompt_tokens"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        sys.exit(f"{len(errors)} requests failed: {errors[:3]}")
    return total[0] / dt


def serve(cmd: list, log: str, clients: int, args, extra: dict, prompt_tokens: dict,
          lock: "lcc.Lock") -> float:
    """Starts the server `cmd` (its port after `--port`), warms it up with one short request,
    then times the clients' load (under the benchmark lock) and stops it."""
    port = int(cmd[cmd.index("--port") + 1])
    lcc.say("$ " + " ".join(cmd))
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, proc, "/health")
        post(port, {"messages": question(-1, 0), "max_tokens": 2, "temperature": 0, **extra})
        with lock:
            return load(port, clients, args.requests, args.tokens, extra, prompt_tokens)
    except SystemExit:
        with open(log) as f:
            tail = f.read()[-2000:]
        print(f"--- the end of {log}:\n{tail}", file=sys.stderr)
        raise
    finally:
        proc.terminate()
        proc.wait()


def run_ours(xdna_vl: str, pack: str, parallel: int, clients: int, args, prompt_tokens: dict,
             lock) -> float:
    cmd = [xdna_vl, "serve", pack, "--assets", args.assets, "--host", "127.0.0.1",
           "--port", str(free_port()), "--threads", str(args.threads), "--parallel", str(parallel),
           "--ctx", str(args.ctx), "--kv", "bf16", "--max-tokens", str(args.tokens)]
    log = os.path.join(args.cache, "serve-compare-ours.log")
    return serve(cmd, log, clients, args, {}, prompt_tokens, lock)


def run_theirs(server: str, model: str, parallel: int, clients: int, args, prompt_tokens: dict,
               lock) -> float:
    # -c is the whole KV budget, shared by the slots: --ctx tokens per slot, as ours; --jinja
    # renders the chat template the GGUF carries (the checkpoint's, as ours).
    cmd = [server, "-m", model, "--host", "127.0.0.1", "--port", str(free_port()),
           "-t", str(args.threads), "--parallel", str(parallel), "-c", str(args.ctx * parallel),
           "-ctk", "f16", "-ctv", "f16", "--jinja", "--no-webui"]
    log = os.path.join(args.cache, "serve-compare-theirs.log")
    return serve(cmd, log, clients, args, {"ignore_eos": True}, prompt_tokens, lock)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=4, help="both servers' parallel sequences")
    p.add_argument("--clients", default="1,4", help="client counts, comma separated")
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--tokens", type=int, default=48, help="completion tokens per request")
    p.add_argument("--ctx", type=int, default=512, help="context per sequence")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cache", default=os.path.join(ROOT, "target/llama.cpp"))
    p.add_argument("--pack", help="our pack (default: the checkpoint's q4 pack in --cache)")
    p.add_argument("--gguf", help="their GGUF (default: the checkpoint's Q4_0 text in --cache)")
    p.add_argument("--assets",
                   help="the checkpoint directory with tokenizer.json and the chat template "
                        "(default: the one --pack and --gguf were made from)")
    p.add_argument("--xdna-vl", default=os.path.join(target_dir(), "release", "xdna-vl"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--lock", help="an flock file held around each timed load (a shared machine)")
    args = p.parse_args()
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    if not clients or min(clients) < 1:
        sys.exit("--clients: give positive client counts, e.g. 1,4")
    for name in ["rounds", "requests", "tokens", "parallel", "threads"]:
        if getattr(args, name) < 1:
            sys.exit(f"--{name} {getattr(args, name)}: must be at least 1")
    if args.ctx < args.tokens + 32:
        sys.exit(f"--ctx {args.ctx}: a request's prompt and --tokens {args.tokens} must fit; "
                 f"give at least {args.tokens + 32}")
    if not os.path.exists(args.xdna_vl):
        sys.exit(f"--xdna-vl {args.xdna_vl}: no such file; build it first "
                 "(cargo build --release -p xdna-vl)")
    server = build_server(args.cache, args.jobs)
    if not (args.pack and args.gguf and args.assets):
        models = checkpoint_models(args.cache, args.seed)
        args.pack = args.pack or models["pack"]
        args.gguf = args.gguf or models["Q4_0"]
        args.assets = args.assets or models["ckpt"]
    for flag, path in [("--pack", args.pack), ("--gguf", args.gguf),
                       ("--assets", os.path.join(args.assets, "tokenizer.json"))]:
        if not os.path.exists(path):
            sys.exit(f"{flag}: {path} does not exist")
    lock = lcc.Lock(args.lock)
    results = {"ours": {}, "theirs": {}}
    for r in range(args.rounds):
        for c in clients:
            ours_prompts, theirs_prompts = {}, {}
            a = run_ours(args.xdna_vl, args.pack, args.parallel, c, args, ours_prompts, lock)
            b = run_theirs(server, args.gguf, args.parallel, c, args, theirs_prompts, lock)
            if ours_prompts != theirs_prompts:
                sys.exit(f"the prompts' tokens differ (request: ours, theirs): "
                         f"{[(k, ours_prompts.get(k), theirs_prompts.get(k)) for k in sorted(ours_prompts)]}")
            results["ours"].setdefault(c, []).append(a)
            results["theirs"].setdefault(c, []).append(b)
            print(f"round {r + 1}, {c} clients: ours {a:.2f} tok/s, llama-server {b:.2f} tok/s, "
                  f"x{a / b:.2f} (prompts of {sorted(set(ours_prompts.values()))} tokens, "
                  f"{args.tokens} completion tokens each)", flush=True)
    one = min(clients)
    for who in ["ours", "theirs"]:
        for c in clients:
            runs = results[who][c]
            vs = [x / y for x, y in zip(runs, results[who][one])]
            print(f"{who}: {c} clients {', '.join(f'{x:.2f}' for x in runs)} tok/s; "
                  f"x{', x'.join(f'{v:.2f}' for v in vs)} its {one}-client aggregate")
    print(json.dumps({"clients": clients, "parallel": args.parallel, "threads": args.threads,
                      "tokens": args.tokens, "requests": args.requests, "pack": args.pack,
                      "gguf": args.gguf, "ours": results["ours"],
                      "theirs": results["theirs"]}))


if __name__ == "__main__":
    main()
