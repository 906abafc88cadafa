// /approvals: every tool call waiting for this user's decision, in every session they may
// decide for, background spawns included; each with a link to its spawn's transcript.
// /approvals/<spawn id>/<call id> (a notification's link) brings that request's card into view.
import { useEffect, useRef } from "preact/hooks";
import { useApprovals } from "../approvals";
import { ApprovalCard } from "../components/approval";
import { useApp } from "../context";
import type { PendingApproval } from "../types";
import { ErrorNote, Link } from "../ui";

const GONE = "No longer waiting: decided by someone, expired, or its spawn ended.";

export function ApprovalsPage({ focus }: { focus?: string }) {
  const { me } = useApp();
  const { pending, loaded, error } = useApprovals();
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
  const focused = useRef<HTMLLIElement>(null);
  const found = focus !== undefined && seen.current.has(focus);
  useEffect(() => {
    if (found) focused.current?.scrollIntoView({ block: "center" });
  }, [found]);
  const focusSpawn = (focus ?? "").split("/")[0] ?? "";
  return (
    <main class="page">
      <h1>Waiting for your decision</h1>
      {!me.permissions.approve && (
        <p class="muted">
          Your role ({me.role}) may not approve tool calls: these are shown so you know what waits.
        </p>
      )}
      <ErrorNote error={error || null} />
      {focus !== undefined && loaded && !found && (
        <p class="muted" data-testid="focus-gone">
          The request you followed is not waiting for your decision: someone decided it, it
          expired, its spawn ended, or it is not yours to decide.{" "}
          <Link href={`/spawns/${encodeURIComponent(focusSpawn)}`}>Open its transcript</Link>.
        </p>
      )}
      {pending.length === 0 && !error && <p class="muted">Nothing waits for a decision.</p>}
      <ul class="approval-list">
        {shown.map(([key, p]) => (
          <li
            key={key}
            ref={key === focus ? focused : undefined}
            class={key === focus ? "focused" : undefined}
          >
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
