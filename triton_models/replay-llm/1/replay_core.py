"""What both replay models share: finding the scenario, the family's tokenizer and the recorded ids.

A replay request names its scenario in the prompt with a marker ``replay:<family>/<case>`` (the last
one in the prompt wins, so an earlier turn quoting another marker does not matter).  The recorded
completion is ``cases[name == <case>].completion`` in ``<corpus dir>/<family>.json``
(``tests/data/families/corpus/`` in the repository); it is tokenized with the family's own
``<families dir>/<family>/tokenizer.json`` with special-token text read as control tokens (what the
real model emits: ``<tool_call>`` is one id on Qwen, ``[TOOL_CALLS]`` one id on Mistral), and those
ids are what the model streams.

Where things are (config parameters first, then the environment, then the repository layout):

* families: parameter ``families_dir``, else ``$OPENAI_API_MODELS_DIR/families`` when that folder
  exists, else ``<repo>/models/families``;
* corpus: parameter ``corpus_dir``, else ``$OPENAI_API_REPLAY_CORPUS``, else
  ``<repo>/tests/data/families/corpus``.

A prompt that arrives as token ids (the TensorRT-LLM interface) carries no family: it is decoded with
every family's tokenizer until one of them shows a marker naming that same family (two families that
share a vocabulary, hermes and qwen3_xml, both decode it; the marker says which is meant).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

MARKER = re.compile(r"replay:([a-z0-9_]+)/([A-Za-z0-9_.\-]+)")
REPO = Path(__file__).resolve().parents[3]


class ReplayError(ValueError):
    """A request the replay model cannot serve; the message goes back to the client verbatim."""


@dataclass(frozen=True)
class Scenario:
    family: str
    case: str
    ids: tuple[int, ...]  # the recorded completion's token ids, in the family's vocabulary
    eos_ids: frozenset[int]  # the family's end-of-sequence ids (generation_config / tokenizer_config)


def _dirs(params: dict[str, Any]) -> tuple[Path, Path]:
    def param(key: str) -> str:
        return str(params.get(key, {}).get("string_value", "") or "")

    families = param("families_dir")
    if not families:
        env = os.environ.get("OPENAI_API_MODELS_DIR")
        families = str(Path(env) / "families") if env and (Path(env) / "families").is_dir() else ""
    corpus = param("corpus_dir") or os.environ.get("OPENAI_API_REPLAY_CORPUS", "")
    return (Path(families) if families else REPO / "models" / "families",
            Path(corpus) if corpus else REPO / "tests" / "data" / "families" / "corpus")


class ReplayLibrary:
    """Tokenizers (loaded on first use) and scenarios (re-read when a corpus file changes)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.families_dir, self.corpus_dir = _dirs(params)
        self._lock = threading.Lock()
        self._tokenizers: dict[str, Tokenizer] = {}
        self._corpus: dict[str, tuple[float, dict[str, Any]]] = {}
        self._scripts: dict[tuple[str, str, float], Scenario] = {}

    # ------------------------------------------------------------------ tokenizers
    def families(self) -> list[str]:
        """The families with a tokenizer folder, sorted (the order ids are decoded in)."""
        if not self.families_dir.is_dir():
            return []
        return sorted(p.name for p in self.families_dir.iterdir() if (p / "tokenizer.json").is_file())

    def tokenizer(self, family: str) -> Tokenizer:
        with self._lock:
            tok = self._tokenizers.get(family)
            if tok is None:
                path = self.families_dir / family / "tokenizer.json"
                if not path.is_file():
                    raise ReplayError(f"replay: no tokenizer for family {family!r} (looked for {path})")
                tok = Tokenizer.from_file(str(path))
                self._tokenizers[family] = tok
            return tok

    def eos_ids(self, family: str) -> frozenset[int]:
        """End ids as the family's configs name them (generation_config.json, else tokenizer_config.json)."""
        folder = self.families_dir / family
        ids: set[int] = set()
        try:
            gen = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
            eos = gen.get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
        except (OSError, ValueError):
            pass
        if not ids:
            try:
                cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
                eos = cfg.get("eos_token")
                text = eos.get("content") if isinstance(eos, dict) else eos
                if isinstance(text, str):
                    tid = self.tokenizer(family).token_to_id(text)
                    if tid is not None:
                        ids.add(tid)
            except (OSError, ValueError):
                pass
        return frozenset(int(i) for i in ids)

    # ------------------------------------------------------------------ markers
    @staticmethod
    def marker_in_text(text: str) -> tuple[str, str]:
        found = MARKER.findall(text)
        if not found:
            raise ReplayError("replay: the prompt names no scenario (put 'replay:<family>/<case>' in it)")
        family, case = found[-1]
        return family, case

    def tokenizer_family(self, family: str) -> str:
        """The folder whose tokenizer a family uses: its corpus file's ``tokenizer_family`` (pythonic
        models use Llama 3's), else the family itself."""
        try:
            named = self._corpus_file(family)[1].get("tokenizer_family")
        except (ReplayError, ValueError):
            return family
        return str(named) if named else family

    def marker_in_ids(self, ids: list[int]) -> tuple[str, str]:
        """Decode the prompt with each family's tokenizer until one shows a marker for a family that
        uses that very tokenizer."""
        available = self.families()
        for folder in available:
            tok = self.tokenizer(folder)
            try:
                text = tok.decode(ids, skip_special_tokens=False)
            except Exception:  # noqa: BLE001 - ids outside this vocabulary: not this family
                continue
            found = MARKER.findall(text)
            if found and self.tokenizer_family(found[-1][0]) == folder:
                return found[-1][0], found[-1][1]
        raise ReplayError(f"replay: no family tokenizer ({', '.join(available) or 'none found in '}"
                          f"{'' if available else str(self.families_dir)}) decodes the prompt to a "
                          "'replay:<family>/<case>' marker")

    # ------------------------------------------------------------------ scenarios
    def _corpus_file(self, family: str) -> tuple[float, dict[str, Any]]:
        path = self.corpus_dir / f"{family}.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            raise ReplayError(f"replay: no corpus for family {family!r} (looked for {path})") from None
        with self._lock:
            cached = self._corpus.get(family)
            if cached is not None and cached[0] == mtime:
                return cached
        data = json.loads(path.read_text(encoding="utf-8"))
        with self._lock:
            self._corpus[family] = (mtime, data)
        return mtime, data

    def scenario(self, family: str, case: str) -> Scenario:
        mtime, data = self._corpus_file(family)
        key = (family, case, mtime)
        with self._lock:
            hit = self._scripts.get(key)
        if hit is not None:
            return hit
        cases = {c.get("name"): c for c in data.get("cases", [])}
        entry = cases.get(case)
        if entry is None:
            raise ReplayError(f"replay: family {family!r} has no case {case!r} "
                              f"(cases: {', '.join(sorted(str(n) for n in cases))})")
        tok = self.tokenizer(self.tokenizer_family(family))
        # add_special_tokens=False: no BOS; special-token text in the completion still becomes its id.
        ids = tuple(tok.encode(str(entry["completion"]), add_special_tokens=False).ids)
        scenario = Scenario(family, case, ids, self.eos_ids(self.tokenizer_family(family)))
        with self._lock:
            self._scripts[key] = scenario
        return scenario


def serve_jobs(incoming: deque[Any], wake: threading.Event, stopping: threading.Event,
               step: Callable[[Any], bool], fail: Callable[[Any, str, str], None]) -> None:
    """Both models' worker loop: take new jobs, `step` each ready one in turn (True: finished), and on
    shutdown `fail` every job left. A job whose step raises fails alone; the others go on."""
    ready: deque[Any] = deque()
    while not stopping.is_set():
        wake.clear()
        while incoming:
            ready.append(incoming.popleft())
        if not ready:
            wake.wait(0.5)
            continue
        for _ in range(len(ready)):
            job = ready.popleft()
            try:
                done = step(job)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
                fail(job, f"replay failed: {type(exc).__name__}: {exc}", "INTERNAL")
                continue
            if not done:
                ready.append(job)
    for job in list(ready) + list(incoming):
        fail(job, "model is shutting down", "UNAVAILABLE")
