// The session list (left pane): newest first, "Load more" pages with the server's cursor,
// subagent sessions left out; per session a status dot, the title (or the id), the last activity
// and the token total when the server knows them. The search box filters the listed sessions by
// title and id as you type.

import { api } from "./api.js";
import { byId, el, formatAgo, formatCost, formatDateTime, formatTokens, say } from "./dom.js";
import { mergeTotals, usageTotals } from "./usage.js";

/** When the session last did something: the server's figure when it has one, else its creation. */
function lastActivity(summary) {
  for (const key of ["lastActivityAt", "updatedAt", "lastEventAt"]) {
    if (typeof summary[key] === "number" && Number.isFinite(summary[key])) return summary[key];
  }
  return typeof summary.activeAt === "number" ? summary.activeAt : summary.createdAt;
}

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
    this.search = byId("session-search");
    this.query = "";
    this.more.addEventListener("click", () => this.loadMore());
    this.search.addEventListener("input", () => {
      this.query = this.search.value.trim().toLowerCase();
      this.applyFilter();
    });
    this.search.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        this.search.value = "";
        this.query = "";
        this.applyFilter();
      }
    });
  }

  matches(summary) {
    if (!this.query) return true;
    const haystack = `${summary.title || ""}\n${summary.id}`.toLowerCase();
    return this.query.split(/\s+/).every((word) => haystack.includes(word));
  }

  /** Show only the sessions the search matches; say so when none does. */
  applyFilter() {
    let shown = 0;
    for (const [id, node] of this.nodes) {
      const visible = this.matches(this.items.get(id));
      node.hidden = !visible;
      if (visible) shown += 1;
    }
    const total = `${this.items.size}${this.cursor ? "+" : ""}`;
    byId("sessions-count").textContent = this.items.size ? (this.query ? `${shown} of ${total}` : total) : "";
    const none = byId("sessions-nomatch");
    none.hidden = !(this.query && this.items.size > 0 && shown === 0);
    none.textContent = this.cursor
      ? `No listed session matches “${this.search.value.trim()}”. Load more to search older sessions.`
      : `No session matches “${this.search.value.trim()}”.`;
    return shown;
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
    this.applyFilter();
  }

  get(id) {
    return this.items.get(id) || null;
  }

  /** A session announced by the stream (new, or resumed into memory): insert or update it. */
  upsert(summary) {
    if (!summary || summary.origin === "subagent") return;
    const known = this.items.get(summary.id);
    if (known) {
      // A summary's own token figures (with the cost) replace totals learnt from projections.
      const totals = summary.tokens ? undefined : known.totals;
      this.update(summary.id, { ...known, ...summary, title: summary.title ?? known.title, totals });
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
    if (item) this.update(id, { ...item, status: status === "closed" ? "stored" : status, activeAt: Date.now() });
  }

  /** Token and cost totals learnt from projections. */
  setUsage(id, totals) {
    const item = this.items.get(id);
    if (item && totals) this.update(id, { ...item, totals: mergeTotals(item.totals || usageTotals(item), totals) });
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
    node.hidden = !this.matches(summary);
    old.replaceWith(node);
  }

  render(summary) {
    const status = STATUS_TEXT[summary.status] || "stored";
    const totals = summary.totals || usageTotals(summary);
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
          el("time", { text: formatAgo(lastActivity(summary)), attrs: { title: `created ${formatDateTime(summary.createdAt)}` } }),
          totals ? " · " : null,
          totals ? el("span", { class: "session-tokens", text: `${formatTokens(totals.tokens)} tokens` }) : null,
          totals && typeof totals.cost === "number" ? ` · ${formatCost(totals.cost, totals.currency)}` : null,
        ),
      ),
    );
    const node = el("li", {}, button);
    node.hidden = !this.matches(summary);
    return node;
  }
}

