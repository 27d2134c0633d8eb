#!/usr/bin/env python3
"""A scripted model behind the providers' own HTTP APIs, for running the examples offline.

    fake_provider.py LOG_FILE [PORT]      # prints "listening on PORT", then serves until killed

It answers Anthropic Messages (`POST /v1/messages`), OpenAI Responses (`POST /v1/responses`) and
OpenAI Chat Completions (`POST /v1/chat/completions`), non-streaming, with tool calls, thinking or
reasoning when asked for, and `usage`. The SDKs reach it through their base URL
(`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`).

**Every request is checked** before it is answered, and a refused one gets the provider's 400:

- the whole body against the SDK's own request type (anthropic 2.16, openai 3.60), strictly,
  unknown keys refused: the strict copies of `scripts/sdk_check.py`;
- the provider invariants the types cannot say (docs/PROVIDER-RULES.md): every tool call answered
  by its result where the API wants it and no result without its call (A4.4-A4.8, B1.8-B1.9,
  B2.2-B2.3), the first turn `user` and turns alternating (A1.7, Anthropic), the turn opening a
  tool loop starting with thinking when thinking is enabled (A6.5), the thinking budget (A6.8), a
  reasoning item followed by what it produced and carrying its encrypted content (B2.4-B2.5),
  call ids of at most 40 characters (B1.7), tool names unique and well formed (A4.10);
- what only the writer can check: each thinking block's signature and each reasoning item's
  encrypted content are those this server wrote for it (A6.2: a block changed in any byte fails),
  so a client that stores a response in pieces or edits it is caught;
- every tool the history calls is among the request's `tools` (A4.11), so a client that stops
  passing Loupe's tools on is caught.

Each request is one JSON line in LOG_FILE: the API, the tools offered, the violations, the calls
the request answers (id → result text) and the reply. `scripts/examples.sh` reads it.

**The script** (decided from the request alone, so a crashed and resumed client gets the same
model): the task is what follows the last user text. The model calls the client's own tool once
for every file named in that text (`name.log`, `name.txt`, `name.md`), a call counting as made
whatever its result; then `search` once (when offered) for the last file's name; then `zoom` once
(when offered) on the first address it can read: a cleared result's stub (`zoom 12+1`), else an
outline line (`12+4|…`), else a search hit; then it answers in text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import sdk_check  # noqa: E402  (the strict copies of the SDKs' request types)
from pydantic import TypeAdapter, ValidationError  # noqa: E402

SECRET = b"fake-provider"
LOUPE_TOOLS = {"zoom", "search"}
FILE = re.compile(r"[\w./-]+\.(?:log|txt|md)\b")
STUB = re.compile(r"zoom (\d+)\+(\d+)")
LINE = re.compile(r"(?m)^(\d+)\+(\d+)\|")
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
counter = itertools.count(1)
log_lock = threading.Lock()


def sign(*parts: str) -> str:
    mac = hmac.new(SECRET, "\x00".join(parts).encode(), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def request_types():
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
    from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

    def adapter(tp):
        strict = TypeAdapter(sdk_check.strict(tp))
        return lambda body: strict.validate_json(json.dumps(body), strict=True)

    return {
        "anthropic": adapter(MessageCreateParamsNonStreaming),
        "responses": adapter(ResponseCreateParamsNonStreaming),
        "chat": adapter(CompletionCreateParamsNonStreaming),
    }


TYPES = request_types()


def text_of(content) -> str:
    """The text a tool result or message holds (a string, or blocks / parts with `text`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_of(c.get("text", c.get("content", ""))) for c in content if isinstance(c, dict))
    return ""


# --------------------------------------------------------------------------------------------
# Each API's request as one neutral list of events, checked on the way


class Conversation:
    def __init__(self):
        self.events: list[tuple] = []  # ("text", str) | ("call", id, name, args) | ("result", id, text)
        self.violations: list[str] = []

    def bad(self, rule: str, what: str):
        self.violations.append(f"{rule}: {what}")

    def task(self) -> list[tuple]:
        last = max((i for i, e in enumerate(self.events) if e[0] == "text"), default=-1)
        return self.events[last + 1:], (self.events[last][1] if last >= 0 else "")


