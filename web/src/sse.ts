// A resumable Server-Sent Events reader over fetch (EventSource cannot send the bearer token).
//
// It keeps the highest `id:` it handed on and reconnects after any drop with `Last-Event-ID`
// set to it, so the server replays exactly what came after: every event once, in order. An event
// whose id is not above the last one (a replay racing a reconnect) is dropped here as well.

export interface SseMessage {
  id: number;
  event: string;
  data: string;
}

export type StreamState = "connecting" | "live" | "reconnecting" | "closed";

export interface FollowOptions {
  url: string;
  token: string;
  /** Resume after this id (0: from the start). */
  after: number;
  onMessage: (message: SseMessage) => void;
  onState?: (state: StreamState, detail?: string) => void;
  /** A 401/403/404 ends the stream: reconnecting would not help. */
  onFatal?: (status: number, message: string) => void;
  /** Seconds of silence (no event, no keepalive) after which the connection is presumed dead. */
  silenceSeconds?: number;
}

/** Splits an SSE byte stream into messages; feed it decoded text, it keeps partial lines. */
export class SseParser {
  private buffer = "";
  private fields: Record<string, string> = {};

  push(text: string, emit: (message: SseMessage) => void): void {
    this.buffer += text;
    let newline: number;
    while ((newline = this.buffer.search(/\r\n|\n|\r/)) !== -1) {
      const line = this.buffer.slice(0, newline);
      const width = this.buffer.startsWith("\r\n", newline) ? 2 : 1;
      this.buffer = this.buffer.slice(newline + width);
      this.line(line, emit);
    }
  }

  private line(line: string, emit: (message: SseMessage) => void): void {
    if (line === "") {
      const { id, event, data } = this.fields;
      this.fields = {};
      if (data !== undefined && id !== undefined && /^\d+$/.test(id)) {
        emit({ id: Number(id), event: event ?? "message", data });
      }
      return;
    }
    if (line.startsWith(":")) return; // a keepalive comment
    const colon = line.indexOf(":");
    const key = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    this.fields[key] = key === "data" && this.fields[key] !== undefined
      ? `${this.fields[key]}\n${value}`
      : value;
  }
}

const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];

/** Follows ``url`` until the returned function is called. */
export function follow(options: FollowOptions): () => void {
  let last = options.after;
  let stopped = false;
  let attempt = 0;
  let controller: AbortController | null = null;
  let detail = "";
  const silence = (options.silenceSeconds ?? 45) * 1000;

  const run = async (): Promise<void> => {
    while (!stopped) {
      options.onState?.(attempt === 0 ? "connecting" : "reconnecting");
      controller = new AbortController();
      const current = controller;
      let watchdog = setTimeout(() => current.abort(), silence);
      const alive = () => {
        clearTimeout(watchdog);
        watchdog = setTimeout(() => current.abort(), silence);
      };
      try {
        const headers: Record<string, string> = {
          Authorization: `Bearer ${options.token}`,
          Accept: "text/event-stream",
        };
        if (last > 0) headers["Last-Event-ID"] = String(last);
        const response = await fetch(options.url, {
          headers,
          signal: current.signal,
          cache: "no-store",
        });
        if (response.status === 401 || response.status === 403 || response.status === 404) {
          const text = await response.text().catch(() => "");
          options.onFatal?.(response.status, messageOf(text) ?? response.statusText);
          stopped = true;
          break;
        }
        if (!response.ok || !response.body) {
          const text = await response.text().catch(() => "");
          throw new Error(`HTTP ${response.status}: ${messageOf(text) ?? response.statusText}`);
        }
        attempt = 0;
        options.onState?.("live");
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        const parser = new SseParser();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          alive();
          parser.push(value, (message) => {
            if (message.id <= last) return; // already handed on
            last = message.id;
            options.onMessage(message);
          });
        }
      } catch (exc) {
        if (stopped) break;
        detail = exc instanceof Error ? exc.message : String(exc);
      } finally {
        clearTimeout(watchdog);
      }
      if (stopped) break;
      const wait = BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length - 1)] ?? 8000;
      attempt += 1;
      options.onState?.("reconnecting", detail || "the connection ended");
      detail = "";
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
    options.onState?.("closed");
  };
  void run();
  return () => {
    stopped = true;
    controller?.abort();
  };
}

function messageOf(text: string): string | undefined {
  try {
    const body = JSON.parse(text) as { error?: { message?: string } };
    return body.error?.message;
  } catch {
    return undefined;
  }
}
