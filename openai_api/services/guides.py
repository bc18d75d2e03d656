"""What a chat or completion request asks its output to match, as one `Guide` for the model's backend.

Sources, at most one per request (two is a 400):

* `response_format`: `{"type": "json_schema", "json_schema": {"schema": ..., "strict": ...}}`, or
  `{"type": "json_object"}` (any JSON object); `{"type": "text"}` is no guide.
* vLLM's extension fields: `guided_json` (a schema, object or JSON text), `guided_regex`,
  `guided_choice` (a list of strings), `guided_grammar` (EBNF), or `structured_outputs` (an object with
  one of `json`, `regex`, `choice`, `grammar`, `json_object`). A regex, a grammar and a choice list (as
  JSON) are at most `MAX_GUIDE_CHARS` characters (`services.bounds`): a 400 `guide_too_large` past it.
* a forced tool call (`tool_choice` a named function, or `required`): `services.tools` builds it.

A JSON schema is checked before any model sees it: it must be valid JSON Schema (draft 2020-12), and it
must not use what the grammar engines behind Triton's guided decoding (xgrammar, as TensorRT-LLM and
vLLM use it) cannot enforce while generating: `not`, `if`/`then`/`else`, `dependentRequired`,
`dependentSchemas`, `uniqueItems`, `allOf` of more than one schema, `multipleOf` on non-integers, a
`$ref` outside the schema, look-arounds or back-references in a `pattern`, `minItems` without `items`,
`minProperties` that only undeclared properties could meet, lower and upper bounds that leave no value
of the schema's type, integer bounds with a fraction or past 64 bits. Each is a 400 naming the schema
path, never an output that does not validate. `oneOf` is enforced as `anyOf` (exclusivity is not
checked), as the engines do.

Every guide holding a client schema writes its `$ref`s in one form every engine follows, hoisted into the
guide's root `$defs` (`schema_refs`), so they keep their meaning also inside a forced call's wrapper. What
the backend still cannot compile comes back from Triton as an error; `backend_refusal` makes it the
client's 400 (`unsupported_schema`) with the backend's reason, naming the tool and the schema path the
guide's `origins` say it came from.

A schema the gateway cannot check is a 400 too, before anything walks it (`services.bounds`): nested
past `MAX_JSON_DEPTH` levels, more than `MAX_SCHEMA_VALUES` values, a `$ref` that points to nothing in
the schema, more than `MAX_REF_HOPS` references in a row, or a loop of references that never produces a
value (`a` -> `b` -> `a`: no output could ever match it). Validity is checked with jsonschema-rs (the
draft named by `$schema`, 2020-12 when it names none or one it does not bundle: nothing is fetched),
which checks a 5,000-property schema in milliseconds where the pure-Python checker took seconds on the
event loop; `pattern` and `patternProperties` must be regular expressions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import jsonschema_rs

from openai_api.errors import BackendError, InvalidRequestError
from openai_api.services.bounds import (
    MAX_GUIDE_CHARS,
    MAX_JSON_DEPTH,
    MAX_OPTIONAL_PROPERTIES,
    MAX_REF_HOPS,
    check_schema_bounds,
)
from openai_api.services.schema_refs import (
    DEFINITIONS,
    MANY_SCHEMAS,
    NAMED_SCHEMAS,
    ONE_SCHEMA,
    CheckedSchema,
    RootDefs,
    pointer_path,
)
from openai_api.triton.errors import guide_refusal
from openai_api.triton.llm import Guide, GuideKind, GuideOrigin, LLMBackend

# keyword -> why it cannot be enforced while generating
_UNENFORCEABLE = {
    "not": "a negation",
    "if": "a conditional", "then": "a conditional", "else": "a conditional",
    "dependentRequired": "a dependency between properties",
    "dependentSchemas": "a dependency between properties",
    "uniqueItems": "uniqueness across array items",
}
# Look-arounds and back-references: regular-language engines cannot follow them.
_IRREGULAR = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]|\\k<")
# Lower and upper bounds by the type they bound; bounds that leave no value of that type are refused (xgrammar
# refuses to compile them: "minLength 5 is greater than maxLength 1", "Invalid range: empty range").
_SIZE_BOUNDS = (("string", "minLength", "maxLength"), ("array", "minItems", "maxItems"),
                ("object", "minProperties", "maxProperties"))
_LOWS = (("minimum", False), ("exclusiveMinimum", True))
_HIGHS = (("maximum", False), ("exclusiveMaximum", True))
# The integers guided decoding enforces bounds within (xgrammar 0.2.8: "Integer exceeds maximum limit due to
# precision loss at 64-bit boundary" past them).
_INT64 = (-(2**63), 2**63 - 1)
# The meta-schemas jsonschema-rs bundles. Any other `$schema` would make it fetch that URL, so the schema
# is checked as 2020-12 instead (what the Python checker did with a `$schema` it did not know).
_DRAFTS = frozenset(f"{scheme}://json-schema.org/{path}{end}" for scheme in ("http", "https") for end in ("", "#")
                    for path in ("draft-04/schema", "draft-06/schema", "draft-07/schema", "draft/2019-09/schema",
                                 "draft/2020-12/schema"))
# Keywords whose value is one schema, a list of schemas or a name -> schema map (walked for refs and checks).
_ONE = ONE_SCHEMA + MANY_SCHEMAS
_NAMED = NAMED_SCHEMAS + DEFINITIONS


def _path(parts: Iterator[Any] | list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _refuse(param: str, where: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"'{param}{where}' {why}.", param=f"{param}{where}", code="unsupported_schema")


def check_schema(schema: Any, param: str) -> CheckedSchema:
    """400 (naming `param` and the path inside the schema) unless `schema` is valid JSON Schema whose every
    part can be enforced while generating, within the gateway's bounds (see the module docstring); the
    schema with its references resolved, for the guide that places it (`schema_refs.RootDefs`)."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"'{param}' must be a JSON schema object.", param=param, code="invalid_schema")
    check_schema_bounds(schema, param)  # first: everything below walks the schema
    _check_valid(schema, param)
    found = _Found()
    _walk(schema, param, "", found)
    if found.optional > MAX_OPTIONAL_PROPERTIES:
        raise InvalidRequestError(
            f"'{param}' lets {found.optional:,} properties be left out (not in `required`); the limit for a schema "
            f"is {MAX_OPTIONAL_PROPERTIES:,}, because guided decoding compiles optional properties in time that "
            "grows steeply with their number. List them in `required`, or split the schema.", param=param,
            code="schema_too_large")
    return CheckedSchema(schema, param, _check_refs(schema, param, found))


