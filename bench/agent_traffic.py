"""Replayable coding-agent sessions for ``bench.agent_sessions``: Claude Code over ``/v1/messages`` and Codex over
``/v1/responses``, every turn carrying the whole conversation, as those agents send it.

A session is a task, then turns in which the agent reads source files: turn 1 is the system prompt, the tools
and the task; each later turn adds the agent's tool calls and their results (``tokens_per_turn`` tokens of real
source text, Python's own standard library read in a fixed order, never lorem ipsum). So turn k's prompt is
turn k-1's prompt plus ~``tokens_per_turn`` tokens, and 26 turns of 4,500 reach ~117k tokens, the shape of
issue #36's table. The text is cut by a token counter given by the caller (the model's tokenizer in the bench,
a stand-in in unit tests), so sizes are the model's tokens.

Claude Code's shape (``claude_code_session``): ``system`` as three text blocks, the first
``x-anthropic-billing-header: cc_version=...; cc_entrypoint=cli; cch=<hash>;`` whose hashes change with every
request (``stable_billing`` keeps them for the session, which is what stripping that block gives a prefix
cache), then the identity line and the instructions; 14 tools with JSON Schemas; ``metadata.user_id``; turns of
an assistant ``text`` + ``tool_use`` (``Read``) and a user ``tool_result`` holding the file as ``cat -n`` prints
it; ``cache_control`` on the last system block and the last message's last block; the
``X-Claude-Code-Session-Id`` header. Codex's shape (``codex_session``): ``instructions``, input items (the user's
``AGENTS.md`` and environment context as ``message`` items, the task, then per turn a ``reasoning`` item with
opaque encrypted content, ``function_call`` items of its ``shell`` tool and their ``function_call_output``
items: ``Exit code / Wall time / Output``), 8 function tools, ``prompt_cache_key`` and the ``session_id``
header. Bodies are non-streamed with ``max_tokens`` 1 unless asked otherwise.

Everything here is deterministic for its arguments (ids and hashes derive from the session id).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Counts the tokens of each text (the model's tokenizer, without special tokens).
Counter = Callable[[list[str]], list[int]]

# Folders of the standard library that hold tests, bundled packages or generated data, not its source.
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__", "ensurepip", "lib2to3",
                       "turtledemo", "config-3"})


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's own ``.py`` files (tests and bundled packages left out), in a fixed order."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for p in base.rglob("*.py"):
        rel = p.relative_to(base)
        if any(part in SKIP_DIRS or part.startswith("config-3") for part in rel.parts[:-1]):
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.relative_to(base).as_posix())


@dataclass(frozen=True)
class Read:
    """Lines ``first`` .. ``first + len(lines) - 1`` (1-based) of one file, as the agent's tool read them."""

    path: str
    first: int
    lines: tuple[str, ...]
    tokens: int  # of the tool's output text (numbered lines for Claude Code), by the corpus' counter

    def numbered(self) -> str:
        """As Claude Code's Read tool returns a file: ``cat -n`` (right-aligned number, a tab, the line)."""
        return "\n".join(f"{self.first + i:>6}\t{line}" for i, line in enumerate(self.lines))

    def plain(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Corpus:
    """Source files read in order from a cursor: ``take(n)`` returns the next reads holding ~n tokens (a read is
    one file's consecutive lines; a file longer than what is left of the budget is read in parts, the next read
    going on where the last stopped). ``numbered``: tokens are counted on ``cat -n`` lines (Claude Code's
    Read), else on the plain lines (Codex's ``sed -n``). Lines are counted one by one, so a read's count is
    the sum of its lines' (the bench reports the model's own counts from ``usage``)."""

    files: Sequence[tuple[str, str]]  # (display path, text)
    count: Counter
    numbered: bool = True
    _file: int = 0
    _line: int = 0  # 0-based index of the next line of the current file
    _cache: dict[int, tuple[list[str], list[int]]] = field(default_factory=dict)

    @classmethod
    def from_paths(cls, paths: Sequence[Path], count: Counter, numbered: bool = True, root: Path | None = None
                   ) -> Corpus:
        base = root or Path(sysconfig.get_paths()["stdlib"])
        files = []
        for p in paths:
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            files.append(("/usr/lib/python3/" + p.relative_to(base).as_posix(), text))
        return cls(files, count, numbered)

    def _lines(self, i: int) -> tuple[list[str], list[int]]:
        got = self._cache.get(i)
        if got is None:
            lines = self.files[i][1].splitlines()
            shown = [f"{n + 1:>6}\t{ln}" for n, ln in enumerate(lines)] if self.numbered else lines
            counts = self.count(shown) if shown else []
            # Each line also costs its newline: one token more (counted once per line by most BPE tokenizers).
            got = (lines, [c + 1 for c in counts])
            self._cache = {i: got}  # one file at a time: a session walks forward
        return got

    def skip(self, tokens: int) -> None:
        """Move the cursor on by ~``tokens`` tokens (a separate session reads different files)."""
        self.take(tokens)

    def take(self, tokens: int) -> list[Read]:
        reads: list[Read] = []
        left = tokens
        while left > 0:
            if self._file >= len(self.files):
                raise ValueError(f"the corpus ran out ({len(self.files)} files) with {left} tokens still to read")
            lines, counts = self._lines(self._file)
            start, got = self._line, 0
            end = start
            while end < len(lines) and got < left:
                got += counts[end]
                end += 1
            if end > start:
                reads.append(Read(self.files[self._file][0], start + 1, tuple(lines[start:end]), got))
                left -= got
            if end >= len(lines):
                self._file, self._line = self._file + 1, 0
            else:
                self._line = end
        return reads


def _hex(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def _uuid(seed: str) -> str:
    h = _hex(seed, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def prose(corpus_texts: Sequence[str], count: Counter, tokens: int, head: str) -> str:
    """``head`` followed by paragraphs of English from the standard library's module docstrings until the text
    holds ~``tokens`` tokens: a long system prompt of real prose."""
    paras = [head]
    have = count([head])[0]
    for text in corpus_texts:
        doc = _docstring(text)
        if not doc or len(doc) < 200:
            continue
        n = count([doc])[0]
        paras.append(doc)
        have += n + 2
        if have >= tokens:
            break
    return "\n\n".join(paras)


def _docstring(source: str) -> str:
    s = source.lstrip()
    for q in ('"""', "'''"):
        if s.startswith(q) or (s[1:].startswith(q) and s[0] in "rRuU"):
            start = s.index(q) + 3
            end = s.find(q, start)
            return s[start:end].strip() if end > 0 else ""
    return ""


CLAUDE_HEAD = """You are an interactive command-line assistant that helps people with software engineering work: \
fixing bugs, adding features, explaining and refactoring code. Use the instructions below and the tools you have.

Be brief and direct; your answers are shown in a terminal. Explain a non-trivial command before you run it. Never \
guess a file's content: read it first. Follow the conventions of the code you change (its libraries, naming, \
typing, comment style) and check what a library the project already uses offers before adding another.

When a task has several steps, plan them with the todo tool, keep exactly one step in progress and mark each one \
done as soon as it is. Prefer the dedicated tools over shell commands for reading, searching and editing files. \
Run the project's linters and tests after a change, and say so when you could not. Never commit unless asked.

The notes below describe the modules of the code base you work in; they are reference for the session."""

CODEX_HEAD = """You are a coding agent running in a terminal-based assistant. You and the user share one workspace; \
you work through the shell tool and patches, and you keep going until the task is resolved before you yield.

Plan non-trivial work with the plan tool. Read files with sed or rg through the shell tool, in chunks of at most \
250 lines. Make edits with apply_patch. Keep changes minimal and in the style of the code around them; do not fix \
unrelated bugs. Validate your work with the project's tests when there are any. In your final message, summarize \
what you changed and where, with file paths, briefly.

The notes below describe the modules of the repository; they are reference for the session."""

TASK = ("The date parsing in our log importer is slow and sometimes wrong around DST changes. Read the standard "
        "library modules it leans on, then tell me where the time goes and propose a fix.")


def _schema(props: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}


_S, _I, _B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}


def claude_tools() -> list[dict[str, Any]]:
    """14 tools in Anthropic's shape (name, description, input_schema), named and shaped as Claude Code's."""
    def tool(name: str, desc: str, props: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
        return {"name": name, "description": desc, "input_schema": _schema(props, required)}

    def d(base: dict[str, Any], text: str) -> dict[str, Any]:
        return {**base, "description": text}

    todo = {"type": "object", "properties": {"content": d(_S, "what to do"), "status": {
        "type": "string", "enum": ["pending", "in_progress", "completed"]}, "activeForm": _S},
        "required": ["content", "status", "activeForm"], "additionalProperties": False}
    return [
        tool("Task", "Launch a sub-agent for a complex, multi-step search or task. Give it a self-contained "
             "prompt; it returns one message with its result.",
             {"description": d(_S, "three to five words"), "prompt": d(_S, "the task"),
              "subagent_type": d(_S, "which agent")}, ["description", "prompt", "subagent_type"]),
        tool("Bash", "Run a bash command in a persistent shell, with an optional timeout. Quote paths with spaces; "
             "prefer the search and read tools over find, grep, cat, head and tail.",
             {"command": d(_S, "the command"), "timeout": d(_I, "milliseconds, at most 600000"),
              "description": d(_S, "what it does, in 5-10 words"), "run_in_background": _B}, ["command"]),
        tool("Glob", "Find files by glob pattern (\"**/*.py\"), newest first.",
             {"pattern": d(_S, "the glob"), "path": d(_S, "folder to search in")}, ["pattern"]),
        tool("Grep", "Search file contents with ripgrep regular expressions; filter by glob or type; output "
             "content, matching files or counts.",
             {"pattern": _S, "path": _S, "glob": _S, "type": _S, "output_mode": {
                 "type": "string", "enum": ["content", "files_with_matches", "count"]}, "-i": _B, "-n": _B,
              "-A": _I, "-B": _I, "-C": _I, "multiline": _B, "head_limit": _I}, ["pattern"]),
        tool("LS", "List the files and folders of an absolute path, optionally ignoring glob patterns.",
             {"path": _S, "ignore": {"type": "array", "items": _S}}, ["path"]),
        tool("Read", "Read a file from the local filesystem by absolute path. Lines come back numbered as cat -n "
             "prints them, starting at 1; long files can be read from an offset, a limit of lines at a time.",
             {"file_path": d(_S, "absolute path"), "offset": d(_I, "first line"), "limit": d(_I, "line count")},
             ["file_path"]),
        tool("Edit", "Replace an exact string in a file with another; the old string must be unique unless "
             "replace_all is set. Read the file first.",
             {"file_path": _S, "old_string": _S, "new_string": _S, "replace_all": _B},
             ["file_path", "old_string", "new_string"]),
        tool("MultiEdit", "Several edits of one file in one step, applied in order; all or none.",
             {"file_path": _S, "edits": {"type": "array", "items": {"type": "object", "properties": {
                 "old_string": _S, "new_string": _S, "replace_all": _B}, "required": ["old_string", "new_string"],
                 "additionalProperties": False}, "minItems": 1}}, ["file_path", "edits"]),
        tool("Write", "Write a file, replacing it if it exists (read it first).",
             {"file_path": _S, "content": _S}, ["file_path", "content"]),
        tool("NotebookEdit", "Replace, insert or delete one cell of a Jupyter notebook.",
             {"notebook_path": _S, "cell_id": _S, "new_source": _S, "cell_type": {
                 "type": "string", "enum": ["code", "markdown"]}, "edit_mode": {
                 "type": "string", "enum": ["replace", "insert", "delete"]}}, ["notebook_path", "new_source"]),
        tool("WebFetch", "Fetch a URL, convert it to markdown and answer a prompt about it.",
             {"url": {"type": "string", "format": "uri"}, "prompt": _S}, ["url", "prompt"]),
        tool("WebSearch", "Search the web; results come back as blocks with links.",
             {"query": {"type": "string", "minLength": 2}, "allowed_domains": {"type": "array", "items": _S},
              "blocked_domains": {"type": "array", "items": _S}}, ["query"]),
        tool("TodoWrite", "Create and update the session's task list: pending, in progress, completed.",
             {"todos": {"type": "array", "items": todo}}, ["todos"]),
        tool("ExitPlanMode", "Leave plan mode once the plan is ready for the user's approval.",
             {"plan": d(_S, "the plan, in markdown")}, ["plan"]),
    ]


def codex_tools() -> list[dict[str, Any]]:
    """8 function tools in the Responses API's flat shape, named and shaped as Codex's."""
    def tool(name: str, desc: str, props: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
        params = {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}
        return {"type": "function", "name": name, "description": desc, "strict": False, "parameters": params}

    arr = {"type": "array", "items": _S}
    return [
        tool("shell", "Runs a shell command and returns its output.",
             {"command": {**arr, "description": "The command to execute"}, "workdir": _S, "timeout_ms": _I,
              "with_escalated_permissions": _B, "justification": _S}, ["command"]),
        tool("apply_patch", "Edit files with a patch in the apply_patch format (*** Begin Patch ... *** End Patch).",
             {"input": _S}, ["input"]),
        tool("update_plan", "Updates the task plan: a short explanation and the steps with their status.",
             {"explanation": _S, "plan": {"type": "array", "items": {"type": "object", "properties": {
                 "step": _S, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}},
                 "required": ["step", "status"], "additionalProperties": False}}}, ["plan"]),
        tool("view_image", "Attach a local image to the conversation.", {"path": _S}, ["path"]),
        tool("list_dir", "Lists entries of a directory with their types, to a depth.",
             {"dir_path": _S, "offset": _I, "limit": _I, "depth": _I}, ["dir_path"]),
        tool("read_file", "Reads a local file with 1-indexed line numbers.",
             {"file_path": _S, "offset": _I, "limit": _I}, ["file_path"]),
        tool("grep_files", "Finds files whose contents match a pattern, newest first.",
             {"pattern": _S, "include": _S, "path": _S, "limit": _I}, ["pattern"]),
        tool("test_sync_tool", "Runs the project's test command and returns a summary of failures.",
             {"target": _S, "timeout_ms": _I}, []),
    ]


@dataclass(frozen=True)
class AgentRequest:
    """One request of a replayed session: what an HTTP client sends."""

    turn: int  # 1-based
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    def encoded(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class SessionShape:
    turns: int = 26
    tokens_per_turn: int = 4500
    system_tokens: int = 3000
    max_tokens: int = 1
    stream: bool = False
    model: str = "synthetic-llm"


def billing_block(session: str, turn: int, stable: bool) -> str:
    """Claude Code's first system block; ``cch`` (and the version's suffix) hash the request, so they change
    with every request unless ``stable``."""
    seed = f"{session}:{0 if stable else turn}"
    return f"x-anthropic-billing-header: cc_version=2.1.37.{_hex('v' + seed, 3)}; cc_entrypoint=cli; " \
           f"cch={_hex('c' + seed, 5)};"


def claude_code_session(corpus: Corpus, prose_texts: Sequence[str], shape: SessionShape, seed: str,
                        stable_billing: bool = False) -> Iterator[AgentRequest]:
    """The requests of one Claude Code session (see the module docstring), turn 1 first. Lazily: turn k's body
    shares its earlier messages' objects with turn k-1's (encode each before asking for the next)."""
    session = _uuid("claude:" + seed)
    instructions = prose(prose_texts, corpus.count, shape.system_tokens, CLAUDE_HEAD)
    env = ("<env>\nWorking directory: /home/dev/logimport\nIs directory a git repo: Yes\nPlatform: linux\n"
           "Today's date: 2026-11-28\n</env>")
    tools = claude_tools()
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,interleaved-thinking-"
               "2025-05-14", "x-app": "cli", "user-agent": "claude-cli/2.1.37 (external, cli)",
               "x-claude-code-session-id": session}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the context "
         "of this repository.\n</system-reminder>"}, {"type": "text", "text": TASK}]}]
    for turn in range(1, shape.turns + 1):
        if turn > 1:
            reads = corpus.take(shape.tokens_per_turn)
            calls, results = [], []
            for j, r in enumerate(reads):
                call_id = f"toolu_01{_hex(f'{seed}:{turn}:{j}', 22)}"
                calls.append({"type": "tool_use", "id": call_id, "name": "Read", "input": {
                    "file_path": r.path, "offset": r.first, "limit": len(r.lines)}})
                results.append({"type": "tool_result", "tool_use_id": call_id, "content": r.numbered()})
            names = ", ".join(sorted({r.path.rsplit("/", 1)[-1] for r in reads}))
            messages.append({"role": "assistant", "content": [
                {"type": "text", "text": f"Let me read {names}."}, *calls]})
            messages.append({"role": "user", "content": results})
        system = [{"type": "text", "text": billing_block(session, turn, stable_billing)},
                  {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                   "cache_control": {"type": "ephemeral"}},
                  {"type": "text", "text": instructions + "\n\n" + env, "cache_control": {"type": "ephemeral"}}]
        sent = [*messages[:-1], _with_cache_control(messages[-1])]
        body = {"model": shape.model, "max_tokens": shape.max_tokens, "system": system, "messages": sent,
                "tools": tools, "metadata": {"user_id": f"user_{_hex(seed, 64)}_account__session_{session}"},
                "temperature": 1, "stream": shape.stream}
        yield AgentRequest(turn, "/v1/messages", headers, body)


def _with_cache_control(message: dict[str, Any]) -> dict[str, Any]:
    """Claude Code marks the last block of the last message as a cache breakpoint (a copy: earlier turns' own
    messages stay unmarked)."""
    m = copy.copy(message)
    blocks = list(m["content"])
    blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    m["content"] = blocks
    return m


def codex_session(corpus: Corpus, prose_texts: Sequence[str], shape: SessionShape, seed: str
                  ) -> Iterator[AgentRequest]:
    """The requests of one Codex session (see the module docstring), turn 1 first; lazily, as
    ``claude_code_session``."""
    session = _uuid("codex:" + seed)
    instructions = prose(prose_texts, corpus.count, shape.system_tokens, CODEX_HEAD)
    headers = {"session_id": session, "originator": "codex_cli_rs", "openai-beta": "responses=experimental",
               "user-agent": "codex_cli_rs/0.63.0 (Debian 12; x86_64) xterm"}

    def user(text: str) -> dict[str, Any]:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    items: list[dict[str, Any]] = [
        user("# AGENTS.md instructions for /home/dev/logimport\n\n<INSTRUCTIONS>\nRun `make test` before you "
             "finish. Keep functions small and typed.\n</INSTRUCTIONS>"),
        user("<environment_context>\n  <cwd>/home/dev/logimport</cwd>\n  <approval_policy>on-request</approval_"
             "policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted</network_access>"
             "\n  <shell>bash</shell>\n</environment_context>"),
        user(TASK)]
    for turn in range(1, shape.turns + 1):
        if turn > 1:
            reads = corpus.take(shape.tokens_per_turn)
            secret = base64.b64encode(hashlib.sha512(f"{seed}:{turn}".encode()).digest() * 12).decode()
            items.append({"type": "reasoning", "id": f"rs_{_hex(f'{seed}:{turn}', 32)}", "summary": [],
                          "content": None, "encrypted_content": secret})
            outputs = []
            for j, r in enumerate(reads):
                call_id = f"call_{_hex(f'{seed}:{turn}:{j}', 24)}"
                cmd = ["bash", "-lc", f"sed -n '{r.first},{r.first + len(r.lines) - 1}p' {r.path}"]
                items.append({"type": "function_call", "name": "shell", "call_id": call_id,
                              "arguments": json.dumps({"command": cmd, "workdir": "/home/dev/logimport"})})
                outputs.append({"type": "function_call_output", "call_id": call_id,
                                "output": f"Exit code: 0\nWall time: 0.1 seconds\nOutput:\n{r.plain()}"})
            items += outputs
        body = {"model": shape.model, "instructions": instructions, "input": list(items), "tools": codex_tools(),
                "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": shape.stream,
                "include": [], "prompt_cache_key": session, "max_output_tokens": shape.max_tokens}
        yield AgentRequest(turn, "/v1/responses", headers, body)
