// The push stream, read with fetch and a ReadableStream reader (not EventSource), so the token
// travels in the Authorization header and never in a URL. The stream reconnects by itself with a
// growing delay and sends Last-Event-ID, so the server replays what was missed.

import { authHeaders } from "./api.js";

const FIRST_DELAY_MS = 300;
const MAX_DELAY_MS = 5000;

/** Parses text/event-stream bytes into frames `{id, event, data}` (data is parsed JSON). */
class FrameParser {
  constructor(onFrame) {
    this.onFrame = onFrame;
    this.decoder = new TextDecoder();
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.id = null;
    this.event = "message";
    this.data = [];
  }

  push(bytes) {
    this.buffer += this.decoder.decode(bytes, { stream: true });
    let cut;
    while ((cut = this.buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buffer.slice(0, cut);
      const width = this.buffer.startsWith("\r\n", cut) ? 2 : 1;
      if (this.buffer[cut] === "\r" && cut + 1 === this.buffer.length) break; // wait for a possible \n
      this.buffer = this.buffer.slice(cut + width);
      this.line(line);
    }
  }

  line(line) {
    if (line === "") {
      this.dispatch();
      return;
    }
    if (line.startsWith(":")) return; // a comment (`: ping`)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") this.id = value;
    else if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
  }

  dispatch() {
    const { id, event, data } = this;
    this.reset();
    if (!data.length) return;
    let parsed;
    try {
      parsed = JSON.parse(data.join("\n"));
    } catch {
      return;
    }
    this.onFrame({ id: id === null ? null : Number(id), event, data: parsed });
  }
}

/**
 * One push stream subscription that stays connected.
 *
 * States reported to `onState`: `connecting`, `live`, `reconnecting`, `unauthenticated`, `stopped`.
 */
export class PushStream {
  /**
   * @param {{name: string, sessionIds?: () => string[] | null, onFrame: (frame: object) => void,
   *          onState?: (state: string, stream: PushStream) => void,
   *          onResumeUnknown?: () => void}} options
   *   `sessionIds` gives the filter (null: broadcast frames only); `onResumeUnknown` is called when
   *   the stream reconnected without any event id to resume from (frames may have been missed).
   */
  constructor(options) {
    this.name = options.name;
    this.sessionIds = options.sessionIds || (() => null);
    this.onFrame = options.onFrame;
    this.onState = options.onState || (() => {});
    this.onResumeUnknown = options.onResumeUnknown || (() => {});
    this.lastEventId = null;
    this.state = "stopped";
    this.controller = null;
    this.wake = null;
    this.running = false;
    this.attempt = 0;
    this.restarting = false;
    this.everLive = false;
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.onState(state, this);
  }

  start() {
    if (this.running) return;
    this.running = true;
    this.loop();
  }

  stop() {
    this.running = false;
    if (this.controller) this.controller.abort();
    if (this.wake) this.wake();
    this.setState("stopped");
  }

  /** Reconnect at once with the current filter (keeps Last-Event-ID, so nothing is lost). */
  restart() {
    if (!this.running) return this.start();
    this.restarting = true;
    if (this.controller) this.controller.abort();
    if (this.wake) this.wake();
  }

  /** Skip the wait before the next attempt. */
  retryNow() {
    this.attempt = 0;
    if (this.wake) this.wake();
  }

  url() {
    const ids = this.sessionIds();
    const params = new URLSearchParams();
    for (const id of ids || []) params.append("sessionId", id);
    const query = params.toString();
    return "/api/v1/stream" + (query ? `?${query}` : "");
  }

  async loop() {
    while (this.running) {
      const controller = new AbortController();
      this.controller = controller;
      this.restarting = false;
      const resumable = this.lastEventId !== null;
      if (!this.everLive) this.setState("connecting");
      let unauthenticated = false;
      try {
        const headers = authHeaders({ Accept: "text/event-stream" });
        if (resumable) headers["Last-Event-ID"] = String(this.lastEventId);
        const response = await fetch(this.url(), { headers, cache: "no-store", signal: controller.signal });
        if (response.status === 401) {
          unauthenticated = true;
        } else if (response.ok && response.body) {
          this.attempt = 0;
          this.setState("live");
          if (this.everLive && !resumable) this.onResumeUnknown();
          this.everLive = true;
          await this.read(response.body.getReader());
        }
      } catch {
        // A network failure or our own abort (restart, stop): handled below.
      }
      if (!this.running) return;
      if (unauthenticated) {
        this.running = false;
        this.setState("unauthenticated");
        return;
      }
      if (this.restarting) continue; // a new filter: reconnect at once, not a failure
      this.setState("reconnecting");
      await this.pause(this.delay());
      this.attempt += 1;
    }
  }

  async read(reader) {
    const parser = new FrameParser((frame) => {
      if (frame.id !== null && Number.isFinite(frame.id)) this.lastEventId = frame.id;
      try {
        this.onFrame(frame);
      } catch (error) {
        console.error("dsh: a push frame could not be applied", error);
      }
    });
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      parser.push(value);
    }
  }

  delay() {
    const base = Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** this.attempt);
    return base + Math.floor(Math.random() * 200);
  }

  pause(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      function done() {
        clearTimeout(timer);
        self.wake = null;
        resolve();
      }
      this.wake = done;
    });
  }
}
