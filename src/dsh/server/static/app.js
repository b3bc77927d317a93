// The dsh web UI: entry point. It wires the panes to the API and to two push streams: a broadcast
// stream (new sessions, statuses, subagent starts and ends, for the session list and the tree) and
// a focus stream following the selected session, its subagents and the open child (their events
// and projections). Frames carry process-wide rising ids, so a frame both streams deliver is
// applied once. Every text that comes from the server is inserted with textContent.

import { adoptTokenFromUrl, api, forgetToken, onUnauthenticated, setToken, token } from "./api.js";
import { ChildPanel } from "./child.js";
import { ConversationView } from "./conversation.js";
import { byId, say } from "./dom.js";
import { SessionList } from "./sessions.js";
import { PushStream } from "./stream.js";
import { SubagentTree } from "./tree.js";

const MAX_FILTER_IDS = 256;
const SEEN_LIMIT = 4096;

let lastFrameId = 0;
const seen = new Set(); // recent frame ids, oldest first
const statusFrames = new Map(); // session id -> {status, frameId}
const projectionSeqs = new Map(); // `${sessionId}\u0000${key}` -> seq of the value shown

const activityOf = (status) => (status === "running" ? "running" : "inactive");

const statuses = {
  stamp: () => lastFrameId,
  since(stamp) {
    const out = new Map();
    for (const [id, frame] of statusFrames) if (frame.frameId > stamp) out.set(id, activityOf(frame.status));
    return out;
  },
};

const sessions = new SessionList({ onSelect: (id) => selectSession(id) });
const conversation = new ConversationView({ onProjections: applySnapshot });
const tree = new SubagentTree({ onSelect: (entry) => openChild(entry), statuses });
const child = new ChildPanel({
  onOpen: (entry) => {
    tree.select(entry.id);
    showPane("subagents");
    refocus();
  },
  onClose: () => {
    tree.select(null);
    refocus();
  },
  onParentResumed: () => scheduleTree(),
});

const broadcast = new PushStream({ name: "broadcast", onFrame, onState: showConnection, onResumeUnknown: scheduleRefetch });
const focus = new PushStream({
  name: "focus",
  sessionIds: focusIds,
  onFrame,
  onState: showConnection,
  onResumeUnknown: scheduleRefetch,
});

// ---------------------------------------------------------------- selection

async function selectSession(id) {
  let summary = sessions.get(id);
  if (!summary) {
    try {
      summary = await api.getSession(id);
    } catch (error) {
      say("sessions-error", `Session ${id} could not be opened: ${error.message}`);
      return;
    }
  }
  sessions.select(id);
  child.close();
  history.replaceState(null, "", `${location.pathname}${location.search}#session=${encodeURIComponent(id)}`);
  showPane("conversation");
  const loading = conversation.open(summary);
  refocus();
  await Promise.all([loading, tree.load(id)]);
  refocus();
}

function openChild(entry) {
  const parentId = conversation.sessionId;
  if (!parentId) return;
  // The address is the row's own parent: a grandchild is addressed through its subagent parent.
  child.open(entry.parentId || parentId, entry);
}

function focusIds() {
  const ids = [];
  const add = (id) => {
    if (id && !ids.includes(id) && ids.length < MAX_FILTER_IDS) ids.push(id);
  };
  add(conversation.sessionId);
  add(child.sessionId);
  for (const id of tree.ids()) add(id);
  return ids;
}

let focusKey = "";
function refocus() {
  if (!conversation.sessionId) {
    if (focus.running) focus.stop();
    focusKey = "";
    return;
  }
  const key = focusIds().join("\n");
  if (key === focusKey && focus.running) return;
  focusKey = key;
  if (focus.running) {
    focus.restart();
  } else {
    // Frame ids are process-wide: resume after the newest frame any stream delivered.
    if (focus.lastEventId === null && lastFrameId > 0) focus.lastEventId = lastFrameId;
    focus.start();
  }
}

// ---------------------------------------------------------------- frames

function onFrame(frame) {
  if (typeof frame.id === "number" && Number.isFinite(frame.id)) {
    if (seen.has(frame.id)) return;
    seen.add(frame.id);
    if (seen.size > SEEN_LIMIT) seen.delete(seen.values().next().value);
    lastFrameId = Math.max(lastFrameId, frame.id);
  }
  const data = frame.data || {};
  switch (frame.event) {
    case "reset":
      scheduleRefetch();
      break;
    case "session/created": {
      const summary = data.session;
      if (!summary) break;
      sessions.upsert(summary);
      if (summary.id === conversation.sessionId) conversation.update({ id: summary.id, status: summary.status });
      if (summary.origin === "subagent" && touchesTree(summary.parentSession)) scheduleTree();
      break;
    }
    case "session/status": {
      const { sessionId, status } = data;
      statusFrames.set(sessionId, { status, frameId: frame.id ?? lastFrameId });
      sessions.setStatus(sessionId, status);
      if (sessionId === conversation.sessionId) {
        conversation.update({ id: sessionId, status: status === "closed" ? "stored" : status });
      }
      tree.setActivity(sessionId, activityOf(status));
      child.setActivity(sessionId, activityOf(status));
      break;
    }
    case "subagent/start":
    case "subagent/end": {
      const { parentSessionId, childSessionId } = data;
      if (touchesTree(parentSessionId) || touchesTree(childSessionId)) scheduleTree();
      if (childSessionId && childSessionId === child.sessionId) child.notify();
      break;
    }
    case "session/event": {
      const { sessionId, seq } = data;
      if (sessionId === conversation.sessionId) conversation.notify(seq);
      if (sessionId === child.sessionId) child.notify(seq);
      break;
    }
    case "session/projection":
      applyProjection(data.sessionId, data.key, data.value, data.seq);
      break;
    default:
      break;
  }
}

