// One tool call waiting for people: what it would run, what approving means, who signed so far,
// and Approve / Deny for those whose role may decide.
import { useState } from "preact/hooks";
import { ApiError } from "../api";
import { useApprovals } from "../approvals";
import { useApp } from "../context";
import type { DecisionOut, Requester } from "../types";
import { pretty } from "../ui";

export interface ApprovalCardProps {
  spawnId: string;
  callId: string;
  tool: string;
  arguments: string;
  argsHash: string;
  needed: number;
  requestedBy: Requester;
  expiresAt: number;
  /** Known signatures (from the pending list; the decision's answer updates them). */
  approvedBy: string[];
  /** Set once the call is settled (the tool ran, was denied, expired, the spawn ended). */
  outcome?: string;
  /** False when the user may not decide this call (not an approver of its owner). */
  decidable?: boolean;
}

function meaning(props: ApprovalCardProps): string {
  const who = props.requestedBy.user ? ` for ${props.requestedBy.user}` : "";
  const persona = props.requestedBy.persona ? ` (${props.requestedBy.persona})` : "";
  const people =
    props.needed > 1
      ? ` It needs ${props.needed} approvals from different people before it runs.`
      : "";
  return (
    `Approving runs ${props.tool} with exactly these arguments${who}${persona}; denying tells ` +
    `the model it was denied and the spawn goes on without it.${people}`
  );
}

function expiry(at: number): string {
  if (!at) return "";
  return `Expires ${new Date(at * 1000).toLocaleString()}`;
}

export function ApprovalCard(props: ApprovalCardProps) {
  const { api, me } = useApp();
  const approvals = useApprovals();
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState("");
  const [answer, setAnswer] = useState<DecisionOut | null>(null);
  const signers = answer?.approved_by ?? props.approvedBy;
  const settled = answer?.settled || !!props.outcome;
  const mine = signers.includes(me.user);
  const canDecide = me.permissions.approve && props.decidable !== false && !settled && !mine;

  const decide = async (approve: boolean) => {
    setBusy(true);
    setError("");
    try {
      const out = await api.post<DecisionOut>(
        `/api/v1/spawns/${encodeURIComponent(props.spawnId)}/decisions`,
        { call_id: props.callId, args_hash: props.argsHash, approve },
      );
      setAnswer(out);
      approvals.refresh();
    } catch (exc) {
      setError(exc instanceof ApiError ? exc.message : String(exc));
      approvals.refresh();
    } finally {
      setBusy(false);
    }
  };

  const left = props.needed - new Set(signers).size;
  return (
    <section
      class={`approval${settled ? " settled" : ""}`}
      data-testid="approval"
      aria-label={`Approval for ${props.tool}`}
    >
      <h4>
        {settled ? "Decided: " : "Needs approval: "}
        <code>{props.tool}</code>
      </h4>
      <pre class="block" data-testid="approval-args">
        {pretty(props.arguments)}
      </pre>
      <p data-testid="approval-meaning">{meaning(props)}</p>
      {signers.length > 0 && !settled && (
        <p data-testid="approval-signers">
          Approved by {signers.join(" and ")}
          {left > 0 && `; needs ${left === 1 ? "one more approval" : `${left} more approvals`} from someone else`}
          {mine && left > 0 && " (a second signature must be someone else's)"}
        </p>
      )}
      {!settled && props.expiresAt > 0 && <p class="muted">{expiry(props.expiresAt)}</p>}
      {(answer || props.outcome) && (
        <p data-testid="approval-outcome" role="status">
          {answer?.message ?? props.outcome}
        </p>
      )}
      {error && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
      {canDecide && (
        <div class="actions">
          <button type="button" disabled={busy} onClick={() => void decide(true)}>
            Approve
          </button>
          <button type="button" class="danger" disabled={busy} onClick={() => void decide(false)}>
            Deny
          </button>
        </div>
      )}
      {!me.permissions.approve && !settled && (
        <p class="muted">Your role ({me.role}) may not approve; someone who may has been asked.</p>
      )}
    </section>
  );
}
