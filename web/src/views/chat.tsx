// /chat: the user's sessions, the conversation (each question, the streamed prose, an Agent tile
// per dispatch), the composer, and the background runs of the session grouped by what they need.
import { Markdown } from "../components/markdown";
import { useCallback, useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError } from "../api";
import { Pending, CancelButton, Tile } from "../components/tile";
import { useApp } from "../context";
import { COORDINATOR, SessionState, type SpawnView, needsInput, statusOf } from "../session";
import { type StreamState, follow } from "../sse";
import type { Agent, ChatSession, History, SessionEvent, Transcript } from "../types";
import { Badge, ErrorNote, Link } from "../ui";
import { TranscriptDialog } from "./transcript";

/** Turn streams held until their session's follower is live, by session id. */
const heldTurnStreams = new Map<string, (() => void)[]>();

function hold(sessionId: string, release: () => void): void {
  heldTurnStreams.set(sessionId, [...(heldTurnStreams.get(sessionId) ?? []), release]);
}

function letGo(sessionId: string): void {
  for (const release of heldTurnStreams.get(sessionId) ?? []) release();
  heldTurnStreams.delete(sessionId);
}

/** A spawn's usage is looked up at most this often while its events come in. */
const USAGE_EVERY_MS = 1000;

interface Live {
  state: SessionState;
  connection: StreamState;
  /** Why the last connection ended, while reconnecting. */
  why: string;
  fatal: string;
  rev: number;
  reloadHistory: () => void;
}

/** Follows one session: its history, then its events from the first, resumably. */
function useSession(sessionId: string | undefined): Live {
  const { api } = useApp();
  const state = useMemo(() => new SessionState(), [sessionId]);
  const [rev, setRev] = useState(0);
  const [connection, setConnection] = useState<StreamState>("connecting");
  const [fatal, setFatal] = useState("");
  const [why, setWhy] = useState("");
  const frame = useRef(0);
  const usageTimers = useRef(new Map<string, ReturnType<typeof setTimeout>>());

  const repaint = useCallback(() => {
    if (frame.current) return;
    frame.current = requestAnimationFrame(() => {
      frame.current = 0;
      setRev(state.rev);
    });
  }, [state]);

  const reloadHistory = useCallback(() => {
    if (!sessionId) return;
    api
      .get<History>(`/api/v1/chat/sessions/${encodeURIComponent(sessionId)}`)
      .then((history) => {
        state.setHistory(history.messages);
        repaint();
      })
      .catch((exc: unknown) => setFatal(exc instanceof Error ? exc.message : String(exc)));
  }, [api, sessionId, state, repaint]);

  const lookUpUsage = useCallback(
    (spawnId: string) => {
      const timers = usageTimers.current;
      if (timers.has(spawnId)) return;
      timers.set(
        spawnId,
        setTimeout(() => {
          timers.delete(spawnId);
          api
            .get<Transcript>(`/api/v1/spawns/${encodeURIComponent(spawnId)}`)
            .then((t) => {
              const spawn = state.spawn(spawnId);
              spawn.usage = t.usage.total;
              spawn.modelCalls = t.usage.turns.length;
              spawn.rev += 1;
              state.rev += 1;
              repaint();
            })
            .catch(() => undefined); // the tile keeps what the events said
        }, USAGE_EVERY_MS),
      );
    },
    [api, state, repaint],
  );

  useEffect(() => {
    setFatal("");
    if (!sessionId) return;
    reloadHistory();
    const roots = () => new Set(state.turns.map((t) => t.spawnId));
    const stop = follow({
      url: `/api/v1/chat/sessions/${encodeURIComponent(sessionId)}/events`,
      token: api.token,
      after: 0,
      onMessage: (message) => {
        let event: SessionEvent;
        try {
          event = JSON.parse(message.data) as SessionEvent;
        } catch {
          return;
        }
        event.seq = message.id;
        state.apply(event);
        if (event.type !== "text") lookUpUsage(event.spawn_id);
        if (event.type === "task_notification" && roots().has(event.spawn_id)) reloadHistory();
        repaint();
      },
      onState: (s, why) => {
        setConnection(s);
        if (s !== "reconnecting") setWhy("");
        else if (why) setWhy(why);
        if (s === "live") letGo(sessionId);
      },
      onFatal: (_status, why) => setFatal(why),
    });
    const timers = usageTimers.current;
    return () => {
      stop();
      for (const t of timers.values()) clearTimeout(t);
      timers.clear();
      if (frame.current) cancelAnimationFrame(frame.current);
      frame.current = 0;
    };
  }, [api, sessionId, state, reloadHistory, lookUpUsage, repaint]);

  return { state, connection, why, fatal, rev, reloadHistory };
}

