#!/usr/bin/env python3
"""An agent loop on a Loupe thread with the Anthropic SDK: extended thinking and a read_file tool.

    python anthropic_loop.py THREAD_ID "Read notes.txt and sum it up"   # a new turn
    python anthropic_loop.py THREAD_ID                                   # resume after a crash

Loupe keeps the conversation. Each step appends the model's response whole and reads back a
context the API accepts, whatever happened before (a crash between a tool call and its result
included). Environment: LOUPE_URL (default http://127.0.0.1:8080), LOUPE_API_KEY in keyed mode,
ANTHROPIC_API_KEY (ANTHROPIC_BASE_URL for another endpoint), ANTHROPIC_MODEL, WORKSPACE (the
folder read_file reads). What to store and why: docs/INTEGRATING.md.
"""

import os
import sys
import time
from pathlib import Path

import anthropic
import httpx

MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")
WORKSPACE = Path(os.environ.get("WORKSPACE", ".")).resolve()
KEY = os.environ.get("LOUPE_API_KEY")
loupe = httpx.Client(base_url=os.environ.get("LOUPE_URL", "http://127.0.0.1:8080"), timeout=60,
                     headers={"Authorization": f"Bearer {KEY}"} if KEY else {})
claude = anthropic.Anthropic()

READ_FILE = {
    "name": "read_file",
    "description": "Read a text file of the workspace, given its path relative to the workspace.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def call(method: str, path: str, **kwargs) -> httpx.Response:
    """A Loupe request, tried again after the Retry-After of a 429 or 503."""
    for _ in range(5):
        response = loupe.request(method, path, **kwargs)
        if response.status_code not in (429, 503):
            return response
        time.sleep(float(response.headers.get("Retry-After", "1")))
    return response


def append(thread: str, entry: dict, expected_next_seq: int | None = None) -> bool:
    """Appends one entry; False when another writer moved the thread first (409 seq-conflict)."""
    body = {"messages": [entry]}
    if expected_next_seq is not None:
        body["expected_next_seq"] = expected_next_seq
    response = call("POST", f"/v1/threads/{thread}/messages", json=body)
    if response.status_code == 409 and "seq-conflict" in response.json().get("type", ""):
        return False
    response.raise_for_status()
    return True


def run_tool(thread: str, name: str, args: dict) -> tuple[str, bool]:
    """The tool's result text and whether it is an error. Loupe answers its own tools."""
    if name in ("zoom", "search"):
        response = call("POST", f"/v1/threads/{thread}/{name}", json=args)
        if response.status_code == 422:  # the model's input does not fit the tool
            return response.json().get("detail", "invalid input"), True
        response.raise_for_status()
        answer = response.json()
        return answer["content"], answer["is_error"]
    path = (WORKSPACE / str(args.get("path", ""))).resolve()
    if name != "read_file" or not path.is_relative_to(WORKSPACE) or not path.is_file():
        return f"Error: no such file {args.get('path')!r}", True
    return path.read_text(errors="replace")[:100_000], False


def main() -> None:
    thread, prompt = sys.argv[1], " ".join(sys.argv[2:])
    # A new thread clears old tool results in batches (each stub names the zoom that reads it
    # whole), and its context offers the zoom and search tools from the first request.
    created = call("POST", "/v1/threads", json={"id": thread})
    if created.status_code == 201:
        call("PUT", f"/v1/threads/{thread}/settings", json={"clearing": {"enabled": True}}).raise_for_status()
    elif created.status_code != 409:
        created.raise_for_status()
    if prompt:
        append(thread, {"type": "user", "message": {"role": "user", "content": prompt}})

    for _ in range(20):
        context = call("GET", f"/v1/threads/{thread}/context",
                       params={"provider": "anthropic", "thinking": "enabled", "model": MODEL}).json()
        response = claude.messages.create(
            model=MODEL, max_tokens=8192, thinking={"type": "enabled", "budget_tokens": 4096},
            tools=[READ_FILE, *context["tools"]], messages=context["messages"])
        # The response whole: content with its signed thinking, id, model, stop_reason, usage.
        # Its id as the entry's uuid makes a retried append a no-op.
        entry = {"uuid": response.id, "type": "assistant", "message": response.model_dump(mode="json", exclude_none=True)}
        if not append(thread, entry, expected_next_seq=context["next_seq"]):
            continue  # another writer appended meanwhile: read the context again
        calls = [block for block in response.content if block.type == "tool_use"]
        if not calls:
            print("".join(block.text for block in response.content if block.type == "text"))
            return
        if os.environ.get("EXAMPLE_CRASH_AFTER_TOOL_CALL"):
            os._exit(75)  # for scripts/examples.sh: die between the tool call and its result
        results = []
        for block in calls:
            text, is_error = run_tool(thread, block.name, block.input)
            results.append({"type": "tool_result", "tool_use_id": block.id, "content": text, "is_error": is_error})
        append(thread, {"uuid": f"{response.id}-results", "type": "user", "message": {"role": "user", "content": results}})
    sys.exit("gave up after 20 model calls")


if __name__ == "__main__":
    main()
