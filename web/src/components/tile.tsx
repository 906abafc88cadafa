// An Agent tile: one dispatch of a persona, live — who runs, why, with which tools, how far it
// got (status, model calls, tokens, cost), its tool calls as they happen, and what waits for people.
import { memo } from "preact/compat";
import { useState } from "preact/hooks";
import { useApprovals } from "../approvals";
import { useApp } from "../context";
import { type CallView, type SpawnView, needsInput, statusOf } from "../session";
import { Badge, ErrorNote, Folded, money, useProgressive } from "../ui";
import { ApprovalCard } from "./approval";
import { ToolCard } from "./toolcard";

export interface TileProps {
  spawn: SpawnView;
  rev: number;
  sessionId: string;
  onOpen: (spawn: SpawnView) => void;
  /** Approval cards inside the tile (the background panel shows its own). */
  showApprovals?: boolean;
  compact?: boolean;
  /** Its answer is repeated, whole, in the coordinator's reply below the tiles: not shown twice. */
  relayed?: boolean;
}

export function CancelButton({ spawn, sessionId }: { spawn: SpawnView; sessionId: string }) {
  const { api } = useApp();
  const [error, setError] = useState<unknown>(null);
  const [asked, setAsked] = useState(false);
  const cancel = async () => {
    setAsked(true);
    try {
      await api.post(
        `/api/v1/chat/sessions/${encodeURIComponent(sessionId)}/spawns/${encodeURIComponent(spawn.spawnId)}/cancel`,
      );
    } catch (exc) {
      setError(exc);
      setAsked(false);
    }
  };
  return (
    <>
      <button
        type="button"
        class="danger quiet"
        aria-label={`Cancel ${spawn.persona}`}
        disabled={asked}
        onClick={() => void cancel()}
      >
        {asked ? "Cancelling…" : "Cancel"}
      </button>
      <ErrorNote error={error} />
    </>
  );
}

export function Pending({ spawn }: { spawn: SpawnView }) {
  const approvals = useApprovals();
  return (
    <>
      {needsInput(spawn).map((c) => {
        const listed = approvals.find(spawn.spawnId, c.event.call_id);
        return (
          <ApprovalCard
            key={c.event.call_id}
            spawnId={spawn.spawnId}
            callId={c.event.call_id}
            tool={c.event.name}
            arguments={c.event.arguments}
            argsHash={c.event.args_hash}
            needed={c.event.needed}
            requestedBy={c.event.requested_by}
            expiresAt={c.event.expires_at}
            approvedBy={listed?.approved_by ?? c.approvedBy}
          />
        );
      })}
    </>
  );
}

function ActivityList({ calls }: { calls: CallView[] }) {
  const shown = useProgressive(calls.length);
  return (
    <div class="activity">
      {calls.slice(0, shown).map((c) => (
        <ToolCard key={c.callId} name={c.name} arguments={c.arguments} result={c.result} isError={c.isError} />
      ))}
    </div>
  );
}

function Activity({ spawn }: { spawn: SpawnView }) {
  const [open, setOpen] = useState(false);
  const calls = [...spawn.calls.values()];
  if (!calls.length) return null;
  return (
    <details
      data-testid="tile-activity"
      onToggle={(e) => setOpen((e.currentTarget as HTMLDetailsElement).open)}
    >
      <summary>Tool calls ({calls.length})</summary>
      {open && <ActivityList calls={calls} />}
    </details>
  );
}

function TileView({
  spawn,
  sessionId,
  onOpen,
  showApprovals = true,
  compact = false,
  relayed = false,
}: TileProps) {
  const status = statusOf(spawn);
  const running = status === "running" || status === "waiting" || status === "queued";
  const usage = spawn.usage;
  return (
    <article
      class={`tile tile-${status}${compact ? " compact" : ""}`}
      data-testid="agent-tile"
      data-spawn-id={spawn.spawnId}
      aria-label={`Agent ${spawn.persona}`}
    >
      <header class="tile-head">
        <h3>{spawn.persona}</h3>
        <Badge kind={status} testid="tile-status">
          {status}
        </Badge>
        {spawn.background && <Badge kind="background">background</Badge>}
      </header>
      <p class="tile-description">{spawn.description}</p>
      {spawn.reason && (
        <p class="tile-reason" data-testid="tile-reason">
          <span class="muted">Why: </span>
          {spawn.reason}
        </p>
      )}
      {!compact && (
        <ul class="tile-tools" data-testid="tile-tools" aria-label={`Tools of ${spawn.persona}`}>
          {spawn.tools.map((t) => (
            <li key={t.name}>
              <code>{t.name}</code> <span class={`class-${t.class ?? "read"}`}>{t.class ?? ""}</span>
            </li>
          ))}
          {spawn.tools.length === 0 && <li class="muted">no tools</li>}
        </ul>
      )}
      {spawn.model && (
        <p class="tile-model" data-testid="tile-model">
          <span class="muted">Model: </span>
          <code>{spawn.model}</code>
          {spawn.modelNote && <span class="muted"> — {spawn.modelNote}</span>}
        </p>
      )}
      {spawn.waiting && !spawn.notification && (
        <p class="warning" data-testid="tile-waiting">
          {spawn.waiting}
        </p>
      )}
      {spawn.missingContext.length > 0 && (
        <p class="warning">Context it lacked: {spawn.missingContext.join(", ")}</p>
      )}
      <p class="tile-usage" data-testid="tile-usage">
        Turns {spawn.modelCalls || usage?.model_calls || 0} · Tokens {usage?.total_tokens ?? 0} · Cost{" "}
        {money(usage?.cost ?? 0)}
      </p>
      {spawn.notification && spawn.notification.message && (
        <div class={`tile-end tile-end-${spawn.notification.status}`} data-testid="tile-notification">
          {relayed ? (
            <p class="muted">Its answer is in the reply below.</p>
          ) : (
            <Folded text={spawn.notification.message} lines={4} />
          )}
        </div>
      )}
      {showApprovals && <Pending spawn={spawn} />}
      {!compact && <Activity spawn={spawn} />}
      <div class="actions">
        <button type="button" aria-label={`Open transcript of ${spawn.persona}`} onClick={() => onOpen(spawn)}>
          Open transcript
        </button>
        {running && <CancelButton spawn={spawn} sessionId={sessionId} />}
      </div>
    </article>
  );
}

/** Re-rendered only when its spawn changed (``rev``) or the approvals list did. */
export const Tile = memo(
  TileView,
  (a, b) =>
    a.spawn === b.spawn && a.rev === b.rev && a.showApprovals === b.showApprovals && a.relayed === b.relayed,
);