function Sessions({ current, rev }: { current?: string; rev: number }) {
  const { api, navigate } = useApp();
  const [sessions, setSessions] = useState<ChatSession[]>([]);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    api
      .get<ChatSession[]>("/api/v1/chat/sessions")
      .then((list) => {
        setSessions(list);
        setError(null);
      })
      .catch(setError);
  }, [api, current, rev]);
  return (
    <aside class="sessions" aria-label="Sessions">
      <button type="button" onClick={() => navigate("/chat")}>
        New session
      </button>
      <ErrorNote error={error} />
      <ul>
        {sessions.map((s) => (
          <li key={s.id}>
            <Link href={`/chat/${encodeURIComponent(s.id)}`} aria-current={s.id === current ? "page" : undefined}>
              {s.title || "(untitled)"}
            </Link>
            <time class="muted session-time" dateTime={s.updated_at} data-testid="session-time">
              {when(s.updated_at)}
            </time>
          </li>
        ))}
        {sessions.length === 0 && !error && <li class="muted">No sessions yet.</li>}
      </ul>
    </aside>
  );
}

/** A session's last activity as a person reads it: the time today, else the date and time. */
function when(iso: string): string {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return "";
  const today = new Date().toDateString() === at.toDateString();
  return today
    ? at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : at.toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
}

interface ContextRow {
  key: string;
  value: string;
}

function Composer({
  sessionId,
  onStarted,
}: {
  sessionId?: string;
  onStarted: (
    sessionId: string,
    spawnId: string,
    question: string,
    agent: string,
    release: () => void,
  ) => void;
}) {
  const { api } = useApp();
  const [text, setText] = useState("");
  const [agent, setAgent] = useState("");
  const [agents, setAgents] = useState<Agent[]>([]);
  const [rows, setRows] = useState<ContextRow[]>([]);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    api
      .get<Agent[]>("/api/v1/agents")
      .then((list) => setAgents(list.filter((a) => a.name !== COORDINATOR)))
      .catch(() => setAgents([]));
  }, [api]);

  const send = async (event?: Event) => {
    event?.preventDefault();
    const question = text.trim();
    if (!question || busy) return;
    const context: Record<string, string> = {};
    for (const row of rows) if (row.key.trim()) context[row.key.trim()] = row.value;
    setBusy(true);
    setError(null);
    try {
      const turn = await api.startTurn(sessionId ?? null, question, agent, context);
      setText("");
      onStarted(turn.sessionId, turn.spawnId, question, agent, turn.release);
    } catch (exc) {
      setError(exc instanceof ApiError ? exc : String(exc));
    } finally {
      setBusy(false);
    }
  };

  const setRow = (index: number, change: Partial<ContextRow>) =>
    setRows(rows.map((r, i) => (i === index ? { ...r, ...change } : r)));

  return (
    <form class="composer" aria-label="Composer" onSubmit={(e) => void send(e)}>
      <label for="message">Message</label>
      <textarea
        id="message"
        rows={3}
        value={text}
        placeholder="Ask about an incident… (Ctrl+Enter sends)"
        onInput={(e) => setText(e.currentTarget.value)}
        onKeyDown={(e) => {
          if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) void send(e);
        }}
      />
      <div class="composer-row">
        <label for="agent">Agent</label>
        <select id="agent" value={agent} onChange={(e) => setAgent(e.currentTarget.value)}>
          <option value="">Coordinator (automatic)</option>
          {agents.map((a) => (
            <option key={a.name} value={a.name} disabled={!a.available}>
              {a.name}
              {a.available ? "" : ` (unavailable: ${a.unavailable_reason ?? ""})`}
            </option>
          ))}
        </select>
        <button type="button" class="quiet" onClick={() => setRows([...rows, { key: "", value: "" }])}>
          Add context
        </button>
        <button type="submit" disabled={busy || !text.trim()}>
          {busy ? "Sending…" : "Send"}
        </button>
      </div>
      {rows.map((row, i) => (
        <div class="context-row" key={i}>
          <input
            aria-label={`Context key ${i + 1}`}
            placeholder="key"
            value={row.key}
            onInput={(e) => setRow(i, { key: e.currentTarget.value })}
          />
          <input
            aria-label={`Context value ${i + 1}`}
            placeholder="value"
            value={row.value}
            onInput={(e) => setRow(i, { value: e.currentTarget.value })}
          />
          <button
            type="button"
            class="quiet"
            aria-label={`Remove context ${i + 1}`}
            onClick={() => setRows(rows.filter((_, k) => k !== i))}
          >
            ✕
          </button>
        </div>
      ))}
      <ErrorNote error={error} />
    </form>
  );
}

