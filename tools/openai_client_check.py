#!/usr/bin/env python3
"""The official OpenAI Python client against `xdna-vl serve`: pictures as data URLs, streamed and
not, /v1/models, a wrong key refused, structured output (response_format json_schema, and the
client's own `parse` into a pydantic model) and tool calls (tool_choice required and named, whole
and streamed, the calls and a tool's result sent back), `return_token_ids`, and with `--thinking`
(a thinking chat template) `reasoning_content` and `reasoning_format: none`. Needs `pip install openai`; CI does not run
it (the Rust tests in xdna-vl/tests/integration/serve.rs and structured.rs check the same over raw
HTTP).

  cargo run --release -p xdna-vl -- serve --port 8080 --api-key k1 &
  python3 tools/openai_client_check.py --base-url http://127.0.0.1:8080/v1 --api-key k1
"""
import argparse
import base64
import json
import os
import sys

import openai

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["color", "n"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "pick", "description": "Pick a color and a number.", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "count", "parameters": {
        "type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 3}},
        "required": ["k"], "additionalProperties": False}}},
]


def fits(v) -> bool:
    return isinstance(v, dict) and set(v) == {"color", "n"} and v["color"] in ("red", "green") \
        and isinstance(v["n"], int) and 1 <= v["n"] <= 9


def check_structured(client) -> bool:
    """response_format json_schema, whole and streamed: the answer parses and fits."""
    ok = True
    messages = [{"role": "user", "content": "A color and a number, as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "strict": True, "schema": SCHEMA}}
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 3}):
        whole = client.chat.completions.create(model="x", messages=messages, response_format=fmt, max_tokens=64,
                                               **sampling)
        text = whole.choices[0].message.content
        parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="x", messages=messages, response_format=fmt, max_tokens=64, stream=True, **sampling) if c.choices]
        good = fits(json.loads(text)) and "".join(parts) == text
        print(f"json_schema {sampling}: {text!r} {'ok' if good else 'BAD'}")
        ok &= good
    try:
        from typing import Literal

        from pydantic import BaseModel, Field

        class Pick(BaseModel):
            color: Literal["red", "green"]
            n: int = Field(ge=1, le=9)

        parsed = client.beta.chat.completions.parse(model="x", messages=messages, response_format=Pick,
                                                    max_tokens=64, temperature=0)
        print("parse into a pydantic model:", parsed.choices[0].message.parsed)
        ok &= parsed.choices[0].message.parsed is not None
    except (ImportError, AttributeError) as e:
        print("the client's parse helper is not there:", e)
    return ok


def check_tools(client) -> bool:
    """tool_choice required and named: fitting calls, whole and streamed; then the result back."""
    ok = True
    messages = [{"role": "user", "content": "Pick something."}]
    for choice in ("required", {"type": "function", "function": {"name": "count"}}):
        whole = client.chat.completions.create(model="x", messages=messages, tools=TOOLS, tool_choice=choice,
                                               parallel_tool_calls=False, max_tokens=200, temperature=0)
        calls = whole.choices[0].message.tool_calls or []
        good = whole.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        for c in calls:
            args = json.loads(c.function.arguments)
            good &= fits(args) if c.function.name == "pick" else (set(args) == {"k"} and 0 <= args["k"] <= 3)
        # Streamed: accumulate delta.tool_calls by index, as clients do.
        acc, finish = {}, None
        for chunk in client.chat.completions.create(model="x", messages=messages, tools=TOOLS, tool_choice=choice,
                                                    parallel_tool_calls=False, max_tokens=200, temperature=0,
                                                    stream=True):
            if not chunk.choices:
                continue
            for d in chunk.choices[0].delta.tool_calls or []:
                a = acc.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                a["id"] = d.id or a["id"]
                a["name"] += (d.function.name or "") if d.function else ""
                a["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = chunk.choices[0].finish_reason or finish
        streamed = [(a["name"], json.loads(a["arguments"])) for _, a in sorted(acc.items())]
        good &= finish == "tool_calls" and streamed == [(c.function.name, json.loads(c.function.arguments)) for c in calls]
        print(f"tool_choice {choice}: {[(c.function.name, c.function.arguments) for c in calls]} {'ok' if good else 'BAD'}")
        ok &= good
        if calls:
            followup = messages + [whole.choices[0].message.model_dump(exclude_none=True),
                                   {"role": "tool", "tool_call_id": calls[0].id, "content": "done"}]
            again = client.chat.completions.create(model="x", messages=followup, tools=TOOLS, max_tokens=16,
                                                   temperature=0)
            print(f"  with the result back: {again.choices[0].finish_reason}")
    try:
        client.chat.completions.create(model="x", messages=messages, response_format={"type": "yaml"})
        print("an unknown response_format was taken")
        ok = False
    except openai.BadRequestError as e:
        print("unknown response_format: 400", e.body.get("param") if isinstance(e.body, dict) else "")
    return ok

def extra(obj, name):
    """A response field the client does not model (pydantic keeps it as an extra)."""
    return (getattr(obj, "model_extra", None) or {}).get(name)


def check_token_ids(client) -> bool:
    """vLLM's `return_token_ids`: the answer's ids, whole and in the streamed finish chunk."""
    messages = [{"role": "user", "content": "Count to three."}]
    whole = client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                           extra_body={"return_token_ids": True})
    ids = extra(whole.choices[0], "token_ids")
    streamed = []
    for chunk in client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                                stream=True, extra_body={"return_token_ids": True}):
        if chunk.choices and extra(chunk.choices[0], "token_ids"):
            streamed += extra(chunk.choices[0], "token_ids")
    plain = client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0)
    good = isinstance(ids, list) and len(ids) == whole.usage.completion_tokens and streamed == ids \
        and extra(plain.choices[0], "token_ids") is None
    print(f"return_token_ids: {ids} (streamed {streamed}) {'ok' if good else 'BAD'}")
    return good


def check_reasoning(client) -> bool:
    """A thinking template's reasoning in `reasoning_content` (whole and streamed), inline with
    `reasoning_format: none`."""
    messages = [{"role": "user", "content": "Think, then answer: red or green?"}]
    whole = client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0)
    reasoning = extra(whole.choices[0].message, "reasoning_content")
    parts = []
    for chunk in client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0,
                                                stream=True):
        if chunk.choices and extra(chunk.choices[0].delta, "reasoning_content"):
            parts.append(extra(chunk.choices[0].delta, "reasoning_content"))
    inline = client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0,
                                            extra_body={"reasoning_format": "none"})
    good = bool(reasoning) and "".join(parts) == reasoning \
        and extra(inline.choices[0].message, "reasoning_content") is None \
        and reasoning.strip() in (inline.choices[0].message.content or "")
    print(f"reasoning_content: {reasoning!r}, content {whole.choices[0].message.content!r} {'ok' if good else 'BAD'}")
    return good


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
    ap.add_argument("--thinking", action="store_true",
                    help="the served chat template opens a <think> block (Qwen3.5's hub template): "
                         "check reasoning_content")
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
    ok &= check_structured(client)
    ok &= check_tools(client)
    ok &= check_token_ids(client)
    if a.thinking:
        ok &= check_reasoning(client)
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
