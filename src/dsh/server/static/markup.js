// Rendered messages: the server renders an assistant message's markdown and sanitizes it
// (history entries' `view.html`, docs/ui.md#markdown). The page never assigns markup to the
// document: it parses the HTML in an inert document (DOMParser runs no script and loads nothing)
// and rebuilds an allow-listed copy element by element, so even a server bug could not put a
// script, an event handler or a foreign URL into the page. Code blocks get a Copy button.

import { el } from "./dom.js";

const TAGS = new Set([
  "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li",
  "ol", "p", "pre", "s", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
]);
const ATTRIBUTES = { a: ["href", "title"], code: ["class"], ol: ["start"], td: ["align"], th: ["align"] };
const SCHEMES = new Set(["http:", "https:", "mailto:"]);

/** A safe link target, or null: only http, https and mailto URLs. */
function safeHref(value) {
  try {
    const url = new URL(value, location.href);
    return SCHEMES.has(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

function copy(node) {
  if (node.nodeType === Node.TEXT_NODE) return document.createTextNode(node.data);
  if (node.nodeType !== Node.ELEMENT_NODE) return null;
  const tag = node.localName;
  if (!TAGS.has(tag)) {
    // An unknown element is dropped, its text kept (the server never sends one).
    return document.createTextNode(node.textContent || "");
  }
  const out = document.createElement(tag);
  for (const name of ATTRIBUTES[tag] || []) {
    const value = node.getAttribute(name);
    if (value === null) continue;
    if (name === "href") {
      const href = safeHref(value);
      if (href === null) continue;
      out.setAttribute("href", href);
      out.setAttribute("target", "_blank");
      out.setAttribute("rel", "noopener noreferrer");
    } else if (name === "class") {
      if (/^language-[A-Za-z0-9_+-]{1,40}$/.test(value)) out.setAttribute("class", value);
    } else if (name === "start") {
      if (/^\d{1,9}$/.test(value)) out.setAttribute("start", value);
    } else if (name === "align") {
      if (value === "left" || value === "right" || value === "center") out.setAttribute("align", value);
    } else {
      out.setAttribute(name, value);
    }
  }
  for (const child of node.childNodes) {
    const copied = copy(child);
    if (copied) out.append(copied);
  }
  return out;
}

/** Put `text` on the clipboard; falls back to a selection copy where the Clipboard API is missing. */
async function toClipboard(text, source) {
  if (navigator.clipboard && navigator.clipboard.writeText) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const range = document.createRange();
  range.selectNodeContents(source);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
  const done = document.execCommand("copy");
  selection.removeAllRanges();
  if (!done) throw new Error("copy refused");
}

/** Wrap each `<pre>` in a block with a Copy button. */
function addCopyButtons(root) {
  for (const pre of [...root.querySelectorAll("pre")]) {
    const code = pre.querySelector("code");
    const language = code && /^language-(.+)$/.exec(code.getAttribute("class") || "");
    const button = el("button", { class: "copy-code", text: "Copy", attrs: { type: "button", "aria-label": "Copy the code" } });
    button.addEventListener("click", async () => {
      try {
        await toClipboard((code || pre).textContent, code || pre);
        button.textContent = "Copied";
      } catch {
        button.textContent = "Copy failed";
      }
      setTimeout(() => {
        button.textContent = "Copy";
      }, 1500);
    });
    const block = el(
      "div",
      { class: "code-block" },
      el("div", { class: "code-head" }, el("span", { class: "code-language", text: language ? language[1] : "" }), button),
    );
    pre.replaceWith(block);
    block.append(pre);
  }
}

/** The sanitized HTML of a rendered message as a `<div class="markdown">`, rebuilt from an allow-list. */
export function renderedMessage(html) {
  const parsed = new DOMParser().parseFromString(`<!doctype html><body>${html}`, "text/html");
  const root = el("div", { class: "markdown" });
  for (const child of parsed.body.childNodes) {
    const copied = copy(child);
    if (copied) root.append(copied);
  }
  addCopyButtons(root);
  return root;
}