function Conversation({
  live,
  sessionId,
  onOpen,
}: {
  live: Live;
  sessionId: string;
  onOpen: (spawn: SpawnView) => void;
}) {
  const { state } = live;
  const end = useRef<HTMLDivElement>(null);
  const follows = useRef(true);
  useEffect(() => {
    if (follows.current) end.current?.scrollIntoView({ block: "end" });
  }, [live.rev]);
  return (
    <section
      class="conversation"
      aria-label="Conversation"
      aria-busy={live.connection !== "live"}
      onScroll={(e) => {
        const el = e.currentTarget;
        follows.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
      }}
    >
      {state.turns.map((turn) => {
        const root = state.spawns.get(turn.spawnId);
        const prose = root?.text || turn.answer || "";
        const ended = root?.notification;
        return (
          <div class="turn" data-testid="turn" key={turn.spawnId}>
            <p class="question" data-testid="question">
              {turn.question}
              {turn.agent && <span class="muted"> → {turn.agent}</span>}
            </p>
            {state.tilesOf(turn.spawnId).map((spawn) => (
              <Tile
                key={spawn.spawnId}
                spawn={spawn}
                rev={spawn.rev}
                sessionId={sessionId}
                onOpen={onOpen}
                showApprovals={!spawn.background}
                compact={spawn.background}
                relayed={relays(root, spawn, prose)}
              />
            ))}
            {root && root.persona === COORDINATOR && <Pending spawn={root} />}
            <div aria-live="polite">
              <Markdown text={prose} testid="prose" />
            </div>
            {ended && ended.status !== "ok" && (
              <p class="error" data-testid="turn-end">
                {ended.status}: {ended.message}
              </p>
            )}
            {!ended && root && statusOf(root) !== "queued" && !prose && (
              <p class="muted" role="status">
                Working…
              </p>
            )}
          </div>
        );
      })}
      {state.turns.length === 0 && <p class="muted">Ask a question below to start.</p>}
      <div ref={end} />
    </section>
  );
}

/** Whether the coordinator's reply ``prose`` repeats ``spawn``'s whole answer. */
function relays(root: SpawnView | undefined, spawn: SpawnView, prose: string): boolean {
  const answer = spawn.notification?.status === "ok" ? spawn.notification.message.trim() : "";
  return !!answer && root !== spawn && root?.persona === COORDINATOR && prose.includes(answer);
}

