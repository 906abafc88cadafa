// Settings → Agents: every persona with its source and availability, the load warnings, and the
// editor: user personas are created, changed and deleted here; builtin and disk ones are shown
// read-only, with the way to override them (save a user persona of the same name).
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { useApp } from "../context";
import type { Agent, AgentChange, LoadWarning, Me } from "../types";
import { Badge, ErrorNote, Link } from "../ui";
import { CheckField, FieldError, HINTS, TextArea, TextField, invalid } from "./persona_fields";
import {
  type FieldErrors,
  type FieldKey,
  type PersonaForm,
  PERMISSION_MODES,
  createBody,
  formOf,
  patchBody,
  problemsOf,
} from "./persona_form";
import "./settings.css";
import { ToolBag } from "./tool_bag";

const LIST = "/settings/agents";
const agentRoute = (name: string) => `${LIST}/${encodeURIComponent(name)}`;
const customPath = (name: string) => `/v1/agents/custom/${encodeURIComponent(name)}`;

/** What the last change did, and the route (a persona's name, or undefined: the list) it is
 * shown on: going anywhere else drops it. */
interface Notice {
  text: string;
  at: string | undefined;
}

// What survives a route change even if the router mounts a new page: the persona a "Save as
// user persona" copies into the New form, and the notice of the last change.
let pendingCopy: Agent | null = null;
let pendingNotice: Notice | null = null;

function takeNotice(): Notice | null {
  const notice = pendingNotice;
  pendingNotice = null;
  return notice;
}

function takeCopy(): Agent | null {
  const copy = pendingCopy;
  pendingCopy = null;
  return copy;
}

function isEditable(agent: Agent): boolean {
  return agent.editable ?? agent.source === "user";
}

/** Why the signed-in user cannot change ``agent`` here, or null when they can. */
function readOnlyReason(agent: Agent, me: Me): string | null {
  if (!isEditable(agent)) {
    if (agent.read_only_reason) return agent.read_only_reason;
    const where = agent.path ? ` (${agent.path})` : "";
    return agent.source === "disk"
      ? `agent '${agent.name}' is a disk persona${where} and is read-only here: edit the file and ` +
          "reload, or save a user persona with the same name to shadow it"
      : `agent '${agent.name}' is a ${agent.source} persona and is read-only: save a user ` +
          "persona with the same name to override it";
  }
  if (!me.permissions.edit_personas) {
    return `role '${me.role}' may not edit personas (it needs edit_personas)`;
  }
  return null;
}

function availability(agent: Agent): string {
  return agent.available ? "available" : `unavailable: ${agent.unavailable_reason ?? "no reason given"}`;
}

