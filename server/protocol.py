"""The wire format: pydantic models of OpenAI's requests and responses (the single source of it).

Requests ignore fields they do not know (OpenAI clients send many); fields we know but cannot honour
are refused with 400 naming the field (see serving.py). Ranges follow OpenAI's documentation; the
sampling extensions (top_k, min_p, repeat_penalty) follow llama.cpp's server.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Request(BaseModel):
    # strict: JSON types as the schema states them. Lax mode would turn `"n": true` into 1 and `"5"` into 5,
    # accepting what the OpenAPI document says is invalid (found by tests/test_server_schema.py's negative fuzzing)
    model_config = ConfigDict(extra="ignore", strict=True)


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
    include_usage: bool = False


class _Sampling(_Request):
    """Sampling fields shared by chat and text completions."""

    model: str | None = Field(
        None, description="A name from GET /v1/models; absent: the served model."
    )
    max_tokens: int | None = Field(
        None, ge=1, le=INT64_MAX, description="Absent: until the end of the context."
    )
    temperature: float = Field(0.8, ge=0.0, le=2.0, description="0 = greedy.")
    top_p: float = Field(0.95, ge=0.0, le=1.0)
    top_k: int = Field(40, ge=0, le=1_000_000, description="llama.cpp extension; 0 = off.")
    min_p: float = Field(0.05, ge=0.0, le=1.0, description="llama.cpp extension.")
    repeat_penalty: float = Field(1.0, ge=0.0, le=10.0, description="llama.cpp extension; 1 = off.")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: Stop | list[Stop] | None = Field(None, description="Up to 16 stop strings.")
    n: int = Field(1, ge=1, le=1, description="Only 1 is supported.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = Field(None, description="Not supported (must be empty).")
    user: str | None = None


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
    arguments: str


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


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


# ---- text completions ----------------------------------------------------------------------------


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] = Field(
        description="A string, or a list of token ids. A list of several strings is not supported."
    )
    max_tokens: int | None = Field(16, ge=1, le=INT64_MAX)
    echo: bool = False
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
    tool_calls: list[ResponseToolCall] | None = None


FinishReason = Literal["stop", "length", "tool_calls", "function_call", "content_filter"]


class ChatChoice(_Response):
    index: int
    message: ResponseMessage
    finish_reason: FinishReason | None
    logprobs: None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    timings: dict[str, int | float] | None = Field(None, description="llama-server's timings (last chunk).")


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
    timings: dict[str, int | float] | None = Field(None, description="llama-server's timings (last chunk).")


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
    timings: dict[str, int | float] | None = Field(None, description="llama-server's timings (last chunk).")


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
