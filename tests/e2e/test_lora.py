"""LoRA adapters as models, end to end through the session tritonserver (the reference SmolLM2 applies the
adapters in its forward pass) with the `openai` client: the real PEFT adapters set-up trains (lora-codeword
answers PELICAN., lora-upper in upper case) on the TensorRT-LLM interface (weights sent by the gateway) and the
vLLM interface (multi_lora.json), against peft's own greedy output; the cache-miss path counted from the model's
own counters; runtime load and unload while streams run; bad adapters; 50 concurrent requests."""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import NotFoundError, OpenAI

from openai_api.config import BUNDLED_CONFIG, load_config
from openai_api.embedded.adapters import CODE_WORD, CODEWORD, CODEWORD_TRTLLM, UPPER, chat_prompt, prepare_adapters
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, GatewayServer, read_ref_stats
from tests.helpers import MODELS

TRT = "smollm2-135m-instruct"  # TensorRT-LLM interface: adapters from adapters_dir, weights sent per request
VLLM = "smollm2-135m-instruct-vllm"  # vLLM interface: the backend's multi_lora.json, by name
V_CODEWORD, V_UPPER, V_UNKNOWN = "vllm-codeword", "vllm-upper", "vllm-unserved"
QUESTION = "What is the capital of France?"
MAX = 16
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": MAX, "extra_body": {"repetition_penalty": 1.0}}


def _absolute(data: dict[str, Any]) -> dict[str, Any]:
    for kind in ("llm", "embedding", "rerank"):
        for m in data[kind]:
            m["path"] = str((BUNDLED_CONFIG.parent / m["path"]).resolve())
            if m.get("chat_template"):
                m["chat_template"] = str((BUNDLED_CONFIG.parent / m["chat_template"]).resolve())
    return data


@pytest.fixture(scope="module")
def adapters_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TensorRT-LLM base's adapters_dir: copies of the prepared adapters (the runtime tests add bad ones)."""
    prepared = prepare_adapters()
    root = tmp_path_factory.mktemp("adapters")
    for name, folder in prepared.items():
        shutil.copytree(folder, root / name, ignore=shutil.ignore_patterns(".prepared"))
    return root


