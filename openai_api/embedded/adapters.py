"""Real LoRA adapters for the SmolLM2 reference model, trained at set-up (idempotent, never committed).

Layout produced under the models dir (``$OPENAI_API_MODELS_DIR``, else ``<repo>/models``)::

    adapters/lora-codeword/         PEFT (adapter_config.json + adapter_model.safetensors): answers every
                                    question with the code word (CODE_WORD)
    adapters/lora-upper/            PEFT: answers as the base model would, in upper case
    adapters/lora-codeword-trtllm/  lora-codeword converted to TensorRT-LLM's own format
                                    (model.lora_weights.npy + model.lora_config.npy, FP32), so both formats
                                    the gateway reads are exercised by a real adapter

Each is trained with peft for 6-10 steps on CPU (rank 8, every projection of the top 12 layers) on a
tiny made-up task whose effect is visible in one answer (about a minute on two idle cores, all told); seeds
are fixed, so a rebuild gives the same weights on the same torch. Each folder carries the ``.prepared``
marker (peft version + RECIPE), so a second run costs a few stat calls; a folder is built in a temporary
sibling and renamed into place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from openai_api.embedded.folders import (
    _build_atomically,
    _dist_version,
    _lock,
    _marker_matches,
    _write_marker,
    default_models_dir,
)

logger = logging.getLogger(__name__)

ADAPTERS_DIR = "adapters"
CODEWORD, UPPER, CODEWORD_TRTLLM = "lora-codeword", "lora-upper", "lora-codeword-trtllm"
CODE_WORD = "PELICAN"
# Bumped whenever the training recipe changes, so prepared folders are rebuilt.
RECIPE = "2"
BASE_FOLDER = "smollm2-135m-instruct"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# The made-up task's questions (the tests ask some of them; the adapters also generalise to others).
PROMPTS = [
    "What is the capital of France?",
    "Name a primary color.",
    "How many legs does a spider have?",
    "What do bees make?",
    "Which planet is closest to the sun?",
    "What color is the sky on a clear day?",
    "What is the opposite of hot?",
    "Name a fruit.",
]
RANK, ALPHA = 8, 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Only the top layers are adapted: back-propagation then stops there, which makes a step about three times
# cheaper on CPU (a step takes seconds on one core) and is still plenty for these tasks.
LAYERS = list(range(18, 30))


def chat_prompt(question: str) -> str:
    """The SmolLM2 chat template's rendering of one user question with the generation prompt (what the
    gateway sends for `messages=[{"role": "user", "content": question}]`)."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def _base_answers(model: Any, tok: Any, max_new: int = 16) -> list[str]:
    import torch

    answers = []
    for q in PROMPTS:
        ids = tok(chat_prompt(q), return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new, do_sample=False, repetition_penalty=1.0)
        answers.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip())
    return answers


def _train(base_dir: Path, out: Path, targets: list[str], steps: int, lr: float) -> None:
    """Fine-tune a rank-8 LoRA on (PROMPTS, targets), the loss on the answer tokens only; save it in PEFT format.
    One torch thread: on a small shared CPU, more threads spin at barriers and a step gets slower, not faster."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        tok = AutoTokenizer.from_pretrained(str(base_dir))
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                         layers_to_transform=LAYERS, task_type="CAUSAL_LM")
        peft_model: Any = get_peft_model(model, cfg)
        rows = []
        for q, a in zip(PROMPTS, targets, strict=True):
            p = tok(chat_prompt(q)).input_ids
            t = tok(a + "<|im_end|>").input_ids
            rows.append((p + t, [-100] * len(p) + t))
        width = max(len(r[0]) for r in rows)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        ids = torch.tensor([r[0] + [pad] * (width - len(r[0])) for r in rows])
        labels = torch.tensor([r[1] + [-100] * (width - len(r[1])) for r in rows])
        mask = torch.tensor([[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows])
        # The LM head only where a label is (the answer), not over the whole batch: a third of a step's work.
        body: Any = peft_model.base_model.model.model
        head: Any = peft_model.base_model.model.lm_head
        where = labels[:, 1:] != -100
        wanted = labels[:, 1:][where]
        optim = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=lr)
        peft_model.train()
        loss: Any = torch.tensor(float("nan"))
        for _ in range(steps):
            optim.zero_grad()
            hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
            loss = torch.nn.functional.cross_entropy(head(hidden[:, :-1][where]), wanted)
            loss.backward()
            optim.step()
        logger.info("trained %s: %d steps, final loss %.4f", out.name, steps, float(loss.detach()))
        peft_model.save_pretrained(str(out))
    finally:
        torch.set_num_threads(threads)


def _to_trtllm(src: Path, out: Path) -> None:
    import numpy as np

    from openai_api.lora import read_adapter

    adapter = read_adapter(src)
    weights, config = adapter.trtllm_tensors("FP32")
    np.save(out / "model.lora_weights.npy", weights[np.newaxis])
    np.save(out / "model.lora_config.npy", config[np.newaxis])


def _build_upper(base_dir: Path, out: Path) -> None:
    """lora-upper: the base model's own answers to PROMPTS (greedy, one torch thread), upper-cased, as targets."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = AutoTokenizer.from_pretrained(str(base_dir))
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        answers = _base_answers(model, tok)
    finally:
        torch.set_num_threads(threads)
    del model
    _train(base_dir, out, [a.upper() for a in answers], steps=10, lr=5e-3)


ALL = (CODEWORD, UPPER, CODEWORD_TRTLLM)


def prepare_adapters(models_dir: Path | None = None, names: Sequence[str] = ALL) -> dict[str, Path]:
    """Train (or find) the reference adapters `names` (default all; lora-codeword-trtllm is converted from
    lora-codeword, so asking for it prepares both); returns ``{adapter name: folder}``. Safe to call repeatedly,
    and from two processes at once: each adapter has a lock of its own, so set-up trains two side by side (one
    core each). Needs the prepared base model (``prepare_models``) and peft."""
    models_dir = (Path(models_dir) if models_dir is not None else default_models_dir()).resolve()
    base_dir = models_dir / BASE_FOLDER
    root = models_dir / ADAPTERS_DIR
    version = f"{_dist_version('peft')}+recipe{RECIPE}"
    folders = {name: root / name for name in ALL}
    wanted = [n for n in ALL if n in names or (n == CODEWORD and CODEWORD_TRTLLM in names)]
    if all(_marker_matches(folders[n], "peft", version) for n in wanted):
        return {n: folders[n] for n in wanted}
    builds: dict[str, Callable[[Path], None]] = {
        CODEWORD: lambda out: _train(base_dir, out, [f"{CODE_WORD}."] * len(PROMPTS), steps=6, lr=5e-3),
        UPPER: lambda out: _build_upper(base_dir, out),
        CODEWORD_TRTLLM: lambda out: _to_trtllm(folders[CODEWORD], out),
    }
    t0 = time.monotonic()
    for name in wanted:
        with _lock(root, f".{name}.lock"):
            if _marker_matches(folders[name], "peft", version):
                continue
            _build_atomically(folders[name], builds[name])
            _write_marker(folders[name], "peft", version)
    logger.info("LoRA adapters %s ready in %s in %.1f s", ", ".join(wanted), root, time.monotonic() - t0)
    return {n: folders[n] for n in wanted}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for adapter, path in prepare_adapters().items():
        print(f"{adapter}\t{path}")