def _check_valid(schema: dict[str, Any], param: str) -> None:
    draft = schema.get("$schema")
    if isinstance(draft, str) and draft not in _DRAFTS:
        schema = {k: v for k, v in schema.items() if k != "$schema"}
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as e:
        where = _path(list(e.instance_path))
        raise InvalidRequestError(f"'{param}{where}' is not valid JSON Schema: {e.message}", param=f"{param}{where}",
                                  code="invalid_schema") from None
    except (jsonschema_rs.ReferencingError, ValueError, OverflowError) as e:  # a number it cannot hold, say
        raise InvalidRequestError(f"'{param}' cannot be checked as JSON Schema: {e}", param=param,
                                  code="invalid_schema") from None


@dataclass(slots=True)
class _Found:
    """What `_walk` collects for `_check_refs`: each `$ref` (its path, the schema holding it) and `$anchor`."""

    refs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    anchors: dict[str, Any] = field(default_factory=dict)
    optional: int = 0  # properties not in their object's `required`, all objects together


def _walk(node: Any, param: str, where: str, found: _Found) -> None:
    # Recursive, but never deeper than the schema (bounded by `MAX_JSON_DEPTH` before this runs).
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, param, f"{where}[{i}]", found)
        return
    if not isinstance(node, dict):
        return
    for key, why in _UNENFORCEABLE.items():
        if key in node:
            raise _refuse(param, f"{where}.{key}", f"uses {why}, which guided decoding cannot enforce")
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        raise _refuse(param, f"{where}.$ref", "points outside the schema; only local references (#/...) are "
                                              "supported")
    if isinstance(ref, str):
        found.refs.append((f"{where}.$ref", node))
    if isinstance(node.get("$anchor"), str):
        found.anchors.setdefault(node["$anchor"], node)
    props = node.get("properties")
    if isinstance(props, dict):
        required = node.get("required")
        found.optional += len(props.keys() - set(required if isinstance(required, list) else ()))
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        raise _refuse(param, f"{where}.allOf", "combines several schemas, which guided decoding cannot enforce; "
                                               "merge them into one")
    multiple = node.get("multipleOf")
    if multiple is not None and not (isinstance(multiple, int) and node.get("type") == "integer"):
        raise _refuse(param, f"{where}.multipleOf", "can only be enforced on integers with an integer divisor")
    _check_bounds(node, param, where)
    pattern = node.get("pattern")
    if isinstance(pattern, str) and _IRREGULAR.search(pattern):
        raise _refuse(param, f"{where}.pattern", "uses a look-around or back-reference, which guided decoding "
                                                 "cannot enforce")
    for key, regex in [("pattern", pattern), *((f"patternProperties.{k}", k) for k in
                                               (node.get("patternProperties") or {}))]:
        if isinstance(regex, str) and not _compiles(regex):
            raise InvalidRequestError(f"'{param}{where}.{key}' is not a valid regular expression.",
                                      param=f"{param}{where}.{key}", code="invalid_schema")
    if isinstance(node.get("minItems"), int) and node["minItems"] > 0 and "items" not in node \
            and "prefixItems" not in node:
        raise _refuse(param, f"{where}.minItems", "needs `items` to say what the items are")
    min_props = node.get("minProperties")
    if isinstance(min_props, int) and "additionalProperties" not in node \
            and min_props > len(node.get("properties") or {}):
        raise _refuse(param, f"{where}.minProperties", "asks for more properties than the schema declares")
    for key, value in node.items():
        if key in _NAMED and isinstance(value, dict):
            for name, sub in value.items():
                _walk(sub, param, f"{where}.{key}.{name}", found)
        elif key in _ONE:
            _walk(value, param, f"{where}.{key}", found)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_bounds(node: dict[str, Any], param: str, where: str) -> None:
    """Bounds of a typed schema that no value of its type meets, and integer bounds guided decoding cannot
    enforce (fractional, or past 64 bits): each a 400 naming the bound."""
    kind = node.get("type")
    kinds = {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)} if isinstance(kind, list) \
        else set()
    for typ, low, high in _SIZE_BOUNDS:
        lo, hi = node.get(low), node.get(high)
        if typ in kinds and isinstance(lo, int | float) and isinstance(hi, int | float) and lo > hi:
            raise _refuse(param, f"{where}.{low}", f"is greater than `{high}` ({lo} > {hi}), so no {typ} matches "
                                                   "the schema")
    if not kinds & {"integer", "number"}:
        return
    integer = "number" not in kinds
    lows = [(k, node[k], ex) for k, ex in _LOWS if _number(node.get(k))]
    highs = [(k, node[k], ex) for k, ex in _HIGHS if _number(node.get(k))]
    if integer:
        for key, value, _ in lows + highs:
            if not _INT64[0] <= value <= _INT64[1]:
                raise _refuse(param, f"{where}.{key}", "is outside the 64-bit range in which guided decoding "
                                                       "enforces integer bounds")
            if isinstance(value, float) and not value.is_integer():
                raise _refuse(param, f"{where}.{key}", "bounds an integer with a fraction, which guided decoding "
                                                       "cannot enforce; write a whole number")
    for key, lo, lo_ex in lows:
        for other, hi, hi_ex in highs:
            if integer:
                empty = lo + lo_ex > hi - hi_ex  # whole bounds: exclusive ones move by one
            else:
                empty = lo > hi or (lo == hi and (lo_ex or hi_ex))
            if empty:
                raise _refuse(param, f"{where}.{key}", f"and `{other}` leave no {'integer' if integer else 'number'} "
                                                       "that matches the schema")


