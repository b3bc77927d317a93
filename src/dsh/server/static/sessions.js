// The session list (left pane): newest first, "Load more" pages with the server's cursor,
// subagent sessions left out, a status dot and the title (or the id) per session.

import { api } from "./api.js";
import { byId, el, formatDateTime, say } from "./dom.js";

const STATUS_TEXT = { running: "running", idle: "idle", stored: "stored" };

export class SessionList {
  constructor({ onSelect }) {
    this.onSelect = onSelect;
    this.list = byId("session-list");
    this.more = byId("sessions-more");
    this.items = new Map(); // id -> summary
    this.nodes = new Map(); // id -> <li>
    this.cursor = null;
    this.selected = null;
    this.more.addEventListener("click", () => this.loadMore());
  }

  /** Load the first page again (keeps the selection). */
  async load() {
    say("sessions-error", "");
    try {
      const page = await api.listSessions({ limit: 50 });
      this.items.clear();
      this.nodes.clear();
      this.list.replaceChildren();
      this.cursor = page.nextCursor;
      for (const item of page.items) this.add(item, "end");
    } catch (error) {
      say("sessions-error", `Sessions could not be listed: ${error.message}`);
    }
    this.refreshChrome();
  }

  async loadMore() {
    if (!this.cursor) return;
    this.more.disabled = true;
    try {
      const page = await api.listSessions({ limit: 50, cursor: this.cursor });
      this.cursor = page.nextCursor;
      for (const item of page.items) if (!this.items.has(item.id)) this.add(item, "end");
    } catch (error) {
      say("sessions-error", `More sessions could not be listed: ${error.message}`);
    } finally {
      this.more.disabled = false;
    }
    this.refreshChrome();
  }

  refreshChrome() {
    this.more.hidden = !this.cursor;
    byId("sessions-empty").hidden = this.items.size > 0;
    const count = this.items.size;
    byId("sessions-count").textContent = count ? `${count}${this.cursor ? "+" : ""}` : "";
  }

  get(id) {
    return this.items.get(id) || null;
  }

  /** A session announced by the stream (new, or resumed into memory): insert or update it. */
  upsert(summary) {
    if (!summary || summary.origin === "subagent") return;
    const known = this.items.get(summary.id);
    if (known) {
      this.update(summary.id, { ...known, ...summary, title: summary.title ?? known.title });
      return;
    }
    // Newest first: insert before the first session created earlier than this one.
    let before = null;
    for (const [id, item] of this.items) {
      if (item.createdAt < summary.createdAt || (item.createdAt === summary.createdAt && id > summary.id)) {
        before = this.nodes.get(id);
        break;
      }
    }
    if (!before && this.cursor) return; // older than every listed session: a later page has it
    this.add(summary, before);
    this.refreshChrome();
  }

  setStatus(id, status) {
    const item = this.items.get(id);
    if (item) this.update(id, { ...item, status: status === "closed" ? "stored" : status });
  }

  /** A `tokens` projection value: the session's token total (null leaves the shown one). */
  setTokens(id, tokens) {
    const item = this.items.get(id);
    if (item && tokens && tokens.total) this.update(id, { ...item, tokens: { ...tokens.total } });
  }

  setTitle(id, title) {
    const item = this.items.get(id);
    if (item) this.update(id, { ...item, title: typeof title === "string" && title ? title : undefined });
  }

  select(id) {
    this.selected = id;
    for (const [itemId, node] of this.nodes) {
      const button = node.firstElementChild;
      if (itemId === id) button.setAttribute("aria-current", "true");
      else button.removeAttribute("aria-current");
    }
  }

  add(summary, where) {
    this.items.set(summary.id, summary);
    const node = this.render(summary);
    this.nodes.set(summary.id, node);
    if (where === "end" || !where) this.list.append(node);
    else this.list.insertBefore(node, where);
  }

  update(id, summary) {
    this.items.set(id, summary);
    const old = this.nodes.get(id);
    if (!old) return;
    const node = this.render(summary);
    this.nodes.set(id, node);
    old.replaceWith(node);
  }

  render(summary) {
    const status = STATUS_TEXT[summary.status] || "stored";
    const button = el(
      "button",
      {
        class: "session",
        attrs: { type: "button", title: summary.id, "aria-current": summary.id === this.selected ? "true" : null },
        data: { id: summary.id, status },
        on: { click: () => this.onSelect(summary.id) },
      },
      el("span", { class: "dot", data: { status }, attrs: { "aria-hidden": "true" } }),
      el(
        "span",
        { class: "session-text" },
        el("span", { class: summary.title ? "session-title" : "session-title mono", text: summary.title || summary.id }),
        el(
          "span",
          { class: "session-meta" },
          el("span", { text: status }),
          " · ",
          el("span", { text: formatDateTime(summary.createdAt) }),
          ...(summary.tokens ? [" · ", el("span", { class: "session-tokens", text: formatTokens(summary.tokens) })] : []),
        ),
      ),
    );
    return el("li", {}, button);
  }
}

/** `12,345 tokens` (billed input plus output), with the cost when the server priced it. */
export function formatTokens(tokens) {
  const count = ["inputTokens", "cacheReadTokens", "cacheWriteTokens", "outputTokens"].reduce((sum, key) => sum + (tokens[key] || 0), 0);
  const text = `${count.toLocaleString("en-US")} tokens`;
  return typeof tokens.cost === "number" && tokens.currency === "USD" ? `${text} · $${tokens.cost.toFixed(4)}` : text;
}
