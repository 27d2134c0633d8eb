// An agent loop on a Loupe thread with the openai SDK's Chat Completions and a read_file tool,
// calling Loupe through the client generated from openapi/openapi.json (openapi-fetch).
//
//   npm ci && npm run build
//   node out/chat_loop.js THREAD_ID "Read notes.txt and sum it up"   # a new turn
//   node out/chat_loop.js THREAD_ID                                   # resume after a crash
//
// Environment: LOUPE_URL (default http://127.0.0.1:8080), LOUPE_API_KEY in keyed mode,
// OPENAI_API_KEY (OPENAI_BASE_URL for another endpoint), OPENAI_MODEL, WORKSPACE (the folder
// read_file reads). What to store and why: docs/INTEGRATING.md.
import { readFileSync, statSync } from "node:fs";
import { resolve, sep } from "node:path";
import OpenAI from "openai";
import type { ChatCompletion, ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";
import createClient from "openapi-fetch";
import type { components, paths } from "./loupe.js";

type Entry = components["schemas"]["Entry"];
const MODEL = process.env.OPENAI_MODEL ?? "gpt-4.1";
const WORKSPACE = resolve(process.env.WORKSPACE ?? ".");
const openai = new OpenAI();
const loupe = createClient<paths>({
  baseUrl: process.env.LOUPE_URL ?? "http://127.0.0.1:8080",
  headers: process.env.LOUPE_API_KEY ? { Authorization: `Bearer ${process.env.LOUPE_API_KEY}` } : {},
  // A 429 or 503 from Loupe says when to try again (Retry-After).
  fetch: async (request: Request): Promise<Response> => {
    for (let attempt = 1; ; attempt++) {
      const response = await fetch(request.clone());
      if (![429, 503].includes(response.status) || attempt === 5) return response;
      await new Promise((r) => setTimeout(r, 1000 * Number(response.headers.get("Retry-After") ?? 1)));
    }
  },
});

const READ_FILE: ChatCompletionTool = {
  type: "function",
  function: {
    name: "read_file",
    description: "Read a text file of the workspace, given its path relative to the workspace.",
    parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  },
};

async function append(thread: string, messages: Entry[], expected_next_seq?: number): Promise<boolean> {
  const { error, response } = await loupe.POST("/v1/threads/{thread_id}/messages", {
    params: { path: { thread_id: thread } },
    body: { messages, expected_next_seq },
  });
  if (response.status === 409 && error?.type.endsWith("seq-conflict")) return false; // another writer
  if (error) throw new Error(`append: ${response.status} ${error.detail}`);
  return true;
}

// The response as one assistant entry: text and calls as blocks, with its id, model and usage.
function storedEntry(completion: ChatCompletion): Entry {
  const { message, finish_reason } = completion.choices[0];
  const calls = (message.tool_calls ?? []).flatMap((c) => (c.type === "function" ? [c] : []));
  const content = [
    ...(message.content ? [{ type: "text", text: message.content }] : []),
    ...calls.map((c) => ({ type: "tool_use", id: c.id, name: c.function.name, input: JSON.parse(c.function.arguments) })),
  ];
  // Chat's usage as the SDK returns it (Loupe counts prompt_tokens and completion_tokens), spread
  // into a plain object: Loupe's generated type for it is an open object, the SDK's an interface.
  const usage = completion.usage && { ...completion.usage };
  return { uuid: completion.id, type: "assistant",
    message: { role: "assistant", id: completion.id, model: completion.model, content, stop_reason: finish_reason, usage } };
}

// The tool's result text and whether it is an error. Loupe answers its own tools.
async function runTool(thread: string, name: string, args: Record<string, unknown>): Promise<[string, boolean]> {
  const params = { path: { thread_id: thread } };
  if (name === "zoom" || name === "search") {
    const { data, error } = name === "zoom"
      ? await loupe.POST("/v1/threads/{thread_id}/zoom", { params, body: args as { id: number; n: number } })
      : await loupe.POST("/v1/threads/{thread_id}/search", { params, body: args as { query: string } });
    return data ? [data.content, data.is_error] : [error?.detail ?? "the tool failed", true];
  }
  const path = resolve(WORKSPACE, String(args.path ?? ""));
  if (name !== "read_file" || !path.startsWith(WORKSPACE + sep) || !statSync(path, { throwIfNoEntry: false })?.isFile()) {
    return [`Error: no such file ${JSON.stringify(args.path)}`, true];
  }
  return [readFileSync(path, "utf8").slice(0, 100_000), false];
}

async function main(): Promise<void> {
  const [thread, ...words] = process.argv.slice(2);
  // Clearing: old tool results become stubs naming the zoom that reads them whole, in batches.
  const created = await loupe.POST("/v1/threads", { body: { id: thread } });
  if (created.response.status === 201) {
    const { error } = await loupe.PUT("/v1/threads/{thread_id}/settings", {
      params: { path: { thread_id: thread } }, body: { clearing: { enabled: true } } });
    if (error) throw new Error(`settings: ${error.detail}`);
  }
  if (words.length > 0) await append(thread, [{ type: "user", message: { role: "user", content: words.join(" ") } }]);

  for (let step = 0; step < 20; step++) {
    const { data: context, error } = await loupe.GET("/v1/threads/{thread_id}/context", {
      params: { path: { thread_id: thread }, query: { provider: "openai", model: MODEL } } });
    if (!context) throw new Error(`context: ${error?.detail}`);
    const completion = await openai.chat.completions.create({
      model: MODEL,
      messages: context.messages as unknown as ChatCompletionMessageParam[],
      tools: [READ_FILE, ...(context.tools as unknown as ChatCompletionTool[])],
    });
    if (!(await append(thread, [storedEntry(completion)], context.next_seq))) continue; // read again
    const calls = (completion.choices[0].message.tool_calls ?? []).flatMap((c) => (c.type === "function" ? [c] : []));
    if (calls.length === 0) {
      console.log(completion.choices[0].message.content ?? "");
      return;
    }
    if (process.env.EXAMPLE_CRASH_AFTER_TOOL_CALL) process.exit(75); // scripts/examples.sh: die here
    const results = [];
    for (const c of calls) {
      const [text, is_error] = await runTool(thread, c.function.name, JSON.parse(c.function.arguments));
      results.push({ type: "tool_result", tool_use_id: c.id, content: text, is_error });
    }
    await append(thread, [{ uuid: `${completion.id}-results`, type: "user", message: { role: "user", content: results } }]);
  }
  throw new Error("gave up after 20 model calls");
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
