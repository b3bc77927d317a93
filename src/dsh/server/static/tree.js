// The subagent tree (right pane): the selected session's descendants (`scope=descendants`), each
// row with its label (or id), a mode badge, an activity indicator and a has-children marker.
// Diagnostic rows look different on purpose and carry no controls. A row whose parent is not a
// listed subagent (an ordinary session) hangs under a synthetic "session <id>" node.

import { api } from "./api.js";
import { byId, el, say } from "./dom.js";

const REASONS = {
  corrupt: "its log has no subagent identity (no descriptor), so it cannot be shown or continued",
  unsupported: "its log is in a format this version cannot read",
  unavailable: "its log could not be read just now (a storage failure); it may be readable later",
};

/** Why a diagnostic row could not be read, in one sentence. */
export function explainReason(reason) {
  return REASONS[reason] || "its log could not be read";
}

export class SubagentTree {
  /**
   * @param {{onSelect: (entry: object) => void,
   *          statuses: {stamp: () => number, since: (stamp: number) => Map<string, string>}}} options
   *   `statuses` knows the status frames: a fetched catalog can be older than a frame that arrived
   *   while it was in flight, so the frames newer than the fetch's start win over its rows.
   */
  constructor({ onSelect, statuses }) {
    this.onSelect = onSelect;
    this.statuses = statuses;
    this.root = byId("tree");
    this.parentId = null;
    this.entries = [];
    this.parentAvailable = false;
    this.unlisted = 0;
    this.selected = null;
    this.activity = new Map(); // id -> activity patched from status frames
    this.loading = null;
    this.again = false;
  }

  /** Ids of every row (for the stream filter). */
  ids() {
    return this.entries.map((entry) => entry.id);
  }

  row(id) {
    return this.entries.find((entry) => entry.id === id) || null;
  }

  clear() {
    this.parentId = null;
    this.entries = [];
    this.activity.clear();
    this.selected = null;
    this.root.replaceChildren();
    byId("tree-empty").hidden = false;
    byId("tree-empty").textContent = "Subagents of the selected session appear here.";
    byId("tree-meta").textContent = "";
    say("tree-error", "");
  }

  /** Fetch the rows of `parentId` (coalesced: one fetch at a time, one more after it when asked). */
  load(parentId) {
    if (parentId !== this.parentId) {
      this.clear();
      this.parentId = parentId;
    }
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.loading = (async () => {
      try {
        do {
          this.again = false;
          const target = this.parentId;
          const stamp = this.statuses.stamp();
          const catalog = await api.listSubagents(target, "descendants");
          if (target !== this.parentId) continue;
          this.entries = catalog.entries || [];
          this.parentAvailable = Boolean(catalog.parentAvailable);
          this.unlisted = typeof catalog.unlisted === "number" ? catalog.unlisted : 0;
          this.activity = this.statuses.since(stamp);
          say("tree-error", "");
          this.render();
        } while (this.again);
      } catch (error) {
        say("tree-error", `Subagents could not be listed: ${error.message}`);
      } finally {
        this.loading = null;
      }
    })();
    return this.loading;
  }

  /** A status frame for `id`: `running` or anything else (inactive). */
  setActivity(id, activity) {
    this.activity.set(id, activity);
    const node = this.root.querySelector(`.tree-row[data-id="${CSS.escape(id)}"]`);
    if (node && node.dataset.kind === "child") {
      node.dataset.activity = activity;
      const dot = node.querySelector(".activity");
      dot.dataset.activity = activity;
      dot.firstElementChild.textContent = activity;
    }
  }

  activityOf(entry) {
    return this.activity.get(entry.id) || entry.activity || "inactive";
  }

  select(id) {
    this.selected = id;
    for (const node of this.root.querySelectorAll(".tree-row")) {
      if (node.dataset.id === id) node.setAttribute("aria-current", "true");
      else node.removeAttribute("aria-current");
    }
  }

