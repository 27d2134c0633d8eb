#!/usr/bin/env python3
"""An agent loop on a Loupe thread with the OpenAI SDK's Responses API and a read_file tool.

    python openai_responses_loop.py THREAD_ID "Read notes.txt and sum it up"   # a new turn
    python openai_responses_loop.py THREAD_ID                                   # resume after a crash

Loupe keeps the conversation (nothing is stored at OpenAI: `store=False`, the reasoning comes back
encrypted and is kept in the thread). Each step stores the response in Loupe's entry format
(reasoning items, calls and text as blocks, with the response's id, model and usage) and reads
back the `input` items the API accepts. Environment: LOUPE_URL (default http://127.0.0.1:8080),
LOUPE_API_KEY in keyed mode, OPENAI_API_KEY (OPENAI_BASE_URL for another endpoint), OPENAI_MODEL,
WORKSPACE (the folder read_file reads). What to store and why: docs/INTEGRATING.md.
"""

import json
import os
import sys
import time
from pathlib import Path

import httpx
from openai import OpenAI

MODEL = os.environ.get("OPENAI_MODEL", "gpt-5.1")
WORKSPACE = Path(os.environ.get("WORKSPACE", ".")).resolve()
KEY = os.environ.get("LOUPE_API_KEY")
loupe = httpx.Client(base_url=os.environ.get("LOUPE_URL", "http://127.0.0.1:8080"), timeout=60,
                     headers={"Authorization": f"Bearer {KEY}"} if KEY else {})
client = OpenAI()

READ_FILE = {
    "type": "function", "name": "read_file", "strict": True,
    "description": "Read a text file of the workspace, given its path relative to the workspace.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"], "additionalProperties": False},
}


def call(method: str, path: str, **kwargs) -> httpx.Response:
    """A Loupe request, tried again after the Retry-After of a 429 or 503."""
    for _ in range(5):
        response = loupe.request(method, path, **kwargs)
        if response.status_code not in (429, 503):
            return response
        time.sleep(float(response.headers.get("Retry-After", "1")))
    return response


def append(thread: str, entries: list[dict], expected_next_seq: int | None = None) -> bool:
    """Appends atomically; False when another writer moved the thread first (409 seq-conflict)."""
    body = {"messages": entries} | ({"expected_next_seq": expected_next_seq} if expected_next_seq is not None else {})
    response = call("POST", f"/v1/threads/{thread}/messages", json=body)
    if response.status_code == 409 and "seq-conflict" in response.json().get("type", ""):
        return False
    response.raise_for_status()
    return True


def stored_entry(response) -> dict:
    """The response as one assistant entry: every output item kept, in order."""
    blocks = []
    for item in response.output:
        if item.type == "function_call":
            blocks.append({"type": "tool_use", "id": item.call_id, "name": item.name, "input": json.loads(item.arguments)})
        elif item.type == "message":
            blocks += [{"type": "text", "text": getattr(part, "text", None) or part.refusal} for part in item.content]
        else:  # reasoning (with its encrypted_content) and any other item, as the API returned it
            blocks.append(item.model_dump(mode="json", exclude_none=True))
    message = {"role": "assistant", "id": response.id, "model": response.model, "content": blocks,
               "stop_reason": response.status, "usage": response.usage.model_dump(mode="json")}
    return {"uuid": response.id, "type": "assistant", "message": message}


def run_tool(thread: str, name: str, args: dict) -> tuple[str, bool]:
    """The tool's result text and whether it is an error. Loupe answers its own tools."""
    if name in ("zoom", "search"):
        response = call("POST", f"/v1/threads/{thread}/{name}", json=args)
        if response.status_code == 422:  # the model's input does not fit the tool
            return response.json().get("detail", "invalid input"), True
        response.raise_for_status()
        return response.json()["content"], response.json()["is_error"]
    path = (WORKSPACE / str(args.get("path", ""))).resolve()
    if name != "read_file" or not path.is_relative_to(WORKSPACE) or not path.is_file():
        return f"Error: no such file {args.get('path')!r}", True
    return path.read_text(errors="replace")[:100_000], False


def main() -> None:
    thread, prompt = sys.argv[1], " ".join(sys.argv[2:])
    # Clearing: old tool results become stubs naming the zoom that reads them whole, in batches.
    if call("POST", "/v1/threads", json={"id": thread}).status_code == 201:
        call("PUT", f"/v1/threads/{thread}/settings", json={"clearing": {"enabled": True}}).raise_for_status()
    if prompt:
        append(thread, [{"type": "user", "message": {"role": "user", "content": prompt}}])

    for _ in range(20):
        context = call("GET", f"/v1/threads/{thread}/context",
                       params={"provider": "openai_responses", "model": MODEL}).json()
        tools = [READ_FILE, *context["tools"]]
        response = client.responses.create(
            model=MODEL, input=context["messages"], tools=tools, reasoning={"effort": "medium"},
            include=["reasoning.encrypted_content"], store=False)
        if not append(thread, [stored_entry(response)], expected_next_seq=context["next_seq"]):
            continue  # another writer appended meanwhile: read the context again
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            print(response.output_text)
            return
        if os.environ.get("EXAMPLE_CRASH_AFTER_TOOL_CALL"):
            os._exit(75)  # for scripts/examples.sh: die between the tool call and its result
        results = []
        for item in calls:  # a function_call_output is stored as a tool_result
            text, is_error = run_tool(thread, item.name, json.loads(item.arguments))
            results.append({"type": "tool_result", "tool_use_id": item.call_id, "content": text, "is_error": is_error})
        append(thread, [{"uuid": f"{response.id}-results", "type": "user", "message": {"role": "user", "content": results}}])
    sys.exit("gave up after 20 model calls")


if __name__ == "__main__":
    main()
