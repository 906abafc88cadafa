// The persona editor's form as plain data: a persona's fields as the text the inputs hold, the
// request body a create or a patch sends, and the server's field problems put back on the fields.
// No rendering here, so the rules (what is sent, what counts as a change) are in one place.
import { ApiError } from "../api";
import type { Agent, Problem } from "../types";

export const PERMISSION_MODES = ["read-only", "mutating-with-confirm", "dual-sign-required"] as const;

/** The form's fields, named by their frontmatter key (the `field` of the server's problems). */
export interface PersonaForm {
  name: string;
  description: string;
  when_to_use: string;
  tools: string;
  disallowed_tools: string;
  permission_mode: string;
  max_turns: string;
  model: string;
  critical_reminder: string;
  initial_prompt: string;
  background: boolean;
  omit_claude_md: boolean;
  metadata: string;
  body: string;
}

export type FieldKey = keyof PersonaForm;
export type FieldErrors = Partial<Record<FieldKey, string>>;

/** Every field, in the order the form shows them (a problem's field is checked against it). */
export const FIELD_KEYS: readonly FieldKey[] = [
  "name",
  "description",
  "when_to_use",
  "tools",
  "disallowed_tools",
  "permission_mode",
  "max_turns",
  "model",
  "critical_reminder",
  "initial_prompt",
  "background",
  "omit_claude_md",
  "metadata",
  "body",
];

export type Built =
  | { ok: true; body: Record<string, unknown> }
  | { ok: false; errors: FieldErrors };

/** Defaults and empty values are left out, so the editor shows what the persona says. */
function pruned(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(pruned);
  if (value === null || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [key, child] of Object.entries(value as Record<string, unknown>)) {
    const kept = pruned(child);
    const empty =
      kept === null ||
      (Array.isArray(kept) && kept.length === 0) ||
      (typeof kept === "object" && kept !== null && Object.keys(kept).length === 0);
    if (!empty) out[key] = kept;
  }
  return out;
}

function metadataText(metadata: Record<string, unknown> | undefined): string {
  const shown = pruned(metadata ?? {}) as Record<string, unknown>;
  return Object.keys(shown).length ? JSON.stringify(shown, null, 2) : "";
}

/** The form of ``agent``; a blank form for a new persona. */
export function formOf(agent: Agent | null): PersonaForm {
  return {
    name: agent?.name ?? "",
    description: agent?.description ?? "",
    when_to_use: agent?.when_to_use ?? "",
    tools: (agent?.tools ?? []).join("\n"),
    disallowed_tools: (agent?.disallowed_tools ?? []).join("\n"),
    permission_mode: agent?.permission_mode ?? "read-only",
    max_turns: agent?.max_turns == null ? "" : String(agent.max_turns),
    model: agent?.model ?? "",
    critical_reminder: agent?.critical_reminder ?? "",
    initial_prompt: agent?.initial_prompt ?? "",
    background: agent?.background ?? false,
    omit_claude_md: agent?.omit_claude_md ?? false,
    metadata: metadataText(agent?.metadata),
    body: agent?.body ?? "",
  };
}

/** One tool name or pattern per line; blank lines and surrounding spaces do not count. */
function lines(text: string): string[] {
  return text
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "");
}

/** An integer when the text is one; else the text itself, so the server's message about it shows. */
function turns(text: string): number | string {
  const trimmed = text.trim();
  return /^-?\d+$/.test(trimmed) ? Number(trimmed) : trimmed;
}

type Parsed = { ok: true; value: Record<string, unknown> | null } | { ok: false; error: string };

/** The metadata text as an object (``null`` when blank), or why it is not one. */
function parseMetadata(text: string): Parsed {
  if (!text.trim()) return { ok: true, value: null };
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (exc) {
    return { ok: false, error: `not valid JSON: ${exc instanceof Error ? exc.message : String(exc)}` };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return { ok: false, error: "must be a JSON object, e.g. {\"ongrid\": {\"scope\": \"manager\"}}" };
  }
  return { ok: true, value: value as Record<string, unknown> };
}

