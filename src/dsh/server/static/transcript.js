// A conversation rendered from history-page events: messages, tool calls with their results, turn
// markers and failed turns. Pages arrive newest first when paging back, so the transcript can
// prepend an older page or append newer events; it remembers which seqs it shows.
//
// Two kinds of entries are not events yet: an answer being streamed (`session/delta` frames, shown
// as plain text, replaced by the rendered message when its `assistant/message` arrives) and a
// prompt the person just sent (shown at once, replaced by the logged message with the same id).

import { el, formatTime } from "./dom.js";
import { renderedMessage } from "./markup.js";

const SOURCE_NAMES = {
  user: "You",
  coordinator: "Parent agent",
  "subagent-settled": "Subagent notice",
  plugin: "Context",
};

const numberFormat = new Intl.NumberFormat();

/** A step's token usage (disjoint counts) as `in 1,200 · cached 800 · out 56`. */
export function usageText(usage) {
  if (!usage || typeof usage !== "object") return "";
  const parts = [];
  const add = (label, value) => {
    if (typeof value === "number" && Number.isFinite(value) && value > 0) parts.push(`${label} ${numberFormat.format(value)}`);
  };
  add("in", usage.inputTokens);
  add("cached", usage.cacheReadTokens);
  add("cache write", usage.cacheWriteTokens);
  add("out", usage.outputTokens);
  add("reasoning", usage.reasoningTokens);
  return parts.length ? `${parts.join(" · ")} tokens` : "";
}

/** Who wrote a user message, from the transcript's point of view (`session` or `child`). */
function authorOf(source, perspective, turn) {
  const kind = source && typeof source === "object" ? source.kind : undefined;
  if (perspective === "child") {
    // A child's task is written by its parent agent (logged with a plain user source in turn 1);
    // a relayed follow-up is the parent agent's too; a person's own follow-up carries its request id.
    if (kind === "coordinator") return { who: "Parent agent", author: "parent-agent" };
    if (kind === "user" && !source.rpcId && turn === 1) return { who: "Parent agent · task", author: "parent-agent" };
  }
  if (kind === "user") return { who: "You", author: "person" };
  return { who: SOURCE_NAMES[kind] || "User", author: String(kind || "user") };
}

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
  constructor(list, { raw = false, perspective = "session" } = {}) {
    this.list = list;
    this.raw = raw;
    this.perspective = perspective;
    this.reset();
  }

  reset() {
    this.list.replaceChildren();
    this.firstSeq = null;
    this.lastSeq = null;
    this.calls = new Map();
    this.turn = null; // the turn of the events being built (from turn/start)
    this.streams = new Map(); // `${turn}/${step}/${kind}` -> {node, text, length}
    this.finished = { turn: 0, step: 0 }; // the newest step whose message is shown
    this.pendingPrompts = new Map(); // message id (or a local key) -> <li>
    this.stepUsage = new Map(); // seq -> usage of each shown assistant message of this session's own events
    this.ownFrom = this.ownFrom ?? 0; // events before this seq came from the session this one was forked from
    this.echoes = 0;
  }

  /** Insert `nodes` before the entries that are not events yet (streams and pending prompts). */
  insertEvents(nodes) {
    const first = this.list.querySelector(":scope > .provisional");
    for (const node of nodes) this.list.insertBefore(node, first);
  }

  get empty() {
    return this.lastSeq === null;
  }

  /** Append events newer than the ones shown. */
  append(events) {
    const fresh = events.filter((event) => this.lastSeq === null || event.seq > this.lastSeq);
    if (!fresh.length) return 0;
    const nodes = this.build(fresh);
    this.insertEvents(nodes);
    this.settle(fresh);
    if (this.firstSeq === null) this.firstSeq = fresh[0].seq;
    this.lastSeq = fresh[fresh.length - 1].seq;
    return fresh.length;
  }

  /** Prepend an older page (events before the first shown seq). */
  prepend(events) {
    const older = events.filter((event) => this.firstSeq === null || event.seq < this.firstSeq);
    if (!older.length) return 0;
    const turn = this.turn; // an older page must not change the turn newer events are read in
    this.turn = null;
    const nodes = this.build(older);
    this.turn = turn;
    this.list.prepend(...nodes);
    this.firstSeq = older[0].seq;
    if (this.lastSeq === null) this.lastSeq = older[older.length - 1].seq;
    return older.length;
  }

  build(events) {
    const nodes = [];
    for (const event of events) {
      if (event.type === "turn/start" && typeof event.data?.turn === "number") this.turn = event.data.turn;
      if (event.type === "assistant/message" && event.seq >= this.ownFrom && event.data?.usage) {
        this.stepUsage.set(event.seq, event.data.usage);
      }
      const node = this.raw ? this.rawEntry(event) : this.entry(event);
      if (node) nodes.push(node);
    }
    return nodes;
  }

  /** Events that complete provisional entries: a step's message ends its stream, a logged prompt its echo. */
  settle(events) {
    for (const event of events) {
      const data = event.data && typeof event.data === "object" ? event.data : {};
      if (event.type === "assistant/message" && typeof data.turn === "number") {
        const step = typeof data.step === "number" ? data.step : 0;
        if (data.turn > this.finished.turn || (data.turn === this.finished.turn && step > this.finished.step)) {
          this.finished = { turn: data.turn, step };
        }
        this.dropStreams((turn, at) => turn < data.turn || (turn === data.turn && at <= step));
      } else if (event.type === "turn/end" && typeof data.turn === "number") {
        this.dropStreams((turn) => turn <= data.turn);
      } else if (event.type === "user/message") {
        // The logged message replaces its echo: matched by message id, else by the same text.
        let key = typeof data.id === "string" && this.pendingPrompts.has(data.id) ? data.id : null;
        if (key === null) {
          const text = textOf(data.content);
          for (const [candidate, node] of this.pendingPrompts) {
            if (node.dataset.text === text) {
              key = candidate;
              break;
            }
          }
        }
        if (key !== null) {
          this.pendingPrompts.get(key).remove();
          this.pendingPrompts.delete(key);
        }
      }
    }
  }

  dropStreams(done) {
    for (const [key, stream] of this.streams) {
      const [turn, step] = key.split("/").map(Number);
      if (done(turn, step)) {
        stream.node.remove();
        this.streams.delete(key);
      }
    }
  }

  /** The shown steps' usage summed (disjoint counts, as the harness's TokenUsage). */
  usageSum() {
    const sum = { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0 };
    for (const usage of this.stepUsage.values()) {
      for (const key of Object.keys(sum)) {
        if (typeof usage[key] === "number" && Number.isFinite(usage[key])) sum[key] += usage[key];
      }
    }
    return sum;
  }

  /** True while an answer is being streamed into the transcript. */
  get streaming() {
    return this.streams.size > 0;
  }

  /**
   * A `session/delta` frame: append its text to the step's streaming entry (plain text). Deltas of
   * a step whose message is already shown are ignored; a gap (a missed delta) marks the entry as
   * incomplete until the message replaces it.
   */
  delta({ turn, step, kind, offset, text }) {
    if (this.raw || typeof turn !== "number" || typeof step !== "number" || typeof text !== "string") return;
    const { finished } = this;
    if (turn < finished.turn || (turn === finished.turn && step <= finished.step)) return;
    const key = `${turn}/${step}/${kind === "reasoning" ? "reasoning" : "text"}`;
    let stream = this.streams.get(key);
    if (!stream) {
      const body = el("div", { class: "text" });
      const node =
        kind === "reasoning"
          ? el(
              "li",
              { class: "entry message assistant streaming provisional", data: { turn, step, kind: "reasoning" } },
              el("details", { class: "reasoning", attrs: { open: "" } }, el("summary", { text: "Reasoning…" }), body),
            )
          : el(
              "li",
              { class: "entry message assistant streaming provisional", data: { turn, step, kind: "text" } },
              el("div", { class: "who" }, el("span", { text: "Assistant" }), el("span", { class: "typing", text: "writing…" })),
              body,
            );
      stream = { node, body, length: 0 };
      this.streams.set(key, stream);
      this.list.append(node); // after the events and after a prompt still waiting for its echo
    }
    const length = [...text].length;
    if (typeof offset === "number" && offset > stream.length) {
      stream.node.dataset.gap = "true"; // text was missed (a reconnect): the message will replace it
    }
    if (typeof offset === "number" && offset + length <= stream.length) return; // already shown
    const fresh = typeof offset === "number" && offset < stream.length ? [...text].slice(stream.length - offset).join("") : text;
    stream.body.append(document.createTextNode(fresh));
    stream.length = (typeof offset === "number" ? Math.max(offset, stream.length) : stream.length) + [...fresh].length;
  }

  /** Show a prompt the person just sent; returns a handle to reconcile or fail it. */
  pendingPrompt(text) {
    const status = el("span", { class: "pending-status", text: "sending…" });
    const node = el(
      "li",
      { class: "entry message user pending-prompt provisional", data: { source: "user", state: "sending", text } },
      el("div", { class: "who" }, el("span", { text: "You" }), status),
      el("div", { class: "text", text }),
    );
    this.list.append(node);
    // Waiting for its logged message from now on (it may be logged before the request answers).
    let key = `local-${++this.echoes}`;
    this.pendingPrompts.set(key, node);
    const transcript = this;
    return {
      node,
      accepted(messageId) {
        node.dataset.state = "queued";
        status.textContent = "sent";
        if (typeof messageId === "string" && messageId && transcript.pendingPrompts.get(key) === node) {
          transcript.pendingPrompts.delete(key);
          key = messageId;
          node.dataset.messageId = messageId;
          transcript.pendingPrompts.set(key, node);
        }
      },
      failed(message, retry) {
        if (transcript.pendingPrompts.get(key) === node) transcript.pendingPrompts.delete(key);
        node.dataset.state = "failed";
        node.classList.add("failed");
        status.textContent = "";
        const again = el("button", { class: "link-button", text: "Retry", attrs: { type: "button" } });
        again.addEventListener("click", () => {
          node.remove();
          retry();
        });
        node.append(el("p", { class: "error-text", attrs: { role: "alert" } }, `Not sent: ${message} `, again));
      },
    };
  }

  rawEntry(event) {
    const { data, view, ...rest } = event;
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
      case "user/message": {
        const { who, author } = authorOf(data.source, this.perspective, this.turn);
        return this.message(event, "user", data, who, author);
      }
      case "assistant/message":
        return this.assistant(event, data.message || {}, data.usage);
      case "tool/call":
        if (this.calls.has(data.callId)) return null; // already shown from the assistant message
        return this.callCard(event, String(data.callId ?? ""), data.name, data.arguments);
      case "tool/result":
        return this.result(event, data.message || {});
      default:
        return null;
    }
  }

  message(event, role, message, who, author) {
    const text = textOf(message.content);
    const kind = message.source?.kind || role;
    if (kind === "plugin") {
      // Context the harness adds for the model (date, sandbox, approvals): folded, it is not a message.
      return el(
        "li",
        { class: "entry context-note", data: { seq: event.seq, type: event.type, source: kind } },
        el(
          "details",
          {},
          el("summary", {}, el("span", { text: "Context for the model" }), " ", el("time", { class: "muted", text: formatTime(event.time) })),
          el("div", { class: "text", text }),
        ),
      );
    }
    return el(
      "li",
      { class: `entry message ${role}`, data: { seq: event.seq, type: event.type, source: kind, author } },
      el("div", { class: "who" }, el("span", { text: who }), el("time", { class: "muted", text: formatTime(event.time) })),
      el("div", { class: "text", text }),
    );
  }

  assistant(event, message, usage) {
    const content = Array.isArray(message.content) ? message.content : [];
    const item = el("li", { class: "entry message assistant", data: { seq: event.seq, type: event.type } });
    const tokens = usageText(usage);
    item.append(
      el(
        "div",
        { class: "who" },
        el("span", { text: "Assistant" }),
        el("time", { class: "muted", text: formatTime(event.time) }),
        tokens ? el("span", { class: "usage muted", text: tokens }) : null,
      ),
    );
    const html = event.view && typeof event.view.html === "string" ? event.view.html : null;
    let rendered = false;
    let shown = false;
    for (const block of content) {
      if (!block || typeof block !== "object") continue;
      if (block.type === "text" && block.text) {
        // The server's rendering covers every text block of the message: shown once, in place of the first.
        if (html !== null) {
          if (!rendered) item.append(renderedMessage(html));
          rendered = true;
        } else {
          item.append(el("div", { class: "text", text: block.text }));
        }
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
      item.append(html !== null ? renderedMessage(html) : el("div", { class: "text", text: message.content }));
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
