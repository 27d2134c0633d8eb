// The Loupe inspector. Reads everything through the tenant API (/v1/...), with the key kept in
// this tab's sessionStorage in keyed mode. Stored content is only ever inserted as text.
"use strict";

(function () {
  const PAGE = 100;
  const FULL_REFRESH_MS = 3000;
  // A burst of events (an import, a fast agent) redraws once.
  const REDRAW_AFTER_MS = 150;
  const RECONNECT_MS = 2000;
  const KEY_ITEM = "loupe.key";
  const KNOWN_KINDS = ["user", "assistant", "attachment", "system", "progress"];

  const state = {
    threads: [],
    threadsCursor: null,
    threadId: null,
    // First seq of the page shown; null follows the latest entries.
    pageStart: null,
    messageCount: null,
    updatedAt: null,
    lastFullRefresh: 0,
    repairsBySeq: new Map(),
    refreshing: false,
    // The thread's event stream: its abort controller, and the last event id received.
    stream: null,
    lastEventId: null,
    redrawTimer: null,
    economicsAt: 0,
    economicsThread: null,
    economicsTimer: null,
  };

  const $ = (id) => document.getElementById(id);

  // Builds an element; strings become text nodes, never markup.
  function h(tag, attrs, ...children) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") element.className = value;
      else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
      else element.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  function setStatus(text, isError) {
    const status = $("status");
    status.textContent = text;
    status.classList.toggle("error", Boolean(isError));
  }

  function key() {
    return sessionStorage.getItem(KEY_ITEM);
  }

  class ApiFailure extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || "HTTP " + status);
      this.status = status;
      this.problem = problem;
    }
  }

  async function api(path, options) {
    const headers = { Accept: "application/json" };
    const token = key();
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method: "GET", headers, cache: "no-store" };
    if (options && options.body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    const response = await fetch(path, init);
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      if (response.status === 401 && document.body.dataset.mode === "keyed") {
        setStatus("This page needs a valid API key: enter one above.", true);
      }
      throw new ApiFailure(response.status, body);
    }
    return body;
  }

  const enc = encodeURIComponent;
  const threadPath = (suffix) => "/v1/threads/" + enc(state.threadId) + (suffix || "");

  function time(value) {
    if (!value) return "";
    const date = new Date(value);
    return isNaN(date) ? String(value) : date.toISOString().replace("T", " ").replace("Z", " UTC");
  }

  function json(value) {
    return JSON.stringify(value, null, 2);
  }

  // ---- Threads -------------------------------------------------------------------------------

  async function loadThreads(more) {
    let path = "/v1/threads?limit=200";
    if (more && state.threadsCursor) path += "&cursor=" + enc(state.threadsCursor);
    const page = await api(path);
    state.threads = more ? state.threads.concat(page.threads) : page.threads;
    state.threadsCursor = page.next_cursor || null;
    $("threads-more").hidden = !state.threadsCursor;
    renderThreads();
  }

  function renderThreads() {
    const needle = $("thread-search").value.trim().toLowerCase();
    const list = $("thread-list");
    list.replaceChildren();
    for (const thread of state.threads) {
      const metadata = JSON.stringify(thread.metadata || {});
      const haystack = (thread.id + " " + metadata).toLowerCase();
      if (needle && !haystack.includes(needle)) continue;
      const current = thread.id === state.threadId;
      list.append(
        h(
          "li",
          {},
          h(
            "button",
            {
              type: "button",
              class: "thread-button",
              "data-thread": thread.id,
              "aria-current": current ? "true" : null,
              onclick: () => openThread(thread.id),
            },
            h("span", { class: "thread-id" }, thread.id),
            h("span", { class: "muted" }, thread.message_count + " entries"),
            metadata !== "{}" ? h("span", { class: "muted small" }, metadata) : null,
            thread.forked_from
              ? h("span", { class: "muted small" }, "fork of " + thread.forked_from.thread_id + " at seq " + thread.forked_from.at_seq)
              : null
          )
        )
      );
    }
    if (!list.children.length) list.append(h("li", { class: "muted" }, "No thread matches."));
  }

  // ---- A thread --------------------------------------------------------------------------------

  async function openThread(id) {
    state.threadId = id;
    state.pageStart = null;
    state.messageCount = null;
    state.updatedAt = null;
    if (location.hash !== "#thread=" + enc(id)) history.replaceState(null, "", "#thread=" + enc(id));
    renderThreads();
    $("thread-title").textContent = "Thread " + id;
    $("outline-lines").replaceChildren();
    follow(id);
    await refreshAll();
    $("thread").focus();
  }

  async function refreshAll() {
    if (!state.threadId) return;
    state.lastFullRefresh = Date.now();
    try {
      const thread = await api(threadPath());
      state.messageCount = thread.message_count;
      state.updatedAt = thread.updated_at;
      $("thread-meta").textContent =
        thread.message_count +
        " entries · created " +
        time(thread.created_at) +
        " · updated " +
        time(thread.updated_at) +
        " · metadata " +
        JSON.stringify(thread.metadata || {});
      await renderLineage(thread);
      // The context first: the history highlights its repairs.
      const results = await Promise.allSettled([loadContext()]);
      const later = await Promise.allSettled([loadHistory(), loadOutline(), loadWork(), refreshEconomics()]);
      const failed = results.find((result) => result.status === "rejected");
      const economics = later[3].status === "rejected" ? later[3].reason : null;
      if (failed) setStatus("Context: " + failed.reason.message, true);
      else if (economics) setStatus("Economics: " + economics.message, true);
      else setStatus("Up to date · " + new Date().toLocaleTimeString());
    } catch (error) {
      setStatus(error.message, true);
    }
  }

  // ---- History ---------------------------------------------------------------------------------

  function pageStartFor() {
    if (state.pageStart !== null) return state.pageStart;
    return Math.max(0, (state.messageCount || 0) - PAGE);
  }

  async function loadHistory() {
    const start = pageStartFor();
    let path = threadPath("/messages?limit=" + PAGE);
    if (start > 0) path += "&after_seq=" + (start - 1);
    const page = await api(path);
    renderEntries(page.messages);
    const last = page.messages.length ? page.messages[page.messages.length - 1].seq : start - 1;
    $("page-range").textContent = page.messages.length
      ? "seq " + start + "–" + last + " of " + page.next_seq
      : "no entries";
    $("page-seq").value = start;
    $("page-prev").disabled = start === 0;
    $("page-first").disabled = start === 0;
    $("page-next").disabled = last + 1 >= page.next_seq;
    $("page-last").disabled = last + 1 >= page.next_seq;
  }

  function goToPage(start) {
    const total = state.messageCount || 0;
    const latest = Math.max(0, total - PAGE);
    state.pageStart = start >= latest ? null : Math.max(0, start);
    loadHistory().catch((error) => setStatus(error.message, true));
  }

  function blockView(block, results) {
    if (typeof block !== "object" || block === null) return h("p", { class: "text" }, String(block));
    switch (block.type) {
      case "text":
        return h("p", { class: "text" }, block.text || "");
      case "thinking":
      case "redacted_thinking":
        return h(
          "details",
          { class: "thinking" },
          h("summary", {}, block.type === "thinking" ? "Thinking" : "Redacted thinking"),
          h("pre", {}, block.thinking || block.data || "")
        );
      case "tool_use":
      case "server_tool_use":
      case "mcp_tool_use": {
        const result = results.get(block.id);
        return h(
          "details",
          { class: "tool-call", "data-tool-use": block.id, open: true },
          h("summary", {}, "Tool call " + (block.name || "?") + " · " + (block.id || "")),
          h("pre", {}, json(block.input)),
          result
            ? h("p", { class: "muted" }, "Result at seq " + result.seq + (result.block.is_error ? " (error)" : ""))
            : h("p", { class: "muted" }, "No result on this page")
        );
      }
      case "tool_result":
        return h(
          "details",
          { class: "tool-result" + (block.is_error ? " is-error" : ""), "data-tool-result": block.tool_use_id, open: true },
          h("summary", {}, "Tool result · " + (block.tool_use_id || "") + (block.is_error ? " · error" : "")),
          typeof block.content === "string"
            ? h("pre", {}, block.content)
            : (block.content || []).map((inner) => blockView(inner, results))
        );
      case "image":
      case "document": {
        const source = block.source || {};
        const name = block.title || block.name || source.media_type || source.type || "";
        return h("p", { class: "media" }, (block.type === "image" ? "Image" : "Document") + (name ? ": " + name : ""));
      }
      default:
        return h(
          "details",
          { class: "muted-block" },
          h("summary", {}, "Block " + (block.type || "?")),
          h("pre", {}, json(block))
        );
    }
  }

  function entryBody(entry, results) {
    const message = entry.message;
    if (message) {
      const content = message.content;
      if (typeof content === "string") return [h("p", { class: "text" }, content)];
      return (content || []).map((block) => blockView(block, results));
    }
    const parts = [];
    if (entry.content !== undefined) {
      parts.push(h("pre", {}, typeof entry.content === "string" ? entry.content : json(entry.content)));
    }
    if (entry.compact_metadata) parts.push(h("pre", { class: "muted" }, json(entry.compact_metadata)));
    if (!parts.length) parts.push(h("details", {}, h("summary", {}, "Entry"), h("pre", {}, json(entry))));
    return parts;
  }

  function renderEntries(entries) {
    // Tool results on this page, by the tool_use id they answer, to pair them with their calls.
    const results = new Map();
    for (const entry of entries) {
      const content = entry.message && entry.message.content;
      if (!Array.isArray(content)) continue;
      for (const block of content) {
        if (block && block.type === "tool_result") results.set(block.tool_use_id, { seq: entry.seq, block });
      }
    }
    const list = $("entries");
    list.replaceChildren();
    let lastResponseId = null;
    let unsent = 0;
    for (const entry of entries) {
      const kind = entry.type;
      const known = KNOWN_KINDS.includes(kind);
      const boundary = kind === "system" && entry.subtype === "compact_boundary";
      // A round starts at an assistant response with a new id (the same rule as /rounds).
      const responseId = kind === "assistant" && entry.message ? entry.message.id || null : null;
      const roundStart = kind === "assistant" && (responseId === null || responseId !== lastResponseId);
      if (kind === "assistant") lastResponseId = responseId;
      const classes = ["entry", "kind-" + (known ? kind : "unknown")];
      if (!known || kind === "system" || kind === "progress" || entry.is_meta) classes.push("muted-entry");
      if (!sentToModel(entry) && !boundary && entry.subtype !== "snip") {
        classes.push("unsent");
        unsent += 1;
      }
      if (boundary) classes.push("boundary");
      if (entry.is_compact_summary) classes.push("summary");
      if (roundStart) classes.push("round-start");
      const repairs = state.repairsBySeq.get(entry.seq) || [];
      if (repairs.length) classes.push("repaired");
      const tags = [];
      if (boundary) tags.push(h("span", { class: "tag tag-boundary" }, "compact boundary"));
      if (entry.is_compact_summary) tags.push(h("span", { class: "tag tag-summary" }, "summary"));
      if (roundStart) tags.push(h("span", { class: "tag" }, "round"));
      if (entry.is_meta) tags.push(h("span", { class: "tag" }, "meta"));
      if (entry.subtype && !boundary) tags.push(h("span", { class: "tag" }, entry.subtype));
      list.append(
        h(
          "li",
          { class: classes.join(" "), "data-seq": entry.seq, id: "seq-" + entry.seq },
          h(
            "div",
            { class: "entry-head" },
            h("span", { class: "seq" }, "#" + entry.seq),
            h("span", { class: "kind" }, known ? kind : kind + " (unknown kind)"),
            tags,
            h("span", { class: "uuid muted small" }, entry.uuid || ""),
            entryTime(entry)
          ),
          repairs.length
            ? h(
                "ul",
                { class: "repair-notes", "aria-label": "Repairs of this entry" },
                repairs.map((repair) => h("li", { class: "repair-note" }, h("strong", {}, repair.kind), " — " + repair.detail))
              )
            : null,
          entryBody(entry, results)
        )
      );
    }
    if (!entries.length) list.append(h("li", { class: "muted" }, "No entries."));
    list.dataset.unsent = String(unsent);
    $("hide-unsent-label").textContent =
      "Hide what no model sees (" + unsent + " of " + entries.length + " entries on this page: progress, bookkeeping, unknown kinds)";
    applyHideUnsent();
  }

  // Whether an entry ever reaches the model: the rule of the service's `history::visibility`
  // (`is_sent_to_model`), which the messages API does not answer per entry.
  function sentToModel(entry) {
    if (entry.is_virtual || entry.erased || (entry.type === "assistant" && entry.is_api_error)) return false;
    switch (entry.type) {
      case "user":
      case "assistant":
      case "attachment":
        return Boolean(entry.message);
      case "system":
        return entry.subtype === "local_command";
      default:
        return false;
    }
  }

  function applyHideUnsent() {
    $("entries").classList.toggle("hide-unsent", $("hide-unsent").checked);
  }

  // When the entry happened, from its own `timestamp`; else when Loupe stored it, said so.
  function entryTime(entry) {
    if (entry.timestamp) {
      return h(
        "time",
        { class: "small entry-time", datetime: entry.timestamp, title: "When it happened (the entry's own timestamp)" },
        time(entry.timestamp)
      );
    }
    return h(
      "time",
      { class: "muted small stored-time", datetime: entry.created_at || "", title: "When Loupe stored it (the entry has no timestamp)" },
      "stored " + time(entry.created_at)
    );
  }

  // ---- Economics -------------------------------------------------------------------------------

  const SVG_NS = "http://www.w3.org/2000/svg";
  // Pages of 10,000 points read at most: 50,000 requests, far more than a chart can show apart.
  const MAX_ECONOMICS_PAGES = 5;
  const ECONOMICS_REFRESH_MS = 5000;
  const CHART = { width: 1100, height: 250, left: 60, right: 150, top: 14, bottom: 38 };
  const MARKER_KINDS = [
    { kind: "compaction", label: "compact boundary" },
    { kind: "clearing", label: "clearing batch" },
    { kind: "outline", label: "outline boundary (current)" },
  ];

  // Builds an SVG element; strings become text nodes.
  function svg(tag, attrs, ...children) {
    const element = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) element.setAttribute(name, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  const number = (value) => Math.round(value).toLocaleString("en-US");

  // 1,234 → "1.2k", 2,500,000 → "2.5M": axis labels stay short.
  function short(value) {
    const units = [[1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [size, unit] of units) {
      if (Math.abs(value) >= size) return (value / size).toFixed(value % size === 0 ? 0 : 1) + unit;
    }
    return String(Math.round(value));
  }

  // A step of 1, 2, 2.5 or 5 × 10^k that cuts `span` into about `count` parts.
  function niceStep(span, count) {
    const raw = Math.max(span / count, 1e-9);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].find((m) => m * power >= raw);
    return step * power;
  }

  function windowTokens() {
    const value = Math.round(Number($("window-tokens").value));
    return Math.min(10000000, Math.max(1000, Number.isFinite(value) && value > 0 ? value : 200000));
  }

  // The economics read folds the whole thread: a thread that keeps growing is read again at most
  // every ECONOMICS_REFRESH_MS, not at every poll.
  function refreshEconomics() {
    const due = state.economicsAt + ECONOMICS_REFRESH_MS - Date.now();
    if (state.economicsThread === state.threadId && due > 0) {
      if (!state.economicsTimer) {
        state.economicsTimer = setTimeout(() => {
          state.economicsTimer = null;
          refreshEconomics().catch((error) => setStatus("Economics: " + error.message, true));
        }, due);
      }
      return Promise.resolve();
    }
    state.economicsAt = Date.now();
    state.economicsThread = state.threadId;
    return loadEconomics();
  }

  async function loadEconomics() {
    const base = "/economics?limit=10000&window_tokens=" + windowTokens();
    let answer = await api(threadPath(base));
    const points = answer.points.slice();
    const markers = answer.markers.slice();
    for (let pages = 1; answer.truncated && pages < MAX_ECONOMICS_PAGES; pages += 1) {
      answer = await api(threadPath(base + "&after_seq=" + answer.next_after_seq));
      points.push(...answer.points);
      markers.push(...answer.markers);
    }
    renderEconomics(Object.assign({}, answer, { points, markers }));
  }

  function renderEconomics(economics) {
    const points = economics.points;
    const last = points.length ? points[points.length - 1] : null;
    const reportedCost = last && last.cost.reported !== null ? last.cost.reported : null;
    const modelled = last ? last.cost.auto_compaction : null;
    const parts = [
      points.length + " requests",
      "mode " + economics.mode,
      economics.auto_compact_tokens > 0
        ? "automatic compaction at " + number(economics.auto_compact_tokens) + " tokens"
        : "automatic compaction off",
    ];
    if (reportedCost !== null && modelled) {
      parts.push(
        "input cost " + number(reportedCost) + " reported, " + number(modelled) + " modelled under automatic compaction (reported ÷ modelled " +
          (reportedCost / modelled).toFixed(2) + ")"
      );
    }
    if (economics.truncated) parts.push("the first " + points.length + " requests only");
    $("economics-summary").textContent = parts.join(" · ");

    const xMax = Math.max(economics.next_seq, last ? last.seq + 1 : 1);
    const markers = economics.markers;
    drawChart($("size-chart"), $("size-legend"), {
      name: "size",
      label: "Context size per request, in tokens",
      fit: $("economics-fit").checked,
      xMax,
      markers,
      series: [
        {
          key: "estimate",
          label: "Loupe's estimate before the request",
          values: points.map((p) => ({ seq: p.seq, value: p.estimate.tokens, note: p.estimate.basis })),
        },
        {
          key: "reported",
          label: "prompt the response reports",
          values: points
            .filter((p) => p.reported)
            .map((p) => ({ seq: p.seq, value: p.reported.prompt_tokens, note: "output " + number(p.reported.output_tokens) })),
        },
      ],
      lines: [
        { key: "window", label: "model window " + short(economics.window_tokens), value: economics.window_tokens },
        economics.auto_compact_tokens > 0
          ? { key: "threshold", label: "auto-compaction " + short(economics.auto_compact_tokens), value: economics.auto_compact_tokens }
          : null,
      ].filter(Boolean),
    });
    drawChart($("cost-chart"), $("cost-legend"), {
      name: "cost",
      label: "Cumulative input cost per request, in token-units",
      xMax,
      markers,
      series: [
        {
          key: "cost-reported",
          label: "reported (mode " + economics.mode + ")",
          values: points.filter((p) => p.cost.reported !== null).map((p) => ({ seq: p.seq, value: p.cost.reported })),
        },
        {
          key: "cost-modelled",
          label: "modelled automatic compaction (" + short(economics.modelled_summary_tokens) + "-token summary)",
          values: points.map((p) => ({ seq: p.seq, value: p.cost.auto_compaction })),
        },
      ],
      lines: [],
    });
  }

  // One chart: series of points by seq, horizontal reference lines, vertical markers. The scale
  // is on the element (`data-*`), so a reader, or a test, can tell what a position means.
  function drawChart(container, legend, spec) {
    const { width, height, left, right, top, bottom } = CHART;
    const plotWidth = width - left - right;
    const plotHeight = height - top - bottom;
    // Scaled to the requests, reference lines above them are named instead of drawn.
    const data = spec.series.flatMap((s) => s.values.map((v) => v.value));
    const fit = spec.fit && data.length > 0;
    const dataMax = Math.max(1, ...data);
    const lines = fit ? spec.lines.filter((l) => l.value <= dataMax) : spec.lines;
    const offScale = fit ? spec.lines.filter((l) => l.value > dataMax) : [];
    const values = data.concat(lines.map((l) => l.value));
    const step = niceStep(Math.max(1, ...values), 5);
    const yMax = step * Math.max(1, Math.ceil((Math.max(1, ...values) * 1.04) / step));
    const xMin = 0;
    const xMax = Math.max(spec.xMax, 1);
    const x = (seq) => left + ((seq - xMin) / (xMax - xMin)) * plotWidth;
    const y = (value) => top + plotHeight - (value / yMax) * plotHeight;
    const fixed = (value) => value.toFixed(2);
    const root = svg("svg", {
      class: "chart-svg chart-" + spec.name,
      viewBox: "0 0 " + width + " " + height,
      role: "img",
      "aria-label": spec.label,
      "data-x-min": xMin,
      "data-x-max": xMax,
      "data-y-max": yMax,
      "data-plot-left": left,
      "data-plot-top": top,
      "data-plot-width": plotWidth,
      "data-plot-height": plotHeight,
      "data-points": spec.series[0].values.length,
    });
    // Grid and axes.
    const grid = svg("g", { class: "grid" });
    for (let value = 0; value <= yMax + step / 2; value += step) {
      grid.append(
        svg("line", { class: "grid-line", x1: left, x2: left + plotWidth, y1: fixed(y(value)), y2: fixed(y(value)) }),
        svg("text", { class: "tick", x: left - 8, y: fixed(y(value) + 4), "text-anchor": "end" }, short(value))
      );
    }
    const xStep = Math.max(1, niceStep(xMax - xMin, 8));
    for (let seq = xMin; seq <= xMax; seq += xStep) {
      grid.append(
        svg("line", { class: "axis-tick", x1: fixed(x(seq)), x2: fixed(x(seq)), y1: top + plotHeight, y2: top + plotHeight + 5 }),
        svg("text", { class: "tick", x: fixed(x(seq)), y: top + plotHeight + 18, "text-anchor": "middle" }, short(seq))
      );
    }
    grid.append(
      svg("line", { class: "axis", x1: left, x2: left + plotWidth, y1: top + plotHeight, y2: top + plotHeight }),
      svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: top + plotHeight }),
      svg("text", { class: "axis-title", x: left + plotWidth / 2, y: height - 4, "text-anchor": "middle" }, "seq (entries of the thread)")
    );
    root.append(grid);
    // Markers under the series.
    const marks = svg("g", { class: "marks" });
    for (const marker of spec.markers) {
      const label = (MARKER_KINDS.find((k) => k.kind === marker.kind) || { label: marker.kind }).label;
      marks.append(
        svg(
          "line",
          {
            class: "mark mark-" + marker.kind,
            "data-seq": marker.seq,
            x1: fixed(x(marker.seq)),
            x2: fixed(x(marker.seq)),
            y1: top,
            y2: top + plotHeight,
          },
          svg("title", {}, label + " at seq " + marker.seq)
        )
      );
    }
    root.append(marks);
    // Named in the right margin, where their lines would be labelled, an arrow saying they are
    // above the scale.
    offScale.forEach((line, index) => {
      root.append(
        svg("text", { class: "off-scale", x: left + plotWidth + 6, y: top + 4 + index * 16 }, "↑ " + line.label)
      );
    });
    // Reference lines, labelled at their right end.
    for (const line of lines) {
      root.append(
        svg(
          "g",
          { class: "ref ref-" + line.key, "data-tokens": line.value },
          svg("line", { x1: left, x2: left + plotWidth, y1: fixed(y(line.value)), y2: fixed(y(line.value)) }),
          svg("text", { x: left + plotWidth + 6, y: fixed(y(line.value) + 4) }, line.label)
        )
      );
    }
    // The series: a path through the points, and each point drawn (circles, then squares).
    spec.series.forEach((series, index) => {
      const group = svg("g", { class: "series series-" + series.key });
      const d = series.values.map((v, i) => (i ? "L" : "M") + fixed(x(v.seq)) + " " + fixed(y(v.value))).join(" ");
      if (d) group.append(svg("path", { class: "series-line", d }));
      for (const v of series.values) {
        const title = svg("title", {}, "seq " + v.seq + ": " + number(v.value) + (v.note ? " (" + v.note + ")" : ""));
        const attrs = { class: "pt pt-" + series.key, "data-seq": v.seq, "data-value": v.value };
        if (index === 0) {
          group.append(svg("circle", Object.assign(attrs, { cx: fixed(x(v.seq)), cy: fixed(y(v.value)), r: 3.5 }), title));
        } else {
          group.append(
            svg("rect", Object.assign(attrs, { x: fixed(x(v.seq) - 3), y: fixed(y(v.value) - 3), width: 6, height: 6 }), title)
          );
        }
      }
      root.append(group);
    });
    // Only a chart with no point at all has no request to show (a thread that reported no
    // usage still has its modelled points).
    if (spec.series.every((series) => !series.values.length)) {
      root.append(svg("text", { class: "empty", x: left + plotWidth / 2, y: top + plotHeight / 2, "text-anchor": "middle" }, "No request in this thread yet."));
    }
    container.replaceChildren(root);

    // The legend: a swatch drawn like the element it names.
    const swatch = (...children) => svg("svg", { class: "swatch", viewBox: "0 0 28 12", width: 28, height: 12, "aria-hidden": "true" }, ...children);
    const items = [];
    spec.series.forEach((series, index) => {
      const point =
        index === 0
          ? svg("circle", { class: "pt pt-" + series.key, cx: 14, cy: 6, r: 3.5 })
          : svg("rect", { class: "pt pt-" + series.key, x: 11, y: 3, width: 6, height: 6 });
      items.push(
        h(
          "li",
          { "data-key": series.key },
          swatch(svg("g", { class: "series series-" + series.key }, svg("path", { class: "series-line", d: "M1 6 L27 6" }), point)),
          series.label + " (" + series.values.length + ")"
        )
      );
    });
    for (const line of spec.lines) {
      items.push(
        h("li", { "data-key": line.key }, swatch(svg("g", { class: "ref ref-" + line.key }, svg("line", { x1: 1, x2: 27, y1: 6, y2: 6 }))), line.label)
      );
    }
    for (const { kind, label } of MARKER_KINDS) {
      const count = spec.markers.filter((m) => m.kind === kind).length;
      items.push(
        h(
          "li",
          { "data-key": "mark-" + kind, class: count ? null : "absent" },
          swatch(svg("line", { class: "mark mark-" + kind, x1: 1, x2: 27, y1: 6, y2: 6 })),
          label + " (" + count + ")"
        )
      );
    }
    legend.replaceChildren(...items);
  }

  // ---- Context ---------------------------------------------------------------------------------

  async function loadContext() {
    const provider = $("provider").value;
    const context = await api(threadPath("/context?provider=" + enc(provider)));
    state.repairsBySeq = new Map();
    for (const repair of context.repairs || []) {
      for (const seq of repair.seqs || []) {
        if (!state.repairsBySeq.has(seq)) state.repairsBySeq.set(seq, []);
        state.repairsBySeq.get(seq).push(repair);
      }
    }
    $("context-summary").textContent =
      (context.messages || []).length +
      " messages · about " +
      context.estimated_tokens +
      " tokens" +
      (context.boundary !== null && context.boundary !== undefined ? " · from the compact boundary at seq " + context.boundary : "");
    const repairs = $("repairs");
    repairs.replaceChildren();
    for (const repair of context.repairs || []) {
      repairs.append(
        h(
          "li",
          { class: "repair", "data-kind": repair.kind },
          h("strong", {}, repair.kind),
          " ",
          repair.detail,
          " ",
          (repair.seqs || []).map((seq) =>
            h("button", { type: "button", class: "link", onclick: () => showSeq(seq) }, "seq " + seq)
          )
        )
      );
    }
    if (!repairs.children.length) repairs.append(h("li", { class: "muted" }, "None: the history is sent as stored."));
    const messages = $("context-messages");
    messages.replaceChildren();
    (context.messages || []).forEach((message, index) => {
      const isSummary = index === 0 && context.boundary !== null && context.boundary !== undefined;
      const content = message.content;
      const body =
        typeof content === "string"
          ? [h("p", { class: "text" }, content)]
          : Array.isArray(content)
          ? content.map((block) => blockView(block, new Map()))
          : [];
      if (message.tool_calls) body.push(h("pre", {}, json(message.tool_calls)));
      messages.append(
        h(
          "li",
          { class: "context-message" + (isSummary ? " summary" : "") },
          h("div", { class: "entry-head" }, h("span", { class: "kind" }, message.role), isSummary ? h("span", { class: "tag tag-summary" }, "summary after the boundary") : null),
          body
        )
      );
    });
  }

  async function showSeq(seq) {
    goToPage(Math.floor(seq / PAGE) * PAGE);
    setTimeout(() => {
      const target = $("seq-" + seq);
      if (target) {
        target.scrollIntoView({ block: "center" });
        target.classList.add("flash");
      }
    }, 300);
  }

  // ---- Outline ---------------------------------------------------------------------------------

  async function loadOutline() {
    const outline = await api(threadPath("/outline"));
    const build = outline.build || {};
    $("outline-status").textContent =
      (outline.options && outline.options.enabled === false ? "Outline mode is off · " : "") +
      (outline.boundary > 0 ? "covers seq 0–" + (outline.boundary - 1) : "covers no entry yet") +
      " · version " +
      outline.version +
      " · build: " +
      (build.last_job_state || "no job yet") +
      ", " +
      build.nodes +
      " nodes" +
      (build.last_error ? " · last error: " + build.last_error : "");
    const list = $("outline-lines");
    const version = String(outline.version);
    // Keep lines the reader opened while the outline is unchanged.
    if (list.dataset.version === version && list.children.length) return;
    list.dataset.version = version;
    list.replaceChildren(...outline.lines.map(lineView));
    if (!outline.lines.length) list.append(h("li", { class: "muted" }, "No lines yet."));
  }

  function lineView(line) {
    const label = line.id + "+" + line.n;
    const zoomed = h("div", { class: "zoomed", hidden: true });
    const button = h(
      "button",
      {
        type: "button",
        class: "line",
        "data-line": label,
        "aria-expanded": "false",
        onclick: async () => {
          const open = button.getAttribute("aria-expanded") === "true";
          if (open) {
            button.setAttribute("aria-expanded", "false");
            zoomed.hidden = true;
            return;
          }
          try {
            const answer = await api(threadPath("/zoom"), { body: { id: line.id, n: line.n } });
            zoomed.replaceChildren(zoomView(answer));
            zoomed.hidden = false;
            button.setAttribute("aria-expanded", "true");
          } catch (error) {
            setStatus("Zoom: " + error.message, true);
          }
        },
      },
      h("span", { class: "line-id" }, label),
      " ",
      line.text
    );
    return h("li", {}, button, zoomed);
  }

  function zoomView(answer) {
    if (answer.is_error) return h("p", { class: "error" }, answer.content);
    if (answer.lines && answer.lines.length) return h("ul", { class: "outline" }, answer.lines.map(lineView));
    return h("pre", { class: "zoom-message" }, answer.content);
  }

  // ---- Jobs and cursors ------------------------------------------------------------------------

  async function loadWork() {
    const [jobs, cursors] = await Promise.all([api(threadPath("/jobs")), api(threadPath("/cursors"))]);
    const jobRows = $("jobs").tBodies[0];
    jobRows.replaceChildren(
      ...jobs.jobs.map((job) =>
        h(
          "tr",
          { class: "job-" + job.state },
          h("td", {}, job.kind),
          h("td", {}, job.state),
          h("td", {}, job.attempts + " / " + job.max_attempts),
          h("td", {}, job.last_error || "")
        )
      )
    );
    if (!jobs.jobs.length) jobRows.append(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No jobs.")));
    const cursorRows = $("cursors").tBodies[0];
    cursorRows.replaceChildren(
      ...cursors.cursors.map((cursor) =>
        h(
          "tr",
          {},
          h("td", {}, cursor.name),
          h("td", {}, cursor.bookmark ? "after seq " + cursor.bookmark.seq : "not advanced yet"),
          h("td", {}, cursor.new_count + " new, " + cursor.pending_entries + " entries"),
          h("td", {}, cursor.lease_expires_at ? "leased until " + time(cursor.lease_expires_at) : "free")
        )
      )
    );
    if (!cursors.cursors.length) cursorRows.append(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No cursors.")));
  }

  // ---- Lineage -------------------------------------------------------------------------------

  function threadLink(id) {
    return h("button", { type: "button", class: "link", "data-thread": id, onclick: () => openThread(id) }, id);
  }

  async function renderLineage(thread) {
    const parts = [];
    if (thread.forked_from) {
      parts.push("Forked from ", threadLink(thread.forked_from.thread_id), " at seq " + thread.forked_from.at_seq + ".");
    }
    const forks = await api("/v1/threads?limit=50&forked_from=" + enc(thread.id));
    if (forks.threads.length) {
      if (parts.length) parts.push(" ");
      parts.push("Forks: ");
      forks.threads.forEach((fork, i) => {
        if (i) parts.push(", ");
        parts.push(threadLink(fork.id), " (at seq " + (fork.forked_from ? fork.forked_from.at_seq : "?") + ")");
      });
      if (forks.next_cursor) parts.push(", …");
    }
    $("thread-lineage").replaceChildren(...parts);
    $("thread-lineage").hidden = !parts.length;
  }

  // ---- Live updates ----------------------------------------------------------------------------

  // Follows the thread's event stream (GET /v1/threads/{id}/events, Server-Sent Events) through
  // fetch, which can send the key's Authorization header where EventSource cannot. Each event
  // redraws the thread; a dropped stream resumes after the last event id, missing nothing.
  function follow(id) {
    if (state.stream) state.stream.abort();
    const controller = new AbortController();
    state.stream = controller;
    state.lastEventId = null;
    document.body.dataset.live = "connecting";
    const run = async () => {
      while (!controller.signal.aborted && state.threadId === id) {
        try {
          const ended = await readStream(id, controller);
          if (ended === "deleted") return;
        } catch (error) {
          if (controller.signal.aborted) return;
          document.body.dataset.live = "reconnecting";
        }
        await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
      }
    };
    run();
  }

  async function readStream(id, controller) {
    const headers = { Accept: "text/event-stream" };
    const token = key();
    if (token) headers.Authorization = "Bearer " + token;
    if (state.lastEventId) headers["Last-Event-ID"] = state.lastEventId;
    const response = await fetch("/v1/threads/" + enc(id) + "/events", {
      headers,
      cache: "no-store",
      signal: controller.signal,
    });
    if (!response.ok || !response.body) throw new Error("HTTP " + response.status);
    document.body.dataset.live = "streaming";
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return "closed";
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const event = { type: "message", id: null };
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event.type = line.slice(6).trim();
          else if (line.startsWith("id:")) event.id = line.slice(3).trim();
        }
        if (event.id) state.lastEventId = event.id;
        if (event.type === "deleted") {
          document.body.dataset.live = "deleted";
          setStatus("This thread was deleted.", true);
          return "deleted";
        }
        if (event.type !== "message" || event.id) scheduleRedraw();
      }
    }
  }

  function scheduleRedraw() {
    if (state.redrawTimer) return;
    state.redrawTimer = setTimeout(async () => {
      state.redrawTimer = null;
      await refreshAll();
    }, REDRAW_AFTER_MS);
  }

  // Jobs and the outline move without an event of their own: redrawn now and then.
  async function refreshSlow() {
    if (state.refreshing || !state.threadId || document.hidden) return;
    if (Date.now() - state.lastFullRefresh < FULL_REFRESH_MS) return;
    state.refreshing = true;
    try {
      state.lastFullRefresh = Date.now();
      await Promise.all([loadOutline(), loadWork()]);
    } catch (error) {
      setStatus(error.message, true);
    } finally {
      state.refreshing = false;
    }
  }

  // ---- Start -----------------------------------------------------------------------------------

  function threadFromHash() {
    const match = /^#thread=(.+)$/.exec(location.hash);
    return match ? decodeURIComponent(match[1]) : null;
  }

  async function start() {
    const form = $("key-form");
    if (form) {
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        sessionStorage.setItem(KEY_ITEM, $("key-input").value.trim());
        $("key-input").value = "";
        boot();
      });
      $("key-forget").addEventListener("click", () => {
        sessionStorage.removeItem(KEY_ITEM);
        setStatus("Key forgotten.");
      });
    }
    $("thread-search").addEventListener("input", renderThreads);
    $("threads-more").addEventListener("click", () => loadThreads(true).catch((error) => setStatus(error.message, true)));
    $("provider").addEventListener("change", refreshAll);
    $("hide-unsent").addEventListener("change", applyHideUnsent);
    const redraw = () => loadEconomics().catch((error) => setStatus("Economics: " + error.message, true));
    $("window-tokens").addEventListener("change", redraw);
    $("economics-fit").addEventListener("change", redraw);
    $("page-first").addEventListener("click", () => goToPage(0));
    $("page-prev").addEventListener("click", () => goToPage(pageStartFor() - PAGE));
    $("page-next").addEventListener("click", () => goToPage(pageStartFor() + PAGE));
    $("page-last").addEventListener("click", () => goToPage(Number.MAX_SAFE_INTEGER));
    $("page-seq").addEventListener("change", () => goToPage(Number($("page-seq").value) || 0));
    window.addEventListener("hashchange", () => {
      const id = threadFromHash();
      if (id && id !== state.threadId) openThread(id);
    });
    setInterval(refreshSlow, FULL_REFRESH_MS);
    await boot();
  }

  async function boot() {
    if (document.body.dataset.mode === "keyed" && !key()) {
      setStatus("Enter an API key to read this tenant's threads.");
      return;
    }
    try {
      await loadThreads(false);
      setStatus("Connected.");
      const id = threadFromHash();
      if (id) await openThread(id);
    } catch (error) {
      setStatus(error.message, true);
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
