"""One scenario through the Python client generated from openapi/openapi.json, used untouched.

Usage: python scenario.py BASE_URL DOCUMENT   (LOUPE_API_KEY: a tenant key). Run by
scripts/clients.sh with the generated package `loupe_client` on the path.
"""

import json
import os
import sys
import time
import uuid

from loupe_client import AuthenticatedClient
from loupe_client.api.context import get_context
from loupe_client.api.cursors import advance_cursor, claim_cursor, get_cursor, get_pending
from loupe_client.api.jobs import compact_thread, get_job
from loupe_client.api.messages import append_messages
from loupe_client.api.threads import create_thread, get_thread, put_thread_settings
from loupe_client.api.transcripts import export_transcript, import_transcript
from loupe_client.api.tree import get_outline, zoom
from loupe_client.models import (
    AdvanceCursorRequest,
    AppendMessagesRequest,
    ClaimRequest,
    CompactRequest,
    CreateThreadRequest,
    JobState,
    Problem,
    Provider,
    ThreadSettingsBody,
    ZoomRequest,
)


def check(condition, what):
    if not condition:
        sys.exit(f"python client: FAIL: {what}")


def exchange(tag, k):
    """A user question and the assistant's answer: one API round."""
    return [
        {"uuid": f"{tag}-q{k}", "type": "user",
         "message": {"role": "user", "content": f"Question {k} about the launch plan and its price"}},
        {"uuid": f"{tag}-a{k}", "type": "assistant",
         "message": {"role": "assistant", "id": f"msg_{tag}_{k}",
                     "content": [{"type": "text", "text": f"Answer {k}: the plan holds at 49"}]}},
    ]


def new_thread(client, name):
    created = create_thread.sync_detailed(client=client, body=CreateThreadRequest(id=name))
    check(created.status_code == 201, f"create thread: {created.status_code} {created.content!r}")
    return created.parsed.id


def append(client, thread, entries):
    body = AppendMessagesRequest.from_dict({"messages": entries})
    appended = append_messages.sync_detailed(thread, client=client, body=body)
    check(appended.status_code == 201, f"append: {appended.status_code} {appended.content!r}")
    return appended.parsed


def poll(what, read, done, tries=150):
    for _ in range(tries):
        value = read()
        if done(value):
            return value
        time.sleep(0.2)
    sys.exit(f"python client: FAIL: {what} did not finish")


def main():
    base, document = sys.argv[1], sys.argv[2]
    providers = json.load(open(document))["components"]["schemas"]["Provider"]["enum"]
    client = AuthenticatedClient(base_url=base, token=os.environ["LOUPE_API_KEY"],
                                 raise_on_unexpected_status=True)
    tag = f"py-{uuid.uuid4().hex[:12]}"

    # A thread, an append, and the context for every provider the document names.
    thread = new_thread(client, tag)
    stored = append(client, thread, exchange(tag, 0) + exchange(tag, 1) + exchange(tag, 2))
    check(stored.next_seq == 6, f"append: next_seq {stored.next_seq}")
    for provider in providers:
        context = get_context.sync_detailed(thread, client=client, provider=Provider(provider))
        check(context.status_code == 200, f"context {provider}: {context.content!r}")
        check(len(context.parsed.messages) > 0, f"context {provider}: no messages")

    # Compaction, polled to its end.
    compact = compact_thread.sync_detailed(thread, client=client,
                                           body=CompactRequest(keep_recent_rounds=1))
    check(compact.status_code in (200, 202), f"compact: {compact.content!r}")
    job = poll("the compaction job",
               lambda: get_job.sync(compact.parsed.id, client=client),
               lambda job: job.state in (JobState.SUCCEEDED, JobState.FAILED))
    check(job.state == JobState.SUCCEEDED, f"compaction: {job.state} {job.last_error}")

    # Outline mode on a thread of its own, built by the server's workers, then zoom.
    outlined = new_thread(client, f"{tag}-outline")
    settings = ThreadSettingsBody.from_dict({"outline": {
        "enabled": True, "line_bytes": 64, "budget_bytes": 4000, "tail_tokens": 20}})
    put = put_thread_settings.sync_detailed(outlined, client=client, body=settings)
    check(put.status_code == 200 and put.parsed.effective.outline.enabled, "outline on")
    append(client, outlined, [m for k in range(4) for m in exchange(f"{tag}-o", k)])
    poll("the outline", lambda: get_outline.sync(outlined, client=client),
         lambda outline: len(outline.lines) > 0)
    zoomed = zoom.sync(outlined, client=client, body=ZoomRequest(id=0, n=1))
    check(not zoomed.is_error and zoomed.content.startswith("0+1|"), f"zoom: {zoomed.content}")

    # A cursor: its count, the pending batch, a claim and the advance under its lease.
    cursor = get_cursor.sync(thread, "py-consumer", client=client)
    check(cursor.new_count >= 6, f"cursor: new_count {cursor.new_count}")
    pending = get_pending.sync(thread, "py-consumer", client=client, limit=3)
    check(pending.entry_count == 3 and pending.has_more, "pending: a batch of 3, more to come")
    claim = claim_cursor.sync(thread, "py-consumer", client=client, body=ClaimRequest(limit=3))
    check(claim.lease is not None and claim.advance_to == pending.advance_to, "claim")
    advanced = advance_cursor.sync(thread, "py-consumer", client=client,
                                   body=AdvanceCursorRequest(to=claim.advance_to,
                                                             lease=claim.lease.token))
    check(advanced.moved and advanced.cursor.bookmark.uuid == claim.advance_to, "advance")

    # A transcript in its JSON form: exported as a list of entries (asked for with `Accept`; JSON
    # Lines stay the default), imported into another thread, exported again the same.
    transcript = new_thread(client, f"{tag}-transcript")
    append(client, transcript, exchange(f"{tag}-t", 0) + exchange(f"{tag}-t", 1))
    as_json = client.with_headers({"Accept": "application/json"})
    exported = export_transcript.sync_detailed(transcript, client=as_json)
    check(exported.status_code == 200 and isinstance(exported.parsed, list)
          and len(exported.parsed) == 4, f"export: {exported.status_code} {exported.content!r}")
    copy = new_thread(client, f"{tag}-copy")
    imported = import_transcript.sync_detailed(copy, client=client, body=exported.parsed)
    check(imported.status_code == 200 and imported.parsed.stored == 4
          and imported.parsed.refused == 0, f"import: {imported.status_code} {imported.content!r}")
    again = export_transcript.sync(copy, client=as_json)
    check([e.to_dict() for e in again] == [e.to_dict() for e in exported.parsed],
          f"the round trip: {again}")

    # A 404 is a problem whose type the client can switch on.
    missing = get_thread.sync_detailed(f"{tag}-missing", client=client)
    check(missing.status_code == 404 and isinstance(missing.parsed, Problem), "404 problem")
    check(missing.parsed.type_.value == "urn:loupe:problem:not-found", f"404 type {missing.parsed}")
    print(f"python client: ok ({len(providers)} providers)")


if __name__ == "__main__":
    main()