def _compiles(regex: str) -> bool:
    try:
        re.compile(regex)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def _resolve(root: dict[str, Any], ref: str, anchors: dict[str, Any]) -> Any:
    """The part of `root` a local `$ref` names (`#`, `#/json/pointer`, `#anchor`), or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return anchors.get(unquote(ref[1:]))
    node: Any = root
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _check_refs(root: dict[str, Any], param: str, found: _Found) -> dict[int, tuple[str, Any]]:
    """Every `$ref` names a schema inside `root`; no chain of references (a `$ref`, or an `allOf` of one
    schema, applies its target at the same place of the output) is longer than `MAX_REF_HOPS` or loops.
    Returns each schema object holding a `$ref` (by `id`) -> its `$ref` and the schema it names."""
    target: dict[int, Any] = {}
    refs: dict[int, tuple[str, Any]] = {}
    for where, node in found.refs:
        resolved = _resolve(root, node["$ref"], found.anchors)
        if not isinstance(resolved, dict | bool):
            raise _refuse(param, where, "points to nothing in the schema" if resolved is None else
                          "does not point to a schema")
        target[id(node)] = resolved
        refs[id(node)] = (node["$ref"], resolved)

    def same_place(node: Any) -> list[Any]:
        """The schemas `node` applies at its own place in the output."""
        if not isinstance(node, dict):
            return []
        out = [target[id(node)]] if id(node) in target else []
        all_of = node.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1:
            out.append(all_of[0])
        return out

    longest: dict[int, int] = {}  # schema -> the longest chain from it, once walked
    for where, start in found.refs:
        if id(start) in longest:
            continue
        # Iterative depth-first walk: (schema, its successors not yet visited, the longest chain below it).
        stack: list[tuple[Any, Iterator[Any], list[int]]] = [(start, iter(same_place(start)), [0])]
        on_path = {id(start)}
        while stack:
            node, successors, best = stack[-1]
            nxt = next(successors, None)
            if nxt is None:
                stack.pop()
                on_path.discard(id(node))
                longest[id(node)] = best[0]
                if stack:
                    stack[-1][2][0] = max(stack[-1][2][0], best[0] + 1)
                continue
            if id(nxt) in on_path:
                raise _refuse(param, where, "is part of a loop of references that never produces a value, so no "
                                            "output could match it")
            if id(nxt) in longest:
                best[0] = max(best[0], longest[id(nxt)] + 1)
                continue
            if len(stack) > MAX_REF_HOPS:
                raise _refuse(param, where, f"starts a chain of more than {MAX_REF_HOPS} references in a row, the "
                                            "limit for a schema")
            on_path.add(id(nxt))
            stack.append((nxt, iter(same_place(nxt)), [0]))
        if longest[id(start)] > MAX_REF_HOPS:
            raise _refuse(param, where, f"starts a chain of more than {MAX_REF_HOPS} references in a row, the "
                                        "limit for a schema")
    return refs


def schema_guide(schema: Any, param: str) -> Guide:
    """A checked JSON schema as a guide (a schema given as JSON text is parsed first)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise InvalidRequestError(f"'{param}' is not valid JSON.", param=param, code="invalid_schema") from None
        except RecursionError:  # nested past what Python's parser follows: far past MAX_JSON_DEPTH
            raise InvalidRequestError(f"'{param}' is nested too deeply to check: past the limit of "
                                      f"{MAX_JSON_DEPTH} levels of JSON nesting in a schema.", param=param,
                                      code="schema_too_deep") from None
    defs = RootDefs()
    placed = defs.root(defs.place(check_schema(schema, param), "#"))
    return Guide("json_schema", json.dumps(placed, ensure_ascii=False, separators=(",", ":")), param,
                 tuple(defs.origins))


