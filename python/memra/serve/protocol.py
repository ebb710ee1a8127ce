"""The OpenAI API's request and response bodies as pydantic models (the fields memra serves).

Requests follow the OpenAI API reference for ``/v1/completions`` and ``/v1/chat/completions``
plus vLLM's extras (``top_k``, ``ignore_eos``, ``stop_token_ids``, ``return_token_ids``,
``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``). Fields a client
sends that memra does not know are ignored and named in a warning, as vLLM does; fields memra knows but cannot honour
(``n`` > 1, ``echo``, ``logprobs``, penalties, ``logit_bias``, ``tools``, and the vLLM / OpenAI
fields of :data:`UNHONOURED` and :data:`CHAT_UNHONOURED`: ``repetition_penalty``, ``min_p``,
``min_tokens``, ``response_format``, guided decoding, ``tool_choice``, ...) are refused with a
400 naming them rather than silently dropped, unless their value asks for nothing
(``repetition_penalty`` 1, ``response_format`` ``{"type": "text"}``). Values are typed strictly
(JSON's own types: ``"stream": "yes"``, ``"max_tokens": true`` or ``"3"`` are refused, not
coerced; a number with a zero fraction, ``4.0``, is the integer JSON means by it), and ``null``
for a field with a default means the default, as OpenAI's reference allows. A bad value is a
:class:`pydantic.ValidationError` whose ``loc`` names the field (memra.serve.app turns it into the
OpenAI error body).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..batch import sampling_problem


def _integral(v: Any) -> Any:
    """A JSON number written with a zero fraction (4.0) is the integer 4: JSON has one number
    type, and a client that computes a count in floating point sends it so (vLLM takes it too).
    Fractions, booleans and strings are left for the strict int check to refuse."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


# A request's integer field: an int, or a float whose value is an integer.
JsonInt = Annotated[int, BeforeValidator(_integral)]


def _text_or_texts(v: Any, what: str) -> list[str]:
    """A string or a list of strings -> list (ValueError naming `what` otherwise)."""
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise ValueError(f"{what} must be a string or a list of strings")


MAX_STOP = 64          # stop strings a request, each matched on every generated token
MAX_STOP_CHARS = 1024  # characters a stop string


def _defaults_for_nulls(cls, data: Any) -> Any:
    """A JSON object with ``null`` dropped for every field of `cls` that has a default (the
    default then applies)."""
    if not isinstance(data, dict):
        return data
    keep = {k for k, f in cls.model_fields.items() if f.is_required() or f.default is None}
    return {k: v for k, v in data.items() if v is not None or k in keep or k not in cls.model_fields}


def _number(x: float):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == x


def _never(v: Any) -> bool:
    return False


