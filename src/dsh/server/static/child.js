// The child panel (right pane, under the tree): a subagent's history read through
// getSubagentHistory with its mode; for a continuable child also a prompt box (promptSubagent) and
// an Interrupt button (interruptSubagent). When the parent is not live the server refuses the
// prompt with `subagent-parent-unavailable`, and the panel offers to resume the parent first.
// A diagnostic row gets an explanation and, on request, the raw log through generic history
// (observation only: nothing is resumed or granted).

import { api, ApiError } from "./api.js";
import { byId, el, formatDuration, submitOnEnter } from "./dom.js";
import { HistoryFeed } from "./feed.js";
import { explainReason } from "./tree.js";

export class ChildPanel {
  constructor({ onOpen, onClose, onParentResumed }) {
    this.onOpen = onOpen;
    this.onClose = onClose;
    this.onParentResumed = onParentResumed;
    this.panel = byId("child-panel");
    this.body = byId("child-body");
    this.actions = byId("child-actions");
    this.form = byId("child-form");
    this.text = byId("child-text");
    this.notice = byId("child-notice");
    this.feed = null;
    this.current = null; // {parentId, entry, view: "child"|"diagnostic"|"raw"}
    this.timing = null;
    byId("child-close").addEventListener("click", () => this.close());
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    submitOnEnter(this.text, this.form);
    byId("child-interrupt").addEventListener("click", () => this.interrupt());
  }

  /** The session id the panel shows (for the stream filter and frame routing), or null. */
  get sessionId() {
    return this.current ? this.current.entry.id : null;
  }

  close() {
    if (this.feed) this.feed.close();
    this.feed = null;
    this.current = null;
    this.panel.hidden = true;
    this.onClose();
  }

  open(parentId, entry) {
    if (this.feed) this.feed.close();
    this.feed = null;
    this.timing = null;
    this.current = { parentId, entry, view: entry.kind === "diagnostic" ? "diagnostic" : "child" };
    this.panel.hidden = false;
    this.panel.dataset.kind = entry.kind;
    this.showNotice(null);
    this.text.value = "";
    if (entry.kind === "diagnostic") this.showDiagnostic();
    else this.showChild();
    this.onOpen(entry);
  }

  header(title, ...meta) {
    byId("child-heading").textContent = title;
    byId("child-meta").replaceChildren(...meta.filter(Boolean));
  }

  showChild() {
    const { parentId, entry } = this.current;
    const continuable = entry.mode === "continuable";
    this.renderHeader();
    this.actions.hidden = !continuable;
    this.form.hidden = !continuable;
    this.feed = new HistoryFeed({
      scroll: this.body,
      perspective: "child",
      fetchPage: (beforeSeq) => api.getSubagentHistory(parentId, entry.id, { mode: entry.mode, beforeSeq }),
      onPage: (page) => this.takeProjections(page),
      onError: (error) => this.showNotice(`The history could not be read: ${error.message}`),
    });
    if (!continuable) {
      this.body.prepend(el("p", { class: "hint", text: "A one-shot subagent: it ran once and cannot be sent messages." }));
    }
    this.feed.load().catch((error) => this.showNotice(`The history could not be read: ${error.message}`));
  }

  renderHeader() {
    const { entry } = this.current;
    const activity = entry.activity || "inactive";
    // Interrupt only means something while the child runs a turn.
    byId("child-interrupt").hidden = !(entry.mode === "continuable" && activity === "running");
    byId("child-working").hidden = activity !== "running";
    const timing = this.timing ? formatDuration(workedMs(this.timing)) : "";
    this.header(
      entry.label || entry.id,
      el("span", { class: `badge mode-${entry.mode}`, text: entry.mode }),
      el("span", { class: "activity-text", data: { activity }, text: activity }),
      timing ? el("span", { class: "muted", text: `worked ${timing}` }) : null,
      el("code", { class: "mono ellipsis", text: entry.id, attrs: { title: entry.id } }),
    );
  }

