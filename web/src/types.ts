// Wire types of the HTTP API the console uses (coordinator/api/schemas.py, workers/messages.py).

export type ToolClass = "read" | "write" | "destructive";
export type SpawnStatus =
  | "queued"
  | "running"
  | "waiting"
  | "ok"
  | "failed"
  | "cancelled";

export interface Me {
  user: string;
  role: string;
  permissions: {
    edit_personas: boolean;
    approve: boolean;
    audit: boolean;
    manage_plugins: boolean;
    tools: string[];
  };
  roles: string[];
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  cost: number;
  model_calls: number;
}

export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

export interface Message {
  role: "system" | "user" | "assistant" | "tool";
  content: string;
  tool_calls: ToolCall[];
  tool_call_id: string | null;
  name: string | null;
}

export interface Requester {
  user: string;
  role: string;
  persona: string;
}

interface Envelope {
  session_id: string;
  spawn_id: string;
  seq: number;
  ts: number;
}

export interface BagTool {
  name: string;
  description?: string;
  class?: ToolClass;
  confirmation?: string;
  [key: string]: unknown;
}

export interface TextEvent extends Envelope {
  type: "text";
  text: string;
}
export interface AgentTileEvent extends Envelope {
  type: "agent_tile";
  persona: string;
  description: string;
  tools: BagTool[];
  reason: string;
  background: boolean;
  missing_context: string[];
  parent_spawn_id?: string;
  /** The model the spawn runs on; ``ongrid/demo`` is the offline demo model. */
  model?: string;
  /** Set when the model is the demo: it is no LLM, and what to configure for a real one. */
  model_note?: string;
}
export interface ToolCallEvent extends Envelope {
  type: "tool_call";
  call_id: string;
  name: string;
  arguments: string;
}
export interface ToolResultEvent extends Envelope {
  type: "tool_result";
  call_id: string;
  name: string;
  content: string;
  is_error: boolean;
}
export interface ConfirmationRequiredEvent extends Envelope {
  type: "confirmation_required";
  call_id: string;
  name: string;
  arguments: string;
  confirmation: "once" | "dual";
  args_hash: string;
  requested_by: Requester;
  expires_at: number;
  needed: number;
}
export interface ApprovalDecidedEvent extends Envelope {
  type: "approval_decided";
  call_id: string;
  name: string;
  args_hash: string;
  decision: "approved" | "denied" | "expired";
  by: string;
  owner: string;
  approved_by: string[];
  needed: number;
  settled: boolean;
}
export interface TaskNotificationEvent extends Envelope {
  type: "task_notification";
  status: "ok" | "failed" | "cancelled";
  persona: string;
  message: string;
  usage: Usage;
  budget_reached: string | null;
}

export interface QueueWaitingEvent extends Envelope {
  type: "queue_waiting";
  queue: string;
  waited_seconds: number;
  fails_in_seconds: number | null;
  message: string;
}

export type SessionEvent =
  | QueueWaitingEvent
  | TextEvent
  | AgentTileEvent
  | ToolCallEvent
  | ToolResultEvent
  | ConfirmationRequiredEvent
  | ApprovalDecidedEvent
  | TaskNotificationEvent;

export interface ChatSession {
  id: string;
  user: string;
  title: string;
  created_at: string;
  updated_at: string;
}

export interface HistoryMessage {
  id: number;
  role: "user" | "assistant" | "system";
  content: string;
  agent: string | null;
  spawn_id: string | null;
  created_at: string;
}

export interface History {
  session: ChatSession;
  messages: HistoryMessage[];
}

export interface Approval {
  args_hash: string;
  approved_by: string[];
  denied_by?: string | null;
  needed: number;
  expires_at?: number;
  requested_by?: Requester;
  expired?: boolean;
}

export interface Transcript {
  spawn_id: string;
  session_id: string;
  parent_spawn_id?: string;
  persona: string;
  persona_source: string;
  model: string;
  status: SpawnStatus;
  background: boolean;
  attempts: number;
  prompt: string;
  context: Record<string, unknown>;
  missing_context: string[];
  result: string;
  error: string;
  created: number;
  updated: number;
  messages: Message[];
  tool_calls: {
    call_id: string;
    name: string;
    arguments: string;
    result: string | null;
    is_error?: boolean;
  }[];
  usage: { total: Usage; turns: Usage[] };
  pending: ToolCall[];
  approvals: Record<string, Approval>;
  budget: Record<string, unknown>;
}