def _response_format_guide(fmt: Any) -> Guide | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise InvalidRequestError("'response_format' must be an object with a 'type'.", param="response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json_object", None, "response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidRequestError("'response_format.json_schema.schema' is required for type 'json_schema'.",
                                      param="response_format.json_schema.schema")
        return schema_guide(spec["schema"], "response_format.json_schema.schema")
    raise InvalidRequestError(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', not {kind!r}.",
                              param="response_format.type")


def _bounded(text: str, param: str, what: str) -> str:
    """`text` (a regex, grammar or choice list as JSON), or a 400 when it is past `MAX_GUIDE_CHARS`."""
    if len(text) > MAX_GUIDE_CHARS:
        raise InvalidRequestError(
            f"'{param}' is {len(text):,} characters long; the limit for {what} is {MAX_GUIDE_CHARS:,}, because "
            "guided decoding compiles it before the first token, in time that grows with its size.", param=param,
            code="guide_too_large")
    return text


def _text(value: Any, param: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"'{param}' must be a non-empty string.", param=param)
    return _bounded(value, param, what)


def _choice(value: Any, param: str) -> Guide:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise InvalidRequestError(f"'{param}' must be a non-empty list of strings.", param=param)
    return Guide("choice", _bounded(json.dumps(value, ensure_ascii=False), param, "a list of choices (as JSON)"),
                 param)


_WHAT = {"regex": "a regular expression", "grammar": "a grammar"}


