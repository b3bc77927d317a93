// A conversation rendered from history-page events: messages, tool calls with their results, turn
// markers and failed turns. Pages arrive newest first when paging back, so the transcript can
// prepend an older page or append newer events; it remembers which seqs it shows.

import { el, formatTime } from "./dom.js";

const SOURCE_NAMES = {
  user: "You",
  coordinator: "Parent agent",
  "subagent-settled": "Subagent notice",
  plugin: "Context",
};

function textOf(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .filter((block) => block && typeof block === "object" && block.type === "text" && typeof block.text === "string")
    .map((block) => block.text)
    .join("");
}

function prettyArguments(raw) {
  if (typeof raw !== "string") return JSON.stringify(raw, null, 2) ?? "";
  try {
    return JSON.stringify(JSON.parse(raw), null, 2);
  } catch {
    return raw;
  }
}

function reasonText(reason) {
  if (!reason || typeof reason !== "object") return "";
  const parts = [String(reason.kind || "ended")];
  // An aborted turn says why in a nested reason: {kind: "user" | "disposed" | ...}.
  if (reason.reason && typeof reason.reason === "object" && reason.reason.kind) parts.push(String(reason.reason.kind));
  const error = reason.error;
  if (error && typeof error === "object") {
    if (error.code) parts.push(String(error.code));
    if (error.message) parts.push(String(error.message));
  }
  return parts.join(" · ");
}

/** Renders events into an `<ol>`; `raw` shows every event as its JSON (the raw log view). */
export class Transcript {
  constructor(list, { raw = false } = {}) {
    this.list = list;
    this.raw = raw;
    this.reset();
  }

  reset() {
    this.list.replaceChildren();
    this.firstSeq = null;
    this.lastSeq = null;
    this.calls = new Map();
  }

  get empty() {
    return this.lastSeq === null;
  }

  /** Append events newer than the ones shown. */
  append(events) {
    const fresh = events.filter((event) => this.lastSeq === null || event.seq > this.lastSeq);
    if (!fresh.length) return 0;
    const nodes = this.build(fresh);
    this.list.append(...nodes);
    if (this.firstSeq === null) this.firstSeq = fresh[0].seq;
    this.lastSeq = fresh[fresh.length - 1].seq;
    return fresh.length;
  }

  /** Prepend an older page (events before the first shown seq). */
  prepend(events) {
    const older = events.filter((event) => this.firstSeq === null || event.seq < this.firstSeq);
    if (!older.length) return 0;
    const nodes = this.build(older);
    this.list.prepend(...nodes);
    this.firstSeq = older[0].seq;
    if (this.lastSeq === null) this.lastSeq = older[older.length - 1].seq;
    return older.length;
  }

  build(events) {
    const nodes = [];
    for (const event of events) {
      const node = this.raw ? this.rawEntry(event) : this.entry(event);
      if (node) nodes.push(node);
    }
    return nodes;
  }

  rawEntry(event) {
    const { data, ...rest } = event;
    return el(
      "li",
      { class: "entry raw", data: { seq: event.seq, type: event.type } },
      el("div", { class: "raw-head" }, el("span", { class: "seq", text: `#${event.seq}` }), el("code", { text: event.type })),
      el("pre", { class: "raw-body", text: JSON.stringify({ ...rest, data }, null, 2) }),
    );
  }

  entry(event) {
    const data = event.data && typeof event.data === "object" ? event.data : {};
    switch (event.type) {
      case "turn/start":
        return el(
          "li",
          { class: "entry turn-marker", data: { seq: event.seq, type: event.type } },
          el("span", { text: `Turn ${data.turn ?? ""}` }),
          el("time", { class: "muted", text: formatTime(event.time) }),
        );
      case "turn/end": {
        const reason = data.reason || {};
        if (reason.kind === "completed") return null;
        return el(
          "li",
          { class: "entry turn-end", data: { seq: event.seq, type: event.type, kind: String(reason.kind || "") } },
          el("span", { class: "turn-end-icon", text: "!", attrs: { "aria-hidden": "true" } }),
          el("span", { text: `Turn ${data.turn ?? ""} ended: ${reasonText(reason)}` }),
        );
      }
      case "user/message":
        return this.message(event, "user", data, SOURCE_NAMES[data.source?.kind] || "User");
      case "assistant/message":
        return this.assistant(event, data.message || {});
      case "tool/call":
        if (this.calls.has(data.callId)) return null; // already shown from the assistant message
        return this.callCard(event, String(data.callId ?? ""), data.name, data.arguments);
      case "tool/result":
        return this.result(event, data.message || {});
      default:
        return null;
    }
  }