export function AgentsPage({ name }: { name?: string }) {
  const { api, me, navigate } = useApp();
  const canEdit = me.permissions.edit_personas;
  const [agents, setAgents] = useState<Agent[] | null>(null);
  const [listError, setListError] = useState<unknown>(null);
  const [warnings, setWarnings] = useState<LoadWarning[] | null>(null);
  const [warningsError, setWarningsError] = useState<unknown>(null);
  const [notice, setNotice] = useState<Notice | null>(takeNotice);
  const [reloading, setReloading] = useState(false);
  const [reloadError, setReloadError] = useState<unknown>(null);

  // A notice set for this page while it stays mounted is shown by state; drop the copy kept
  // for a page that might have been mounted instead.
  useEffect(() => {
    pendingNotice = null;
  });

  const refresh = useCallback(async () => {
    const [list, found] = await Promise.allSettled([
      api.get<Agent[]>("/api/v1/agents"),
      api.get<LoadWarning[]>("/api/v1/agents/warnings"),
    ]);
    if (list.status === "fulfilled") {
      setAgents(list.value);
      setListError(null);
    } else setListError(list.reason);
    if (found.status === "fulfilled") {
      setWarnings(found.value);
      setWarningsError(null);
    } else setWarningsError(found.reason);
  }, [api]);

  useEffect(() => {
    void refresh();
  }, [refresh]);

  const announce = (text: string, at: string | undefined) => {
    pendingNotice = { text, at };
    setNotice(pendingNotice);
  };
  const shown = notice && notice.at === name ? notice.text : null;

  const reload = async () => {
    setReloading(true);
    setReloadError(null);
    try {
      const out = await api.post<{ registry_version: number; agents: number; warnings: number }>(
        "/api/v1/agents/reload",
      );
      announce(
        `Reloaded: ${out.agents} personas, ${out.warnings} load warnings ` +
          `(registry version ${out.registry_version}).`,
        name,
      );
      await refresh();
    } catch (exc) {
      setReloadError(exc);
    } finally {
      setReloading(false);
    }
  };

  const saved = async (change: AgentChange, created: boolean) => {
    let said = created ? `Created user persona '${change.name}'.` : `Saved '${change.name}'.`;
    if (change.notice) said += ` It ${change.notice}.`;
    const findings = (change.findings ?? []).filter((f) => f.kind !== "missing_config");
    if (findings.length) {
      said += ` ${findings.length} finding(s): ${findings.map((f) => f.reason + (f.hint ? ` (${f.hint})` : "")).join("; ")}`;
    }
    await refresh();
    announce(said, change.name);
    if (created) navigate(agentRoute(change.name));
  };

  const deleted = async (agent: Agent) => {
    const restored = agent.shadows
      ? ` The ${agent.shadows} persona '${agent.name}' is in effect again.`
      : "";
    await refresh();
    announce(`Deleted user persona '${agent.name}'.${restored}`, undefined);
    navigate(LIST);
  };

  const copyAsUser = (agent: Agent) => {
    pendingCopy = agent;
    navigate(`${LIST}/new`);
  };

  return (
    <main class="page settings-page">
      <header class="settings-header">
        <h1>Agents</h1>
        {canEdit && (
          <div class="actions settings-actions">
            <button type="button" onClick={() => navigate(`${LIST}/new`)}>
              New persona
            </button>
            <button type="button" onClick={() => void reload()} disabled={reloading}>
              Reload
            </button>
          </div>
        )}
      </header>
      <p role="status" class="settings-notice" hidden={!shown}>
        {shown}
      </p>
      <ErrorNote error={reloadError} />
      <div class={name === undefined ? "settings-layout" : "settings-layout settings-layout-open"}>
        <AgentList agents={agents} error={listError} selected={name} me={me} warnings={warnings} />
        {name !== undefined && (
          <EditorPane
            key={name}
            name={name}
            agents={agents}
            me={me}
            onSaved={saved}
            onDeleted={deleted}
            onCopy={copyAsUser}
          />
        )}
      </div>
      <Warnings warnings={warnings} error={warningsError} />
    </main>
  );
}

// -- the list ------------------------------------------------------------------------------------

