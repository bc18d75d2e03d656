"""The Responses API's tools as chat function tools, and the model's calls back as the client's own items.

Decided per tool type (OpenAI's `Tool` union, as Codex and the Agents SDK send it):

* `function`: a chat function tool (`name`, `description`, `parameters`, `strict`); a call is a
  `function_call` item. `defer_loading: true` (tool search's "discover me later"): not offered until a
  `tool_search_output` input item loads it.
* `namespace` (`{name, description, tools: [function | custom]}`, e.g. Codex's `multi_agent_v1` sub-agent
  tools): each member is offered as `<namespace>__<member>` (Codex's own flat spelling of a namespaced
  tool, `codex-rs/protocol/src/tool_name.rs`), its description led by the namespace's; a call comes back
  under the member's own `name` with `namespace` set, as OpenAI returns it, and an input item that carries
  a `namespace` maps back to the flat name.
* `custom` (`{name, description, format}`: free text, or a `grammar` in Lark or regex syntax; Codex's
  `apply_patch`): offered as a function with one string parameter `input`, the grammar, when given, quoted
  in its description (the gateway does not constrain a tool's input to a Lark grammar); a call is a
  `custom_tool_call` item whose `input` is that string.
* `tool_search` run by the client (`execution: "client"`, with `parameters`): offered as a function named
  `tool_search`; a call is a `tool_search_call` item (`execution: "client"`, `arguments` an object). The
  tools a `tool_search_output` input item returns are offered from then on.
* Everything else: the hosted tools this gateway cannot run (`web_search*`, `file_search`,
  `code_interpreter`, `image_generation`, `computer*`, `mcp`, `local_shell`, `shell`, `apply_patch`,
  `tool_search` run by the server) and types it does not know are left out of the prompt, never a 400
  that stops an agent: `omitted_tools` names them, the route sends them in the `OMITTED_TOOLS_HEADER`
  response header (comma-separated types, first appearance order) and the service logs them.

Names must be unique across what is offered (a 400 naming the second); a call to a name nothing offers
(a model's invention) comes back as a plain `function_call` under that name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openai_api.errors import InvalidRequestError

OMITTED_TOOLS_HEADER = "x-omitted-tools"
NAMESPACE_JOIN = "__"
TOOL_SEARCH = "tool_search"
# How a custom tool's free-form input travels inside a function call's JSON arguments.
CUSTOM_INPUT = "input"


@dataclass(frozen=True, slots=True)
class Offered:
    """One tool the model was offered, as the client named it."""

    kind: str  # "function", "custom" or "tool_search"
    name: str  # the client's own name (a namespace member's name without its namespace)
    namespace: str | None = None


def flat_name(name: str, namespace: str | None) -> str:
    """The name the model sees for `namespace`'s member `name` (Codex's spelling: stray underscores at the
    join trimmed, then `__`)."""
    if not namespace:
        return name
    return f"{namespace.rstrip('_')}{NAMESPACE_JOIN}{name.lstrip('_')}"


def omitted_tools(tools: list[Any] | None) -> list[str]:
    """The types of `tools` the gateway leaves out (see the module docstring), each once, in order."""
    out: list[str] = []
    for tool in tools or ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not _offerable(tool) and str(kind) not in out:
            out.append(str(kind))
    return out


def _offerable(tool: Any) -> bool:
    if not isinstance(tool, dict):
        return True  # not a tool at all: `ResponseTools` refuses it
    kind = tool.get("type")
    return kind in ("function", "namespace", "custom") or (kind == TOOL_SEARCH and tool.get("execution") == "client")


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _custom_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom tool as a function taking its free-form input as one string."""
    fmt = tool.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise _bad(f"'{where}.format' must be {{'type': 'text'}} or {{'type': 'grammar', 'syntax', 'definition'}}.",
                   f"{where}.format")
    about = "Free-form text input."
    if fmt["type"] == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if syntax not in ("lark", "regex") or not isinstance(definition, str):
            raise _bad(f"'{where}.format' of type grammar needs 'syntax' ('lark' or 'regex') and a string "
                       "'definition'.", f"{where}.format")
        about = f"The raw input text (not JSON); it must match this {syntax} grammar:\n{definition}"
    return {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string", "description": about}},
            "required": [CUSTOM_INPUT], "additionalProperties": False}