export interface PendingApproval {
  spawn_id: string;
  session_id: string;
  owner: string;
  persona: string;
  call: ToolCall;
  args_hash: string;
  requested_by: Requester;
  expires_at: number;
  approved_by: string[];
  needed: number;
}

export interface DecisionOut {
  spawn_id: string;
  status: SpawnStatus;
  settled: boolean;
  approved_by: string[];
  needed: number;
  message: string;
}

export type Source = "builtin" | "disk" | "user";

export interface Agent {
  name: string;
  description: string;
  when_to_use?: string | null;
  tools?: string[] | null;
  disallowed_tools?: string[] | null;
  permission_mode?: string;
  max_turns?: number | null;
  model?: string | null;
  critical_reminder?: string | null;
  initial_prompt?: string | null;
  background?: boolean;
  omit_claude_md?: boolean;
  metadata?: Record<string, unknown>;
  body?: string;
  source: Source;
  path?: string | null;
  available: boolean;
  unavailable_reason: string | null;
  shadows: Source | null;
  editable?: boolean;
  read_only_reason?: string | null;
  [key: string]: unknown;
}

export interface AgentChange extends Agent {
  notice: string | null;
  /** What lint finds in the saved persona: saved anyway, but worth a look. */
  findings?: LoadWarning[];
  registry_version: number;
}

export interface LoadWarning {
  path: string;
  reason: string;
  kind: string;
  persona: string;
  source: string;
  subject: string;
  hint: string;
}

export interface Skill {
  name: string;
  description: string;
  class: ToolClass;
  [key: string]: unknown;
}

export interface SkillsOut {
  role: string;
  agent: string | null;
  tools: Skill[];
  dropped: { name: string; reason: string }[];
}

export interface Problem {
  field: string;
  message: string;
  in?: string;
}

// -- marketplaces and plugins (coordinator/api/plugins.py) ----------------------------------------

export interface MarketplaceProblem {
  plugin: string;
  reason: string;
}

/** An added marketplace; one that cannot be read any more carries ``error`` instead of the
 * fields read from its marketplace.json. */
export interface Marketplace {
  name: string;
  source: string;
  kind: "directory" | "git" | string;
  location: string;
  ref: string;
  added_by: string;
  added_at: string | null;
  owner?: string | Record<string, unknown> | null;
  description?: string | null;
  plugins?: number;
  problems?: MarketplaceProblem[];
  error?: string | null;
}

/** One plugin a marketplace lists (an entry it could not read has only the name and reason). */
export interface MarketplacePlugin {
  name: string;
  marketplace: string;
  description?: string | null;
  version?: string | null;
  category?: string | null;
  source?: string;
  reachable: boolean;
  unreachable_reason: string | null;
  installed?: string | null;
}

export type AllowMode = "read-only" | "mutating-with-confirm" | "dual-sign-required";

export interface InstalledPlugin {
  name: string;
  version: string;
  marketplace: string;
  source: string;
  ref: string;
  content_hash: string;
  path: string;
  allowed_mode: string;
  mcp: boolean;
  /** Granted at install: the network (through the workers' egress proxy), a writable folder. */
  network?: boolean;
  writable?: boolean;
  /** What the install lets it do, one line each. */
  grants?: string[];
  installed_by: string;
  installed_at: string | null;
  agents?: string[];
  skills?: string[];
  tools?: string[];
  mcp_servers?: string[];
  unused?: string[];
  warnings?: string[];
  /** Set when the installed copy cannot be read (the record is still there). */
  error?: string | null;
}

export interface InstallOutcome extends InstalledPlugin {
  changed: boolean;
  registry_version: number;
}

/** One plugin of `POST /api/v1/plugins/{name}/update`: `error` is set when it failed. */
export type UpdateResult = {
  name: string;
  updated: boolean;
  version: string | null;
  content_hash: string | null;
  error: string | null;
};