def read_anthropic(body: dict, conv: Conversation):
    messages = body.get("messages", [])
    if messages and messages[0].get("role") != "user":
        conv.bad("A1.7", "the first message is not user")
    for i, (a, b) in enumerate(zip(messages, messages[1:])):
        if a.get("role") == b.get("role"):
            conv.bad("A1.5/A1.6", f"messages {i} and {i + 1} are both {a.get('role')}")
    thinking = body.get("thinking") or {}
    if thinking.get("type") == "enabled" and not 1024 <= thinking.get("budget_tokens", 0) < body.get("max_tokens", 0):
        conv.bad("A6.8", "budget_tokens must be at least 1024 and below max_tokens")
    pending: list[str] = []  # the previous assistant turn's tool_use ids
    opener = None  # the assistant turn after the last user turn with a prompt
    for i, m in enumerate(messages):
        blocks = m["content"] if isinstance(m.get("content"), list) else [{"type": "text", "text": m.get("content", "")}]
        if m.get("role") == "user":
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if [b.get("type") for b in blocks[: len(results)]] != ["tool_result"] * len(results):
                conv.bad("A4.5", f"message {i}: tool_result blocks do not come first")
            ids = [b.get("tool_use_id") for b in results]
            if sorted(ids) != sorted(pending):
                conv.bad("A4.4/A4.7/A4.8", f"message {i} answers {ids}, the turn before called {pending}")
            for b in results:
                conv.events.append(("result", b.get("tool_use_id"), text_of(b.get("content", ""))))
            prompts = [b for b in blocks if b.get("type") != "tool_result"]
            for b in prompts:
                conv.events.append(("text", text_of([b])))
            if prompts:
                opener = None
            pending = []
        else:
            if opener is None:
                opener = (i, blocks)
            for b in blocks:
                if b.get("type") == "thinking" and b.get("signature") != sign(body.get("model", ""), b.get("thinking", "")):
                    conv.bad("A6.2", f"message {i}: a thinking block this model did not write as it is")
                if b.get("type") == "tool_use":
                    conv.events.append(("call", b.get("id"), b.get("name"), b.get("input")))
            pending = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
    if pending:
        conv.bad("A4.4", f"the request ends with unanswered tool_use {pending}")
    if thinking.get("type") == "enabled" and opener is not None:
        first = (opener[1] or [{}])[0].get("type")
        if first not in ("thinking", "redacted_thinking"):
            conv.bad("A6.5", f"message {opener[0]} opens the tool loop with {first}, not thinking")
    return [t.get("name") for t in body.get("tools", [])]


def read_responses(body: dict, conv: Conversation):
    items = body.get("input", [])
    items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else items
    open_calls: list[str] = []
    for i, it in enumerate(items):
        kind = it.get("type", "message")
        if kind != "function_call_output" and open_calls and kind != "function_call":
            conv.bad("B2.3", f"item {i} ({kind}) comes before the outputs of {open_calls}")
            open_calls = []
        if kind == "reasoning":
            nxt = items[i + 1].get("type", "message") if i + 1 < len(items) else None
            if nxt in (None, "reasoning") or (nxt == "message" and items[i + 1].get("role") != "assistant"):
                conv.bad("B2.4", f"reasoning item {i} is not followed by the item it produced")
            if it.get("encrypted_content") != sign(body.get("model", ""), it.get("id", "")):
                conv.bad("B2.5/A6.2", f"reasoning item {i}: encrypted_content missing or not this model's")
        elif kind == "function_call":
            open_calls.append(it.get("call_id"))
            conv.events.append(("call", it.get("call_id"), it.get("name"), json.loads(it.get("arguments") or "{}")))
        elif kind == "function_call_output":
            if it.get("call_id") not in open_calls:
                conv.bad("B2.2", f"item {i}: output for call {it.get('call_id')} with no call before it")
            else:
                open_calls.remove(it.get("call_id"))
            conv.events.append(("result", it.get("call_id"), text_of(it.get("output"))))
        elif kind == "message" and it.get("role") == "user":
            conv.events.append(("text", text_of(it.get("content"))))
    if open_calls:
        conv.bad("B2.3", f"calls without output: {open_calls}")
    return [t.get("name") for t in body.get("tools", [])]


