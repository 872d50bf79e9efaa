#!/usr/bin/env bash
# The whole chain on a tiny random Qwen3-VL with a trained tokenizer, as a user runs it on a real
# checkpoint: tools/tiny_chat_checkpoint.py -> packs build -> tools/hybrid_input.py --reference ->
# hybrid_prompt_probe --tokenizer. Checks the probe's greedy ids and text against transformers'
# (answer.json), the stop at <|im_end|> and its --decode control, hybrid_input.py's refusals, and
# that the committed fixture tests/fixtures/chat is what this run makes (byte for byte).
#
#   tools/test_chain.sh            run in a temporary directory (needs torch, transformers, pillow)
#   tools/test_chain.sh --update   regenerate tests/fixtures/chat
#
# CI does not run this (no Python there); probes/tests/integration/chat_cli.rs checks the committed result.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FIXTURE=tests/fixtures/chat
PROMPT="Describe these pictures."
STEPS=16

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [[ "${1:-}" == "--update" ]]; then
    OUT=$FIXTURE
    mkdir -p "$OUT"
    find "$OUT" -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
else
    OUT=$WORK/chat
fi
mkdir -p "$OUT"

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }

echo "== checkpoint"
python3 tools/tiny_chat_checkpoint.py --out "$OUT" --prompt "$PROMPT" --steps "$STEPS" 2>&1 | grep -v -i -E "warn|writing model" || true
[[ -f "$OUT/Qwen3-VL-tiny/model.safetensors" ]] || { echo "FAILED: no checkpoint"; exit 1; }

echo "== packs build"
cargo build --release -q -p packs --bin packs
cargo build --release -q -p probes --bin hybrid_prompt_probe
target/release/packs build "$OUT/Qwen3-VL-tiny" -o "$WORK/tiny-f32.pack" --quant f32 -q

echo "== tools/hybrid_input.py"
python3 tools/hybrid_input.py --model "$OUT/Qwen3-VL-tiny" --image "$OUT/picture-1.png" \
    --image "$OUT/picture-2.png" --prompt "$PROMPT" -o "$OUT/inputs.safetensors" \
    --reference "$STEPS" 2>&1 | grep -v -i -E "warn|loading weights" || true

echo "== hybrid_prompt_probe"
PROBE=(target/release/hybrid_prompt_probe "$WORK/tiny-f32.pack" "$OUT/inputs.safetensors"
       --tokenizer "$OUT/Qwen3-VL-tiny/tokenizer.json")
"${PROBE[@]}" --reference "$OUT/reference.safetensors" | tee "$WORK/compare.txt"
"${PROBE[@]}" --reference "$OUT/reference.safetensors" --json > "$WORK/compare.json" || true
"${PROBE[@]}" --json > "$WORK/answer.json" || true
"${PROBE[@]}" --decode "$STEPS" --json > "$WORK/decode.json" || true
"${PROBE[@]}" | tee "$WORK/answer.txt"

check() {  # check NAME PYTHON-EXPRESSION (a = answer.json, c / g / d = the probe's JSON runs)
    if python3 - "$OUT/answer.json" "$WORK/compare.json" "$WORK/answer.json" "$WORK/decode.json" \
        "$WORK/answer.txt" <<EOF
import json, sys
a, c, g, d = (json.load(open(p)) for p in sys.argv[1:5])
streamed = open(sys.argv[5]).read()
sys.exit(0 if ($2) else 1)
EOF
    then ok "$1"; else bad "$1"; fi
}
check "reference run passes" 'c["pass"] is True and c["first_divergence"] is None'
check "teacher-forced ids = transformers' answer (ends at <|im_end|>)" \
    'c["greedy_ids"] == a["answer"]["greedy_ids"] and a["answer"]["greedy_ids"][-1] == a["end_of_turn_id"]'
check "teacher-forced text = transformers' text" 'c["answer"]["text"] == a["answer"]["text"] and c["answer"]["stop"] == "im_end"'
check "free-running ids and text = transformers'" \
    'g["greedy_ids"] == a["answer"]["greedy_ids"] and g["answer"]["text"] == a["answer"]["text"] and g["answer"]["stop"] == "im_end"'
check "streamed text = transformers' text" '("answer: " + a["answer"]["text"] + "\n") in streamed'
check "--decode N runs past <|im_end|> (control)" \
    'd["greedy_ids"] == a["all"]["greedy_ids"] and d["answer"]["text"] == a["all"]["text"] and d["answer"]["stop"] == "steps" and len(d["greedy_ids"]) > len(g["greedy_ids"])'

echo "== hybrid_input.py refusals"
refused() {  # refused NAME EXPECTED-TEXT ARGS...
    local name=$1 want=$2
    shift 2
    local code=0
    python3 tools/hybrid_input.py "$@" -o "$WORK/x.safetensors" --prompt hi > "$WORK/err.txt" 2>&1 || code=$?
    if [[ $code == 2 ]] && grep -q -F -- "$want" "$WORK/err.txt"; then
        ok "refuses $name"
    else
        bad "refuses $name (exit $code): $(tail -3 "$WORK/err.txt")"
    fi
}
CK=$WORK/ck
cp -r "$OUT/Qwen3-VL-tiny" "$CK"
refused "a missing model directory" "$WORK/nope: no such model directory" --model "$WORK/nope" --image "$OUT/picture-1.png"
rm "$CK/model.safetensors"
refused "a missing model file" "$CK: no model.safetensors" --model "$CK" --image "$OUT/picture-1.png"
cp "$OUT/Qwen3-VL-tiny/model.safetensors" "$CK/"
mv "$CK/tokenizer.json" "$WORK/tokenizer.json"
refused "a missing tokenizer" "$CK/tokenizer.json: missing" --model "$CK" --image "$OUT/picture-1.png"
mv "$WORK/tokenizer.json" "$CK/"
echo "not a picture" > "$WORK/broken.png"
refused "an unreadable image" "$WORK/broken.png: cannot read the image" --model "$CK" --image "$WORK/broken.png"
refused "a missing image" "$WORK/none.png: no such image file" --model "$CK" --image "$WORK/none.png"
python3 - "$CK/config.json" <<'EOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["model_type"] = "qwen2_vl"
cfg["architectures"] = ["Qwen2VLForConditionalGeneration"]
json.dump(cfg, open(sys.argv[1], "w"))
EOF
refused "a checkpoint that is not Qwen3-VL" "model_type 'qwen2_vl' (Qwen2VLForConditionalGeneration): not a Qwen3-VL checkpoint" \
    --model "$CK" --image "$OUT/picture-1.png"
# Control: the same command on the untouched checkpoint is accepted.
if python3 tools/hybrid_input.py --model "$OUT/Qwen3-VL-tiny" --image "$OUT/picture-1.png" --prompt hi \
    -o "$WORK/x.safetensors" > /dev/null 2>&1; then ok "accepts the good checkpoint (control)"; else bad "control"; fi

if [[ "$OUT" != "$FIXTURE" ]]; then
    echo "== the committed fixture is this run's output"
    if diff -r "$OUT" "$FIXTURE" --exclude=README.md > "$WORK/diff.txt"; then
        ok "tests/fixtures/chat is byte-identical"
    else
        bad "tests/fixtures/chat differs from this run: $(head -5 "$WORK/diff.txt")"
    fi
fi
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