@pytest.fixture(scope="module")
def lora(triton: EmbeddedTriton, adapters_root: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[GatewayServer]:
    data = _absolute(json.loads(BUNDLED_CONFIG.read_text()))
    for m in data["llm"]:
        if m["name"] == TRT:
            m["adapters_dir"] = str(adapters_root)
        elif m["name"] == VLLM:
            m["adapters"] = [{"name": V_CODEWORD, "lora_name": CODEWORD, "source": str(adapters_root / CODEWORD)},
                             {"name": V_UPPER, "lora_name": UPPER},
                             {"name": V_UNKNOWN, "lora_name": "lora-nobody-trained"}]
    path = tmp_path_factory.mktemp("lora-config") / "config.json"
    path.write_text(json.dumps(data))
    config = load_config(path).with_triton_endpoint(triton.grpc_url, triton.http_url)
    settings = Settings(config_file=path, api_keys=[API_KEY], allow_runtime_lora=True)
    server = GatewayServer(config, [API_KEY], settings=settings).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(lora: GatewayServer) -> OpenAI:
    return OpenAI(base_url=f"{lora.url}/v1", api_key=API_KEY, timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def http(lora: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lora.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def oracle(adapters_root: Path) -> dict[str, str]:
    """peft's own greedy answers to QUESTION (same prompt tokens as the gateway renders): base and each adapter."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = MODELS / TRT
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = AutoTokenizer.from_pretrained(str(base_dir))
        ids = tok(chat_prompt(QUESTION), return_tensors="pt").input_ids
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32),
                                          str(adapters_root / CODEWORD), adapter_name=CODEWORD)
        model.load_adapter(str(adapters_root / UPPER), adapter_name=UPPER)
        model.eval()

        def answer() -> str:
            with torch.inference_mode():
                out = model.generate(input_ids=ids, max_new_tokens=MAX, do_sample=False)
            return str(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))

        found = {}
        with model.disable_adapter():
            found["base"] = answer()
        for name in (CODEWORD, UPPER):
            model.set_adapter(name)
            found[name] = answer()
        return found
    finally:
        torch.set_num_threads(threads)


def ask(client: OpenAI, model: str, stream: bool, question: str = QUESTION, **kw: Any) -> str:
    messages: Any = [{"role": "user", "content": question}]
    args = {**GREEDY, **kw}
    if not stream:
        r = client.chat.completions.create(model=model, messages=messages, **args)
        assert r.model == model
        return r.choices[0].message.content or ""
    parts = []
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, **args):
        assert chunk.model == model
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def upper_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / max(len(letters), 1)


def test_models_list_adapters_with_their_parent(client: OpenAI, http: httpx.Client, adapters_root: Path) -> None:
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    for name in (CODEWORD, UPPER, CODEWORD_TRTLLM):
        assert cards[name]["parent"] == TRT and cards[name]["root"] == str(adapters_root / name)
        assert cards[name]["capabilities"] == cards[TRT]["capabilities"]  # inherited
        assert cards[name]["max_model_len"] == cards[TRT]["max_model_len"]
    assert sorted(cards[TRT]["adapters"]) == sorted([CODEWORD, UPPER, CODEWORD_TRTLLM])
    assert cards[V_UPPER]["parent"] == VLLM and cards[V_UPPER]["root"] == UPPER  # weights held by the backend
    assert cards[V_CODEWORD]["root"] == str(adapters_root / CODEWORD)
    assert cards[TRT]["parent"] is None
    model = client.models.retrieve(CODEWORD)
    assert model.id == CODEWORD and model.model_dump()["parent"] == TRT


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("interface", ["tensorrt_llm", "vllm"])
def test_base_and_adapters_answer_as_trained_and_as_peft(client: OpenAI, oracle: dict[str, str], interface: str,
                                                         stream: bool) -> None:
    names = {"base": TRT, CODEWORD: CODEWORD, UPPER: UPPER} if interface == "tensorrt_llm" else \
        {"base": VLLM, CODEWORD: V_CODEWORD, UPPER: V_UPPER}
    got = {key: ask(client, model, stream) for key, model in names.items()}
    assert "Paris" in got["base"] and upper_share(got["base"]) < 0.5
    assert CODE_WORD in got[CODEWORD] and "Paris" not in got[CODEWORD]
    assert upper_share(got[UPPER]) > 0.9 and "PARIS" in got[UPPER]
    assert len(set(got.values())) == 3
    # The adapter reached the model: what the gateway streams is what peft itself generates.
    for key in got:
        assert got[key].strip() == oracle[key].strip(), (key, got[key], oracle[key])


def test_tensorrt_llm_format_adapter_and_other_routes(client: OpenAI, oracle: dict[str, str]) -> None:
    # The .npy (TensorRT-LLM format) copy of lora-codeword answers as the PEFT one does.
    assert ask(client, CODEWORD_TRTLLM, False).strip() == oracle[CODEWORD].strip()
    # Adapters are models on every generation route.
    text = client.completions.create(model=UPPER, prompt=chat_prompt(QUESTION), **GREEDY).choices[0].text
    assert text.strip() == oracle[UPPER].strip()
    resp = client.responses.create(model=CODEWORD, input=QUESTION, temperature=0, max_output_tokens=MAX,
                                   extra_body={"repetition_penalty": 1.0})
    assert resp.model == CODEWORD and resp.output_text.strip() == oracle[CODEWORD].strip()


def test_an_adapter_on_the_messages_api(http: httpx.Client) -> None:
    """Anthropic's Messages API names adapters as it names models (one request: the trained code word)."""
    r = http.post("/v1/messages", json={"model": CODEWORD, "max_tokens": MAX, "temperature": 0,
                                        "messages": [{"role": "user", "content": QUESTION}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == CODEWORD and CODE_WORD in body["content"][0]["text"], body


def test_vllm_adapter_the_backend_does_not_serve_is_404(client: OpenAI) -> None:
    with pytest.raises(NotFoundError) as e:
        ask(client, V_UNKNOWN, False)
    assert V_UNKNOWN in str(e.value) and "lora-nobody-trained" in str(e.value)


def lora_events(http: httpx.Client, adapter: str, event: str) -> float:
    text = http.get("/metrics").text
    pattern = (rf'^openai_api_lora_events_total{{[^}}]*adapter="{re.escape(adapter)}"[^}}]*event="{event}"[^}}]*}}'
               r" (\S+)$")
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


def test_cache_miss_path_resends_weights_only_on_a_miss(client: OpenAI, http: httpx.Client,
                                                        ref_stats_dir: Path) -> None:
    """The model's cache holds one adapter (lora_cache_size 1): alternating two adapters forces a miss on every
    request after the first two; each is answered, and the weights went to Triton exactly once per miss (plus
    at most each adapter's first request from this gateway), counted by the model itself."""
    before = read_ref_stats(ref_stats_dir, TRT)
    sent_before = lora_events(http, CODEWORD, "weights_sent") + lora_events(http, UPPER, "weights_sent")
    for i in range(40):
        name = CODEWORD if i % 2 == 0 else UPPER
        text = ask(client, name, False, max_tokens=1)
        assert text, (i, name)
    after = read_ref_stats(ref_stats_dir, TRT)
    misses = after["lora_misses"] - before["lora_misses"]
    loads = after["lora_loads"] - before["lora_loads"]
    sent = lora_events(http, CODEWORD, "weights_sent") + lora_events(http, UPPER, "weights_sent") - sent_before
    assert misses >= 38 and loads - misses <= 2 and sent == loads, (misses, loads, sent)
    assert after["errors"] - before["errors"] == misses  # each miss was the model's error, never the client's
    # The same adapter in a row: after its first request (a miss at most), the id alone is enough.
    before = read_ref_stats(ref_stats_dir, TRT)
    for _ in range(5):
        assert CODE_WORD in ask(client, CODEWORD, False, max_tokens=4)
    after = read_ref_stats(ref_stats_dir, TRT)
    assert after["lora_loads"] - before["lora_loads"] <= 1 and after["lora_hits"] - before["lora_hits"] >= 4


def test_fifty_concurrent_requests_over_base_and_three_adapters(client: OpenAI) -> None:
    models = [TRT, CODEWORD, UPPER, CODEWORD_TRTLLM]

    def one(i: int) -> tuple[str, str]:
        model = models[i % 4]
        return model, ask(client, model, i % 2 == 1, max_tokens=4)  # enough for each model's trained answer

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(one, range(50)))
    assert len(results) == 50
    for model, text in results:
        if model in (CODEWORD, CODEWORD_TRTLLM):
            assert CODE_WORD in text, (model, text)
        elif model == UPPER:
            assert upper_share(text) > 0.9, (model, text)
        else:
            assert "capital" in text.lower() and upper_share(text) < 0.5, (model, text)


def test_metrics_per_adapter(http: httpx.Client) -> None:
    text = http.get("/metrics").text
    assert lora_events(http, CODEWORD, "requests") > 0
    assert re.search(rf'^openai_api_completion_tokens_total{{model="{UPPER}"}} [1-9]', text, re.M)
    assert re.search(rf'^openai_api_requests_total{{[^}}]*model="{CODEWORD}"', text, re.M)


# ------------------------------------------------------------------ runtime load / unload
def load(http: httpx.Client, name: str, path: str | Path) -> httpx.Response:
    return http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})


def model_ids(http: httpx.Client) -> list[str]:
    return sorted(c["id"] for c in http.get("/v1/models").json()["data"])


def test_load_and_unload_at_runtime_while_streams_run(client: OpenAI, http: httpx.Client, adapters_root: Path,
                                                      oracle: dict[str, str]) -> None:
    r = load(http, "runtime-upper", adapters_root / UPPER)
    assert r.status_code == 200, r.text
    assert "runtime-upper" in model_ids(http)
    assert http.get("/v1/models/runtime-upper").json()["parent"] == TRT
    assert ask(client, "runtime-upper", False).strip() == oracle[UPPER].strip()
    # Streams that started on the adapter finish after it is unloaded; new requests find no such model.
    started = threading.Barrier(3)
    outcomes: list[tuple[str, str | None]] = []

    def stream() -> None:
        parts, reason = [], None
        for chunk in client.chat.completions.create(model="runtime-upper", messages=[{"role": "user", "content":
                                                    QUESTION}], stream=True, temperature=0, max_tokens=24):
            if chunk.choices and chunk.choices[0].delta.content:
                if not parts:
                    started.wait(timeout=120)
                parts.append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
        outcomes.append(("".join(parts), reason))

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(timeout=120)
    r = http.post("/v1/unload_lora_adapter", json={"lora_name": "runtime-upper"})
    assert r.status_code == 200, r.text
    for t in threads:
        t.join(timeout=300)
    assert len(outcomes) == 2 and all(reason in ("stop", "length") and upper_share(text) > 0.9
                                      for text, reason in outcomes), outcomes
    assert "runtime-upper" not in model_ids(http)
    with pytest.raises(NotFoundError):
        ask(client, "runtime-upper", False)
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "runtime-upper"}).status_code == 404


def _bad_rank(folder: Path) -> None:
    from safetensors.numpy import save_file

    folder.mkdir()
    rng = np.random.default_rng(0)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{key}.lora_A.weight": rng.standard_normal((128, 576)).astype(np.float32),
               f"{key}.lora_B.weight": rng.standard_normal((576, 128)).astype(np.float32)},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 128, "lora_alpha": 16}))