def read_chat(body: dict, conv: Conversation):
    pending: list[str] = []
    for i, m in enumerate(body.get("messages", [])):
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                conv.bad("B1.9", f"message {i} answers {m.get('tool_call_id')}, not a pending call")
            else:
                pending.remove(m.get("tool_call_id"))
            conv.events.append(("result", m.get("tool_call_id"), text_of(m.get("content"))))
            continue
        if pending:
            conv.bad("B1.8", f"message {i} ({role}) comes before the results of {pending}")
            pending = []
        if role == "user":
            conv.events.append(("text", text_of(m.get("content"))))
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None and not calls:
                conv.bad("B1.5", f"message {i}: empty tool_calls")
            if m.get("content") is None and not calls:
                conv.bad("B1.4", f"message {i}: null content without tool_calls")
            for c in calls or []:
                if len(c.get("id", "")) > 40:
                    conv.bad("B1.7", f"message {i}: call id {c.get('id')} is longer than 40")
                pending.append(c.get("id"))
                conv.events.append(("call", c.get("id"), c["function"].get("name"), json.loads(c["function"].get("arguments") or "{}")))
    if pending:
        conv.bad("B1.8", f"the request ends with unanswered calls {pending}")
    return [(t.get("function") or {}).get("name") for t in body.get("tools", [])]


# --------------------------------------------------------------------------------------------
# The scripted model


def decide(conv: Conversation, tools: list[str]) -> tuple:
    """("call", name, args) or ("text", answer), from the request alone."""
    task, prompt = conv.task()
    calls = [e for e in task if e[0] == "call"]
    own = next((t for t in tools if t not in LOUPE_TOOLS), None)
    files = list(dict.fromkeys(FILE.findall(prompt)))
    read = {str((c[3] or {}).get("path")) for c in calls if c[2] == own}
    for f in files:
        if own and f not in read:
            return ("call", own, {"path": f})
    if "search" in tools and files and not any(c[2] == "search" for c in calls):
        return ("call", "search", {"query": files[-1]})
    if "zoom" in tools and not any(c[2] == "zoom" for c in calls):
        everything = "\n".join(e[-1] for e in conv.events if e[0] in ("text", "result"))
        found = STUB.search(everything) or LINE.search(everything)
        if found:
            return ("call", "zoom", {"id": int(found.group(1)), "n": int(found.group(2))})
    zoomed = [e for e in task if e[0] == "result" and any(c[1] == e[1] and c[2] == "zoom" for c in calls)]
    return ("text", f"Read {len(read)} file(s) of {len(files)}; zoom gave back {sum(len(z[2]) for z in zoomed)} characters.")


def check(api: str, body: dict) -> tuple[Conversation, list[str]]:
    conv = Conversation()
    try:
        TYPES[api](body)
    except ValidationError as e:
        for err in sdk_check._errors(e):
            conv.bad("SDK request type", err)
    try:
        tools = {"anthropic": read_anthropic, "responses": read_responses, "chat": read_chat}[api](body, conv)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        conv.bad("shape", f"{type(e).__name__}: {e}")
        return conv, []
    if len(set(tools)) != len(tools) or not all(isinstance(t, str) and NAME.match(t) for t in tools):
        conv.bad("A4.10", f"tool names not unique or malformed: {tools}")
    for e in conv.events:
        if e[0] == "call" and e[2] not in tools:
            conv.bad("A4.11", f"the history calls {e[2]}, which the request's tools do not define")
    return conv, tools


# --------------------------------------------------------------------------------------------
# Replies, in each API's response shape