function BackgroundRuns({ live, sessionId, onOpen }: { live: Live; sessionId: string; onOpen: (s: SpawnView) => void }) {
  const runs = live.state.background();
  const groups: [string, SpawnView[]][] = [
    ["Needs input", runs.filter((s) => needsInput(s).length > 0)],
    ["Working", runs.filter((s) => !s.notification && needsInput(s).length === 0)],
    ["Done", runs.filter((s) => !!s.notification)],
  ];
  return (
    <aside class="background" aria-label="Background runs">
      <h2>Background runs</h2>
      {groups.map(([title, items]) => (
        <section key={title} aria-label={title}>
          <h3>
            {title} <span class="muted">({items.length})</span>
          </h3>
          {items.map((spawn) => (
            <div class="bg-item" data-testid="bg-item" data-spawn-id={spawn.spawnId} key={spawn.spawnId}>
              <div class="bg-head">
                <strong>{spawn.persona}</strong>
                <Badge kind={statusOf(spawn)}>{statusOf(spawn)}</Badge>
              </div>
              {title === "Needs input" && <Pending spawn={spawn} />}
              {spawn.notification && (
                <p data-testid="bg-notification">{spawn.notification.message}</p>
              )}
              <div class="actions">
                <button type="button" class="quiet" aria-label={`Open transcript of ${spawn.persona}`} onClick={() => onOpen(spawn)}>
                  Transcript
                </button>
                {!spawn.notification && <CancelButton spawn={spawn} sessionId={sessionId} />}
              </div>
            </div>
          ))}
          {items.length === 0 && <p class="muted">None.</p>}
        </section>
      ))}
    </aside>
  );
}

const CONNECTION_TEXT: Record<StreamState, string> = {
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  closed: "Disconnected",
};

export function ChatPage({ sessionId }: { sessionId?: string }) {
  const { navigate } = useApp();
  const live = useSession(sessionId);
  const [open, setOpen] = useState<SpawnView | null>(null);
  const [listRev, setListRev] = useState(0);
  useEffect(() => setOpen(null), [sessionId]);

  const started = (
    sid: string,
    spawnId: string,
    question: string,
    agent: string,
    release: () => void,
  ) => {
    setListRev((n) => n + 1);
    if (sid === sessionId && live.connection === "live") release();
    else hold(sid, release);
    if (sid !== sessionId) {
      navigate(`/chat/${encodeURIComponent(sid)}`);
      return;
    }
    live.state.addTurn({ spawnId, question, agent: agent || null, answer: null });
    live.reloadHistory();
  };

  const errors = useMemo(() => {
    const out = new Map<string, boolean>();
    if (open) for (const c of open.calls.values()) out.set(c.callId, c.isError);
    return out;
  }, [open, open?.rev]);

  return (
    <div class="chat-layout">
      <Sessions current={sessionId} rev={listRev} />
      <main class="chat-main">
        {sessionId && (
          <div class="chat-status">
            <span role="status" data-testid="connection" class={`connection connection-${live.connection}`}>
              {CONNECTION_TEXT[live.connection]}
            </span>
            {live.why && <span class="warning">{live.why}</span>}
            <span class="muted">{live.state.events} events</span>
          </div>
        )}
        {live.fatal && (
          <p class="error" role="alert">
            {live.fatal}
          </p>
        )}
        {sessionId ? (
          <Conversation live={live} sessionId={sessionId} onOpen={setOpen} />
        ) : (
          <section class="conversation" aria-label="Conversation">
            <h1>New session</h1>
            <p class="muted">
              Ask the coordinator — it picks the specialist — or pick an agent yourself. Add context
              (key → value) for the persona's initial prompt.
            </p>
          </section>
        )}
        <Composer sessionId={sessionId} onStarted={started} />
      </main>
      {sessionId && <BackgroundRuns live={live} sessionId={sessionId} onOpen={setOpen} />}
      {open && sessionId && (
        <TranscriptDialog
          spawnId={open.spawnId}
          persona={open.persona}
          rev={live.state.spawns.get(open.spawnId)?.rev ?? 0}
          errors={errors}
          onClose={() => setOpen(null)}
        />
      )}
    </div>
  );
}
