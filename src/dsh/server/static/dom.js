// Small DOM helpers. Data text only ever goes in through textContent (never innerHTML), and
// attributes are set with setAttribute, which the browser never parses as markup.

/**
 * Create an element.
 * @param {string} tag
 * @param {{class?: string, text?: string, attrs?: Record<string, string>, data?: Record<string, string>,
 *          on?: Record<string, EventListener>}} [options]
 * @param {...(Node|string|null|undefined|false)} children strings become text nodes
 */
export function el(tag, options = {}, ...children) {
  const node = document.createElement(tag);
  if (options.class) node.className = options.class;
  if (options.text !== undefined && options.text !== null) node.textContent = String(options.text);
  for (const [name, value] of Object.entries(options.attrs || {})) {
    if (value !== undefined && value !== null && value !== false) node.setAttribute(name, String(value));
  }
  for (const [name, value] of Object.entries(options.data || {})) {
    if (value !== undefined && value !== null) node.dataset[name] = String(value);
  }
  for (const [name, handler] of Object.entries(options.on || {})) node.addEventListener(name, handler);
  append(node, ...children);
  return node;
}

/** Append nodes; strings become text nodes, empty values are skipped. */
export function append(parent, ...children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return parent;
}

/** Remove every child of `node`. */
export function clear(node) {
  while (node.firstChild) node.firstChild.remove();
  return node;
}

/** Set the text of the element `id` (and show it), or hide it when `text` is empty. */
export function say(id, text) {
  const node = document.getElementById(id);
  if (!node) return;
  node.textContent = text || "";
  node.hidden = !text;
}

/** `document.getElementById`, failing loudly when the page and the script disagree. */
export function byId(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`the page has no #${id}`);
  return node;
}

const dateTime = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
const timeOnly = new Intl.DateTimeFormat(undefined, { timeStyle: "medium" });

/** An epoch-ms time as a short local date and time. */
export function formatDateTime(ms) {
  return typeof ms === "number" && Number.isFinite(ms) ? dateTime.format(new Date(ms)) : "";
}

/** An epoch-ms time as a local time of day. */
export function formatTime(ms) {
  return typeof ms === "number" && Number.isFinite(ms) ? timeOnly.format(new Date(ms)) : "";
}

/** A duration in ms as `850 ms`, `12.3 s` or `4 min 05 s`. */
export function formatDuration(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const minutes = Math.floor(ms / 60_000);
  const seconds = Math.round((ms % 60_000) / 1000);
  return `${minutes} min ${String(seconds).padStart(2, "0")} s`;
}

/** Enter (or Ctrl/Cmd+Enter) in `textarea` submits `form`; Shift+Enter is a new line; IME composition is left alone. */
export function submitOnEnter(textarea, form) {
  textarea.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.isComposing || event.shiftKey || event.altKey) return;
    event.preventDefault();
    form.requestSubmit();
  });
}

const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 });

/** A token count as `950`, `12.3K`, `1.2M`. */
export function formatTokens(count) {
  return typeof count === "number" && Number.isFinite(count) ? compact.format(count) : "";
}

/** A cost as `$0.0042` / `$1.23` (amount and currency code). */
export function formatCost(amount, currency = "USD") {
  if (typeof amount !== "number" || !Number.isFinite(amount)) return "";
  const digits = amount !== 0 && Math.abs(amount) < 0.01 ? 4 : 2;
  try {
    return new Intl.NumberFormat(undefined, { style: "currency", currency, minimumFractionDigits: digits, maximumFractionDigits: digits }).format(amount);
  } catch {
    return `${amount.toFixed(digits)} ${currency}`;
  }
}

/** A past time relative to now: `just now`, `5 min ago`, `3 h ago`, else the date. */
export function formatAgo(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms)) return "";
  const delta = Date.now() - ms;
  if (delta < 45_000) return "just now";
  if (delta < 3_600_000) return `${Math.round(delta / 60_000)} min ago`;
  if (delta < 86_400_000) return `${Math.round(delta / 3_600_000)} h ago`;
  return formatDateTime(ms);
}