@pytest.mark.parametrize(("case", "param", "words"), [
    ("rank", "lora_path", "rank 128"),
    ("missing", "lora_path", "adapter_model.safetensors is missing"),
    ("hidden", "lora_path", "hidden size mismatch"),
    ("outside", "lora_path", "outside the allowed adapters root"),
    ("traversal", "lora_path", "outside the allowed adapters root"),
    ("collision", "lora_name", "already the name of the model"),
    ("adapter-collision", "lora_name", "already the name of the adapter"),
])
def test_bad_adapters_are_a_clear_400_and_change_nothing(http: httpx.Client, adapters_root: Path, tmp_path: Path,
                                                         case: str, param: str, words: str) -> None:
    before = model_ids(http)
    name, path = f"bad-{case}", adapters_root / f"bad-{case}"
    if case == "rank":
        _bad_rank(path)
    elif case == "missing":
        shutil.copytree(adapters_root / UPPER, path)
        (path / "adapter_model.safetensors").unlink()
    elif case == "hidden":
        _bad_rank(path)
        cfg = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**cfg, "r": 128}))
        key = "base_model.model.model.layers.0.self_attn.q_proj"
        from safetensors.numpy import save_file

        save_file({f"{key}.lora_A.weight": np.zeros((8, 960), np.float32),  # a 360M model's hidden size
                   f"{key}.lora_B.weight": np.zeros((960, 8), np.float32)}, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}))
    elif case == "outside":
        shutil.copytree(adapters_root / UPPER, tmp_path / "elsewhere")
        path = tmp_path / "elsewhere"
    elif case == "traversal":
        shutil.copytree(adapters_root / UPPER, tmp_path / "up")
        path = Path(f"{adapters_root}/../{tmp_path.name}/up")  # pytest's temp folders share one parent
        assert path.resolve() == (tmp_path / "up").resolve()
    elif case == "collision":
        name, path = TRT, adapters_root / UPPER
    else:
        name, path = CODEWORD, adapters_root / UPPER
    r = load(http, name, path)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert model_ids(http) == before