  message(event, role, message, who) {
    const text = textOf(message.content);
    const kind = message.source?.kind || role;
    return el(
      "li",
      { class: `entry message ${role}`, data: { seq: event.seq, type: event.type, source: kind } },
      el("div", { class: "who" }, el("span", { text: who }), el("time", { class: "muted", text: formatTime(event.time) })),
      el("div", { class: "text", text }),
    );
  }

  assistant(event, message) {
    const content = Array.isArray(message.content) ? message.content : [];
    const item = el("li", { class: "entry message assistant", data: { seq: event.seq, type: event.type } });
    item.append(
      el("div", { class: "who" }, el("span", { text: "Assistant" }), el("time", { class: "muted", text: formatTime(event.time) })),
    );
    let shown = false;
    for (const block of content) {
      if (!block || typeof block !== "object") continue;
      if (block.type === "text" && block.text) {
        item.append(el("div", { class: "text", text: block.text }));
        shown = true;
      } else if (block.type === "reasoning" && (block.text || block.reasoning)) {
        const details = el("details", { class: "reasoning" }, el("summary", { text: "Reasoning" }));
        details.append(el("div", { class: "text", text: block.text || block.reasoning }));
        item.append(details);
        shown = true;
      } else if (block.type === "tool-call") {
        item.append(this.callBody(event, String(block.id ?? ""), block.name, block.arguments));
        shown = true;
      }
    }
    if (typeof message.content === "string" && message.content) {
      item.append(el("div", { class: "text", text: message.content }));
      shown = true;
    }
    return shown ? item : null;
  }

  callBody(event, callId, name, args) {
    const result = el("div", { class: "tool-result pending", text: "waiting for the result…" });
    const card = el(
      "div",
      { class: "tool-call", data: { callId, name: String(name ?? "") } },
      el(
        "details",
        { class: "tool-args" },
        el("summary", {}, el("span", { class: "tool-icon", text: "⚙", attrs: { "aria-hidden": "true" } }), el("code", { class: "tool-name", text: String(name ?? "tool") })),
        el("pre", { text: prettyArguments(args) }),
      ),
      result,
    );
    this.calls.set(callId, result);
    return card;
  }

  callCard(event, callId, name, args) {
    return el(
      "li",
      { class: "entry message assistant tool-only", data: { seq: event.seq, type: event.type } },
      this.callBody(event, callId, name, args),
    );
  }

  result(event, message) {
    const block = Array.isArray(message.content)
      ? message.content.find((item) => item && typeof item === "object" && item.type === "tool-result")
      : null;
    const callId = String(block?.toolCallId ?? message.source?.callId ?? "");
    const text = block ? textOf(block.content) : textOf(message.content);
    const isError = Boolean(block?.isError);
    const target = this.calls.get(callId);
    if (target) {
      target.classList.remove("pending");
      target.classList.toggle("error", isError);
      target.dataset.seq = String(event.seq);
      target.replaceChildren(
        el("span", { class: "result-label", text: isError ? "error" : "result" }),
        el("div", { class: "text", text: text || "(no text)" }),
      );
      return null;
    }
    return el(
      "li",
      { class: `entry tool-result-entry${isError ? " error" : ""}`, data: { seq: event.seq, type: event.type } },
      el("span", { class: "result-label", text: isError ? "tool error" : "tool result" }),
      el("div", { class: "text", text: text || "(no text)" }),
    );
  }
}
