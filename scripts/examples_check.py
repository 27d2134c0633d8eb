#!/usr/bin/env python3
"""What each example must show, checked on what it left behind (scripts/examples.sh).

    examples_check.py workspace DIR
        writes the files the examples' read_file reads: three logs of about 32 KB each, so
        that two results pass clearing's batch and the older is cleared (a stub to zoom).
    examples_check.py check LOUPE_URL THREAD API PROVIDER_LOG WORKSPACE
        checks one example's thread in Loupe and the requests the fake provider logged for API.

The checks, each against what Loupe and the fake provider say now, never a figure written here:

1. every request the example sent was valid for its provider (no violation logged), and each
   passed Loupe's tools on (zoom and search, offered from the first request with clearing on);
2. a multi-turn tool loop: at least two responses calling the example's own tool, each call
   answered by a stored result;
3. the crash: the thread holds a tool call stored without its result (the run that died), and a
   later request, valid, answered that call (Loupe's repaired context);
4. zoom: the model called it on an address it read in its context (a cleared result's stub); the
   stored result is Loupe's answer to the same call, the model received it, and it holds the
   cleared file whole; a search the model made was answered with Loupe's hits (`id+n|…` lines
   naming entries stored before), and the model received them;
5. every stored response keeps its id, model and usage, and the thread's context counts from the
   reported usage (`context_tokens.basis` is `usage`).
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

LOUPE_TOOLS = {"zoom", "search"}
PROVIDERS = {"anthropic": "anthropic", "responses": "openai_responses", "chat": "openai"}


def workspace(folder: str) -> None:
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(["a.log", "b.log", "c.log"]):
        lines, size, i = [], 0, 0
        while size < 32_000:
            line = (f"2026-01-0{k + 1}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z worker-{i % 5} "
                    f"GET /api/items/{(i * 7919 + k) % 10_000} served in {(i * 37 + 11 * k) % 997} ms\n")
            lines.append(line)
            size += len(line)
            i += 1
        (root / name).write_text("".join(lines))


def loupe(base: str, method: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def entries(base: str, thread: str) -> list[dict]:
    out, after = [], -1
    while True:
        page = loupe(base, "GET", f"/v1/threads/{thread}/messages?after_seq={after}&limit=500")
        out += page["messages"]
        if not page.get("next_after_seq"):
            return out
        after = page["next_after_seq"]


def blocks(entry: dict) -> list[dict]:
    content = (entry.get("message") or {}).get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def result_text(block: dict) -> str:
    content = block.get("content", "")
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)


def check(base: str, thread: str, api: str, log_path: str, folder: str) -> list[str]:
    failures: list[str] = []
    fail = failures.append
    requests = [r for r in map(json.loads, Path(log_path).read_text().splitlines()) if r["api"] == api]
    stored = entries(base, thread)
    calls = {b["id"]: (e, b) for e in stored if e["type"] == "assistant" for b in blocks(e) if b.get("type") == "tool_use"}
    results = {b["tool_use_id"]: b for e in stored if e["type"] == "user" for b in blocks(e) if b.get("type") == "tool_result"}
    result_seq = {b["tool_use_id"]: e["seq"] for e in stored if e["type"] == "user" for b in blocks(e) if b.get("type") == "tool_result"}

    # 1. valid requests, Loupe's tools passed on
    if not requests:
        fail(f"the fake provider saw no {api} request")
    for i, r in enumerate(requests):
        if r["violations"]:
            fail(f"request {i} refused: {r['violations']}")
        if not LOUPE_TOOLS <= set(r["tools"]):
            fail(f"request {i} did not pass Loupe's tools on: {r['tools']}")

    # 2. a multi-turn tool loop
    own = [(e, b) for e, b in calls.values() if b["name"] not in LOUPE_TOOLS]
    answered = [b for _, b in own if b["id"] in results and not results[b["id"]].get("is_error")]
    if len({e["seq"] for e, _ in own}) < 2 or len(answered) < 2:
        fail(f"no multi-turn tool loop: {len(own)} calls of the example's tool, {len(answered)} answered")

    # 3. the crash between a call and its result, survived
    crashed = [i for i in calls if i not in results]
    if not crashed:
        fail("no tool call is stored without its result: the crash run did not crash where it should")
    for i in crashed:
        if not any(i in r["answered"] and not r["violations"] for r in requests):
            fail(f"no valid request answered the crashed call {i}")

    # 4. zoom (and search) answered from Loupe, and received by the model
    loupe_calls = [(e, b) for e, b in calls.values() if b["name"] in LOUPE_TOOLS]
    if not any(b["name"] == "zoom" for _, b in loupe_calls):
        fail("the model never called zoom")
    for e, b in loupe_calls:
        stored_result = results.get(b["id"])
        if stored_result is None:
            fail(f"{b['name']} call {b['id']} has no stored result")
            continue
        text = result_text(stored_result)
        if not any(r["answered"].get(b["id"], {}).get("text") == text for r in requests):
            fail(f"the model never received the stored result of {b['name']}({b['input']})")
        if b["name"] == "search":
            # The thread has grown since (and search ranks what it holds now): each hit must name
            # an entry stored before the answer, in zoom's own address form.
            hits = [(int(i), int(n)) for i, n in re.findall(r"(?m)^(\d+)\+(\d+)\|", text)]
            if stored_result.get("is_error") or not hits or any(i >= result_seq[b["id"]] for i, _ in hits):
                fail(f"the stored result of search({b['input']}) is not a list of Loupe's hits: {text[:200]!r}")
            continue
        answer = loupe(base, "POST", f"/v1/threads/{thread}/zoom", b["input"])
        if text != answer["content"] or bool(stored_result.get("is_error")) != answer["is_error"]:
            fail(f"the stored result of zoom({b['input']}) is not Loupe's answer")
        if b["name"] == "zoom":
            target = next((x for x in stored if x["seq"] == b["input"].get("id")), None)
            read = [results[t["tool_use_id"]] for t in blocks(target or {}) if t.get("type") == "tool_result"]
            sources = [calls[r["tool_use_id"]][1]["input"].get("path") for r in read if r["tool_use_id"] in calls]
            if not sources:
                fail(f"zoom({b['input']}) does not open a result of the example's tool (from a cleared stub)")
            for path in sources:
                if (Path(folder) / path).read_text() not in answer["content"]:
                    fail(f"zoom({b['input']}) does not give {path} back whole")

    # 5. ids, models and usage stored; the context counts from usage
    for e in stored:
        message = e.get("message") or {}
        if e["type"] == "assistant" and not (message.get("id") and message.get("model") and message.get("usage")):
            fail(f"assistant entry {e['seq']} lacks its response id, model or usage")
    context = loupe(base, "GET", f"/v1/threads/{thread}/context?provider={PROVIDERS[api]}")
    if context["context_tokens"]["basis"] != "usage":
        fail(f"the context does not count from the stored usage: {context['context_tokens']}")
    return failures


def main() -> int:
    if sys.argv[1:2] == ["workspace"]:
        workspace(sys.argv[2])
        return 0
    base, thread, api, log_path, folder = sys.argv[2:7]
    failures = check(base.rstrip("/"), thread, api, log_path, folder)
    for f in failures:
        print(f"examples: {thread}: FAIL: {f}", file=sys.stderr)
    if not failures:
        print(f"examples: {thread}: ok (tool loop, crash survived, zoom and search answered, all requests valid)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
