"""`text.json_args`: earlier calls' arguments decoded and written back exactly as the standard library does,
with what the source text gives remembered (the oracle here is `json` itself)."""

from __future__ import annotations

import json
import math

import pytest

from openai_api.text import json_args
from openai_api.text.families.family import dump, dump_object
from openai_api.text.json_args import DecodedArguments, canonical, decode, nested_deeper_than

TEXTS = [
    '{"cmd": ["ls", "-la"], "timeout": 10}',
    '{"a":1,"b":1.0,"c":true,"d":null,"e":[1e400]}',   # 1e400 is inf to json.loads
    '{"n": 123456789012345678901234567890}',          # past 64 bits: orjson refuses, json takes it
    '{"x": NaN, "y": -Infinity}',                     # not JSON, but json.loads takes it
    '{"s": "\\ud800 lone surrogate"}',                 # orjson refuses a lone surrogate
    '{"k": 1, "k": 2}',                               # duplicate keys: the last one
    '{"t": "ünïcödé → 漢字 \\u00e9", "f": 0.1, "g": -0.0}',
    '[1, 2, {"a": [3]}]',
    '"just a string"',
    "42",
    '{"tiny": 1e-400, "big": 1.5e308, "e": 1E5, "neg": -5, "int64": 9223372036854775807}',
    '{"u64": 18446744073709551615, "past": 18446744073709551616, "frac": 0.12345678901234567890}',
    ' \t{ "spaced" : [ 1 , 2 ] }\n',
]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_gives_what_json_loads_gives(text: str) -> None:
    got, want = decode(text), json.loads(text)
    assert json.dumps(got, ensure_ascii=False) == json.dumps(want, ensure_ascii=False)
    assert type(got) is (DecodedArguments if isinstance(want, dict) else type(want))
    assert canonical(got) == json.dumps(want, ensure_ascii=False)
    assert canonical(got) == canonical(decode(text))  # the remembered text, the same again


def test_nan_survives() -> None:
    v = decode('{"x": NaN}')
    assert math.isnan(v["x"])


@pytest.mark.parametrize("text", ["{", '{"a": }', "", '{"a": 1} trailing', '{"a": "\t"}', "01", "[1,]",
                                  "{'a': 1}", '{"a": 1,}', "\ufeff{}"])
def test_invalid_json_raises_as_json_loads_does(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        decode(text)


def test_deep_nesting_raises_as_json_loads_does() -> None:
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(RecursionError):
        json.loads(text)
    with pytest.raises(RecursionError):
        decode(text)


def test_decoded_arguments_are_read_only() -> None:
    v = decode('{"a": 1}')
    assert v == {"a": 1}
    for change in (lambda: v.__setitem__("a", 2), lambda: v.pop("a"), lambda: v.update(b=1), v.clear,
                   lambda: v.setdefault("c", 1), v.popitem, lambda: v.__delitem__("a")):
        with pytest.raises(TypeError):
            change()
    assert v == {"a": 1}
    assert dict(v) | {"b": 2} == {"a": 1, "b": 2}  # a copy is an ordinary dict


def test_dump_object_is_json_dumps_of_the_object() -> None:
    args = decode('{"path": "a.py", "content": "x = \\"1\\"\\n", "n": [1, 2.5, null]}')
    assert dump_object(("name", "write"), ("arguments", args)) == json.dumps(
        {"name": "write", "arguments": json.loads(args.source)}, ensure_ascii=False)
    assert dump_object(("name", "é"), ("parameters", {})) == json.dumps({"name": "é", "parameters": {}},
                                                                         ensure_ascii=False)
    assert dump(args) == json.dumps(json.loads(args.source), ensure_ascii=False)


def test_depth_verdict_is_remembered_by_source_text() -> None:
    calls: list[int] = []

    def check(value: object, depth: int) -> bool:
        calls.append(depth)
        return False

    text = '{"depth-memo-test": [[1]]}'
    assert nested_deeper_than(decode(text), 8, check) is False
    assert nested_deeper_than(decode(text), 8, check) is False
    assert calls == [8]
    assert nested_deeper_than(decode(text), 2, check) is False  # another limit: checked for it
    assert calls == [8, 2]
    assert nested_deeper_than({"plain": 1}, 8, check) is False  # no source: checked every time
    assert calls == [8, 2, 8]


def test_memo_is_bounded_in_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = json_args._Memo(max_chars=1000)
    monkeypatch.setattr(json_args, "_MEMO", memo)
    for i in range(100):
        v = decode(json.dumps({"i": i, "pad": "x" * 50}))
        assert canonical(v) == json.dumps({"i": i, "pad": "x" * 50})
    assert 0 < memo._chars <= 1000
    assert len(memo._map) < 100
