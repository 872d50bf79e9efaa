#!/usr/bin/env python3
"""The official OpenAI Python client against `xdna-vl serve`: pictures as data URLs, streamed and
not, /v1/models, and a wrong key refused. Needs `pip install openai`; CI does not run it (the Rust
tests in xdna-vl/tests/integration/serve.rs check the same over raw HTTP).

  cargo run --release -p xdna-vl -- serve --port 8080 --api-key k1 &
  python3 tools/openai_client_check.py --base-url http://127.0.0.1:8080/v1 --api-key k1
"""
import argparse
import base64
import os
import sys

import openai

HERE = os.path.dirname(os.path.abspath(__file__))
PICTURES = [os.path.join(HERE, "..", "tests", "fixtures", "chat", f) for f in ("picture-1.png", "picture-2.png")]


def data_url(path: str) -> str:
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--prompt", default="Describe these pictures.")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key)
    content = [{"type": "image_url", "image_url": {"url": data_url(p)}} for p in PICTURES]
    content.append({"type": "text", "text": a.prompt})
    messages = [{"role": "user", "content": content}]
    whole = client.chat.completions.create(model="x", messages=messages, temperature=0)
    text = whole.choices[0].message.content
    print(f"whole:  {text!r} ({whole.choices[0].finish_reason}, {whole.usage.prompt_tokens} prompt tokens)")
    parts, usage = [], None
    for chunk in client.chat.completions.create(model="x", messages=messages, temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    print(f"stream: {''.join(parts)!r} ({usage.completion_tokens} tokens)")
    print("models:", [m.id for m in client.models.list()])
    ok = "".join(parts) == text and usage.completion_tokens == whole.usage.completion_tokens
    if a.api_key != "none":
        try:
            openai.OpenAI(base_url=a.base_url, api_key=a.api_key + "-wrong").models.list()
            ok = False
            print("a wrong key was accepted")
        except openai.AuthenticationError:
            print("wrong key: 401")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
