// A live history view: the tail page first, "Load earlier" pages before it (beforeSeq), and new
// events as the push stream announces them. A `session/event` frame carries only a summary, so a
// frame newer than what is shown makes the feed fetch the tail page and append the events it has
// not shown; when the tail page no longer reaches back to the shown events (a gap), the view
// starts again from the tail page.

import { el } from "./dom.js";
import { Transcript } from "./transcript.js";

export class HistoryFeed {
  /**
   * @param {{scroll: HTMLElement, fetchPage: (beforeSeq?: number) => Promise<object>, raw?: boolean,
   *          onPage?: (page: object) => void, onError?: (error: Error) => void}} options
   */
  constructor({
    scroll,
    fetchPage,
    raw = false,
    perspective = "session",
    onPage = () => {},
    onShown = () => {},
    onError = () => {},
  }) {
    this.scroll = scroll;
    this.fetchPage = fetchPage;
    this.onPage = onPage;
    this.onShown = onShown;
    this.onError = onError;
    this.earlier = el("button", { class: "secondary wide earlier", text: "Load earlier", attrs: { type: "button", hidden: "" } });
    this.list = el("ol", { class: "entries" });
    this.earlier.addEventListener("click", () => this.loadEarlier());
    scroll.replaceChildren(this.earlier, this.list);
    this.transcript = new Transcript(this.list, { raw, perspective });
    this.nextBeforeSeq = null;
    this.syncing = null;
    this.again = false;
    this.closed = false;
  }

  close() {
    this.closed = true;
  }

  nearBottom() {
    const { scrollTop, scrollHeight, clientHeight } = this.scroll;
    return scrollHeight - scrollTop - clientHeight < 80;
  }

  toBottom() {
    this.scroll.scrollTop = this.scroll.scrollHeight;
  }

  setEarlier(page) {
    this.nextBeforeSeq = page.hasMore && typeof page.nextBeforeSeq === "number" ? page.nextBeforeSeq : null;
    this.earlier.hidden = this.nextBeforeSeq === null;
  }

  /** True when every event of the session is shown (no earlier page). */
  get complete() {
    return this.nextBeforeSeq === null && !this.transcript.empty;
  }

  /** Events before `inheritedEventCount` belong to the session this one was forked from. */
  own(page) {
    if (typeof page.inheritedEventCount === "number") this.transcript.ownFrom = page.inheritedEventCount;
  }

  /** Show the tail page (from scratch). */
  async load() {
    const page = await this.fetchPage();
    if (this.closed) return;
    this.transcript.reset();
    this.own(page);
    this.transcript.append(events(page));
    this.setEarlier(page);
    this.onPage(page);
    this.onShown();
    this.toBottom();
  }

  async loadEarlier() {
    if (this.nextBeforeSeq === null) return;
    this.earlier.disabled = true;
    try {
      const page = await this.fetchPage(this.nextBeforeSeq);
      if (this.closed) return;
      const height = this.scroll.scrollHeight;
      this.own(page);
      this.transcript.prepend(events(page));
      this.setEarlier(page);
      this.onShown();
      this.scroll.scrollTop += this.scroll.scrollHeight - height; // keep the reader's place
    } catch (error) {
      this.onError(error);
    } finally {
      this.earlier.disabled = false;
    }
  }

  /** A `session/delta` frame: streamed text of the session's current step. */
  delta(data) {
    const stick = this.nearBottom();
    this.transcript.delta(data);
    if (stick) this.toBottom();
  }

  /** Show a prompt the person just sent, before the log has it (see `Transcript.pendingPrompt`). */
  pendingPrompt(text) {
    const handle = this.transcript.pendingPrompt(text);
    this.toBottom();
    return handle;
  }

  /** A frame said event `seq` was appended. */
  notify(seq) {
    if (typeof seq === "number" && this.transcript.lastSeq !== null && seq <= this.transcript.lastSeq) return;
    this.sync();
  }

  /** Fetch the tail page and append what is new; concurrent calls share one fetch and one follow-up. */
  sync() {
    if (this.syncing) {
      this.again = true;
      return this.syncing;
    }
    this.syncing = (async () => {
      try {
        do {
          this.again = false;
          await this.syncOnce();
        } while (this.again && !this.closed);
      } catch (error) {
        this.onError(error);
      } finally {
        this.syncing = null;
      }
    })();
    return this.syncing;
  }

  async syncOnce() {
    const page = await this.fetchPage();
    if (this.closed) return;
    const fresh = events(page);
    this.own(page);
    const stick = this.nearBottom();
    const last = this.transcript.lastSeq;
    const first = fresh.length ? fresh[0].seq : null;
    if (last === null || (first !== null && first > last + 1 && page.hasMore)) {
      // Nothing shown yet, or a gap the tail page does not cover: start again from the tail.
      this.transcript.reset();
      this.transcript.append(fresh);
      this.setEarlier(page);
      this.toBottom();
    } else {
      this.transcript.append(fresh);
      if (stick) this.toBottom();
    }
    this.onPage(page);
    this.onShown();
  }
}

/** The page's events; an entry's presentation hint (`view`, e.g. rendered html) rides along as `event.view`. */
function events(page) {
  return (page.events || [])
    .filter((entry) => entry && entry.event && typeof entry.event.seq === "number")
    .map((entry) => (entry.view && typeof entry.view === "object" ? { ...entry.event, view: entry.view } : entry.event));
}