  showDiagnostic() {
    const { entry } = this.current;
    const reason = String(entry.reason ?? "unavailable");
    this.header(
      `diagnostic: ${reason}`,
      el("span", { class: "badge warning", text: "unreadable" }),
      el("code", { class: "mono ellipsis", text: entry.id, attrs: { title: entry.id } }),
    );
    this.actions.hidden = true;
    const raw = el("button", { class: "secondary", text: "View raw log (observation only)", attrs: { type: "button" } });
    raw.addEventListener("click", () => this.showRaw());
    this.body.replaceChildren(
      el(
        "div",
        { class: "diagnostic-explain" },
        el("p", { class: "diagnostic-title" }, el("span", { text: "⚠ ", attrs: { "aria-hidden": "true" } }), "This subagent could not be read."),
        el("p", { text: `The catalog lists it, but ${explainReason(reason)}. It cannot be prompted or interrupted from here.` }),
        el("p", { class: "muted", text: "The raw log view reads the session's events as they are stored. It only observes: nothing is resumed, changed or granted." }),
        raw,
      ),
    );
  }

  showRaw() {
    const { entry } = this.current;
    this.current.view = "raw";
    this.header(`Raw log`, el("span", { class: "badge warning", text: "observation only" }), el("code", { class: "mono ellipsis", text: entry.id, attrs: { title: entry.id } }));
    this.feed = new HistoryFeed({
      scroll: this.body,
      raw: true,
      fetchPage: (beforeSeq) => api.getSessionHistory(entry.id, { beforeSeq }),
      onError: (error) => this.showNotice(`The raw log could not be read: ${error.message}`),
    });
    this.actions.hidden = true;
    this.feed.load().catch((error) => this.showNotice(`The raw log could not be read: ${error.message}`));
  }

  /** A frame: event `seq` was appended to the shown session. */
  notify(seq) {
    if (this.feed) this.feed.notify(seq);
  }

  /** A `session/delta` frame for the shown child: its answer as it is written. */
  delta(data) {
    if (this.feed && this.current && this.current.view === "child") this.feed.delta(data);
  }

  /** The tree's row for the shown child changed (activity, or a new catalog). */
  updateEntry(entry) {
    if (!this.current || entry.id !== this.current.entry.id) return;
    if (this.current.view !== "child" || entry.kind !== "child") return;
    this.current.entry = entry;
    this.renderHeader();
  }

  setActivity(id, activity) {
    if (!this.current || this.current.entry.id !== id || this.current.view !== "child") return;
    this.current.entry = { ...this.current.entry, activity };
    this.renderHeader();
  }

  takeProjections(page) {
    const values = page.projections && page.projections.values;
    if (values && typeof values === "object") this.setTiming(values.subagentTiming);
  }

  setTiming(value) {
    if (!this.current || this.current.view !== "child") return;
    this.timing = value && typeof value === "object" ? value : null;
    this.renderHeader();
  }

  showNotice(text, ...extra) {
    if (!text) {
      this.notice.hidden = true;
      this.notice.replaceChildren();
      return;
    }
    this.notice.hidden = false;
    this.notice.replaceChildren(el("span", { text }), ...extra);
  }

  async send() {
    if (!this.current || this.current.view !== "child") return;
    const text = this.text.value.trim();
    if (!text) return;
    const { parentId, entry } = this.current;
    this.showNotice(null);
    this.form.classList.add("busy");
    try {
      const accepted = await api.promptSubagent(parentId, entry.id, text);
      this.text.value = "";
      this.feed.pendingPrompt(text).accepted(accepted && accepted.messageId);
      this.feed.sync();
    } catch (error) {
      if (error instanceof ApiError && error.code === "subagent-parent-unavailable") {
        const resume = el("button", { class: "primary", text: "Resume parent and send", attrs: { type: "button" } });
        resume.addEventListener("click", () => this.resumeAndSend(parentId));
        this.showNotice("The parent session is not live, so it cannot deliver messages to its subagents.", resume);
      } else {
        this.showNotice(`Not sent: ${error.message}`);
      }
    } finally {
      this.form.classList.remove("busy");
    }
  }

  async resumeAndSend(parentId) {
    this.showNotice("Resuming the parent…");
    try {
      await api.resumeSession(parentId);
    } catch (error) {
      this.showNotice(`The parent could not be resumed: ${error.message}`);
      return;
    }
    this.onParentResumed(parentId);
    await this.send();
  }

  async interrupt() {
    if (!this.current || this.current.view !== "child") return;
    const { parentId, entry } = this.current;
    try {
      await api.interruptSubagent(parentId, entry.id);
      this.showNotice("Interrupt sent.");
    } catch (error) {
      this.showNotice(`The interrupt failed: ${error.message}`);
    }
  }
}

function workedMs(timing) {
  let total = typeof timing.settledMs === "number" ? timing.settledMs : 0;
  const active = timing.active;
  if (active && typeof active.since === "number" && typeof active.through === "number") {
    total += Math.max(0, active.through - active.since);
  }
  return total;
}