class ResponseTools:
    """A request's tools: `chat` (chat function tools, or None), and per offered name what it was."""

    def __init__(self, tools: list[Any] | None, loaded: list[dict[str, Any]] | None = None) -> None:
        self.chat: list[dict[str, Any]] | None = None
        self.offered: dict[str, Offered] = {}
        self.omitted = omitted_tools(tools)
        out: list[dict[str, Any]] = []
        for i, tool in enumerate(tools or ()):
            self._add(tool, f"tools[{i}]", out, deferred_ok=False)
        for tool in loaded or ():  # from tool_search_output items: deferred tools now loaded
            self._add(tool, "input.tool_search_output.tools", out, deferred_ok=True)
        self.chat = out or None

    def _add(self, tool: Any, where: str, out: list[dict[str, Any]], deferred_ok: bool) -> None:
        if not isinstance(tool, dict):
            raise _bad(f"'{where}' must be an object.", where)
        kind = tool.get("type")
        if kind == "namespace":
            ns, members = tool.get("name"), tool.get("tools")
            if not isinstance(ns, str) or not ns or not isinstance(members, list) or not members:
                raise _bad(f"'{where}' (a namespace) needs a 'name' and a non-empty list 'tools'.", where)
            lead = tool.get("description")
            for j, member in enumerate(members):
                mwhere = f"{where}.tools[{j}]"
                if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                    raise _bad(f"'{mwhere}.type' must be 'function' or 'custom' inside a namespace.",
                               f"{mwhere}.type")
                self._one(member, mwhere, out, ns, lead if isinstance(lead, str) else None, deferred_ok)
        elif kind in ("function", "custom") or (kind == TOOL_SEARCH and tool.get("execution") == "client"):
            self._one(tool, where, out, None, None, deferred_ok)

    def _one(self, tool: dict[str, Any], where: str, out: list[dict[str, Any]], namespace: str | None,
             lead: str | None, deferred_ok: bool) -> None:
        kind = tool["type"]
        name = TOOL_SEARCH if kind == TOOL_SEARCH else tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"'{where}.name' is required.", f"{where}.name")
        if tool.get("defer_loading") is True and not deferred_ok:
            return  # offered once a tool search loads it
        flat = flat_name(name, namespace)
        if flat in self.offered:
            if deferred_ok:
                return  # loaded again by a later search: already offered
            raise _bad(f"Tool name {flat!r} is offered twice; tool names must be unique.", f"{where}.name")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise _bad(f"'{where}.description' must be a string.", f"{where}.description")
        if lead:
            description = f"{lead}\n\n{description}" if description else lead
        if kind == "custom":
            parameters: Any = _custom_function(tool, where)
        else:
            parameters = tool.get("parameters")
        fn: dict[str, Any] = {"name": flat}
        if description:
            fn["description"] = description
        if parameters is not None:
            fn["parameters"] = parameters
        if kind == "function" and tool.get("strict") is not None:
            fn["strict"] = tool["strict"]
        out.append({"type": "function", "function": fn})
        self.offered[flat] = Offered(kind, name, namespace)

    def choice(self, choice: Any) -> Any:
        """`tool_choice` as chat's: `none` / `auto` / `required`; a function, custom tool (with its namespace,
        if any) or `tool_search` by name; `allowed_tools` (`mode` auto or required) narrows what is offered.
        A hosted tool's choice (its tool left out) is `auto`."""
        if choice is None or isinstance(choice, str):
            if choice not in (None, "none", "auto", "required"):
                raise _bad("tool_choice must be 'none', 'auto' or 'required', or an object.", "tool_choice")
            return choice
        if not isinstance(choice, dict):
            raise _bad("tool_choice must be a string or an object.", "tool_choice")
        kind = choice.get("type")
        if kind in ("function", "custom"):
            name = choice.get("name")
            if not isinstance(name, str) or not name:
                raise _bad(f"tool_choice of type {kind!r} names the tool: 'name' is required.", "tool_choice.name")
            return {"type": "function", "function": {"name": flat_name(name, choice.get("namespace"))}}
        if kind == TOOL_SEARCH and TOOL_SEARCH in self.offered:
            return {"type": "function", "function": {"name": TOOL_SEARCH}}
        if kind == "allowed_tools":
            return self._allowed(choice)
        if isinstance(kind, str):
            return "auto"  # a hosted tool (web_search_preview, file_search, mcp, ...): it is not offered
        raise _bad("tool_choice.type is required.", "tool_choice.type")

    def _allowed(self, choice: dict[str, Any]) -> str:
        mode, allowed = choice.get("mode", "auto"), choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, list):
            raise _bad("tool_choice of type allowed_tools needs 'mode' ('auto' or 'required') and a list 'tools'.",
                       "tool_choice")
        keep: set[str] = set()
        for t in allowed:
            if isinstance(t, dict) and t.get("type") in ("function", "custom") and isinstance(t.get("name"), str):
                keep.add(flat_name(t["name"], t.get("namespace")))
            elif isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("name"), str):
                keep |= {f for f, o in self.offered.items() if o.namespace == t["name"]}
            elif isinstance(t, dict) and t.get("type") == TOOL_SEARCH:
                keep.add(TOOL_SEARCH)
        self.chat = [t for t in self.chat or () if t["function"]["name"] in keep] or None
        return mode if self.chat else "none"

    def kind(self, flat: str) -> str:
        """What a call to `flat` comes back as: "function", "custom" or "tool_search"."""
        offered = self.offered.get(flat)
        return offered.kind if offered is not None else "function"

    def item(self, call_id: str, flat: str, arguments: str, status: str) -> dict[str, Any]:
        """The output item of the model's call of `flat` with `arguments` (JSON text)."""
        offered = self.offered.get(flat) or Offered("function", flat)
        suffix = call_id.removeprefix("call_")
        ns = {"namespace": offered.namespace} if offered.namespace else {}
        if offered.kind == "custom":
            return {"type": "custom_tool_call", "id": f"ctc_{suffix}", "call_id": call_id, "name": offered.name,
                    "input": custom_input(arguments), **ns}
        if offered.kind == TOOL_SEARCH:
            return {"type": "tool_search_call", "id": f"tsc_{suffix}", "call_id": call_id, "execution": "client",
                    "arguments": _object(arguments), "status": status}
        return {"type": "function_call", "id": f"fc_{suffix}", "call_id": call_id, "name": offered.name,
                "arguments": arguments, "status": status, **ns}


def custom_input(arguments: str) -> str:
    """A custom tool's free-form input from the call's JSON arguments: `{"input": "..."}` (as offered); an
    object with one string is that string; anything else the arguments text as written."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict):
        if isinstance(value.get(CUSTOM_INPUT), str):
            return str(value[CUSTOM_INPUT])
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and strings:
            return strings[0]
    return value if isinstance(value, str) else arguments


def _object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
