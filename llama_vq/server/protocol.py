"""The wire format of the main routes' requests, as pydantic models: the OpenAPI document's request bodies.

The engine (llama-server's handlers) parses and validates every body itself; these models describe what it reads,
for /docs, /openapi.json and the clients generated from them, and are never used to parse a request. Fields that
llama-server accepts beyond these pass (extra="allow"); see its README for each field's meaning.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Sampling(_Open):
    """Sampling and output controls every completion route reads (llama-server's task parameters)."""

    temperature: float | None = Field(None, description="0 is greedy")
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = Field(None, description="fixes the sample at temperature > 0")
    stop: str | list[str] | None = Field(None, description="strings that end the generation, not included")
    stream: bool | None = Field(None, description="Server-Sent Events")
    logit_bias: dict[str, float] | list[list[float]] | None = None
    grammar: str | None = Field(None, description="GBNF grammar")
    json_schema: dict[str, Any] | None = Field(None, description="JSON schema the output must follow")
    cache_prompt: bool | None = Field(None, description="reuse the slot's KV cache for the common prefix")
    id_slot: int | None = Field(None, description="the slot to run on (-1: any)")
    n_probs: int | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = Field(None, description="text, or parts ({type: text, ...})")
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class Tool(_Open):
    type: Literal["function"]
    function: dict[str, Any] = Field(description="{name, description, parameters (a JSON schema)}")


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = Field(None, description="completions per request")
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = Field(None, description="{type: text | json_object | json_schema}")
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None
    stream_options: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(Sampling):
    """OpenAI's /v1/completions."""

    prompt: str | list[str] | list[int]
    model: str | None = None
    max_tokens: int | None = None
    n: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class NativeCompletionRequest(Sampling):
    """llama-server's own /completion."""

    prompt: str | list[int] | list[str | list[int]]
    n_predict: int | None = Field(None, description="tokens to generate (-1: until the end)")
    n_keep: int | None = None
    ignore_eos: bool | None = None
    return_tokens: bool | None = None
    post_sampling_probs: bool | None = None
    samplers: list[str] | None = None


class InfillChunk(_Open):
    text: str
    filename: str | None = None


class InfillRequest(Sampling):
    input_prefix: str
    input_suffix: str
    input_extra: list[InfillChunk] | None = None
    prompt: str | None = None
    n_predict: int | None = None


class ResponsesRequest(Sampling):
    """OpenAI's Responses API."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(_Open):
    """Anthropic's Messages API."""

    messages: list[AnthropicMessage]
    max_tokens: int
    model: str | None = None
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool | None = None
    thinking: dict[str, Any] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    stop_sequences: list[str] | None = None


class CountTokensRequest(_Open):
    messages: list[AnthropicMessage]
    model: str | None = None
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


class TokenizeRequest(_Open):
    content: str | list[str | int]
    add_special: bool | None = None
    parse_special: bool | None = None
    with_pieces: bool | None = None


class DetokenizeRequest(_Open):
    tokens: list[int]


class ApplyTemplateRequest(_Open):
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class EmbeddingsRequest(_Open):
    input: str | list[str] | list[int] | list[list[int]] | None = Field(None, description="OpenAI's field")
    content: str | list[str] | None = Field(None, description="llama-server's /embedding field")
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = None


class RerankRequest(_Open):
    query: str
    documents: list[str]
    top_n: int | None = None


class SlotActionRequest(_Open):
    filename: str | None = Field(None, description="the file in --slot-save-path (save and restore)")


class LoraAdapter(_Open):
    id: int
    scale: float


class LoraAdapters(RootModel[list[LoraAdapter]]):
    pass


class ErrorDetail(BaseModel):
    code: int
    message: str
    type: str


class ErrorResponse(BaseModel):
    """llama-server's error body."""

    error: ErrorDetail


_TRANSCRIPTION_FORM = {
    "type": "object",
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "model": {"type": "string"},
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string"},
    },
    "required": ["file"],
}

# request bodies by (method, llama-server's path)
BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("POST", "/v1/chat/completions"): ChatCompletionRequest,
    ("POST", "/chat/completions"): ChatCompletionRequest,
    ("POST", "/v1/chat/completions/input_tokens"): ChatCompletionRequest,
    ("POST", "/chat/completions/input_tokens"): ChatCompletionRequest,
    ("POST", "/v1/completions"): CompletionRequest,
    ("POST", "/completion"): NativeCompletionRequest,
    ("POST", "/completions"): NativeCompletionRequest,
    ("POST", "/infill"): InfillRequest,
    ("POST", "/v1/responses"): ResponsesRequest,
    ("POST", "/responses"): ResponsesRequest,
    ("POST", "/v1/responses/input_tokens"): ResponsesRequest,
    ("POST", "/responses/input_tokens"): ResponsesRequest,
    ("POST", "/v1/messages"): MessagesRequest,
    ("POST", "/v1/messages/count_tokens"): CountTokensRequest,
    ("POST", "/tokenize"): TokenizeRequest,
    ("POST", "/detokenize"): DetokenizeRequest,
    ("POST", "/apply-template"): ApplyTemplateRequest,
    ("POST", "/embedding"): EmbeddingsRequest,
    ("POST", "/embeddings"): EmbeddingsRequest,
    ("POST", "/v1/embeddings"): EmbeddingsRequest,
    ("POST", "/rerank"): RerankRequest,
    ("POST", "/reranking"): RerankRequest,
    ("POST", "/v1/rerank"): RerankRequest,
    ("POST", "/v1/reranking"): RerankRequest,
    ("POST", "/slots/:id_slot"): SlotActionRequest,
    ("POST", "/lora-adapters"): LoraAdapters,
}
MULTIPART = frozenset({("POST", "/v1/audio/transcriptions"), ("POST", "/audio/transcriptions")})
PATH_PARAMETERS = {
    "/slots/:id_slot": [
        {"name": "id_slot", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}},
        {"name": "action", "in": "query", "required": True, "schema": {"enum": ["save", "restore", "erase"]}},
    ],
}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def operation_extra(method: str, path: str) -> dict[str, Any]:
    """What a route's OpenAPI operation adds to FastAPI's: its request body, its path and query parameters, and
    llama-server's error body for 4xx and 5xx answers."""
    extra: dict[str, Any] = {
        "responses": {
            code: {
                "description": "llama-server's error body",
                "content": {"application/json": {"schema": _ref("ErrorResponse")}},
            }
            for code in ("4XX", "5XX")
        }
    }
    model = BODIES.get((method, path))
    if model is not None:
        extra["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(model.__name__)}}}
    elif (method, path) in MULTIPART:
        extra["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": _TRANSCRIPTION_FORM}}}
    if path in PATH_PARAMETERS:
        extra["parameters"] = PATH_PARAMETERS[path]
    return extra


def component_schemas() -> dict[str, Any]:
    """Every model's JSON schema, for the document's components (nested models hoisted beside them)."""
    out: dict[str, Any] = {}
    models: set[type[BaseModel]] = {*BODIES.values(), ErrorResponse}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out