function touchesTree(id) {
  return Boolean(id) && (id === conversation.sessionId || tree.row(id) !== null);
}

/** Apply a projection value when it is newer than the one shown (a `null` value clears it). */
function applyProjection(sessionId, key, value, seq) {
  const slot = `${sessionId}\u0000${key}`;
  const held = projectionSeqs.get(slot);
  if (typeof seq === "number" && held !== undefined && seq <= held) return;
  if (typeof seq === "number") projectionSeqs.set(slot, seq);
  if (key === "title") {
    sessions.setTitle(sessionId, value);
    if (sessionId === conversation.sessionId) conversation.update({ id: sessionId, title: value || undefined });
  } else if (key === "tokens") {
    sessions.setTokens(sessionId, value);
  } else if (key === "subagentTiming" && sessionId === child.sessionId) {
    child.setTiming(value);
  }
}

function applySnapshot(sessionId, values, asOfSeq) {
  for (const [key, value] of Object.entries(values)) applyProjection(sessionId, key, value, asOfSeq);
}

let treeTimer = null;
function scheduleTree() {
  if (treeTimer) return;
  treeTimer = setTimeout(async () => {
    treeTimer = null;
    const parentId = conversation.sessionId;
    if (!parentId) return;
    await tree.load(parentId);
    const row = child.sessionId ? tree.row(child.sessionId) : null;
    if (row) child.updateEntry({ ...row, activity: tree.activityOf(row) });
    refocus();
  }, 60);
}

let refetchTimer = null;
function scheduleRefetch() {
  if (refetchTimer) return;
  refetchTimer = setTimeout(async () => {
    refetchTimer = null;
    await sessions.load();
    if (conversation.sessionId) {
      sessions.select(conversation.sessionId);
      conversation.refresh();
      scheduleTree();
    }
    if (child.feed) child.feed.sync();
  }, 50);
}

// ---------------------------------------------------------------- connection state

const CONNECTION_TEXT = {
  connecting: "connecting…",
  live: "live",
  reconnecting: "reconnecting…",
  unauthenticated: "signed out",
  stopped: "offline",
};

function showConnection() {
  const states = [broadcast.state];
  if (focus.running || focus.state === "unauthenticated") states.push(focus.state);
  let state = "live";
  for (const candidate of ["unauthenticated", "reconnecting", "connecting", "stopped"]) {
    if (states.includes(candidate)) {
      state = candidate;
      break;
    }
  }
  const box = byId("connection");
  box.dataset.state = state;
  byId("connection-text").textContent = CONNECTION_TEXT[state];
  byId("reconnect-now").hidden = state !== "reconnecting";
  if (state === "unauthenticated") signOut();
}

function whenLive(stream, timeoutMs) {
  return new Promise((resolve) => {
    if (stream.state === "live") return resolve();
    const started = Date.now();
    const check = () => {
      if (stream.state === "live" || !stream.running || Date.now() - started > timeoutMs) resolve();
      else setTimeout(check, 25);
    };
    check();
  });
}

// ---------------------------------------------------------------- panes (narrow windows)

function showPane(name) {
  document.body.dataset.pane = name;
  for (const tab of document.querySelectorAll("[data-pane-tab]")) {
    tab.setAttribute("aria-pressed", tab.dataset.paneTab === name ? "true" : "false");
  }
}

for (const tab of document.querySelectorAll("[data-pane-tab]")) {
  tab.addEventListener("click", () => showPane(tab.dataset.paneTab));
}

// ---------------------------------------------------------------- sign-in and start

function signOut() {
  const hadToken = Boolean(token());
  broadcast.stop();
  focus.stop();
  forgetToken();
  // Several calls may be refused at once: the first one (which still had a token) explains.
  if (hadToken) say("signin-error", "The server did not accept the token.");
  byId("signin").hidden = false;
  byId("layout").hidden = true;
}

byId("signin-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = byId("signin-token").value.trim();
  if (!value) return;
  say("signin-error", "");
  setToken(value);
  byId("signin-token").value = "";
  start(null);
});

byId("reconnect-now").addEventListener("click", () => {
  broadcast.retryNow();
  focus.retryNow();
});

onUnauthenticated(() => signOut());

async function start(initialSession) {
  byId("signin").hidden = true;
  byId("layout").hidden = false;
  broadcast.start();
  await whenLive(broadcast, 3000);
  await sessions.load();
  if (initialSession) await selectSession(initialSession);
}

function boot() {
  const params = adoptTokenFromUrl();
  showPane("sessions");
  if (!token()) {
    byId("signin").hidden = false;
    byId("layout").hidden = true;
    return;
  }
  start(params.get("session"));
}

boot();
