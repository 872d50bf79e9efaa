#!/usr/bin/env python3
"""The official Ollama Python client against `xdna-vl serve`'s Ollama routes: list, show, chat and
generate (pictures as the client sends them, streamed and not, each streamed answer equal to the
whole one), a refused field and a wrong model as ResponseError, and a wrong key refused. Needs
`pip install ollama` (checked with 0.6.3); CI does not run it (server/tests/ollama.rs checks the
same shapes over raw HTTP).

  cargo run --release -p xdna-vl -- serve --port 18434 --api-key k1 &
  python3 tools/ollama_client_check.py --host http://127.0.0.1:18434 --api-key k1
"""
import argparse
import json
import os
import sys

import ollama

HERE = os.path.dirname(os.path.abspath(__file__))
PICTURES = [os.path.join(HERE, "..", "tests", "fixtures", "chat", f) for f in ("picture-1.png", "picture-2.png")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="http://127.0.0.1:18434")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--prompt", default="Describe these pictures.")
    a = ap.parse_args()
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else None
    client = ollama.Client(host=a.host, headers=headers)
    ok = True

    def check(what: str, cond: bool) -> None:
        nonlocal ok
        ok &= cond
        print(f"{'ok  ' if cond else 'FAIL'} {what}")

    listed = client.list()
    model = listed.models[0].model
    print(f"list:   {[(m.model, m.size, m.details.family, str(m.modified_at)) for m in listed.models]}")
    shown = client.show(model)
    print(f"show:   capabilities {shown.capabilities}, model_info {shown.modelinfo}")
    check("list names one model, show says it takes images", len(listed.models) == 1 and "vision" in (shown.capabilities or []))

    options = {"temperature": 0, "num_predict": 24}
    messages = [{"role": "user", "content": a.prompt, "images": PICTURES}]
    whole = client.chat(model=model, messages=messages, options=options)
    print(f"chat:   {whole.message.content!r} ({whole.done_reason}, prompt {whole.prompt_eval_count} tokens "
          f"in {whole.prompt_eval_duration} ns, answer {whole.eval_count} in {whole.eval_duration} ns, "
          f"total {whole.total_duration} ns)")
    parts, last = [], None
    for chunk in client.chat(model=model, messages=messages, options=options, stream=True):
        parts.append(chunk.message.content or "")
        last = chunk
    print(f"stream: {''.join(parts)!r} ({len(parts)} objects, last done={last.done} {last.done_reason})")
    check("chat streamed equals chat whole", "".join(parts) == whole.message.content
          and last.done and last.eval_count == whole.eval_count)

    gen = client.generate(model=model, prompt=a.prompt, images=PICTURES, options=options)
    print(f"generate: {gen.response!r} ({gen.done_reason}, {gen.eval_count} tokens)")
    gparts, glast = [], None
    for chunk in client.generate(model=model, prompt=a.prompt, images=PICTURES, options=options, stream=True):
        gparts.append(chunk.response or "")
        glast = chunk
    print(f"generate stream: {''.join(gparts)!r} ({len(gparts)} objects)")
    check("generate streamed equals generate whole, and equals chat", "".join(gparts) == gen.response == whole.message.content
          and glast.done and glast.eval_count == gen.eval_count)

    js = client.chat(model=model, messages=messages, format="json", options=options)
    print(f"format='json': {js.message.content!r}")
    try:
        json.loads(js.message.content)
        check("format='json' answers JSON (constrained decoding)", True)
    except ValueError:
        check("format='json' answers JSON (constrained decoding)", js.done_reason == "length")

    for what, call, status in [
        ("a think level refused by name", lambda: client.generate(model=model, prompt="x", think="high"), 400),
        ("a model this server does not serve", lambda: client.chat(model="llama3.2", messages=messages), 404),
    ]:
        try:
            call()
            check(what, False)
        except ollama.ResponseError as e:
            print(f"        {e}")
            check(what, e.status_code == status)
    if a.api_key:
        try:
            ollama.Client(host=a.host, headers={"Authorization": "Bearer wrong"}).list()
            check("a wrong key is refused", False)
        except ollama.ResponseError as e:
            check(f"a wrong key is refused ({e.status_code}: {e.error[:40]}...)", e.status_code == 401)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
