"""The wire format: pydantic models of OpenAI's requests and responses (the single source of it).

Requests ignore fields they do not know (OpenAI clients send many); fields we know but cannot honour
are refused with 400 naming the field (see serving.py). Ranges follow OpenAI's documentation; the
sampling extensions (top_k, min_p, repeat_penalty, grammar, json_schema ...) follow llama.cpp's
server. Every optional field accepts null, meaning "not given" (its default applies), as OpenAI's API
does; llama-server's native requests (/completion, /tokenize ...) are at the end.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Request(BaseModel):
    # strict: JSON types as the schema states them. Lax mode would turn `"n": true` into 1 and `"5"` into 5,
    # accepting what the OpenAPI document says is invalid (found by tests/test_server_schema.py's negative fuzzing)
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        """``"temperature": null`` means "not given": drop it so the default applies. The fields'
        types admit null in the schema (``X | None``) so that the OpenAPI document says so too."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- errors --------------------------------------------------------------------------------------


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorDetail


# ---- shared request pieces -----------------------------------------------------------------------

Stop = Annotated[str, Field(min_length=1, max_length=1024)]


class StreamOptions(_Request):
    include_usage: bool | None = False


class _Sampling(_Request):
    """Sampling fields shared by chat and text completions."""

    model: str | None = Field(
        None, description="A name from GET /v1/models; absent: the served model."
    )
    max_tokens: int | None = Field(
        None, ge=1, le=INT64_MAX, description="Absent: until the end of the context."
    )
    temperature: float | None = Field(0.8, ge=0.0, le=2.0, description="0 = greedy.")
    top_p: float | None = Field(0.95, ge=0.0, le=1.0)
    top_k: int | None = Field(40, ge=0, le=1_000_000, description="llama.cpp extension; 0 = off.")
    min_p: float | None = Field(0.05, ge=0.0, le=1.0, description="llama.cpp extension.")
    repeat_penalty: float | None = Field(1.0, ge=0.0, le=10.0, description="llama.cpp extension; 1 = off.")
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: Stop | list[Stop] | None = Field(None, description="Up to 16 stop strings.")
    n: int | None = Field(1, ge=1, le=1, description="Only 1 is supported.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = Field(None, description="Not supported (must be empty).")
    user: str | None = None
    typical_p: float | None = Field(1.0, ge=0.0, le=1.0, description="llama.cpp extension; 1 = off.")
    repeat_last_n: int | None = Field(
        64, ge=-1, le=1_000_000, description="llama.cpp extension; -1 = the context size."
    )
    grammar: str | None = Field(
        None, max_length=1 << 20, description="llama.cpp extension: a GBNF grammar for the output."
    )
    json_schema: dict[str, Any] | None = Field(
        None, description="llama.cpp extension: a JSON schema the output must satisfy."
    )
    cache_prompt: bool | None = Field(
        True, description="llama.cpp extension: reuse the KV cache of a shared prompt prefix."
    )


# ---- chat ----------------------------------------------------------------------------------------


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ImagePart(_Request):
    type: Literal["image_url"]
    image_url: dict[str, Any]


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Request):
    name: str
    arguments: str = Field(description="The arguments as a JSON text, as the model wrote them.")


class ToolCall(_Request):
    id: str | None = None
    type: Literal["function"] | None = "function"
    function: FunctionCall


class _Message(_Request):
    content: str | list[ContentPart] | None = None
    name: str | None = None


class SystemMessage(_Message):
    role: Literal["system", "developer"] = Field(description="'developer' is treated as 'system'.")


class UserMessage(_Message):
    role: Literal["user"]


class AssistantMessage(_Message):
    role: Literal["assistant"]
    tool_calls: list[ToolCall] | None = Field(None, description="The calls this message made.")
    reasoning_content: str | None = Field(
        None, description="The model's thinking (templates that keep it in the history render it)."
    )


class ToolMessage(_Message):
    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1, description="The id of the call this result answers.")


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDef(_Request):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormatText(_Request):
    type: Literal["text"]


class ResponseFormatJsonObject(_Request):
    type: Literal["json_object"]
    schema_: dict[str, Any] | None = Field(
        None, alias="schema", description="llama-cpp-python extension: a JSON schema."
    )


class JsonSchema(_Request):
    name: str = Field("response", max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormatJsonSchema(_Request):
    type: Literal["json_schema"]
    json_schema: JsonSchema


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
    Field(discriminator="type"),
]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(
        None, ge=1, le=INT64_MAX, description="Newer name of max_tokens."
    )
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = Field(None, description="Not supported (must be false).")
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description='llama.cpp extension: extra template variables, e.g. {"enable_thinking": true} '
        "(over the server's --chat-template-kwargs).",
    )
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy", "auto"] | None = Field(
        None, description="llama.cpp extension: where thinking goes (default: --reasoning-format)."
    )


