"""vLLM's `/tokenize` and `/detokenize`, with each model's own tokenizer.

`/tokenize` takes a `prompt`, or chat `messages` that are rendered and tokenized exactly as
`/v1/chat/completions` would (the model's template, tools and `tool_choice`, special-token text in
content kept plain): `count` is then the prompt a chat request would send, and messages a chat would
refuse as longer than the context are refused here too. LLMs and encoders alike: `max_model_len` is an
LLM's context length or an encoder's `max_tokens`. A prompt is counted whole even past it (as vLLM does:
a client asks in order to know), up to `MAX_COUNT` tokens (or `max_model_len`, if more), found without
tokenizing all of a huge text; past that, a 400. `add_special_tokens` (default true, as vLLM's) tokenizes a
prompt as this gateway sends it: with the tokenizer's added tokens, an LLM's BOS (as `/v1/completions`
by default) or an encoder's `[CLS] ... [SEP]` (as `/v1/embeddings`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from openai_api.errors import InvalidRequestError, ModelNotFoundError
from openai_api.quota.caller import first_usable
from openai_api.schemas.dialects import DetokenizeRequest, TokenizeRequest
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.chat import ChatService
from openai_api.services.preprocess import Preprocessor
from openai_api.services.registry import ModelRegistry
from openai_api.services.tools import plan_tools
from openai_api.text.tokenizer import TextTokenizer

# The most tokens `/tokenize` counts in a prompt (unless a model's context is longer): tens of milliseconds
# and a few MB of tokenizer work; a body of megabytes of text would cost a GB tokenized whole.
MAX_COUNT = 65536


def _encode(tok: TextTokenizer, text: str, limit: int, special: bool) -> list[int]:
    if tok.bound(text, limit)[1]:
        raise InvalidRequestError(f"The prompt is more than {limit} tokens long, the most this server counts.",
                                  param="prompt", code="too_many_tokens")
    return tok.encode(text, add_special_tokens=special)


def _decode(tok: TextTokenizer, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


class TokenizeService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor, chat: ChatService) -> None:
        self.registry = registry
        self.preprocess = preprocess
        self.chat = chat

    def model_name(self, name: str | None) -> str:
        """A request's model (any kind), or, as vLLM serves one model and clients may name none, the first
        LLM (else the first model)."""
        if name:
            if self.registry.kind_of(name) is None:
                raise ModelNotFoundError(f"The model {name!r} does not exist.", param="model")
            return name
        first = first_usable([*self.registry.llms, *self.registry.encoders])
        if first is None:
            raise ModelNotFoundError("No model is configured (that this key may use).", param="model")
        return first

    def _tokenizer(self, name: str) -> tuple[TextTokenizer, int]:
        """The model's tokenizer and its `max_model_len`."""
        llm = self.registry.llms.get(name)
        if llm is not None:
            return llm.tokenizer, llm.context_length
        enc = self.registry.encoders[name]
        return enc.tokenizer, enc.config.max_tokens

    async def tokenize(self, req: TokenizeRequest) -> dict[str, Any]:
        name = self.model_name(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise InvalidRequestError("Send either 'prompt' or 'messages', not "
                                      f"{'both' if req.prompt is not None else 'neither'}.", param="prompt")
        tok, max_len = self._tokenizer(name)
        if req.messages is not None:
            ids = await self._chat_ids(name, req)
        else:
            prompt = req.prompt or ""
            special = req.add_special_tokens is not False
            ids = await self.preprocess.run(len(prompt), _encode, tok, prompt, max(max_len, MAX_COUNT), special)
        body: dict[str, Any] = {"count": len(ids), "max_model_len": max_len, "tokens": ids, "token_strs": None}
        if req.return_token_strs:
            body["token_strs"] = [tok.tokenizer.id_to_token(i) or "" for i in ids]
        return body

    async def _chat_ids(self, name: str, req: TokenizeRequest) -> list[int]:
        rt = self.registry.llms.get(name)
        if rt is None or rt.template is None:
            raise InvalidRequestError(f"The model {name!r} has no chat template; send 'prompt' instead.",
                                      param="messages", code="no_chat_template")
        if req.add_special_tokens:
            raise InvalidRequestError("add_special_tokens is not supported with 'messages': the chat template "
                                      "writes the special tokens itself.", param="add_special_tokens",
                                      code="unsupported_parameter")
        if not req.messages:
            raise InvalidRequestError("'messages' must not be empty.", param="messages")
        try:
            chat = ChatCompletionRequest(model=name, messages=req.messages, tools=req.tools,
                                         tool_choice=req.tool_choice, chat_template_kwargs=req.chat_template_kwargs,
                                         add_generation_prompt=req.add_generation_prompt,
                                         continue_final_message=req.continue_final_message)
        except ValidationError as e:
            raise InvalidRequestError(f"Invalid chat request: {e.errors()[0]['msg']}", param="messages") from None
        prompt = await self.chat.prompt(rt, chat, plan_tools(rt, chat))
        return list(prompt.ids)

    async def detokenize(self, req: DetokenizeRequest) -> dict[str, Any]:
        name = self.model_name(req.model)
        tok, _ = self._tokenizer(name)
        vocab = tok.vocab_size
        bad = next((t for t in req.tokens if t < 0 or t >= vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"Token id {bad} is outside the vocabulary (0..{vocab - 1}).", param="tokens")
        text = await self.preprocess.run(len(req.tokens), _decode, tok, req.tokens)
        return {"prompt": text}