# vLLM's and OpenAI's fields that would change the output and that memra cannot honour: refused
# (a 400 naming the field) unless the value asks for nothing, so that a client relying on one
# never gets another output in silence. name -> (whether a value asks for nothing, those values).
UNHONOURED = {
    "repetition_penalty": (_number(1), "1"),
    "min_p": (_number(0), "0"),
    "min_tokens": (_number(0), "0"),
    "use_beam_search": (lambda v: v is False, "false"),
    "include_stop_str_in_output": (lambda v: v is False, "false: a stop string or a stop id's text is never emitted"),
    "skip_special_tokens": (lambda v: v is True, "true: special tokens give no text"),
    "truncate_prompt_tokens": (_never, "null"),
    "prompt_logprobs": (_never, "null"),
    "allowed_token_ids": (_never, "null"),
    "bad_words": (lambda v: v == [], "[]"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"}'),
    "guided_json": (_never, "null"),
    "guided_regex": (_never, "null"),
    "guided_choice": (_never, "null"),
    "guided_grammar": (_never, "null"),
    "structural_tag": (_never, "null"),
    "structured_outputs": (_never, "null"),
}
CHAT_UNHONOURED = {  # the same, of /v1/chat/completions only
    "tool_choice": (lambda v: v in ("none", "auto"), '"none" or "auto": memra calls no tools'),
    "functions": (lambda v: v == [], "[]"),
    "function_call": (lambda v: v in ("none", "auto"), '"none" or "auto"'),
    "echo": (lambda v: v is False, "false"),
    "chat_template": (_never, "null: the checkpoint's template"),
}


def _refuse_unhonoured(table: dict, v: Any, name: str) -> Any:
    asks_nothing, values = table[name]
    if v is not None and not asks_nothing(v):
        only = values if values.startswith("null") else f"{values}, or null"
        raise ValueError(f"not supported by memra (only {only})")
    return v


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices;
    vLLM's ``continuous_usage_stats`` also gives every other chunk the ``usage`` so far
    (completion_tokens: the tokens generated up to and including that chunk's). Unset,
    ``include_usage`` is OpenAI's false, except beside ``continuous_usage_stats`` true, which
    asks for usage (vLLM's default of include_usage is true); an explicit false turns both off."""

    model_config = ConfigDict(strict=True)

    include_usage: bool | None = None
    continuous_usage_stats: bool = False

    def usage_chunks(self) -> tuple[bool, bool]:
        """(a last usage chunk, usage in every chunk)."""
        last = self.include_usage if self.include_usage is not None else self.continuous_usage_stats
        return last, last and self.continuous_usage_stats

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        return _defaults_for_nulls(cls, data)


class _SamplingRequest(BaseModel):
    """Fields /v1/completions and /v1/chat/completions share. Fields memra does not know are kept
    in ``model_extra`` only to be named in a warning (memra.serve.app.parse, as vLLM logs them)
    and otherwise ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    # temperature, top_p and top_k (but vLLM's -1) are held to Model.generate's rules (_sampling).
    temperature: float | None = None
    top_p: float | None = None
    top_k: JsonInt | None = Field(None, ge=-1)  # -1 or 0: off (vLLM's convention)
    n: JsonInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[JsonInt] = Field(default_factory=list)
    # The bounds inside the Annotated, before the float step: the int schema checks them and names
    # 2**64 exactly (on the field they would run as a Python check after it, whose message
    # prints a bound past 2**63 rounded through a float: 18446744073709552000).
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64), BeforeValidator(_integral)] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # UNHONOURED: refused unless they ask for nothing
    repetition_penalty: Any = None
    min_p: Any = None
    min_tokens: Any = None
    use_beam_search: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    truncate_prompt_tokens: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    structured_outputs: Any = None

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        return _defaults_for_nulls(cls, data)

    @field_validator(*UNHONOURED)
    @classmethod
    def _unhonoured(cls, v: Any, info) -> Any:
        return _refuse_unhonoured(UNHONOURED, v, info.field_name)

    @field_validator("temperature", "top_p", "top_k")
    @classmethod
    def _sampling(cls, v: Any, info) -> Any:
        # The sampler's own rule (memra.batch.sampling_problem), checked before the request is
        # scheduled: a value it refuses (a temperature finite as a double but inf as a float32,
        # a top_k beyond int32) is this field's 400, not a failure mid-generation.
        if v is None or (info.field_name == "top_k" and v == -1):
            return v
        problem = sampling_problem(info.field_name, v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> list[str]:
        stops = [s for s in _text_or_texts(v, "stop") if s]
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        long = next((s for s in stops if len(s) > MAX_STOP_CHARS), None)
        if long is not None:
            raise ValueError(f"a stop string has at most {MAX_STOP_CHARS} characters, got one of {len(long)}")
        return stops

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_ids(cls, v: Any) -> Any:
        return [] if v is None else v

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_a_stream(cls, v, info):
        # vLLM's 400: options of a stream that is not streamed would be ignored silently (stream
        # is declared first, so info.data holds it once it validated).
        if v is not None and not info.data.get("stream", False):
            raise ValueError("only with stream = true")
        return v

    @field_validator("n")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"memra returns one choice per request (n = 1), got {v}")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float) -> float:
        if v != 0.0:
            raise ValueError("penalties are not supported by memra (use 0)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v):
        if v and any(b != 0 for b in v.values()):  # biases of 0 ask for nothing
            raise ValueError("logit_bias is not supported by memra (biases of 0 only)")
        for key in v or ():  # the keys are token ids (the handler checks the vocabulary)
            # at most 19 digits: a token id, and int() of it cannot meet Python's 4300-digit limit
            if not (key.isascii() and key.isdigit()) or len(key) > 19:
                raise ValueError(f"logit_bias keys are token ids, got {key[:40]!r}")
        return v


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions. ``prompt``: text, a list of token ids, or a list holding one of
    those (memra serves one prompt per request)."""

    prompt: Any
    max_tokens: JsonInt | None = Field(16, ge=1)
    echo: bool = False
    logprobs: JsonInt | None = None
    suffix: str | None = None
    best_of: JsonInt | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> str | list[int]:
        def ids(x) -> bool:
            return isinstance(x, list) and bool(x) and all(
                isinstance(_integral(t), int) and not isinstance(t, bool) for t in x)

        if isinstance(v, str):
            return v
        if ids(v):
            return [_integral(t) for t in v]
        if isinstance(v, list) and len(v) == 1 and (isinstance(v[0], str) or ids(v[0])):
            return v[0] if isinstance(v[0], str) else [_integral(t) for t in v[0]]  # a batch of one
        if isinstance(v, list) and len(v) > 1 and all(isinstance(p, str) or ids(p) for p in v):
            raise ValueError(f"memra serves one prompt per request, got {len(v)}")
        raise ValueError("prompt must be a string, a non-empty list of token ids, or a list holding one of those")

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported(cls, v):
        if v:
            raise ValueError("not supported by memra")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        # 0 asks for the chosen tokens' log probabilities (OpenAI, vLLM): a null in their place
        # would read as "none were asked for".
        if v is not None:
            raise ValueError("not supported by memra")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v):
        if v not in (None, 1):
            raise ValueError("memra returns one choice per request (best_of = 1)")
        return v


class ContentPart(BaseModel):
    """One part of a message's content; memra takes text parts only."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message. ``content`` may be a list of text parts (joined with newlines, as vLLM
    does for templates that take string content). Other keys (name, tool_call_id, ...) reach
    the chat template as they are, but an assistant's ``tool_calls`` reach it with each
    ``function.arguments`` parsed from its JSON string into a mapping (vLLM's rendering; a 400
    when it is not a JSON object, where vLLM now renders {} in silence)."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[ContentPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any) -> Any:
        # One message naming the part at fault (pydantic's union errors would name the string
        # branch of the union).
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError(f"content must be a string, a list of text parts or null, got {type(v).__name__}")
        for j, part in enumerate(v):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                if not isinstance(part, dict):
                    got = f"a {type(part).__name__}"
                elif part.get("type") != "text":
                    got = f"type {part.get('type')!r}"
                elif "text" not in part:
                    got = "a text part without \"text\""
                else:
                    got = f"\"text\" of type {type(part['text']).__name__}"
                raise ValueError(f"content part {j} must be {{\"type\": \"text\", \"text\": <string>}} "
                                 f"(memra takes text parts only), got {got}")
        return v

    @model_validator(mode="after")
    def _tool_call_arguments(self):
        extra = self.model_extra
        for key in ("name", "tool_call_id"):  # OpenAI's types; a template would print 5 as "5"
            if extra.get(key) is not None and not isinstance(extra[key], str):
                raise ValueError(f"{key} must be a string, got {type(extra[key]).__name__}")
        calls = extra.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ValueError(f"tool_calls must be a list, got {type(calls).__name__}")
        _template_tool_calls(self.role, calls)  # its ValueError: a 400
        return self

    def as_template_dict(self) -> dict:
        """The message as the chat template sees it, as vLLM's server builds it: ``content`` a
        string (a list of parts joined with newlines; null or absent: "", so a template writing
        ``{{ message.content }}`` puts no "None" in the prompt); keys whose value is null left
        out (a null ``name`` is no name); an assistant's ``tool_calls`` with each
        ``function.arguments`` a dict (null or [] calls: no key)."""
        d = self.model_dump(exclude_none=True)
        d.setdefault("content", "")
        if isinstance(self.content, list):
            d["content"] = "\n".join(p.text for p in self.content)
        if "tool_calls" in d:
            d["tool_calls"] = _template_tool_calls(self.role, d["tool_calls"])
            if d["tool_calls"] is None:
                del d["tool_calls"]
        return d


def _template_tool_calls(role: str, calls: Any) -> Any:
    """An assistant's ``tool_calls`` as chat templates take them: OpenAI sends each
    ``function.arguments`` as a JSON string, transformers' templates iterate it as a mapping,
    so it is parsed (null or "" becomes {}) as vLLM does, and an empty list is None (vLLM drops
    it); a copy, the request is left as it was. ValueError naming the call when the arguments
    are not a JSON object (vLLM renders {} for a string that is not JSON)."""
    if role != "assistant" or not isinstance(calls, list):
        return calls
    if not calls:
        return None
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and not isinstance(fn.get("arguments"), dict):
            args = fn.get("arguments")
            where = f"tool_calls[{i}].function.arguments"
            if args in (None, ""):
                parsed = {}
            elif isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where} is not JSON: {e}") from None
                except RecursionError:  # "[[[..." deeper than json's recursion limit
                    raise ValueError(f"{where} nests deeper than memra parses") from None
                if not isinstance(parsed, dict):
                    raise ValueError(f"{where} must be a JSON object, got {type(parsed).__name__}")
            else:
                raise ValueError(f"{where} must be a JSON object or a string holding one, got "
                                 f"{type(args).__name__}")
            call = dict(call, function=dict(fn, arguments=parsed))
        out.append(call)
    return out


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions. ``max_tokens`` (or ``max_completion_tokens``) absent: up to
    the server's --max-len. ``continue_final_message`` (with ``add_generation_prompt`` false, as
    vLLM and transformers require): the model continues the last message (an assistant's
    prefill) instead of starting a new one."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: JsonInt | None = Field(None, ge=1)
    max_completion_tokens: JsonInt | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # vLLM's: the prompt ends inside the last message
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: JsonInt | None = None
    tools: list[dict] | None = None
    # CHAT_UNHONOURED: refused unless they ask for nothing
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    echo: Any = None
    chat_template: Any = None

    @field_validator("logprobs", "top_logprobs", "tools")
    @classmethod
    def _unsupported(cls, v):
        if v:
            raise ValueError("not supported by memra")
        return v

    @field_validator(*CHAT_UNHONOURED)
    @classmethod
    def _chat_unhonoured(cls, v: Any, info) -> Any:
        return _refuse_unhonoured(CHAT_UNHONOURED, v, info.field_name)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict | None) -> dict | None:
        # add_generation_prompt and continue_final_message there win over the fields (vLLM's
        # order); the conversation itself comes only from `messages`.
        if v and "messages" in v:
            raise ValueError("the conversation is the request's messages field, not a chat template variable")
        for key in ("add_generation_prompt", "continue_final_message"):
            if v and v.get(key) is not None and not isinstance(v[key], bool):
                raise ValueError(f"{key} must be true, false or null, got {v[key]!r}")
        return v

    @model_validator(mode="after")
    def _max_tokens(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


# ---------------------------------------------------------------------- responses

class Usage(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    """A choice of a completion (or of one streamed chunk: ``text`` is then the new text)."""

    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None
    # vLLM's extras: the stop string or stop_token_ids id that ended it (None: EOS, length); the
    # ids with return_token_ids (the prompt's on a whole answer and a stream's first chunk)
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    """The body of /v1/completions, and each streamed chunk of it (same object type)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatMessageOut(BaseModel):
    """The assistant's message of a chat completion."""

    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    """A choice of a chat completion."""

    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    """The body of /v1/chat/completions."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None


class ChatDelta(BaseModel):
    """What one streamed chunk adds to the assistant's message."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    """A choice of one streamed chat chunk."""

    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None  # the first chunk's, with return_token_ids


class ModelCard(BaseModel):
    """One entry of GET /v1/models."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "memra"
    max_model_len: int | None = None


class ModelList(BaseModel):
    """The body of GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    """The ``error`` object of the OpenAI error format."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """An error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo
