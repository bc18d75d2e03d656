"""A client schema's local references (`$ref`), rewritten so they keep their meaning inside the guide the gateway
builds around the schema.

A `$ref` is relative to its schema's root: `#/$defs/Address`, `#` (the root: a recursive model),
`#/definitions/Node` (pydantic v1 and other draft-07 writers), `#/properties/a`, `#name` (an `$anchor`).
pydantic writes every nested model as `$defs` + `$ref`, so instructor, pydantic-ai, the Agents SDK and
LangChain send such schemas as tool parameters and response formats. Once the gateway places a tool's
parameters inside a larger guide (a forced call `{"name": <const>, "arguments": <parameters>}`, a list of
calls, an `anyOf` of the tools: `services.tools`), `#` is the guide's root, not the schema's, and every
reference points to nothing (xgrammar: "Cannot find field $defs in #/$defs/Address"). Grammar engines also
follow fewer pointers than JSON Schema allows: xgrammar 0.2.8 walks a pointer name by name, with no `~0` /
`~1` / percent decoding and no array indices (`#/properties/a/prefixItems/1`: "Cannot find field 1").

So a guide built from schemas that hold references takes one form that every engine follows (`RootDefs`):
each schema a reference points to is copied once into the guide's root `$defs` under a plain name (letters,
digits and `_`, from the name it had: `Address`; `Address_2` when that is taken), every `$ref` and every
OpenAPI `discriminator.mapping` value naming a referenced schema becomes `#/$defs/<name>`, and the client's
own `$defs` / `definitions` are left out (nothing points there any more). A referenced schema met inside
another one's copy is written as a `$ref` to its own copy, so the guide holds each part of the client's
schema once, plus one small `$ref` object per referenced schema. A schema without references is used as it
is, not copied. References resolve as `guides.check_schema` resolved them (it refuses the ones that do not).

The keyword tables below say where a schema keeps subschemas; `guides` walks the same places.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from openai_api.triton.llm import GuideOrigin

# Keywords whose value is one schema (`items` may also be a draft-04..07 list of them), a list of schemas,
# or a name -> schema map.
ONE_SCHEMA = ("items", "additionalItems", "additionalProperties", "contains", "propertyNames", "unevaluatedItems",
              "unevaluatedProperties", "not", "if", "then", "else")
MANY_SCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")
NAMED_SCHEMAS = ("properties", "patternProperties", "dependentSchemas")
DEFINITIONS = ("$defs", "definitions")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")
_MAX_NAME = 48


@dataclass(frozen=True, slots=True)
class CheckedSchema:
    """A client's schema that `guides.check_schema` passed. `param` is where the request holds it
    (`tools[0].function.parameters`); `refs` maps each schema object holding a `$ref` (by `id`) to its `$ref`
    text and the schema that names."""

    schema: dict[str, Any]
    param: str
    refs: Mapping[int, tuple[str, Any]] = field(default_factory=dict)


def pointer_path(ref: str) -> str:
    """A local `$ref` as a request path suffix: `#/$defs/a~1b` -> `.$defs.a/b`, `#name` -> `#name`."""
    if not ref.startswith("#/"):
        return "" if ref == "#" else ref
    return "".join("." + unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/"))


class RootDefs:
    """The root `$defs` of one guide built from client schemas, and where each part of the guide came from
    (`origins`, for a backend's refusal to name the client's own schema: `guides.backend_refusal`)."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}
        self.origins: list[GuideOrigin] = []
        self._next: dict[str, int] = {}

    def place(self, checked: CheckedSchema, at: str, tool: str = "") -> Any:
        """`checked.schema` as it goes at JSON pointer `at` of the guide (`#`: the guide is the schema): itself
        when it holds no reference, else a copy whose references name this root's `$defs` (filled here)."""
        self.origins.append(GuideOrigin(at, checked.param, tool))
        if not checked.refs:
            return checked.schema
        names: dict[int, str] = {}  # id(referenced schema) -> its name in `defs`
        by_text: dict[str, str] = {}  # a `$ref` text -> the name it now points to (for `discriminator.mapping`)
        targets: list[tuple[Any, str]] = []
        for ref, target in checked.refs.values():
            if id(target) not in names:
                name = names[id(target)] = self._name(ref, target)
                targets.append((target, name))
                self.origins.append(GuideOrigin(f"#/$defs/{name}", checked.param + pointer_path(ref), tool))
            by_text.setdefault(ref, names[id(target)])
        copier = _Copier(checked.refs, names, by_text)
        for target, name in targets:
            self.defs[name] = copier.copy(target)
        return copier.sub(checked.schema)

    def root(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The guide's schema with its root `$defs` (unchanged when nothing was hoisted)."""
        return {**schema, "$defs": self.defs} if self.defs else schema

    def _name(self, ref: str, target: Any) -> str:
        if ref.startswith("#/"):
            raw = unquote(ref.rsplit("/", 1)[1]).replace("~1", "/").replace("~0", "~")
        elif ref == "#":
            title = target.get("title") if isinstance(target, dict) else None
            raw = title if isinstance(title, str) else "root"
        else:
            raw = unquote(ref[1:])  # an anchor
        base = _UNSAFE.sub("_", raw).strip("_")[:_MAX_NAME] or "schema"
        if not base[0].isalpha():
            base = f"s_{base}"  # an array index (`prefixItems/1`): some engines make rule names of these
        n = self._next.get(base, 1)
        name = base if n == 1 else f"{base}_{n}"
        while name in self.defs:
            n += 1
            name = f"{base}_{n}"
        self._next[base] = n + 1
        self.defs[name] = None  # taken; filled once every name is known
        return name


class _Copier:
    """Copies a schema with its references renamed (see the module docstring). Recursive, but never deeper
    than the schema, which `services.bounds` has bounded before anything walks it."""

    def __init__(self, refs: Mapping[int, tuple[str, Any]], names: dict[int, str], by_text: dict[str, str]) -> None:
        self.refs = refs
        self.names = names
        self.by_text = by_text

    def sub(self, node: Any) -> Any:
        """A subschema: a `$ref` to its own copy when something references it, else its copy."""
        if isinstance(node, dict) and id(node) in self.names:
            return {"$ref": f"#/$defs/{self.names[id(node)]}"}
        return self.copy(node)

    def copy(self, node: Any) -> Any:
        if not isinstance(node, dict):
            return node  # `true` / `false`
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in DEFINITIONS:
                continue
            if key == "$ref" and id(node) in self.refs:
                value = f"#/$defs/{self.names[id(self.refs[id(node)][1])]}"
            elif key in ONE_SCHEMA or key in MANY_SCHEMAS:
                value = [self.sub(v) for v in value] if isinstance(value, list) else self.sub(value)
            elif key in NAMED_SCHEMAS and isinstance(value, dict):
                value = {name: self.sub(v) for name, v in value.items()}
            elif key == "discriminator" and isinstance(value, dict) and isinstance(value.get("mapping"), dict):
                value = {**value, "mapping": {k: self._mapped(v) for k, v in value["mapping"].items()}}
            out[key] = value
        return out

    def _mapped(self, value: Any) -> Any:
        """A `discriminator.mapping` value: renamed when it is the text of one of the schema's `$ref`s."""
        return f"#/$defs/{self.by_text[value]}" if isinstance(value, str) and value in self.by_text else value
