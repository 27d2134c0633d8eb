// One scenario through the TypeScript client generated from openapi/openapi.json (openapi-typescript
// types, openapi-fetch calls), used untouched and type-checked with `tsc --strict`.
// Usage: node scenario.js BASE_URL DOCUMENT   (LOUPE_API_KEY: a tenant key); see scripts/clients.sh.
import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Entry = components["schemas"]["Entry"];
type Provider = components["schemas"]["Provider"];

function check(condition: boolean, what: string): asserts condition {
  if (!condition) {
    console.error(`typescript client: FAIL: ${what}`);
    process.exit(1);
  }
}

function exchange(tag: string, k: number): Entry[] {
  return [
    {
      uuid: `${tag}-q${k}`,
      type: "user",
      message: { role: "user", content: `Question ${k} about the launch plan and its price` },
    },
    {
      uuid: `${tag}-a${k}`,
      type: "assistant",
      message: {
        role: "assistant",
        id: `msg_${tag}_${k}`,
        content: [{ type: "text", text: `Answer ${k}: the plan holds at 49` }],
      },
    },
  ];
}

async function poll<T>(what: string, read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  for (let attempt = 0; attempt < 150; attempt++) {
    const value = await read();
    if (done(value)) return value;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  check(false, `${what} did not finish`);
}

async function main(): Promise<void> {
  const [base, documentPath] = process.argv.slice(2);
  check(base !== undefined && documentPath !== undefined, "usage: scenario.js BASE_URL DOCUMENT");
  const document = JSON.parse(readFileSync(documentPath, "utf8"));
  const providers: Provider[] = document.components.schemas.Provider.enum;
  const client = createClient<paths>({
    baseUrl: base,
    headers: { Authorization: `Bearer ${process.env.LOUPE_API_KEY ?? ""}` },
  });
  const tag = `ts-${randomUUID().slice(0, 12)}`;

  const newThread = async (id: string): Promise<string> => {
    const { data, response } = await client.POST("/v1/threads", { body: { id } });
    check(response.status === 201 && data !== undefined, `create thread: ${response.status}`);
    return data.id;
  };
  const append = async (thread: string, messages: Entry[]) => {
    const { data, response } = await client.POST("/v1/threads/{thread_id}/messages", {
      params: { path: { thread_id: thread } },
      body: { messages },
    });
    check(response.status === 201 && data !== undefined, `append: ${response.status}`);
    return data;
  };

  // A thread, an append, and the context for every provider the document names.
  const thread = await newThread(tag);
  const stored = await append(thread, [...exchange(tag, 0), ...exchange(tag, 1), ...exchange(tag, 2)]);
  check(stored.next_seq === 6, `append: next_seq ${stored.next_seq}`);
  for (const provider of providers) {
    const { data } = await client.GET("/v1/threads/{thread_id}/context", {
      params: { path: { thread_id: thread }, query: { provider } },
    });
    check(data !== undefined && data.messages.length > 0, `context ${provider}`);
  }

  // Compaction, polled to its end.
  const compact = await client.POST("/v1/threads/{thread_id}/compact", {
    params: { path: { thread_id: thread } },
    body: { keep_recent_rounds: 1 },
  });
  check(compact.data !== undefined, `compact: ${compact.response.status}`);
  const jobId = compact.data.id;
  const job = await poll(
    "the compaction job",
    async () => (await client.GET("/v1/jobs/{job_id}", { params: { path: { job_id: jobId } } })).data,
    (job) => job !== undefined && (job.state === "succeeded" || job.state === "failed"),
  );
  check(job?.state === "succeeded", `compaction: ${job?.state} ${job?.last_error}`);

  // Outline mode on a thread of its own, built by the server's workers, then zoom.
  const outlined = await newThread(`${tag}-outline`);
  const put = await client.PUT("/v1/threads/{thread_id}/settings", {
    params: { path: { thread_id: outlined } },
    body: { outline: { enabled: true, line_bytes: 64, budget_bytes: 4000, tail_tokens: 20 } },
  });
  check(put.data?.effective.outline.enabled === true, "outline on");
  await append(outlined, [0, 1, 2, 3].flatMap((k) => exchange(`${tag}-o`, k)));
  await poll(
    "the outline",
    async () =>
      (await client.GET("/v1/threads/{thread_id}/outline", { params: { path: { thread_id: outlined } } })).data,
    (outline) => outline !== undefined && outline.lines.length > 0,
  );
  const zoomed = await client.POST("/v1/threads/{thread_id}/zoom", {
    params: { path: { thread_id: outlined } },
    body: { id: 0, n: 1 },
  });
  check(zoomed.data?.is_error === false && zoomed.data.content.startsWith("0+1|"), "zoom");

  // A cursor: its count, the pending batch, a claim and the advance under its lease.
  const path = { thread_id: thread, name: "ts-consumer" };
  const cursor = await client.GET("/v1/threads/{thread_id}/cursors/{name}", { params: { path } });
  check((cursor.data?.new_count ?? 0) >= 6, "cursor new_count");
  const pending = await client.GET("/v1/threads/{thread_id}/cursors/{name}/pending", {
    params: { path, query: { limit: 3 } },
  });
  check(pending.data?.entry_count === 3 && pending.data.has_more, "pending: a batch of 3, more to come");
  const claim = await client.POST("/v1/threads/{thread_id}/cursors/{name}/claim", {
    params: { path },
    body: { limit: 3 },
  });
  const lease = claim.data?.lease;
  const to = claim.data?.advance_to;
  check(lease != null && to != null && to === pending.data.advance_to, "claim");
  const advanced = await client.POST("/v1/threads/{thread_id}/cursors/{name}/advance", {
    params: { path },
    body: { to, lease: lease.token },
  });
  check(advanced.data?.moved === true && advanced.data.cursor.bookmark?.uuid === to, "advance");

  // A transcript in its JSON form: exported as an array of entries (asked for with `Accept`; JSON
  // Lines stay the default), imported into another thread, exported again the same.
  const transcript = await newThread(`${tag}-transcript`);
  await append(transcript, [...exchange(`${tag}-t`, 0), ...exchange(`${tag}-t`, 1)]);
  const exportJson = async (thread_id: string): Promise<Entry[]> => {
    const { data, response } = await client.GET("/v1/threads/{thread_id}/export", {
      params: { path: { thread_id } },
      headers: { Accept: "application/json" },
    });
    check(
      response.headers.get("content-type") === "application/json" && Array.isArray(data),
      `export: ${response.status}`,
    );
    return data;
  };
  const entries = await exportJson(transcript);
  check(entries.length === 4, `export: ${entries.length} entries`);
  const copy = await newThread(`${tag}-copy`);
  const imported = await client.POST("/v1/threads/{thread_id}/import", {
    params: { path: { thread_id: copy } },
    body: entries,
  });
  check(imported.data?.stored === 4 && imported.data.refused === 0, `import: ${imported.response.status}`);
  check(JSON.stringify(await exportJson(copy)) === JSON.stringify(entries), "the round trip");

  // A 404 is a problem whose type the client can switch on.
  const missing = await client.GET("/v1/threads/{thread_id}", {
    params: { path: { thread_id: `${tag}-missing` } },
  });
  check(missing.response.status === 404 && missing.error !== undefined, "404");
  const kind: components["schemas"]["Problem"]["type"] = missing.error.type;
  check(kind === "urn:loupe:problem:not-found", `404 type ${kind}`);
  console.log(`typescript client: ok (${providers.length} providers)`);
}

await main();
