// What a session's event stream adds up to: one SpawnView per spawn (its tile, prose, tool
// calls, approvals and end), and the turns the history names. Mutable on purpose: a replay of
// thousands of events applies each in O(1) and the views re-render once per animation frame,
// each tile only when its own `rev` moved.
import type {
  AgentTileEvent,
  BagTool,
  ConfirmationRequiredEvent,
  HistoryMessage,
  SessionEvent,
  SpawnStatus,
  TaskNotificationEvent,
  Usage,
} from "./types";

export const COORDINATOR = "coordinator";

export interface CallView {
  callId: string;
  name: string;
  arguments: string;
  result: string | null;
  isError: boolean;
  seq: number;
}

export interface ConfirmationView {
  event: ConfirmationRequiredEvent;
  /** Who approved so far, as last heard (the approvals feed or a decision's answer). */
  approvedBy: string[];
  outcome: string;
  settled: boolean;
}

export interface SpawnView {
  spawnId: string;
  persona: string;
  description: string;
  reason: string;
  tools: BagTool[];
  background: boolean;
  parent: string;
  missingContext: string[];
  model: string;
  modelNote: string;
  /** The last notice that no worker consumes the spawn's queue, until it runs again. */
  waiting: string;
  firstSeq: number;
  text: string;
  calls: Map<string, CallView>;
  confirmations: Map<string, ConfirmationView>;
  notification: TaskNotificationEvent | null;
  /** From the spawn's transcript (fetched as it runs) or its notification. */
  usage: Usage | null;
  modelCalls: number;
  rev: number;
}

export interface Turn {
  /** The spawn the question started: the coordinator's turn, or the persona picked. */
  spawnId: string;
  question: string;
  agent: string | null;
  answer: string | null;
}

export function statusOf(spawn: SpawnView): SpawnStatus {
  if (spawn.notification) return spawn.notification.status;
  for (const c of spawn.confirmations.values()) if (!c.settled) return "waiting";
  return spawn.firstSeq ? "running" : "queued";
}

export function needsInput(spawn: SpawnView): ConfirmationView[] {
  if (spawn.notification) return [];
  return [...spawn.confirmations.values()].filter((c) => !c.settled);
}

function blank(spawnId: string): SpawnView {
  return {
    spawnId,
    persona: "",
    description: "",
    reason: "",
    tools: [],
    background: false,
    parent: "",
    missingContext: [],
    model: "",
    modelNote: "",
    waiting: "",
    firstSeq: 0,
    text: "",
    calls: new Map(),
    confirmations: new Map(),
    notification: null,
    usage: null,
    modelCalls: 0,
    rev: 0,
  };
}

export class SessionState {
  readonly spawns = new Map<string, SpawnView>();
  /** Spawn ids in the order their first event came. */
  readonly order: string[] = [];
  turns: Turn[] = [];
  lastSeq = 0;
  events = 0;
  rev = 0;

  spawn(spawnId: string): SpawnView {
    let found = this.spawns.get(spawnId);
    if (!found) {
      found = blank(spawnId);
      this.spawns.set(spawnId, found);
      this.order.push(spawnId);
    }
    return found;
  }

  /** The questions and final answers the history holds, each question with its spawn. */
  setHistory(messages: HistoryMessage[]): void {
    const turns: Turn[] = [];
    for (const m of messages) {
      if (m.role === "user" && m.spawn_id) {
        turns.push({ spawnId: m.spawn_id, question: m.content, agent: m.agent, answer: null });
      } else if (m.spawn_id) {
        const turn = turns.find((t) => t.spawnId === m.spawn_id);
        if (turn) turn.answer = m.content;
      }
    }
    // Turns started here and not yet in the history stay.
    for (const t of this.turns) if (!turns.some((k) => k.spawnId === t.spawnId)) turns.push(t);
    this.turns = turns;
    this.rev += 1;
  }

  addTurn(turn: Turn): void {
    if (!this.turns.some((t) => t.spawnId === turn.spawnId)) this.turns.push(turn);
    this.rev += 1;
  }

  apply(event: SessionEvent): void {
    if (event.seq <= this.lastSeq) return; // never twice
    this.lastSeq = event.seq;
    this.events += 1;
    this.rev += 1;
    const spawn = this.spawn(event.spawn_id);
    spawn.rev += 1;
    // Any other event of the spawn means a worker has it again: the notice is over.
    if (event.type !== "queue_waiting") spawn.waiting = "";
    switch (event.type) {
      case "agent_tile":
        this.tile(spawn, event);
        break;
      case "queue_waiting":
        spawn.waiting = event.message;
        break;
      case "text":
        spawn.text += event.text;
        break;
      case "tool_call":
        spawn.calls.set(event.call_id, {
          callId: event.call_id,
          name: event.name,
          arguments: event.arguments,
          result: null,
          isError: false,
          seq: event.seq,
        });
        break;
      case "tool_result": {
        const call = spawn.calls.get(event.call_id);
        if (call) {
          call.result = event.content;
          call.isError = event.is_error;
        } else {
          spawn.calls.set(event.call_id, {
            callId: event.call_id,
            name: event.name,
            arguments: "",
            result: event.content,
            isError: event.is_error,
            seq: event.seq,
          });
        }
        const asked = spawn.confirmations.get(event.call_id);
        if (asked && !asked.settled) {
          asked.settled = true;
          asked.outcome ||= event.is_error ? "not run" : "approved: the tool ran";
        }
        break;
      }
      case "confirmation_required":
        spawn.confirmations.set(event.call_id, {
          event,
          approvedBy: [],
          outcome: "",
          settled: false,
        });
        break;
      case "approval_decided": {
        const asked = spawn.confirmations.get(event.call_id);
        if (asked) {
          asked.approvedBy = event.approved_by;
          asked.settled = event.settled;
          if (event.settled) asked.outcome = `${event.decision} by ${event.by || "deadline"}`;
        }
        break;
      }
      case "task_notification":
        spawn.notification = event;
        spawn.usage = event.usage;
        if (!spawn.persona) spawn.persona = event.persona;
        for (const c of spawn.confirmations.values()) {
          if (!c.settled) {
            c.settled = true;
            c.outcome ||= `the spawn ended (${event.status})`;
          }
        }
        break;
    }
  }

  private tile(spawn: SpawnView, event: AgentTileEvent): void {
    spawn.persona = event.persona;
    spawn.description = event.description;
    spawn.reason = event.reason;
    spawn.tools = event.tools;
    spawn.background = event.background;
    spawn.parent = event.parent_spawn_id ?? "";
    spawn.missingContext = event.missing_context;
    spawn.model = event.model ?? "";
    spawn.modelNote = event.model_note ?? "";
    spawn.firstSeq = event.seq;
  }

  /** The turn a spawn belongs to: its own, its parent's, else the last turn begun before it. */
  turnOf(spawn: SpawnView): string | undefined {
    const roots = new Set(this.turns.map((t) => t.spawnId));
    let current: SpawnView | undefined = spawn;
    for (let depth = 0; current && depth < 8; depth += 1) {
      if (roots.has(current.spawnId)) return current.spawnId;
      current = current.parent ? this.spawns.get(current.parent) : undefined;
    }
    let best: string | undefined;
    let bestSeq = -1;
    for (const t of this.turns) {
      const root = this.spawns.get(t.spawnId);
      const seq = root?.firstSeq ?? 0;
      if (root && seq <= spawn.firstSeq && seq > bestSeq) {
        best = t.spawnId;
        bestSeq = seq;
      }
    }
    return best;
  }

  /** Tiles shown under a turn: every spawn of it but a coordinator's own. */
  tilesOf(turnSpawnId: string): SpawnView[] {
    return this.order
      .map((id) => this.spawns.get(id))
      .filter((s): s is SpawnView => !!s && !!s.persona && s.persona !== COORDINATOR)
      .filter((s) => this.turnOf(s) === turnSpawnId);
  }

  background(): SpawnView[] {
    return this.order
      .map((id) => this.spawns.get(id))
      .filter((s): s is SpawnView => !!s && s.background);
  }
}