def usage_figures(body: dict) -> tuple[int, int]:
    return len(json.dumps(body)) // 4, 20 + next(counter) % 7


def reply_anthropic(body: dict, action: tuple) -> dict:
    n, (prompt, output) = next(counter), usage_figures(body)
    content = []
    if (body.get("thinking") or {}).get("type") == "enabled":
        thought = f"Step {n}: next, {action[1] if action[0] == 'call' else 'the answer'}."
        content.append({"type": "thinking", "thinking": thought, "signature": sign(body["model"], thought)})
    if action[0] == "call":
        content.append({"type": "tool_use", "id": f"toolu_{n:06d}", "name": action[1], "input": action[2]})
    else:
        content.append({"type": "text", "text": action[1]})
    return {"id": f"msg_{n:06d}", "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": "tool_use" if action[0] == "call" else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": output,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def reply_responses(body: dict, action: tuple) -> dict:
    n, (prompt, output) = next(counter), usage_figures(body)
    items = []
    if body.get("reasoning"):
        rid = f"rs_{n:06d}"
        reasoning = {"id": rid, "type": "reasoning", "summary": []}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            reasoning["encrypted_content"] = sign(body["model"], rid)
        items.append(reasoning)
    if action[0] == "call":
        items.append({"id": f"fc_{n:06d}", "type": "function_call", "call_id": f"call_{n:06d}",
                      "name": action[1], "arguments": json.dumps(action[2]), "status": "completed"})
    else:
        items.append({"id": f"msg_{n:06d}", "type": "message", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": action[1], "annotations": []}]})
    return {"id": f"resp_{n:06d}", "object": "response", "created_at": 1764900000 + n, "status": "completed",
            "model": body["model"], "output": items, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": body.get("tools", []), "store": body.get("store", True),
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt + output}}


def reply_chat(body: dict, action: tuple) -> dict:
    n, (prompt, output) = next(counter), usage_figures(body)
    message = {"role": "assistant", "content": None, "refusal": None}
    if action[0] == "call":
        message["tool_calls"] = [{"id": f"call_{n:06d}", "type": "function",
                                  "function": {"name": action[1], "arguments": json.dumps(action[2])}}]
    else:
        message["content"] = action[1]
    return {"id": f"chatcmpl-{n:06d}", "object": "chat.completion", "created": 1764900000 + n,
            "model": body["model"], "choices": [{"index": 0, "message": message, "logprobs": None,
                                                  "finish_reason": "tool_calls" if action[0] == "call" else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output,
                      "prompt_tokens_details": {"cached_tokens": 0}}}


ROUTES = {"/v1/messages": ("anthropic", reply_anthropic), "/v1/responses": ("responses", reply_responses),
          "/v1/chat/completions": ("chat", reply_chat)}


class Handler(BaseHTTPRequestHandler):
    log_path: Path

    def do_POST(self):
        route = ROUTES.get(self.path.split("?")[0].rstrip("/"))
        if route is None:
            return self.answer(404, {"error": {"message": f"no route {self.path}"}})
        api, reply = route
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        conv, tools = check(api, body)
        action = decide(conv, tools) if not conv.violations else ("refused",)
        calls = {e[1]: e[2] for e in conv.events if e[0] == "call"}
        record = {"api": api, "model": body.get("model"), "tools": tools, "violations": conv.violations,
                  "answered": {e[1]: {"name": calls.get(e[1]), "text": e[2]} for e in conv.events if e[0] == "result"},
                  "action": list(action)}
        with log_lock, self.log_path.open("a") as log:
            log.write(json.dumps(record) + "\n")
        if conv.violations:
            message = "; ".join(conv.violations)
            error = ({"type": "error", "error": {"type": "invalid_request_error", "message": message}}
                     if api == "anthropic" else
                     {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}})
            return self.answer(400, error)
        self.answer(200, reply(body, action))

    def answer(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main() -> int:
    Handler.log_path = Path(sys.argv[1])
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
