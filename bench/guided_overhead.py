"""What guided decoding costs the SmolLM2 reference model on this CPU, measured outside Triton with the
same code the model runs (``triton_models/smollm2-135m-instruct/1/smollm2_guide.py``) and the same
weights, one torch thread:

* compile time of a typical schema: first compile (a fresh schema) against a cache hit;
* per generated token: the guide's work (bitmask fill + apply + accept + the finished check) against
  an unguided decode step (forward pass + sampling), both on the same sampled sequences.

Run: ``.venv/bin/python -m bench.guided_overhead [--tokens 200] [--runs 5]``; prints a small table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "triton_models" / "smollm2-135m-instruct" / "1"))
from smollm2_guide import GuideCompiler, GuideSpec, trtllm_guide  # noqa: E402

WEIGHTS = REPO / "models" / "smollm2-135m-instruct"
# A typical response_format / tool-call schema: enums, bounded integers, a nested object, an array.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "mood", "address", "tags"],
}
# A typical tool's parameters: no length bounds (bounded strings such as maxLength compile slower).
TOOL = {
    "type": "object",
    "properties": {
        "location": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "hourly": {"type": "boolean"},
    },
    "required": ["location", "unit"],
}
PROMPTS = ["Describe a person.", "What is the capital of France?", "Write a haiku about rain."]


def fresh_schema(schema: dict[str, object], i: int) -> str:
    return json.dumps({**schema, "title": f"Schema{i}"})  # a new text is a cache miss


def compile_times(compiler: GuideCompiler, schema: dict[str, object], runs: int) -> tuple[list[float], list[float]]:
    first, cached = [], []
    for i in range(runs):
        spec = trtllm_guide("json_schema", fresh_schema(schema, i))
        assert spec is not None
        _, s, hit = compiler.compile(spec)
        assert not hit
        first.append(s)
        _, s, hit = compiler.compile(spec)
        assert hit
        cached.append(s)
    return first, cached


@torch.inference_mode()  # as in the engine, which samples inside inference mode
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=120, help="max tokens per guided run")
    ap.add_argument("--runs", type=int, default=5, help="compile samples")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(WEIGHTS), dtype=torch.float32).eval()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(WEIGHTS / "tokenizer.json"))
    t0 = time.perf_counter()
    compiler = GuideCompiler(WEIGHTS, int(model.config.vocab_size), [2])
    compiler.ready()
    ready_s = time.perf_counter() - t0

    times = {
        "tool schema (no length bounds)": compile_times(compiler, TOOL, args.runs),
        "person schema (maxLength 24, pattern, nested, array)": compile_times(compiler, SCHEMA, args.runs),
    }

    spec = GuideSpec("json_schema", json.dumps(SCHEMA), "bench")
    guide_us, fwd_ms, sample_us, tokens = [], [], [], 0
    gen = torch.Generator().manual_seed(0)
    for q in PROMPTS:
        state = compiler.start(spec)
        ids = tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
        cache, pending = None, ids
        for _ in range(args.tokens):
            t = time.perf_counter()
            out = model(input_ids=torch.tensor([pending]), past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[0, -1].float()
            t1 = time.perf_counter()
            g0 = state.seconds
            state.mask(logits, [2])
            t2 = time.perf_counter()
            probs = torch.softmax(logits / 0.8, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=gen))
            t3 = time.perf_counter()
            if token == 2:
                break
            state.accept(token)
            fwd_ms.append((t1 - t) * 1e3)
            sample_us.append((t3 - t2) * 1e6)
            guide_us.append((state.seconds - g0) * 1e6)
            tokens += 1
            pending = [token]
            if state.finished:
                break

    med = statistics.median
    step_ms = med(fwd_ms) + med(sample_us) / 1e3
    print(
        f"xgrammar {compiler.version}; torch {torch.__version__}, 1 thread; {tokens} guided tokens "
        f"over {len(PROMPTS)} prompts (person schema, temperature 0.8)"
    )
    print(f"compiler set-up (tokenizer index, once per model): {ready_s * 1e3:.0f} ms")
    for name, (first, cached) in times.items():
        print(
            f"compile {name}: first median {med(first) * 1e3:.2f} ms (min {min(first) * 1e3:.2f}, "
            f"max {max(first) * 1e3:.2f}); cached median {med(cached) * 1e6:.1f} us"
        )
    print(f"unguided decode step (forward + sampling): median {step_ms:.1f} ms")
    print(
        f"guide per token (fill + apply + accept + finished check): median {med(guide_us):.0f} us, "
        f"p90 {sorted(guide_us)[int(len(guide_us) * 0.9)]:.0f} us = {med(guide_us) / 1e3 / step_ms * 100:.2f}% "
        "of a step"
    )


if __name__ == "__main__":
    main()
