// The conversation view (centre pane): the selected session's history with "Load earlier", new
// events as they happen, answers streaming in as they are written, a prompt box (promptSession; a
// stored session is resumed by the server first) whose message shows at once, a "working" line and
// an Interrupt button while a turn runs, token and cost figures, and a Fork button.

import { api } from "./api.js";
import { append, byId, clear, el, formatCost, formatDateTime, formatTokens, say, submitOnEnter } from "./dom.js";
import { HistoryFeed } from "./feed.js";
import { mergeTotals, usageTotals } from "./usage.js";

export class ConversationView {
  constructor({ onProjections, onForked }) {
    this.onProjections = onProjections;
    this.onForked = onForked;
    this.scroll = byId("conversation-scroll");
    this.form = byId("prompt-form");
    this.text = byId("prompt-text");
    this.interruptButton = byId("conversation-interrupt");
    this.forkButton = byId("conversation-fork");
    this.working = byId("conversation-working");
    this.summary = null;
    this.feed = null;
    this.usage = null; // {tokens, cost, currency} from the summary or the projections
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    submitOnEnter(this.text, this.form);
    this.interruptButton.addEventListener("click", () => this.interrupt());
    this.forkButton.addEventListener("click", () => this.fork());
  }

  get sessionId() {
    return this.summary ? this.summary.id : null;
  }

  open(summary) {
    if (this.feed) this.feed.close();
    this.summary = summary;
    this.usage = usageTotals(summary);
    this.text.value = "";
    say("prompt-error", "");
    say("conversation-error", "");
    this.renderHeader();
    this.form.hidden = false;
    const id = summary.id;
    this.feed = new HistoryFeed({
      scroll: this.scroll,
      fetchPage: (beforeSeq) => api.getSessionHistory(id, { beforeSeq }),
      onPage: (page) => this.takePage(page),
      onShown: () => this.countShown(),
      onError: (error) => say("conversation-error", `The history could not be read: ${error.message}`),
    });
    return this.feed.load().then(
      () => this.showEmpty(),
      (error) => {
        this.scroll.replaceChildren(el("p", { class: "empty", text: "This session's history could not be read." }));
        say("conversation-error", error.message);
      },
    );
  }

  /** An empty session says how to begin. */
  showEmpty() {
    if (!this.feed || !this.feed.transcript.empty) return;
    if (this.scroll.querySelector(".empty")) return;
    this.feed.list.before(el("p", { class: "empty conversation-empty", text: "No messages yet. Write the first one below." }));
  }

  takePage(page) {
    const values = page.projections && page.projections.values;
    if (values && typeof values === "object") {
      this.onProjections(page.sessionId, values, page.projections.asOfSeq);
      const totals = usageTotals(values);
      if (totals) this.setUsage(totals);
    }
    if (!this.feed || !this.feed.transcript.empty) this.scroll.querySelector(".conversation-empty")?.remove();
  }

  /**
   * Without totals from the server, a session whose every event is shown gets its own total summed
   * from its steps (its forked-from prefix left out); it is marked as counted here, and has no cost.
   */
  countShown() {
    if (!this.feed || (this.usage && !this.usage.local)) return;
    if (!this.feed.complete) return;
    const totals = usageTotals({ usage: this.feed.transcript.usageSum() });
    if (!totals || totals.tokens === 0) return;
    this.usage = { ...totals, local: true, detail: `${totals.detail} (summed from the steps shown)` };
    this.renderHeader();
  }

  /** The summary changed (status, title). */
  update(summary) {
    if (!this.summary || summary.id !== this.summary.id) return;
    this.summary = { ...this.summary, ...summary };
    const totals = usageTotals(summary);
    if (totals) this.usage = totals;
    this.renderHeader();
    this.countShown();
  }

  setUsage(totals) {
    this.usage = mergeTotals(this.usage, totals);
    if (this.summary) this.renderHeader();
  }

  renderHeader() {
    const summary = this.summary;
    const status = summary.status || "stored";
    const heading = byId("conversation-heading");
    heading.textContent = summary.title || summary.id;
    heading.classList.toggle("mono", !summary.title);
    heading.title = summary.id;
    const usage = this.usage;
    append(
      clear(byId("conversation-meta")),
      el("span", { class: "status-pill", data: { status }, text: status }),
      summary.title ? el("code", { class: "mono ellipsis", text: summary.id }) : null,
      summary.createdAt ? el("span", { text: `created ${formatDateTime(summary.createdAt)}` }) : null,
      usage && typeof usage.tokens === "number"
        ? el("span", { class: "usage-total", text: `${formatTokens(usage.tokens)} tokens`, attrs: { title: usage.detail || "" } })
        : null,
      usage && typeof usage.cost === "number" ? el("span", { class: "cost-total", text: formatCost(usage.cost, usage.currency) }) : null,
    );
    const running = status === "running";
    this.interruptButton.hidden = !running;
    this.working.hidden = !running;
    this.forkButton.hidden = false;
    this.forkButton.disabled = running;
    this.forkButton.title = running ? "A running turn cannot be forked: wait until it ends" : "Copy this conversation into a new session";
  }

  /** A frame: event `seq` was appended to this session. */
  notify(seq) {
    if (this.feed) this.feed.notify(seq);
  }

  /** A `session/delta` frame for this session. */
  delta(data) {
    if (!this.feed) return;
    this.scroll.querySelector(".conversation-empty")?.remove();
    this.feed.delta(data);
  }

  /** Fetch the tail again (after a reset). */
  refresh() {
    if (this.feed) this.feed.sync();
  }

  send() {
    if (!this.summary || !this.feed) return;
    const text = this.text.value.trim();
    if (!text) return;
    this.text.value = "";
    this.deliver(this.summary.id, text);
  }

  /** Show `text` at once, then send it; the logged message replaces the echo, a failure is shown on it. */
  async deliver(sessionId, text) {
    say("prompt-error", "");
    this.scroll.querySelector(".conversation-empty")?.remove();
    const feed = this.feed;
    const echo = feed.pendingPrompt(text);
    try {
      const accepted = await api.promptSession(sessionId, text);
      echo.accepted(accepted && accepted.messageId);
      if (this.feed === feed) feed.sync();
    } catch (error) {
      echo.failed(error.message, () => {
        if (this.feed === feed) this.deliver(sessionId, text);
      });
    }
  }

  async interrupt() {
    if (!this.summary) return;
    try {
      await api.interruptSession(this.summary.id);
    } catch (error) {
      say("prompt-error", `The interrupt failed: ${error.message}`);
    }
  }

  async fork() {
    if (!this.summary) return;
    say("conversation-error", "");
    this.forkButton.disabled = true;
    try {
      const created = await api.forkSession(this.summary.id);
      this.onForked(created.session);
    } catch (error) {
      say("conversation-error", `The session could not be forked: ${error.message}`);
    } finally {
      this.forkButton.disabled = this.summary ? this.summary.status === "running" : true;
    }
  }
}
