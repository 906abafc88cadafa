// A spawn's transcript: its messages, each tool call as a card with its folded result, usage per
// model call, pending approvals, final status. As a dialog over the chat (from a tile) or as a
// page of its own (/spawns/<id>, e.g. from the approvals list).
import { Markdown } from "../components/markdown";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { useApprovals } from "../approvals";
import { ApprovalCard } from "../components/approval";
import { ToolCard } from "../components/toolcard";
import { useApp } from "../context";
import type { Message, Transcript } from "../types";
import { Badge, ErrorNote, Folded, money, useProgressive } from "../ui";

const FINISHED = new Set(["ok", "failed", "cancelled"]);
/** While a spawn runs and nothing tells us it changed (the page of its own), look again. */
const POLL_MS = 2000;

export function useTranscript(spawnId: string, rev: number, poll: boolean) {
  const { api } = useApp();
  const [transcript, setTranscript] = useState<Transcript | null>(null);
  const [error, setError] = useState<unknown>(null);
  const load = useCallback(async () => {
    try {
      setTranscript(await api.get<Transcript>(`/api/v1/spawns/${encodeURIComponent(spawnId)}`));
      setError(null);
    } catch (exc) {
      setError(exc);
    }
  }, [api, spawnId]);
  useEffect(() => {
    const soon = setTimeout(() => void load(), 100);
    return () => clearTimeout(soon);
  }, [load, rev]);
  const running = transcript ? !FINISHED.has(transcript.status) : true;
  useEffect(() => {
    if (!poll || !running) return;
    const every = setInterval(() => void load(), POLL_MS);
    return () => clearInterval(every);
  }, [poll, running, load]);
  return { transcript, error, reload: load };
}

function MessageView({
  message,
  results,
  errors,
}: {
  message: Message;
  results: Map<string, string | null>;
  errors: Map<string, boolean>;
}) {
  if (message.role === "tool") return null; // shown inside the card of its call
  return (
    <div class={`message message-${message.role}`} data-testid="message" data-role={message.role}>
      <div class="message-role">{message.role === "system" ? "system prompt" : message.role}</div>
      {message.content &&
        (message.role === "assistant" ? (
          <Markdown text={message.content} />
        ) : (
          <Folded text={message.content} lines={message.role === "system" ? 3 : 40} />
        ))}
      {message.tool_calls.map((call) => (
        <ToolCard
          key={call.id}
          name={call.name}
          arguments={call.arguments}
          result={results.has(call.id) ? (results.get(call.id) ?? null) : null}
          isError={errors.get(call.id) ?? false}
        />
      ))}
    </div>
  );
}