# ---- text completions ----------------------------------------------------------------------------


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] = Field(
        description="A string, or a list of token ids. A list of several strings is not supported."
    )
    max_tokens: int | None = Field(16, ge=1, le=INT64_MAX)
    echo: bool | None = False
    suffix: str | None = Field(None, description="Not supported (must be absent).")
    best_of: int | None = Field(None, ge=1, le=1)
    logprobs: int | None = Field(None, ge=0, le=5, description="Not supported (must be absent).")


# ---- responses -----------------------------------------------------------------------------------


class PromptTokensDetails(_Response):
    cached_tokens: int = Field(
        0, description="Prompt tokens reused from the KV cache or a state file."
    )


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ResponseFunctionCall(_Response):
    name: str
    arguments: str


class ResponseToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class ResponseMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


FinishReason = Literal["stop", "length", "tool_calls", "function_call", "content_filter"]


class ChatChoice(_Response):
    index: int
    message: ResponseMessage
    finish_reason: FinishReason | None
    logprobs: None = None


class Timings(_Response):
    """llama-server's per-request timings (milliseconds; per_second = tokens per second)."""

    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    prompt_per_token_ms: float = 0.0
    prompt_per_second: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    predicted_per_token_ms: float = 0.0
    predicted_per_second: float = 0.0


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    timings: Timings | None = None


class DeltaFunctionCall(_Response):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class Delta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    timings: Timings | None = None


class CompletionChoice(_Response):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    timings: Timings | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llama-vq"


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class KVBytes(_Response):
    k: int
    v: int
    total: int


class Health(_Response):
    status: Literal["ok", "loading", "error", "shutting_down"]
    model: str | None = None
    n_ctx: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: bool | None = None
    kv_cache_bytes: KVBytes | None = None
    queue_depth: int = 0
    error: str | None = None


# ---- llama-server's native API (/completion, /tokenize, /detokenize, /apply-template, /props) --------


class NativeCompletionRequest(_Request):
    """llama-server's POST /completion: a raw prompt (text, token ids, or both mixed)."""

    prompt: str | list[int | str] = Field(description="Text, token ids, or a mix of both.")
    n_predict: int | None = Field(
        -1, ge=-1, le=INT64_MAX, description="Tokens to generate; -1 = until a stop (or the context end)."
    )
    temperature: float | None = Field(0.8, ge=0.0, le=2.0)
    top_k: int | None = Field(40, ge=0, le=1_000_000)
    top_p: float | None = Field(0.95, ge=0.0, le=1.0)
    min_p: float | None = Field(0.05, ge=0.0, le=1.0)
    typical_p: float | None = Field(1.0, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(1.0, ge=0.0, le=10.0)
    repeat_last_n: int | None = Field(64, ge=-1, le=1_000_000)
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="-1 or absent: random.")
    stop: list[Stop] | None = Field(None, description="Up to 16 stop strings.")
    stream: bool | None = False
    grammar: str | None = Field(None, max_length=1 << 20)
    json_schema: dict[str, Any] | None = None
    cache_prompt: bool | None = True
    ignore_eos: bool | None = False
    n_probs: int | None = Field(0, ge=0, le=0, description="Not supported (must be 0).")
    return_tokens: bool | None = Field(False, description="Also return the generated token ids.")


class NativeCompletionResponse(_Response):
    index: int = 0
    content: str
    tokens: list[int] = Field(default_factory=list)
    id_slot: int = 0
    stop: bool
    model: str | None = None
    tokens_predicted: int = 0
    tokens_evaluated: int = 0
    generation_settings: dict[str, Any] | None = None
    prompt: str | None = None
    has_new_line: bool | None = None
    truncated: bool | None = None
    stop_type: Literal["none", "eos", "limit", "word"] | None = None
    stopping_word: str | None = None
    tokens_cached: int | None = None
    timings: Timings | None = None


class TokenizeRequest(_Request):
    content: str | list[int | str] = ""
    add_special: bool | None = False
    parse_special: bool | None = True
    with_pieces: bool | None = False


class TokenPiece(_Response):
    id: int
    piece: str | list[int] = Field(description="The token's text, or its bytes when not UTF-8.")


class TokenizeResponse(_Response):
    tokens: list[int] | list[TokenPiece]


class DetokenizeRequest(_Request):
    tokens: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(default_factory=list)


class DetokenizeResponse(_Response):
    content: str


class ApplyTemplateResponse(_Response):
    prompt: str


class GenerationSettings(_Response):
    n_ctx: int
    params: dict[str, Any]


class Modalities(_Response):
    vision: bool = False
    audio: bool = False


class Props(_Response):
    """llama-server's GET /props, plus llama-vq's cache and build facts."""

    default_generation_settings: GenerationSettings
    total_slots: int
    model_alias: str
    model_path: str
    modalities: Modalities = Modalities()
    chat_template: str
    chat_template_tool_use: str | None = None
    chat_template_caps: dict[str, Any] = Field(default_factory=dict)
    bos_token: str = ""
    eos_token: str = ""
    build_info: str
    is_sleeping: bool = False
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    jinja: bool
    reasoning_format: str
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
