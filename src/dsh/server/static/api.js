// The HTTP API client: the token and every data call. The token is read once from the URL
// fragment (#token=...), kept in sessionStorage and removed from the address bar; every call sends
// it in the Authorization header, so it never appears in a URL the page requests.

const TOKEN_KEY = "dsh.token";

/** A failed call: the wire error's code, message and details, and the HTTP status. */
export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

/**
 * Move `#token=...` from the address into sessionStorage and strip it from the URL. Other fragment
 * parameters (the selected session) stay.
 * @returns {URLSearchParams} the fragment's remaining parameters
 */
export function adoptTokenFromUrl() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  if (params.has("token")) {
    const token = params.get("token");
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return params;
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** Headers of every call. */
export function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${token()}`, ...extra };
}

const listeners = { unauthenticated: [] };

/** Call `handler` whenever a call is answered 401. */
export function onUnauthenticated(handler) {
  listeners.unauthenticated.push(handler);
}

function tellUnauthenticated() {
  for (const handler of listeners.unauthenticated) handler();
}

async function call(method, path, { body, query, signal } = {}) {
  let url = path;
  if (query) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) {
      if (value !== undefined && value !== null) params.append(name, String(value));
    }
    const text = params.toString();
    if (text) url += `?${text}`;
  }
  const headers = authHeaders({ Accept: "application/json" });
  const init = { method, headers, cache: "no-store", signal };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    if (error && error.name === "AbortError") throw error;
    throw new ApiError(0, "network", "the server cannot be reached", {});
  }
  let payload = null;
  const text = await response.text();
  if (text) {
    try {
      payload = JSON.parse(text);
    } catch {
      payload = null;
    }
  }
  if (!response.ok) {
    const error = payload && payload.error ? payload.error : {};
    if (response.status === 401) tellUnauthenticated();
    throw new ApiError(
      response.status,
      error.code || "http-" + response.status,
      error.message || `the server answered ${response.status}`,
      error.details,
    );
  }
  return payload;
}

const seg = encodeURIComponent;

/** The browser's time zone, when it has a usable IANA name. */
function timeZone() {
  try {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    return typeof zone === "string" && /^[A-Za-z_]+(\/[A-Za-z0-9_+-]+)*$/.test(zone) ? zone : undefined;
  } catch {
    return undefined;
  }
}

async function prompt(path, text) {
  const body = { content: [{ type: "text", text }] };
  const zone = timeZone();
  if (zone) body.clientTimeZone = zone;
  try {
    return await call("POST", path, { body });
  } catch (error) {
    // A zone the server's tz database does not know: send the message without it.
    if (error instanceof ApiError && error.code === "invalid-time-zone") {
      return call("POST", path, { body: { content: body.content } });
    }
    throw error;
  }
}

export const api = {
  listSessions: ({ limit = 50, cursor, search } = {}) =>
    call("GET", "/api/v1/sessions", { query: { limit, cursor, search: search || undefined } }),
  forkSession: (id) => call("POST", `/api/v1/sessions/${seg(id)}/fork`),
  listApprovals: () => call("GET", "/api/v1/approvals"),
  decideApproval: (id, decision) => call("POST", `/api/v1/approvals/${seg(id)}`, { body: { decision } }),
  getSession: (id) => call("GET", `/api/v1/sessions/${seg(id)}`),
  resumeSession: (id) => call("POST", `/api/v1/sessions/${seg(id)}/resume`),
  promptSession: (id, text) => prompt(`/api/v1/sessions/${seg(id)}/prompt`, text),
  interruptSession: (id) => call("POST", `/api/v1/sessions/${seg(id)}/interrupt`),
  getSessionHistory: (id, { beforeSeq, maxMessages } = {}) =>
    call("GET", `/api/v1/sessions/${seg(id)}/history`, { query: { beforeSeq, maxMessages } }),
  listSubagents: (id, scope = "descendants") =>
    call("GET", `/api/v1/sessions/${seg(id)}/subagents`, { query: { scope } }),
  getSubagentHistory: (pid, cid, { mode, beforeSeq, maxMessages } = {}) =>
    call("GET", `/api/v1/sessions/${seg(pid)}/subagents/${seg(cid)}/history`, {
      query: { mode, beforeSeq, maxMessages },
    }),
  promptSubagent: (pid, cid, text) => prompt(`/api/v1/sessions/${seg(pid)}/subagents/${seg(cid)}/prompt`, text),
  interruptSubagent: (pid, cid) => call("POST", `/api/v1/sessions/${seg(pid)}/subagents/${seg(cid)}/interrupt`),
};
