// The conversation view (centre pane): the selected session's history with "Load earlier", new
// events as they happen, a prompt box (promptSession; a stored session is resumed by the server
// first) and an Interrupt button while a turn runs.

import { api } from "./api.js";
import { append, byId, clear, el, formatDateTime, say, submitOnCtrlEnter } from "./dom.js";
import { HistoryFeed } from "./feed.js";

export class ConversationView {
  constructor({ onProjections }) {
    this.onProjections = onProjections;
    this.scroll = byId("conversation-scroll");
    this.form = byId("prompt-form");
    this.text = byId("prompt-text");
    this.interruptButton = byId("conversation-interrupt");
    this.summary = null;
    this.feed = null;
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    submitOnCtrlEnter(this.text, this.form);
    this.interruptButton.addEventListener("click", () => this.interrupt());
  }

  get sessionId() {
    return this.summary ? this.summary.id : null;
  }

  clear() {
    if (this.feed) this.feed.close();
    this.feed = null;
    this.summary = null;
    const heading = byId("conversation-heading");
    heading.textContent = "No session selected";
    heading.classList.remove("mono");
    heading.removeAttribute("title");
    byId("conversation-meta").replaceChildren();
    this.scroll.replaceChildren(el("p", { class: "empty", text: "Choose a session to read its conversation." }));
    this.form.hidden = true;
    this.interruptButton.hidden = true;
    say("conversation-error", "");
  }

  open(summary) {
    if (this.feed) this.feed.close();
    this.summary = summary;
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
      onError: (error) => say("conversation-error", `The history could not be read: ${error.message}`),
    });
    return this.feed.load().catch((error) => {
      this.scroll.replaceChildren(el("p", { class: "empty", text: "This session's history could not be read." }));
      say("conversation-error", error.message);
    });
  }

  takePage(page) {
    const values = page.projections && page.projections.values;
    if (values && typeof values === "object") this.onProjections(page.sessionId, values, page.projections.asOfSeq);
  }

  /** The summary changed (status, title). */
  update(summary) {
    if (!this.summary || summary.id !== this.summary.id) return;
    this.summary = { ...this.summary, ...summary };
    this.renderHeader();
  }

  renderHeader() {
    const summary = this.summary;
    const status = summary.status || "stored";
    const heading = byId("conversation-heading");
    heading.textContent = summary.title || summary.id;
    heading.classList.toggle("mono", !summary.title);
    heading.title = summary.id;
    append(
      clear(byId("conversation-meta")),
      el("span", { class: "status-pill", data: { status }, text: status }),
      summary.title ? el("code", { class: "mono ellipsis", text: summary.id }) : null,
      summary.createdAt ? el("span", { text: `created ${formatDateTime(summary.createdAt)}` }) : null,
    );
    this.interruptButton.hidden = status !== "running";
  }

  /** A frame: event `seq` was appended to this session. */
  notify(seq) {
    if (this.feed) this.feed.notify(seq);
  }

  /** Fetch the tail again (after a reset). */
  refresh() {
    if (this.feed) this.feed.sync();
  }

  async send() {
    if (!this.summary) return;
    const text = this.text.value.trim();
    if (!text) return;
    say("prompt-error", "");
    this.form.classList.add("busy");
    try {
      await api.promptSession(this.summary.id, text);
      this.text.value = "";
      if (this.feed) this.feed.sync();
    } catch (error) {
      say("prompt-error", `Not sent: ${error.message}`);
    } finally {
      this.form.classList.remove("busy");
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
}
