"""What a chat template's own source says about how it reads its input, read once from its Jinja AST.

`structurally_bounded`: whether its work stays proportional to its input (what lets a small request render
inline on the event loop); `reads_arguments_as_text`: whether it wants an earlier call's arguments as OpenAI's
JSON string rather than the decoded object; `reads_content_parts`: whether it loops over a message's content
parts. `text.templates.ChatTemplate` asks these once, when it compiles a template.
"""

from __future__ import annotations

import jinja2
import jinja2.nodes

# Loops nested deeper than this make a template's work grow as a power of its input.
_MAX_LOOP_DEPTH = 2


def _loop_depth(node: jinja2.nodes.Node) -> int:
    inner = max((_loop_depth(child) for child in node.iter_child_nodes()), default=0)
    return inner + 1 if isinstance(node, jinja2.nodes.For) else inner


def structurally_bounded(ast: jinja2.nodes.Template) -> bool:
    """Whether the template's own structure keeps its work proportional to its input: no `range` (loops
    of a length the template picks), no repetition or power operators, no macros (recursion), and loops
    nested at most `_MAX_LOOP_DEPTH` deep. The bundled and usual model templates are; such a template
    with a small input is cheap enough to render on the event loop."""
    if any(isinstance(n, jinja2.nodes.Mul | jinja2.nodes.Pow | jinja2.nodes.Macro
                      | jinja2.nodes.CallBlock) for n in ast.find_all(jinja2.nodes.Node)):
        return False
    if any(n.name == "range" for n in ast.find_all(jinja2.nodes.Name)):
        return False
    return _loop_depth(ast) <= _MAX_LOOP_DEPTH


def _parents(ast: jinja2.nodes.Template) -> dict[int, jinja2.nodes.Node]:
    """Each node's parent, by the child's id (Jinja's AST has no parent links)."""
    parents: dict[int, jinja2.nodes.Node] = {}
    for node in ast.find_all(jinja2.nodes.Node):
        for child in node.iter_child_nodes():
            parents[id(child)] = node
    return parents


def _key_access(node: jinja2.nodes.Node, key: str) -> bool:
    """`x.key`, `x['key']` or `x.get('key')`."""
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == key
    if isinstance(node, jinja2.nodes.Getitem):
        return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Call) and isinstance(node.node, jinja2.nodes.Getattr):
        return (node.node.attr == "get" and bool(node.args) and isinstance(node.args[0], jinja2.nodes.Const)
                and node.args[0].value == key)
    return False


def _uses_of(ast: jinja2.nodes.Template, key: str) -> list[jinja2.nodes.Node]:
    """Every expression that reads a message's `key` field: the accesses themselves, and the loads of
    names that a `set` or a macro parameter bound to such an access (one level of aliasing, which is as
    deep as real templates go: `{% set args = tool_call.arguments %}`, `visible_text(m.content)`)."""
    found = [n for n in ast.find_all(jinja2.nodes.Node) if _key_access(n, key)]
    aliases = {a.target.name for a in ast.find_all(jinja2.nodes.Assign)
               if isinstance(a.target, jinja2.nodes.Name) and any(a.node is n for n in found)}
    for macro in ast.find_all(jinja2.nodes.Macro):
        params = [p.name for p in macro.args]
        for call in ast.find_all(jinja2.nodes.Call):
            if isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name:
                aliases.update(params[i] for i, arg in enumerate(call.args[:len(params)])
                               if any(arg is n for n in found))
    names = [n for n in ast.find_all(jinja2.nodes.Name) if n.ctx == "load" and n.name in aliases]
    return found + names


def reads_arguments_as_text(ast: jinja2.nodes.Template) -> bool:
    """Whether the template wants an earlier call's `function.arguments` as OpenAI's JSON string.

    transformers' documentation and vLLM hand templates a dict (vLLM parses the string for every template),
    and a template that applies `tojson`, `items` or a `for` loop to it needs one. The string is kept only
    where the template is written for it: it tests the value's type (`arguments is string`: it prints a
    string as it is, which keeps the model's own text), or it only concatenates or prints the value raw
    (DeepSeek-V3.1's `'...' + tool['function']['arguments']`), which a dict would turn into Python syntax
    or a render error.
    """
    parents = _parents(ast)
    tests = text = structured = False
    for use in _uses_of(ast, "arguments"):
        parent = parents.get(id(use))
        if isinstance(parent, jinja2.nodes.Test) and parent.name in ("string", "mapping"):
            tests = True
        elif isinstance(parent, jinja2.nodes.Add | jinja2.nodes.Concat | jinja2.nodes.Output):
            text = True
        elif isinstance(parent, jinja2.nodes.Filter) and parent.name in ("tojson", "items", "dictsort"):
            structured = True
        elif isinstance(parent, jinja2.nodes.Getattr) and parent.attr in ("items", "keys", "values"):
            structured = True
        elif isinstance(parent, jinja2.nodes.For) and parent.iter is use:
            structured = True
    return tests or (text and not structured)


def reads_content_parts(ast: jinja2.nodes.Template) -> bool:
    """Whether the template reads a message's `content` as a list of parts (it loops over it, or filters it
    with `selectattr`/`map`), as vLLM detects its "openai" content format. Such a template gets the text
    parts as sent; any other gets them joined into one string, which is all it can print."""
    parents = _parents(ast)
    for use in _uses_of(ast, "content"):
        parent = parents.get(id(use))
        if isinstance(parent, jinja2.nodes.For) and parent.iter is use:
            return True
        if isinstance(parent, jinja2.nodes.Filter) and parent.name in ("selectattr", "map", "rejectattr"):
            return True
    return False