/** JSON with sorted keys: two objects are the same metadata when these are equal. */
function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, item: unknown) =>
    item && typeof item === "object" && !Array.isArray(item)
      ? Object.fromEntries(Object.entries(item as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : 1)))
      : item,
  );
}

const OPTIONAL_TEXT = ["model", "critical_reminder", "initial_prompt"] as const;
const TOOL_LISTS = ["tools", "disallowed_tools"] as const;

/** The body of ``POST /v1/agents/custom``. Empty optional fields are left out (their default);
 * ``unknownFields`` (keys this version does not know, of a persona being copied) are sent as they
 * were, so the copy keeps them. */
export function createBody(form: PersonaForm, unknownFields: Record<string, unknown> = {}): Built {
  const metadata = parseMetadata(form.metadata);
  if (!metadata.ok) return { ok: false, errors: { metadata: metadata.error } };
  const body: Record<string, unknown> = {
    ...unknownFields,
    name: form.name.trim(),
    // Sent even when blank: the server says at the field that it is required.
    description: form.description,
    when_to_use: form.when_to_use,
    permission_mode: form.permission_mode,
    background: form.background,
    omit_claude_md: form.omit_claude_md,
    body: form.body,
  };
  for (const key of TOOL_LISTS) {
    const listed = lines(form[key]);
    if (listed.length) body[key] = listed;
  }
  if (form.max_turns.trim()) body["max_turns"] = turns(form.max_turns);
  for (const key of OPTIONAL_TEXT) if (form[key] !== "") body[key] = form[key];
  if (metadata.value) body["metadata"] = metadata.value;
  return { ok: true, body };
}

/** The body of ``PATCH /v1/agents/custom/{name}``: only the fields that differ from
 * ``initial`` (``null`` resets a cleared list, turn cap or metadata to its default). */
export function patchBody(form: PersonaForm, initial: PersonaForm): Built {
  const metadata = parseMetadata(form.metadata);
  if (!metadata.ok) return { ok: false, errors: { metadata: metadata.error } };
  const body: Record<string, unknown> = {};
  for (const key of ["description", "when_to_use", "permission_mode", ...OPTIONAL_TEXT, "body"] as const) {
    if (form[key] !== initial[key]) body[key] = form[key];
  }
  for (const key of ["background", "omit_claude_md"] as const) {
    if (form[key] !== initial[key]) body[key] = form[key];
  }
  for (const key of TOOL_LISTS) {
    const listed = lines(form[key]);
    if (listed.join("\n") !== lines(initial[key]).join("\n")) body[key] = listed.length ? listed : null;
  }
  if (form.max_turns.trim() !== initial.max_turns.trim()) {
    body["max_turns"] = form.max_turns.trim() ? turns(form.max_turns) : null;
  }
  const before = parseMetadata(initial.metadata);
  const was = before.ok ? before.value : null;
  if (canonical(metadata.value ?? {}) !== canonical(was ?? {})) body["metadata"] = metadata.value;
  return { ok: true, body };
}

function isField(key: string): key is FieldKey {
  return (FIELD_KEYS as readonly string[]).includes(key);
}

/** A refused save split into messages at the fields (by the first segment of each problem's
 * dotted field: ``metadata.requires.env`` is the metadata field's) and the rest, shown above
 * the form. */
export function problemsOf(error: unknown): { fields: FieldErrors; other: string[] } {
  const fields: FieldErrors = {};
  const other: string[] = [];
  const problems: Problem[] = error instanceof ApiError ? error.problems : [];
  for (const problem of problems) {
    const key = problem.field.split(".")[0] ?? "";
    const inBody = problem.in === undefined || problem.in === "body";
    if (inBody && isField(key)) {
      const rest = problem.field.slice(key.length + 1);
      const message = rest ? `${rest}: ${problem.message}` : problem.message;
      fields[key] = fields[key] ? `${fields[key]}; ${message}` : message;
    } else {
      other.push(problem.field ? `${problem.field}: ${problem.message}` : problem.message);
    }
  }
  return { fields, other };
}