def _structured_outputs(value: Any) -> Guide:
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise InvalidRequestError("'structured_outputs' must be an object.", param=param)
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if value.get(k) not in (None, False)]
    if len(given) != 1:
        raise InvalidRequestError("'structured_outputs' must set exactly one of json, regex, choice, grammar and "
                                  "json_object.", param=param)
    key = given[0]
    if key == "json":
        return schema_guide(value["json"], "structured_outputs.json")
    if key == "json_object":
        return Guide("json_object", None, param)
    if key == "choice":
        return _choice(value["choice"], "structured_outputs.choice")
    kind: GuideKind = "regex" if key == "regex" else "grammar"
    return Guide(kind, _text(value[key], f"structured_outputs.{key}", _WHAT[kind]), param)


GUIDE_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")


def request_guide(body: Any) -> Guide | None:
    """The guide a request's own fields ask for (`response_format`, or vLLM's extensions), or None."""
    # vLLM's fields are declared (typed) on chat and completions bodies; elsewhere they are extras.
    extra: dict[str, Any] = {**(body.model_extra or {}), **{
        k: getattr(body, k) for k in GUIDE_FIELDS if getattr(body, k, None) is not None}}
    found: list[Guide] = []
    fmt_guide = _response_format_guide(getattr(body, "response_format", None))
    if fmt_guide is not None:
        found.append(fmt_guide)
    if extra.get("guided_json") is not None:
        found.append(schema_guide(extra["guided_json"], "guided_json"))
    if extra.get("guided_regex") is not None:
        found.append(Guide("regex", _text(extra["guided_regex"], "guided_regex", _WHAT["regex"]), "guided_regex"))
    if extra.get("guided_choice") is not None:
        found.append(_choice(extra["guided_choice"], "guided_choice"))
    if extra.get("guided_grammar") is not None:
        found.append(Guide("grammar", _text(extra["guided_grammar"], "guided_grammar", _WHAT["grammar"]),
                           "guided_grammar"))
    if extra.get("structured_outputs") is not None:
        found.append(_structured_outputs(extra["structured_outputs"]))
    if len(found) > 1:
        raise InvalidRequestError(f"Only one output constraint may be given; this request has "
                                  f"{', '.join(g.param for g in found)}.", param=found[1].param)
    return found[0] if found else None


def require_support(backend: LLMBackend, model: str, guide: Guide) -> None:
    """400 when the model's backend is known not to enforce `guide` (unknown until Triton's config was
    read: then the adapter refuses it the same way when it builds the request)."""
    kinds = backend.guide_kinds
    if kinds is not None and guide.kind not in kinds:
        raise InvalidRequestError(
            f"The model {model!r} ({backend.protocol} protocol) cannot enforce '{guide.param}': its Triton backend "
            "takes no guided-decoding input, so the output could not be guaranteed to match.", param=guide.param,
            code="unsupported_parameter")


_POINTER = re.compile(r"#/[^\s'\",;)\]]*")


def _origin(guide: Guide, reason: str) -> tuple[GuideOrigin, str] | None:
    """The client schema (and the path inside it) a backend's reason points at: the part holding the first
    JSON pointer the reason quotes, else the guide's only schema; None when the guide has several and the
    reason does not say which."""
    parts = sorted(guide.origins, key=lambda o: len(o.at), reverse=True)
    for pointer in _POINTER.findall(reason):
        for o in parts:
            if o.at == "#" or pointer == o.at or pointer.startswith(o.at + "/"):
                return o, pointer_path("#" + pointer[len(o.at):])
    schemas = [o for o in guide.origins if not o.at.startswith("#/$defs/")]
    return (schemas[0], "") if len(schemas) == 1 else None


def backend_refusal(guide: Guide, err: BackendError) -> InvalidRequestError | None:
    """The client's 400 for a guide the model's backend could not compile (`triton.errors.guide_refusal` reads
    Triton's message in `err.detail`), naming the tool and the schema path it came from when the guide says
    (`Guide.origins`) and carrying the backend's reason; None when Triton's error is about something else."""
    reason = guide_refusal(err.detail or "")
    if reason is None:
        return None
    found = _origin(guide, reason)
    if found is not None:
        origin, inside = found
        param = origin.param + inside
        what = f"'{param}'" + (f" (the parameters of tool {origin.tool!r})" if origin.tool else "")
    else:
        param = guide.param
        tools = ", ".join(f"{o.tool!r} ({o.param})" for o in guide.origins if o.tool and o.at[:8] != "#/$defs/")
        what = f"'{param}'" + (f", built from the tools {tools}," if tools else "")
    return InvalidRequestError(f"The model's backend cannot compile {what} for guided decoding: {reason}",
                               param=param, code="unsupported_schema")
