// /approvals: every tool call waiting for this user's decision, in every session they may
// decide for, background spawns included; each with a link to its spawn's transcript.
import { useRef } from "preact/hooks";
import { useApprovals } from "../approvals";
import { ApprovalCard } from "../components/approval";
import { useApp } from "../context";
import type { PendingApproval } from "../types";
import { ErrorNote, Link } from "../ui";

const GONE = "No longer waiting: decided by someone, expired, or its spawn ended.";

export function ApprovalsPage() {
  const { me } = useApp();
  const { pending, error } = useApprovals();
  // Calls seen since the page opened stay listed once decided, so a decision's outcome stays
  // readable instead of the card vanishing under the pointer.
  const seen = useRef(new Map<string, PendingApproval>());
  const waiting = new Set<string>();
  for (const p of pending) {
    const key = `${p.spawn_id}/${p.call.id}`;
    waiting.add(key);
    seen.current.set(key, p);
  }
  const shown = [...seen.current.entries()];
  return (
    <main class="page">
      <h1>Waiting for your decision</h1>
      {!me.permissions.approve && (
        <p class="muted">
          Your role ({me.role}) may not approve tool calls: these are shown so you know what waits.
        </p>
      )}
      <ErrorNote error={error || null} />
      {pending.length === 0 && !error && <p class="muted">Nothing waits for a decision.</p>}
      <ul class="approval-list">
        {shown.map(([key, p]) => (
          <li key={key}>
            <p class="approval-context">
              <strong>{p.persona}</strong> for <strong>{p.owner}</strong>
              {p.requested_by.role && <span class="muted"> ({p.requested_by.role})</span>} ·{" "}
              <Link href={`/spawns/${encodeURIComponent(p.spawn_id)}`}>Open transcript</Link>
            </p>
            <ApprovalCard
              spawnId={p.spawn_id}
              callId={p.call.id}
              tool={p.call.name}
              arguments={p.call.arguments}
              argsHash={p.args_hash}
              needed={p.needed}
              requestedBy={p.requested_by}
              expiresAt={p.expires_at}
              approvedBy={p.approved_by}
              outcome={waiting.has(key) ? undefined : GONE}
            />
          </li>
        ))}
      </ul>
    </main>
  );
}