function AgentList({
  agents,
  error,
  selected,
  me,
  warnings,
}: {
  agents: Agent[] | null;
  error: unknown;
  selected: string | undefined;
  me: Me;
  /** The lint findings of every persona: a persona with one says so on its row. */
  warnings: LoadWarning[] | null;
}) {
  if (error && !agents) return <ErrorNote error={error} />;
  if (!agents) return <p class="settings-list">Loading personas…</p>;
  return (
    <div class="settings-list settings-scroll">
      <ErrorNote error={error} />
      <table class="settings-table">
        <caption>Personas</caption>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Source</th>
            <th scope="col">Availability</th>
            <th scope="col">
              <span class="visually-hidden">Open</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {agents.map((agent) => {
            const editable = me.permissions.edit_personas && isEditable(agent);
            // Settings unset on the API's host are said in the warnings; the rest are the file's.
            const problems = (a: Agent) =>
              (warnings ?? []).filter((w) => w.persona === a.name && w.kind !== "missing_config");
            return (
              <tr
                key={agent.name}
                data-testid="agent-row"
                data-name={agent.name}
                class={agent.name === selected ? "settings-selected" : undefined}
              >
                <th scope="row">
                  <code>{agent.name}</code>
                  <div class="muted">{agent.description}</div>
                </th>
                <td>
                  <Badge kind={agent.source} testid="agent-source">
                    {agent.source}
                  </Badge>
                  {agent.shadows && <div class="muted">overrides the {agent.shadows} one</div>}
                </td>
                <td>
                  <span
                    data-testid="agent-availability"
                    class={agent.available && !problems(agent).length ? "settings-available" : "settings-unavailable"}
                  >
                    {availability(agent)}
                  </span>
                  {problems(agent).length > 0 && (
                    <div class="warning" data-testid="agent-findings">
                      {problems(agent).map((f) => f.reason).join("; ")}
                    </div>
                  )}
                </td>
                <td>
                  <Link
                    href={agentRoute(agent.name)}
                    aria-current={agent.name === selected ? "page" : undefined}
                  >
                    {editable ? "Edit" : "View"}
                    <span class="visually-hidden"> {agent.name}</span>
                  </Link>
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

function Warnings({ warnings, error }: { warnings: LoadWarning[] | null; error: unknown }) {
  return (
    <section class="settings-warnings" aria-labelledby="settings-warnings-heading">
      <h2 id="settings-warnings-heading">Load warnings</h2>
      <ErrorNote error={error} />
      {warnings === null ? null : warnings.length === 0 ? (
        <p class="muted">None: every persona file and row loaded cleanly.</p>
      ) : (
        <div class="settings-scroll">
          <table class="settings-table settings-warning-table">
            <thead>
              <tr>
                <th scope="col">Kind</th>
                <th scope="col">Persona</th>
                <th scope="col">Problem</th>
              </tr>
            </thead>
            <tbody>
              {warnings.map((warning, at) => (
                <tr key={at} data-testid="warning" data-kind={warning.kind} data-persona={warning.persona}>
                  <td>
                    <Badge kind={warning.kind}>{warning.kind}</Badge>
                  </td>
                  <td>
                    {warning.persona ? <code>{warning.persona}</code> : <span class="muted">(not loaded)</span>}
                  </td>
                  <td>
                    {warning.reason}
                    {warning.hint && <div class="muted">{warning.hint}</div>}
                    {warning.path && <div class="muted settings-path">{warning.path}</div>}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}

// -- the editor ----------------------------------------------------------------------------------

interface EditorCallbacks {
  onSaved: (change: AgentChange, created: boolean) => Promise<void>;
  onDeleted: (agent: Agent) => Promise<void>;
  onCopy: (agent: Agent) => void;
}

/** Which editor a route opens: the New form, a user persona's, or a read-only view. */
function EditorPane({
  name,
  agents,
  me,
  ...callbacks
}: { name: string; agents: Agent[] | null; me: Me } & EditorCallbacks) {
  const [copy] = useState(() => (name === "new" ? takeCopy() : null));
  if (name === "new") {
    if (!me.permissions.edit_personas) {
      return (
        <section class="settings-editor">
          <h2>New persona</h2>
          <p data-testid="read-only-reason">
            Role '{me.role}' may not create personas (it needs edit_personas).
          </p>
          <Link href={LIST}>Back to the list</Link>
        </section>
      );
    }
    return <Editor mode="new" agent={copy} reason={null} me={me} {...callbacks} />;
  }
  if (!agents) return <p class="settings-editor">Loading…</p>;
  const agent = agents.find((a) => a.name === name);
  if (!agent) {
    return (
      <section class="settings-editor">
        <h2>No persona '{name}'</h2>
        <p class="error">There is no persona of that name (it may have been deleted).</p>
        <Link href={LIST}>Back to the list</Link>
      </section>
    );
  }
  const reason = readOnlyReason(agent, me);
  // Keyed by the persona's content: once a save or a reload changes it, the form shows the new
  // values (unsaved edits of a persona changed meanwhile are dropped, not merged).
  return (
    <Editor
      key={JSON.stringify(agent)}
      mode={reason ? "view" : "edit"}
      agent={agent}
      reason={reason}
      me={me}
      {...callbacks}
    />
  );
}

type Mode = "new" | "edit" | "view";

function Editor({
  mode,
  agent,
  reason,
  me,
  onSaved,
  onDeleted,
  onCopy,
}: { mode: Mode; agent: Agent | null; reason: string | null; me: Me } & EditorCallbacks) {
  const { api, navigate } = useApp();
  // The editor is mounted anew for each saved version of the persona (see EditorPane).
  const [initial] = useState<PersonaForm>(() => formOf(agent));
  const [form, setForm] = useState<PersonaForm>(initial);
  const [fieldErrors, setFieldErrors] = useState<FieldErrors>({});
  const [formErrors, setFormErrors] = useState<string[]>([]);
  const [outcome, setOutcome] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const heading = useRef<HTMLHeadingElement>(null);
  const formRef = useRef<HTMLFormElement>(null);
  const readOnly = mode === "view";
  const title = mode === "new" ? "New persona" : `${readOnly ? "View" : "Edit"} ${agent?.name ?? ""}`;
  const unknown = agent?.unknown_fields as Record<string, unknown> | undefined;

  useEffect(() => {
    heading.current?.focus();
    heading.current?.scrollIntoView({ block: "nearest" });
  }, []);

  const set = <K extends FieldKey>(key: K, value: PersonaForm[K]) =>
    setForm((current) => ({ ...current, [key]: value }));

  const refused = (errors: FieldErrors, other: string[]) => {
    setFieldErrors(errors);
    setFormErrors(other);
    const first = Object.keys(errors)[0];
    // After the render that marks it: keyboard users land on the first field to fix.
    const focusFirst = () => formRef.current?.querySelector<HTMLElement>(`#field-${first}`)?.focus();
    if (first) setTimeout(focusFirst, 0);
  };

  const save = async (event: Event) => {
    event.preventDefault();
    if (readOnly || busy) return;
    setOutcome(null);
    const built = mode === "new" ? createBody(form, unknown) : patchBody(form, initial);
    if (!built.ok) return refused(built.errors, []);
    if (mode === "edit" && Object.keys(built.body).length === 0) {
      refused({}, []);
      setOutcome("Nothing to save: no field was changed.");
      return;
    }
    setBusy(true);
    try {
      const change =
        mode === "new"
          ? await api.post<AgentChange>("/v1/agents/custom", built.body)
          : await api.patch<AgentChange>(customPath(agent?.name ?? form.name), built.body);
      refused({}, []);
      await onSaved(change, mode === "new");
    } catch (exc) {
      const { fields, other } = problemsOf(exc);
      const marked = Object.keys(fields).length > 0;
      const summary =
        marked && other.length === 0 ? ["Not saved: correct the fields marked below."] : other;
      refused(fields, summary.length ? summary : [exc instanceof Error ? exc.message : String(exc)]);
    } finally {
      setBusy(false);
    }
  };

  const remove = async () => {
    if (!agent) return;
    setBusy(true);
    try {
      await api.delete(customPath(agent.name));
      await onDeleted(agent);
    } catch (exc) {
      setConfirming(false);
      refused({}, [exc instanceof Error ? exc.message : String(exc)]);
    } finally {
      setBusy(false);
    }
  };

  const nameHint = mode === "edit" ? "A persona's name cannot be changed." : HINTS.name;
  // A read-only view leaves out the hints: they say how to fill a field, not what it holds.
  const field = { form, errors: fieldErrors, disabled: readOnly, set, showHints: !readOnly };
  return (
    // Not labelled by its heading: "Edit <name>" could match a field's label (e.g. "Model").
    <section class="settings-editor">
      <h2 tabIndex={-1} ref={heading}>
        {title}
      </h2>
      {agent && mode !== "new" && (
        <p class="muted">
          <Badge kind={agent.source}>{agent.source}</Badge>{" "}
          {agent.path && <span class="settings-path">{agent.path}</span>}
          {agent.shadows && <span> · overrides the {agent.shadows} persona of this name</span>}
        </p>
      )}
      {mode === "new" && agent && (
        <p class="muted">
          A user persona copied from the {agent.source} persona '{agent.name}'; saving it under the
          same name overrides that one.
        </p>
      )}
      {reason && (
        <p class="settings-read-only" data-testid="read-only-reason">
          {reason}
        </p>
      )}
      {formErrors.length > 0 && (
        <div class="error" role="alert">
          {formErrors.length === 1 ? (
            formErrors[0]
          ) : (
            <ul>
              {formErrors.map((message, at) => (
                <li key={at}>{message}</li>
              ))}
            </ul>
          )}
        </div>
      )}
      <form ref={formRef} class="settings-form" noValidate onSubmit={(event) => void save(event)}>
        <TextField {...field} name="name" label="Name" readOnlyText={mode === "edit"} hint={nameHint} />
        <TextField {...field} name="description" label="Description" />
        <TextArea {...field} name="when_to_use" label="When to use" rows={3} />
        <TextArea {...field} name="tools" label="Tools" rows={4} mono />
        <TextArea {...field} name="disallowed_tools" label="Disallowed tools" rows={2} mono />
        <div class="settings-field">
          <label for="field-permission_mode">Permission mode</label>
          <select
            id="field-permission_mode"
            value={form.permission_mode}
            disabled={readOnly}
            {...invalid("permission_mode", fieldErrors)}
            onChange={(e) => set("permission_mode", e.currentTarget.value)}
          >
            {PERMISSION_MODES.map((mode_) => (
              <option key={mode_} value={mode_}>
                {mode_}
              </option>
            ))}
            {!(PERMISSION_MODES as readonly string[]).includes(form.permission_mode) && (
              <option value={form.permission_mode}>{form.permission_mode}</option>
            )}
          </select>
          <FieldError name="permission_mode" errors={fieldErrors} />
        </div>
        <TextField {...field} name="max_turns" label="Max turns" inputMode="numeric" />
        <TextField {...field} name="model" label="Model" />
        <TextArea {...field} name="critical_reminder" label="Critical reminder" rows={2} />
        <TextArea {...field} name="initial_prompt" label="Initial prompt" rows={2} />
        <CheckField {...field} name="background" label="Background" />
        <CheckField {...field} name="omit_claude_md" label="Omit CLAUDE.md" />
        <TextArea {...field} name="metadata" label="Metadata (JSON)" rows={4} mono />
        <TextArea {...field} name="body" label="System prompt" rows={12} mono />
        {unknown && Object.keys(unknown).length > 0 && (
          <div class="settings-field">
            <span class="settings-label" id="settings-unknown-label">
              Unknown keys (kept as they are)
            </span>
            <pre class="block" aria-labelledby="settings-unknown-label" data-testid="unknown-fields">
              {JSON.stringify(unknown, null, 2)}
            </pre>
          </div>
        )}
        <div class="actions settings-actions">
          {!readOnly && (
            <button type="submit" disabled={busy}>
              Save
            </button>
          )}
          {readOnly && agent && !isEditable(agent) && me.permissions.edit_personas && (
            <button type="button" onClick={() => onCopy(agent)}>
              Save as user persona
            </button>
          )}
          <button type="button" class="quiet" onClick={() => navigate(LIST)}>
            Cancel
          </button>
          {mode === "edit" && !confirming && (
            <button type="button" class="danger" onClick={() => setConfirming(true)} disabled={busy}>
              Delete
            </button>
          )}
          {mode === "edit" && confirming && (
            <span class="settings-confirm">
              <span>
                Delete '{agent?.name}'{agent?.shadows ? `; the ${agent.shadows} persona comes back` : ""}?
              </span>
              <button type="button" class="danger" onClick={() => void remove()} disabled={busy}>
                Confirm delete
              </button>
              <button type="button" class="quiet" onClick={() => setConfirming(false)}>
                Keep it
              </button>
            </span>
          )}
        </div>
        {outcome && <p class="muted">{outcome}</p>}
      </form>
      {agent && mode !== "new" && <ToolBag agent={agent.name} me={me} />}
    </section>
  );
}
