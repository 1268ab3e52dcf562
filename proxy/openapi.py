"""The OpenAPI 3.1 description the server publishes at /openapi.json.

Request bodies are described loosely but truthfully: only the required fields, types
and ranges the wire protocols (openai_chat, anthropic_messages, openai_responses)
enforce, so a body the schema rejects is one the server answers with a 4xx, and the
fuzz tests (tests/test_fuzz_endpoints.py) can hold the server to it. Unknown fields are
allowed everywhere, as the wire protocols tolerate them; an optional field set to null
counts as absent.
"""

from __future__ import annotations

from typing import Any

from jumpahead.core.options import options_schema

_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_INT = {"type": "integer"}
_OBJ = {"type": "object"}
_POS_INT = {"type": "integer", "minimum": 1}
_TOP_P = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
_NULLABLE = {"type": "null"}
_FUNCTION_TYPED = {"properties": {"type": {"const": "function"}}}  # also true when "type" is absent


def _one_of(*schemas: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": list(schemas)}


_JUMPAHEAD = options_schema()  # generated from the type the wire protocols parse (core/options.py)


def _messages_request(roles: list[str], message: dict[str, Any], **properties: Any) -> dict[str, Any]:
    """A request body with a non-empty `messages` array of objects with a role among
    `roles` and the `message` properties; `model`, the `properties` and `jumpahead` besides."""
    return {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "model": _STR,
            "messages": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["role"], "properties": {"role": {"enum": roles}, **message}}},
            **properties,
            "jumpahead": _JUMPAHEAD,
        },
    }


_CHAT_CONTENT = _one_of(_STR, _NULLABLE, _OBJ, {"type": "array", "items": _one_of(_STR, _OBJ)})
_CHAT_TOOL_CALL = {"type": "object", "properties": {  # a flat {"name", "arguments"} is tolerated; a bad id is replaced
    "function": {"type": "object", "required": ["name"],
                 "properties": {"name": {"type": "string", "minLength": 1},
                                "arguments": _one_of(_STR, _OBJ, {"type": "array"}, _NULLABLE)}}}}
CHAT_REQUEST = _messages_request(
    ["system", "developer", "user", "assistant", "tool", "function"],
    {"content": _CHAT_CONTENT, "tool_calls": {"type": "array", "items": _CHAT_TOOL_CALL}},
    # a tool whose type is not "function" (hosted tools) is skipped, whatever it holds
    tools={"type": "array", "items": {"type": "object", "if": _FUNCTION_TYPED, "then": {"properties": {
        "function": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string", "minLength": 1},
                                    "parameters": _one_of(_OBJ, _NULLABLE)}}}}}},
    tool_choice=_one_of({"enum": ["auto", "none", "required"]}, _OBJ),
    max_tokens=_POS_INT, max_completion_tokens=_POS_INT,
    n={"type": "integer", "minimum": 1, "maximum": 1},
    temperature={"type": "number", "minimum": 0},
    top_p=_TOP_P,
    top_k={"type": "integer", "minimum": -1},
    min_p={"type": "number", "minimum": 0, "maximum": 1},
    presence_penalty={"type": "number", "minimum": -2, "maximum": 2},
    frequency_penalty={"type": "number", "minimum": -2, "maximum": 2},
    repetition_penalty={"type": "number", "exclusiveMinimum": 0},
    seed=_INT,
    stop=_one_of(_STR, {"type": "array", "items": _STR}),
    stream=_BOOL,
    stream_options={"type": "object", "properties": {"include_usage": _BOOL}},
    logit_bias={"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
)

_BLOCKS = _one_of(_STR, _OBJ, {"type": "array", "items": _one_of(_STR, _OBJ)})  # unknown block types are skipped
MESSAGES_REQUEST = _messages_request(
    ["user", "assistant", "system", "developer"],
    {"content": _one_of(_BLOCKS, _NULLABLE)},
    system=_one_of(_STR, _OBJ, _NULLABLE, {"type": "array", "items": _one_of(_STR, _OBJ)}),
    max_tokens=_POS_INT,
    temperature={"type": "number", "minimum": 0, "maximum": 1},
    top_p=_TOP_P,
    top_k={"type": "integer", "minimum": 0},
    seed=_INT,
    stop_sequences={"type": "array", "items": _STR},
    stream=_BOOL,
    # a tool without input_schema is a server tool (web_search, ...): skipped
    tools={"type": "array", "items": {"type": "object", "if": {
        "required": ["input_schema"], "not": {"properties": {"input_schema": _NULLABLE}}}, "then": {
        "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}, "input_schema": _OBJ}}}},
    tool_choice={"type": "object", "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}, "name": _STR}},
)
COUNT_TOKENS_REQUEST: dict[str, Any] = {
    **MESSAGES_REQUEST,
    "properties": {k: v for k, v in MESSAGES_REQUEST["properties"].items() if k not in ("max_tokens", "stream")},
}

RESPONSES_REQUEST: dict[str, Any] = {
    "type": "object",
    "description": "input, or previous_response_id with input, must yield at least one message",
    "properties": {
        "model": _STR,
        "input": _one_of(_STR, _NULLABLE, {"type": "array", "items": _one_of(_STR, _OBJ)}),
        "instructions": _one_of(_STR, _NULLABLE),
        "previous_response_id": {"type": "string", "minLength": 1},
        "max_output_tokens": _POS_INT,
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": _TOP_P,
        "seed": _INT,
        "stream": _BOOL,
        "store": _BOOL,
        "include": {"type": "array", "items": _STR},
        "tools": {"type": "array", "items": {"type": "object", "if": _FUNCTION_TYPED, "then": {
            "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1},
                                                 "parameters": _one_of(_OBJ, _NULLABLE)}}}},
        "tool_choice": _one_of({"enum": ["auto", "none", "required"]}, _OBJ),
        "reasoning": _OBJ,
        "context_management": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
            "type": {"const": "compaction"}, "compact_threshold": _one_of(_POS_INT, _NULLABLE)}}},
        "jumpahead": _JUMPAHEAD,
    },
}

OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": _STR, "type": _STR, "param": _one_of(_STR, _NULLABLE),
                   "code": _one_of(_STR, _NULLABLE)}}}}
ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"},
    "error": {"type": "object", "required": ["type", "message"], "properties": {"type": _STR, "message": _STR}}}}

# Status codes a request may get besides its success: bad input, access, size.
_ERROR_STATUSES = {"400": "invalid request", "401": "missing or wrong API key",
                   "403": "Origin or Host not allowed", "413": "request body too large"}


def _errors(anthropic: bool) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/" + ("AnthropicError" if anthropic else "OpenAIError")}
    return {code: {"description": text, "content": {"application/json": {"schema": ref}}}
            for code, text in _ERROR_STATUSES.items()}


def _post(op_id: str, summary: str, schema: str, anthropic: bool = False, streams: bool = True) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": _OBJ}}
    if streams:
        ok["text/event-stream"] = {"schema": _STR}
    return {"post": {
        "operationId": op_id, "summary": summary,
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {"200": {"description": "the answer (SSE when stream is true)", "content": ok},
                      **_errors(anthropic)}}}


def _get(op_id: str, summary: str, params: list[str] = (), anthropic: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary,
                          "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": _OBJ}}},
                                        **_errors(anthropic)}}
    if params:
        op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": _STR} for p in params]
        op["responses"]["404"] = {"description": "not found"}
    return op


def _dashboard_paths() -> dict[str, Any]:
    """The live dashboard (proxy/dashboard.py): its page and scripts need no key (they
    hold no data), its data does."""
    out: dict[str, Any] = {}
    for path, op_id, summary, media in (
            ("/dashboard", "dashboard", "the live dashboard page (no API key needed)", "text/html"),
            ("/dashboard/dashboard.js", "dashboard_js", "the dashboard's script", "text/javascript"),
            ("/dashboard/dashboard.css", "dashboard_css", "the dashboard's style sheet", "text/css"),
            ("/dashboard/plotly.min.js", "dashboard_plotly", "plotly.js as the plotly package ships it",
             "text/javascript")):
        out[path] = {"get": {"operationId": op_id, "summary": summary, "security": [],
                             "responses": {"200": {"description": "ok", "content": {media: {"schema": _STR}}}}}}
    out["/dashboard.json"] = {"get": _get("dashboard_json", "what the dashboard shows: turns, sessions, "
                                          "provenance, time saved, interventions, queue, prefix cache")}
    return out


def openapi_document(version: str = "0.1.0") -> dict[str, Any]:
    """The whole document; aliases without /v1 are listed as their own paths."""
    paths: dict[str, Any] = {}
    for prefix in ("/v1", ""):
        tag = prefix.strip("/") or "bare"
        paths[f"{prefix}/chat/completions"] = _post(f"chat_completions_{tag}", "OpenAI chat completions",
                                                    "ChatCompletionRequest")
        paths[f"{prefix}/messages"] = _post(f"messages_{tag}", "Anthropic messages (also ?beta=true)",
                                            "MessagesRequest", anthropic=True)
        paths[f"{prefix}/messages/count_tokens"] = _post(f"count_tokens_{tag}", "Anthropic token count",
                                                         "CountTokensRequest", anthropic=True, streams=False)
        paths[f"{prefix}/responses"] = _post(f"responses_{tag}", "OpenAI responses", "ResponsesRequest")
        paths[f"{prefix}/responses/compact"] = _post(f"responses_compact_{tag}", "OpenAI responses compaction",
                                                     "ResponsesRequest", streams=False)
    delete = _get("delete_response", "delete a stored response", ["response_id"])
    delete["operationId"] = "delete_response"
    paths["/v1/responses/{response_id}"] = {
        "get": _get("get_response", "a stored response", ["response_id"]), "delete": delete}
    paths["/v1/models"] = {"get": _get("list_models", "the served model")}
    paths["/v1/models/{model_id}"] = {"get": _get("get_model", "any model name maps to the served model",
                                                  ["model_id"])}
    root = _get("root", "what answers here")
    paths["/"] = {"get": root, "head": {**root, "operationId": "root_head"}}
    health = _get("health", "model, device, BLAS, rows running (no API key needed)")
    health["security"] = []
    paths["/health"] = {"get": health}
    paths["/metrics"] = {"get": _get("metrics", "engine, server, policy counters (Prometheus text format)")}
    paths["/metrics.json"] = {"get": _get("metrics_json", "the same counters as JSON")}
    paths["/openapi.json"] = {"get": _get("openapi", "this document")}
    paths.update(_dashboard_paths())
    return {
        "openapi": "3.1.0",
        "info": {"title": "jumpahead", "version": version,
                 "description": "A local model server for coding agents (OpenAI and Anthropic protocols)."},
        "paths": paths,
        "components": {
            "schemas": {"ChatCompletionRequest": CHAT_REQUEST, "MessagesRequest": MESSAGES_REQUEST,
                        "CountTokensRequest": COUNT_TOKENS_REQUEST, "ResponsesRequest": RESPONSES_REQUEST,
                        "OpenAIError": OPENAI_ERROR, "AnthropicError": ANTHROPIC_ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }
