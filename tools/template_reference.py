#!/usr/bin/env python3
"""Hub chat templates rendered by transformers, for the engine's template test.

  python3 tools/template_reference.py           # writes tests/fixtures/engine/hub-templates.json
  python3 tools/template_reference.py --check   # renders again, compares with the committed file

The templates (copied beside the output, never edited):
  qwen3-vl-instruct.chat_template.jinja  Qwen3-VL Instruct's (see tests/fixtures/engine/README.md)
  qwen3_5-hub.chat_template.jinja        Qwen3.5's, as llama.cpp keeps it in
      models/templates/Qwen3.5-4B.jinja (its scripts/get_chat_template.py reads it off the hub;
      copied from the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist)

For each template and message set (text, pictures, a system prompt, a chat whose assistant turns
carry `<think>` reasoning, assistant turns with a `reasoning_content` field, tools with an assistant's calls and the tool's results, a tool turn
last, Qwen3.5's `enable_thinking` off and on), with and without the generation prompt:
`tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False,
**kwargs)` with the template given as
`chat_template`, the tiny chat checkpoint's tokenizer (its special tokens are the variables the
template sees). A message set the template refuses (`raise_exception`) is kept with its error.

Needs transformers (5.x). CI does not run it; `cargo test -p engine` reads the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "engine")
OUT = os.path.join(OUT_DIR, "hub-templates.json")
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "chat", "Qwen3-VL-tiny")
TEMPLATES = {
    "qwen3-vl-instruct": "qwen3-vl-instruct.chat_template.jinja",
    "qwen3_5": "qwen3_5-hub.chat_template.jinja",
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
        "units": {"type": "object", "properties": {"t": {"enum": ["C", "F"]}}}},
        "required": ["city"]}}}


def user(*items) -> dict:
    if len(items) == 1 and isinstance(items[0], str):
        return {"role": "user", "content": items[0]}
    return {"role": "user", "content": [{"type": "image"} if it == "<image>" else {"type": "text", "text": it}
                                        for it in items]}


def cases() -> dict[str, dict]:
    think = "<think>\nThe user asks about colours.\n</think>\n\nRed and green."
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "units": {"t": "C"},
                                                          "metric": True, "ratio": 0.5, "hint": None, "tags": ["a", 1]}}}
    return {
        "text": dict(messages=[user("What is a pack?")]),
        "one_image": dict(messages=[user("<image>", "What is this?")]),
        "two_images": dict(messages=[user("<image>", "<image>", "Describe these pictures.")]),
        "system": dict(messages=[{"role": "system", "content": "You are terse."}, user("<image>", "Colours?")]),
        "chat": dict(messages=[user("<image>", "What is this?"), {"role": "assistant", "content": "A square."},
                               user("And the colours?"), {"role": "assistant", "content": think},
                               user("Thanks. Anything else?")]),
        "thinking_last": dict(messages=[user("Colours?"), {"role": "assistant", "content": think}]),
        "tools": dict(messages=[{"role": "system", "content": "Use tools."}, user("Weather in Paris?")],
                      tools=[WEATHER]),
        "tool_results": dict(messages=[user("Weather in Paris?"),
                                       {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
                                       {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
                                       {"role": "tool", "tool_call_id": "call_1", "content": "then rain"}],
                             tools=[WEATHER]),
        "calls_without_text": dict(messages=[user("Weather?"),
                                             {"role": "assistant", "content": "", "tool_calls": [call, call]},
                                             {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                                             user("And tomorrow?")],
                                   tools=[WEATHER]),
        # An assistant turn's reasoning as its own field (OpenAI's `reasoning_content`, which
        # xdna-vl serve passes on): Qwen3.5's template renders it after the last user turn only.
        "reasoning_field": dict(messages=[user("Colours?"),
                                          {"role": "assistant", "content": "Red.", "reasoning_content": "Look at it."},
                                          user("Weather in Paris?"),
                                          {"role": "assistant", "content": "Let me look.",
                                           "reasoning_content": "\nThe user wants the weather.\n", "tool_calls": [call]},
                                          {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
                                tools=[WEATHER]),
        "system_image_refused": dict(messages=[{"role": "system", "content": [{"type": "image"}]}, user("Hi")]),
        # Extra variables (`chat_template_kwargs`): Qwen3.5's template opens the answer with an
        # empty think block when enable_thinking is false; Qwen3-VL's ignores it.
        "thinking_off": dict(messages=[user("<image>", "What is this?")], kwargs={"enable_thinking": False}),
        "thinking_on": dict(messages=[user("What is a pack?")], kwargs={"enable_thinking": True}),
    }


def render(tokenizer, template: str, case: dict, generation: bool) -> dict:
    try:
        text = tokenizer.apply_chat_template(case["messages"], tools=case.get("tools"), chat_template=template,
                                             add_generation_prompt=generation, tokenize=False,
                                             **case.get("kwargs", {}))
        return {"text": text}
    except Exception as e:  # the template's raise_exception (jinja2's TemplateError)
        return {"error": str(e)}


def make() -> dict:
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    doc = {"transformers_version": transformers.__version__, "templates": {}}
    for name, file in TEMPLATES.items():
        with open(os.path.join(OUT_DIR, file)) as f:
            template = f.read()
        out = {}
        for case_name, case in cases().items():
            out[case_name] = dict(case, generation=render(tokenizer, template, case, True),
                                  no_generation=render(tokenizer, template, case, False))
        doc["templates"][name] = {"file": file, "cases": out}
    return doc


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = ap.parse_args(argv)
    doc = make()
    if args.check:
        with open(OUT) as f:
            same = json.load(f)["templates"] == doc["templates"]
        print(f"{OUT}: {'same' if same else 'DIFFERS'}")
        return 0 if same else 1
    with open(OUT, "w") as f:
        f.write(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    for name, t in doc["templates"].items():
        refused = [c for c, v in t["cases"].items() if "error" in v["generation"]]
        print(f"{name}: {len(t['cases'])} cases, refused by the template: {refused or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
