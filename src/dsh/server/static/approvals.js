// Approvals (top of the conversation pane): every tool call waiting for a person's decision, with
// the asking agent, the tool, the exact command or change (`preview`) and Approve / Always / Deny
// (decideApproval). The list is fetched (listApprovals) and then kept by the broadcast frames
// `approval/pending` and `approval/settled`; a decision's error is shown on its card.

import { api } from "./api.js";
import { byId, el, formatTime } from "./dom.js";

const OUTCOME_TEXT = {
  "allowed-once": "approved",
  "allowed-always": "approved for the session",
  rejected: "denied",
  cancelled: "withdrawn (the turn ended)",
  unavailable: "timed out",
};

export class ApprovalList {
  constructor({ onOpenSession }) {
    this.onOpenSession = onOpenSession;
    this.root = byId("approvals");
    this.list = byId("approval-list");
    this.items = new Map(); // approval id -> {approval, node}
  }

  async load() {
    try {
      const answer = await api.listApprovals();
      const fresh = new Set();
      for (const approval of answer.items || []) {
        fresh.add(approval.id);
        this.add(approval);
      }
      for (const id of [...this.items.keys()]) if (!fresh.has(id)) this.remove(id);
    } catch (error) {
      this.root.hidden = false;
      this.list.replaceChildren(el("li", { class: "error-text", text: `Approvals could not be listed: ${error.message}` }));
    }
  }

  /** An `approval/pending` frame (or a listed request). */
  add(approval) {
    if (!approval || typeof approval.id !== "string" || this.items.has(approval.id)) return;
    const node = this.render(approval);
    this.items.set(approval.id, { approval, node });
    this.list.append(node);
    this.refresh();
  }

  /** An `approval/settled` frame: the card says how it ended, then leaves. */
  settled(id, outcome) {
    const item = this.items.get(id);
    if (!item) return;
    item.node.dataset.state = "settled";
    for (const button of item.node.querySelectorAll("button")) button.disabled = true;
    item.node.querySelector(".approval-status").textContent = OUTCOME_TEXT[outcome] || String(outcome || "settled");
    setTimeout(() => this.remove(id), 1200);
  }

  remove(id) {
    const item = this.items.get(id);
    if (!item) return;
    item.node.remove();
    this.items.delete(id);
    this.refresh();
  }

  refresh() {
    this.root.hidden = this.items.size === 0;
    byId("approvals-count").textContent = this.items.size ? String(this.items.size) : "";
  }

  render(approval) {
    const status = el("span", { class: "approval-status", attrs: { role: "status" } });
    const error = el("p", { class: "error-text", attrs: { role: "alert", hidden: "" } });
    const decide = async (decision, button) => {
      error.hidden = true;
      for (const other of node.querySelectorAll("button.decision")) other.disabled = true;
      status.textContent = "sending…";
      try {
        await api.decideApproval(approval.id, decision);
        status.textContent = decision === "deny" ? "denied" : "approved";
      } catch (failure) {
        status.textContent = "";
        error.textContent = `The decision was not taken: ${failure.message}`;
        error.hidden = false;
        for (const other of node.querySelectorAll("button.decision")) other.disabled = false;
        button.focus();
      }
    };
    const button = (text, decision, kind, title) => {
      const node = el("button", { class: `decision ${kind}`, text, attrs: { type: "button", title } });
      node.addEventListener("click", () => decide(decision, node));
      return node;
    };
    const who = el(
      "button",
      { class: "link-button mono ellipsis", text: approval.sessionId, attrs: { type: "button", title: "Open this session" } },
    );
    who.addEventListener("click", () => this.onOpenSession(approval.sessionId));
    const node = el(
      "li",
      { class: "approval", data: { id: approval.id, sessionId: approval.sessionId, tool: approval.toolName } },
      el(
        "div",
        { class: "approval-head" },
        el("span", { class: "approval-icon", text: "?", attrs: { "aria-hidden": "true" } }),
        el("strong", { text: approval.label || "agent" }),
        el("span", { text: " wants to use " }),
        el("code", { class: "tool-name", text: approval.toolName || "a tool" }),
        el("time", { class: "muted", text: formatTime(approval.createdAt) }),
      ),
      approval.subject ? el("p", { class: "approval-subject", text: approval.subject }) : null,
      el("pre", { class: "approval-preview", text: approval.preview || "" }),
      el("div", { class: "approval-session muted small" }, "session ", who),
      el(
        "div",
        { class: "approval-actions" },
        button("Approve", "allow", "primary", "Run this call once"),
        approval.pattern
          ? button("Always", "always", "secondary", `Also allow calls matching ${approval.pattern} for the rest of this session`)
          : null,
        button("Deny", "deny", "secondary danger", "Refuse this call"),
        status,
      ),
      error,
    );
    return node;
  }
}
