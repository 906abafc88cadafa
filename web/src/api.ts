// The HTTP API client: every call carries the bearer token; every failure becomes an ApiError
// with the server's message, code and field problems (coordinator/api/errors.py's shape).
import type { Problem } from "./types";

/** Seconds a plain request may take before it is abandoned with an error that says so. */
const REQUEST_TIMEOUT_MS = 30_000;

/** At most this long the turn's own stream is held while the session's follower connects. */
const HOLD_TURN_STREAM_MS = 15_000;

export interface StartedTurn {
  sessionId: string;
  spawnId: string;
  /** Lets go of the turn's own event stream (the session's follower reads the events). */
  release: () => void;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code: string = "",
    readonly problems: Problem[] = [],
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

interface ErrorBody {
  error?: { code?: string; message?: string; details?: Record<string, unknown> };
}

export async function errorFrom(response: Response): Promise<ApiError> {
  let body: ErrorBody = {};
  try {
    body = (await response.json()) as ErrorBody;
  } catch {
    // not JSON (a proxy's page): the status says enough
  }
  const error = body.error ?? {};
  const details = error.details ?? {};
  const problems = Array.isArray(details["problems"]) ? (details["problems"] as Problem[]) : [];
  const message = error.message ?? `${response.status} ${response.statusText || "error"}`;
  return new ApiError(response.status, message, error.code ?? "", problems, details);
}

export class Api {
  constructor(readonly token: string) {}

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { Authorization: `Bearer ${this.token}`, Accept: "application/json", ...extra };
  }

  /** ``timeoutMs``: longer for a request the server may spend minutes on (a git clone). */
  async request<T>(
    method: string,
    path: string,
    body?: unknown,
    timeoutMs: number = REQUEST_TIMEOUT_MS,
  ): Promise<T> {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), timeoutMs);
    let response: Response;
    try {
      response = await fetch(path, {
        method,
        headers: this.headers(body === undefined ? {} : { "Content-Type": "application/json" }),
        body: body === undefined ? null : JSON.stringify(body),
        signal: controller.signal,
        cache: "no-store",
      });
    } catch (exc) {
      const why = controller.signal.aborted
        ? `no answer within ${timeoutMs / 1000} s`
        : String(exc);
      throw new ApiError(0, `the server could not be reached (${method} ${path}: ${why})`);
    } finally {
      clearTimeout(timer);
    }
    if (!response.ok) throw await errorFrom(response);
    if (response.status === 204) return undefined as T;
    return (await response.json()) as T;
  }

  get<T>(path: string): Promise<T> {
    return this.request<T>("GET", path);
  }
  post<T>(path: string, body?: unknown, timeoutMs?: number): Promise<T> {
    return this.request<T>("POST", path, body ?? {}, timeoutMs);
  }
  patch<T>(path: string, body: unknown): Promise<T> {
    return this.request<T>("PATCH", path, body);
  }
  delete(path: string): Promise<void> {
    return this.request<void>("DELETE", path);
  }

  /** Starts a turn (the POST answers an event stream) and returns the ids from its headers;
   * the stream itself is left: the session follower reads the events, resumably. */
  async startTurn(
    sessionId: string | null,
    text: string,
    agent: string,
    context: Record<string, string>,
  ): Promise<StartedTurn> {
    const path = sessionId
      ? `/api/v1/chat/sessions/${encodeURIComponent(sessionId)}/messages`
      : "/api/v1/chat";
    const body: Record<string, unknown> = sessionId ? { content: text } : { prompt: text };
    if (agent) body["agent"] = agent;
    if (Object.keys(context).length) body["context"] = context;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
    let response: Response;
    try {
      response = await fetch(path, {
        method: "POST",
        headers: this.headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
    } catch (exc) {
      throw new ApiError(0, `the server could not be reached: ${String(exc)}`);
    } finally {
      clearTimeout(timer);
    }
    if (!response.ok) throw await errorFrom(response);
    // The turn's own stream stays open until the session's follower is live (workers stream a
    // reply token by token only while someone watches the session), then is let go: closing
    // our side ends only this stream, never the turn (coordinator/api/chat.py).
    const stream = response.body;
    const release = () => void stream?.cancel().catch(() => undefined);
    const released = setTimeout(release, HOLD_TURN_STREAM_MS);
    return {
      sessionId: response.headers.get("X-Session-Id") ?? sessionId ?? "",
      spawnId: response.headers.get("X-Spawn-Id") ?? "",
      release: () => {
        clearTimeout(released);
        release();
      },
    };
  }
}