  render() {
    const rows = this.entries;
    const byParent = new Map();
    const known = new Set(rows.map((entry) => entry.id));
    const roots = new Map(); // ordinary parent id -> rows hanging under its synthetic node
    for (const entry of rows) {
      const parent = entry.parentId ?? this.parentId;
      const bucket = known.has(parent) ? byParent : roots;
      if (!bucket.has(parent)) bucket.set(parent, []);
      bucket.get(parent).push(entry);
    }
    const children = (id) => byParent.get(id) || [];
    const branch = (entry, level) => {
      const kids = children(entry.id);
      const item = el("li", {
        class: "tree-item",
        attrs: { role: "treeitem", "aria-level": String(level), "aria-expanded": kids.length ? "true" : null },
      });
      item.append(this.renderRow(entry, kids.length));
      if (kids.length) {
        const group = el("ul", { class: "tree-group", attrs: { role: "group" } });
        for (const kid of kids) group.append(branch(kid, level + 1));
        item.append(group);
      }
      return item;
    };
    const nodes = [];
    for (const [parent, list] of roots) {
      const group = el("ul", { class: "tree-group", attrs: { role: "group" } });
      for (const entry of list) group.append(branch(entry, 2));
      nodes.push(
        el(
          "li",
          { class: "tree-item", attrs: { role: "treeitem", "aria-level": "1", "aria-expanded": "true" } },
          el(
            "div",
            { class: "tree-session", data: { id: parent } },
            el("span", { class: "tree-session-label", text: "session" }),
            el("span", { class: "mono ellipsis", text: parent, attrs: { title: parent } }),
          ),
          group,
        ),
      );
    }
    this.root.replaceChildren(...nodes);
    const empty = byId("tree-empty");
    empty.hidden = rows.length > 0;
    empty.textContent = "This session has no subagents.";
    const diagnostics = rows.filter((entry) => entry.kind === "diagnostic").length;
    const parts = [`${rows.length} ${rows.length === 1 ? "subagent" : "subagents"}`];
    if (diagnostics) parts.push(`${diagnostics} unreadable`);
    parts.push(this.parentAvailable ? "parent live" : "parent not live");
    byId("tree-meta").textContent = rows.length ? parts.join(" · ") : "";
    // Sessions of the store the listing could not read at all: no row can show them (whose child
    // each one is cannot be known), so they are counted here, as `dsh agents` does on stderr.
    const unlisted = byId("tree-unlisted");
    unlisted.hidden = !this.unlisted;
    unlisted.textContent = this.unlisted
      ? `⚠ ${this.unlisted} stored ${this.unlisted === 1 ? "session" : "sessions"} could not be read and ${this.unlisted === 1 ? "is" : "are"} not listed; run dsh doctor for details.`
      : "";
    if (this.selected) this.select(this.selected);
  }

  renderRow(entry, kidCount) {
    if (entry.kind === "diagnostic") {
      const reason = String(entry.reason ?? "unavailable");
      return el(
        "button",
        {
          class: "tree-row diagnostic",
          attrs: { type: "button", "aria-label": `diagnostic: ${reason}. Subagent ${entry.id} could not be read.` },
          data: { kind: "diagnostic", id: entry.id, reason },
          on: { click: () => this.onSelect(entry) },
        },
        el("span", { class: "warning-icon", text: "⚠", attrs: { "aria-hidden": "true" } }),
        el(
          "span",
          { class: "row-text" },
          el("span", { class: "row-label", text: `diagnostic: ${reason}` }),
          el("span", { class: "row-id mono", text: entry.id }),
        ),
      );
    }
    const activity = this.activityOf(entry);
    const mode = String(entry.mode ?? "");
    const label = typeof entry.label === "string" && entry.label ? entry.label : null;
    const marker =
      entry.hasChildren || kidCount
        ? el("span", {
            class: "has-children",
            text: kidCount ? `⑂ ${kidCount}` : "⑂",
            attrs: { title: "has subagents of its own", "aria-label": "has subagents of its own" },
          })
        : null;
    return el(
      "button",
      {
        class: "tree-row child",
        attrs: { type: "button", title: entry.id },
        data: { kind: "child", id: entry.id, mode, activity },
        on: { click: () => this.onSelect(entry) },
      },
      el("span", { class: "activity", data: { activity } }, el("span", { class: "visually-hidden", text: activity })),
      el(
        "span",
        { class: "row-text" },
        el("span", { class: label ? "row-label" : "row-label mono", text: label || entry.id }),
        label ? el("span", { class: "row-id mono", text: entry.id }) : null,
      ),
      el("span", { class: `badge mode-${mode}`, text: mode }),
      marker,
    );
  }
}