export function TranscriptBody({
  transcript,
  errors,
}: {
  transcript: Transcript;
  errors?: Map<string, boolean>;
}) {
  const approvals = useApprovals();
  const results = new Map<string, string | null>();
  const known = new Map(errors ?? []);
  for (const call of transcript.tool_calls) {
    results.set(call.call_id, call.result);
    if (call.is_error !== undefined) {
      known.set(call.call_id, call.is_error || (known.get(call.call_id) ?? false));
    }
  }
  const finished = FINISHED.has(transcript.status);
  const shown = useProgressive(transcript.messages.length);
  return (
    <div class="transcript">
      <dl class="facts">
        <dt>Status</dt>
        <dd>
          <Badge kind={transcript.status} testid="transcript-status">
            {transcript.status}
          </Badge>
        </dd>
        <dt>Persona</dt>
        <dd>
          {transcript.persona} {transcript.persona_source && `(${transcript.persona_source})`}
        </dd>
        <dt>Model</dt>
        <dd>{transcript.model || "—"}</dd>
        <dt>Attempts</dt>
        <dd>{transcript.attempts}</dd>
        <dt>Usage</dt>
        <dd>
          {transcript.usage.total.total_tokens} tokens, {money(transcript.usage.total.cost)},{" "}
          {transcript.usage.total.model_calls} model calls
        </dd>
      </dl>
      {Object.keys(transcript.context).length > 0 && (
        <details>
          <summary>Context ({Object.keys(transcript.context).length} keys)</summary>
          <pre class="block">{JSON.stringify(transcript.context, null, 2)}</pre>
        </details>
      )}
      {transcript.missing_context.length > 0 && (
        <p class="warning">Missing context: {transcript.missing_context.join(", ")}</p>
      )}
      <div class="messages">
        {transcript.messages.slice(0, shown).map((m, i) => (
          <MessageView key={i} message={m} results={results} errors={known} />
        ))}
      </div>
      {!finished &&
        transcript.pending.map((call) => {
          const approval = transcript.approvals[call.id];
          if (!approval) return null;
          const listed = approvals.find(transcript.spawn_id, call.id);
          return (
            <ApprovalCard
              key={call.id}
              spawnId={transcript.spawn_id}
              callId={call.id}
              tool={call.name}
              arguments={call.arguments}
              argsHash={approval.args_hash}
              needed={approval.needed}
              requestedBy={approval.requested_by ?? { user: "", role: "", persona: "" }}
              expiresAt={Number(approval.expires_at ?? 0)}
              approvedBy={listed?.approved_by ?? approval.approved_by}
            />
          );
        })}
      {transcript.result && (
        <section class="result">
          <h4>Final answer</h4>
          <Folded text={transcript.result} lines={60} testid="transcript-result" />
        </section>
      )}
      {transcript.error && (
        <p class="error" data-testid="transcript-error">
          {transcript.error}
        </p>
      )}
      <table class="usage">
        <caption>Usage per model call</caption>
        <thead>
          <tr>
            <th scope="col">#</th>
            <th scope="col">Prompt tokens</th>
            <th scope="col">Completion tokens</th>
            <th scope="col">Cost</th>
          </tr>
        </thead>
        <tbody>
          {transcript.usage.turns.map((u, i) => (
            <tr key={i}>
              <td>{i + 1}</td>
              <td>{u.prompt_tokens}</td>
              <td>{u.completion_tokens}</td>
              <td>{money(u.cost)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** The transcript over the chat, opened from a tile; Escape or Close closes it. */
export function TranscriptDialog({
  spawnId,
  persona,
  rev,
  errors,
  onClose,
}: {
  spawnId: string;
  persona: string;
  rev: number;
  errors: Map<string, boolean>;
  onClose: () => void;
}) {
  const { transcript, error } = useTranscript(spawnId, rev, false);
  const dialog = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    // Back to whatever opened it (the tile's button) once it closes: keyboard users stay put.
    const opener = document.activeElement instanceof HTMLElement ? document.activeElement : null;
    const node = dialog.current;
    if (node && !node.open) node.showModal();
    return () => {
      // While the modal is open the rest of the page is inert: close it before moving focus.
      if (node?.open) node.close();
      opener?.focus();
    };
  }, []);
  return (
    <dialog
      ref={dialog}
      class="transcript-dialog"
      aria-label={`Transcript of ${persona}`}
      onClose={onClose}
      onCancel={(e) => {
        e.preventDefault();
        onClose();
      }}
    >
      <header class="dialog-head">
        <h2>Transcript of {persona}</h2>
        <button type="button" onClick={onClose}>
          Close
        </button>
      </header>
      <ErrorNote error={error} />
      {transcript ? <TranscriptBody transcript={transcript} errors={errors} /> : !error && <p role="status">Loading…</p>}
    </dialog>
  );
}

export function TranscriptPage({ spawnId }: { spawnId: string }) {
  const { transcript, error } = useTranscript(spawnId, 0, true);
  return (
    <main class="page">
      <h1>Transcript{transcript ? ` of ${transcript.persona}` : ""}</h1>
      <ErrorNote error={error} />
      {transcript ? <TranscriptBody transcript={transcript} /> : !error && <p role="status">Loading…</p>}
    </main>
  );
}
