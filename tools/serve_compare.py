#!/usr/bin/env python3
"""`xdna-vl serve --parallel N` against llama.cpp's `llama-server --parallel N` on the same
random 2B-shaped text model, the same threads and the same greedy requests; A B A B; ratios.

    python3 tools/serve_compare.py --assets ~/models/Qwen3-VL-2B-Instruct --rounds 2 --threads 2 \
        --parallel 4 --clients 1,4

1. builds `llama-server` (CPU only, -march=native) from the llama.cpp that the PyPI
   `llama-cpp-python` sdist vendors, as tools/llama_cpp_compare.py builds llama-bench (same cache,
   its own build directory: the server is configured in);
2. writes the random Qwen3-VL-2B text model as GGUF and quantizes it to Q4_0 (llama_cpp_compare's
   model; kept between runs), and ours is `bench`'s random q4 pack of the same shapes
   (`target/bench/qwen3-vl-2b-q4-seed1.pack`, made by `bench --shape qwen3-vl-2b --kinds q4` or
   `bench streams`), served with the tokenizer and chat template of a real Qwen3-VL checkpoint
   (`--assets DIR`: a hub download's directory; the random pack carries no tokenizer, and the
   bundled tiny tokenizer's image id (510) is not the 2B's (151655), which the engine refuses);
3. for each round and each client count C: starts one server on a free loopback port, lets C
   clients each send `--requests` chat completions of `--tokens` greedy tokens (llama.cpp with
   `ignore_eos`; ours stops only at an end-of-turn id, rare on random weights), and measures
   the aggregate completion tokens per second (usage counts over wall time); then the other.

Prints per round and client count ours / theirs tok/s and the ratio, and each server's aggregate
at C clients against its own at 1 client. Everything runs on 127.0.0.1 and stops by itself.
Needs what llama_cpp_compare.py needs (gguf, numpy, cmake, a C++ compiler) and a built
`target/release/xdna-vl`.
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


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def load(port: int, clients: int, requests: int, tokens: int, extra: dict) -> float:
    """C clients, each `requests` completions one after another: completion tokens/s in all."""
    total = [0]
    errors = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for j in range(requests):
            body = {"messages": [{"role": "user", "content": f"Client {i} asks question {j}."}],
                    "max_tokens": tokens, "temperature": 0, **extra}
            try:
                n = post(port, body)["usage"]["completion_tokens"]
            except Exception as e:  # counted, and the run fails below
                errors.append(repr(e))
                return
            with lock:
                total[0] += n

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


def run_ours(xdna_vl: str, pack: str, threads: int, parallel: int, clients: int, args) -> float:
    port = free_port()
    cmd = [xdna_vl, "serve", pack, "--assets", args.assets,
           "--port", str(port), "--threads", str(threads), "--parallel", str(parallel),
           "--ctx", str(args.ctx), "--kv", "bf16", "--max-tokens", str(args.tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc, "/health")
        return load(port, clients, args.requests, args.tokens, {})
    finally:
        proc.terminate()
        proc.wait()


def run_theirs(server: str, model: str, threads: int, parallel: int, clients: int, args) -> float:
    port = free_port()
    # -c is the whole KV budget, shared by the slots: --ctx tokens per slot, as ours.
    cmd = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "--parallel", str(parallel), "-c", str(args.ctx * parallel), "-ctk", "f16", "-ctv", "f16",
           "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc, "/health")
        return load(port, clients, args.requests, args.tokens, {"ignore_eos": True})
    finally:
        proc.terminate()
        proc.wait()


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
    p.add_argument("--pack", default=os.path.join(ROOT, "target/bench/qwen3-vl-2b-q4-seed1.pack"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--assets", required=True,
                   help="a Qwen3-VL checkpoint directory with tokenizer.json and the chat template")
    args = p.parse_args()
    if not os.path.exists(os.path.join(args.assets, "tokenizer.json")):
        sys.exit(f"--assets {args.assets}: no tokenizer.json there; give a Qwen3-VL checkpoint "
                 "directory (e.g. a download of Qwen/Qwen3-VL-2B-Instruct)")
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    if not clients or min(clients) < 1:
        sys.exit("--clients: give positive client counts, e.g. 1,4")
    if not os.path.exists(args.pack):
        sys.exit(f"{args.pack}: no such pack; make it with "
                 "`cargo run --release -p probes --bin bench -- streams --shape qwen3-vl-2b --kinds q4`")
    xdna_vl = os.path.join(ROOT, "target/release/xdna-vl")
    if not os.path.exists(xdna_vl):
        sys.exit(f"{xdna_vl}: build it first (cargo build --release -p xdna-vl)")
    server = build_server(args.cache, args.jobs)
    exes = lcc.build_llama(args.cache, args.jobs)
    model = lcc.make_models(args.cache, exes["llama-quantize"], args.seed)["Q4_0"]
    results = {"ours": {}, "theirs": {}}
    for r in range(args.rounds):
        for c in clients:
            a = run_ours(xdna_vl, args.pack, args.threads, args.parallel, c, args)
            b = run_theirs(server, model, args.threads, args.parallel, c, args)
            results["ours"].setdefault(c, []).append(a)
            results["theirs"].setdefault(c, []).append(b)
            print(f"round {r + 1}, {c} clients: ours {a:.2f} tok/s, llama-server {b:.2f} tok/s, "
                  f"x{a / b:.2f}", flush=True)
    one = min(clients)
    for who in ["ours", "theirs"]:
        for c in clients:
            runs = results[who][c]
            vs = [x / y for x, y in zip(runs, results[who][one])]
            print(f"{who}: {c} clients {', '.join(f'{x:.2f}' for x in runs)} tok/s; "
                  f"x{', x'.join(f'{v:.2f}' for v in vs)} its {one}-client aggregate")
    print(json.dumps({"clients": clients, "parallel": args.parallel, "threads": args.threads,
                      "tokens": args.tokens, "ours": results["ours"],
                      "theirs": results["theirs"]}))


if __name__ == "__main__":
    main()
