// The persona editor's inputs: each labelled, with its hint and, after a refused save, its
// error tied to it (id "field-<key>-error", aria-invalid, aria-describedby).
import type { FieldErrors, FieldKey, PersonaForm } from "./persona_form";

/** What to put in a field, shown under it (after the persona fields' own descriptions). */
export const HINTS: Partial<Record<FieldKey, string>> = {
  name: "snake_case or kebab-case: lowercase letters, digits, '_' or '-'.",
  description: "Shown in pickers and in the coordinator's catalog.",
  when_to_use: "When the coordinator should pick it; the first line goes in its catalog.",
  tools: "One tool name or pattern per line; * is a wildcard.",
  disallowed_tools: "One per line; applied after Tools, and wins.",
  max_turns: "Blank or 0: the default cap.",
  model: "e.g. openai/gpt-4o-mini; blank: the organisation default.",
  initial_prompt: "A template over the spawn context.",
  metadata: "A JSON object; blank: none.",
};

export interface FieldProps {
  form: PersonaForm;
  errors: FieldErrors;
  disabled: boolean;
  set: <K extends FieldKey>(key: K, value: PersonaForm[K]) => void;
  label: string;
  hint?: string;
  showHints: boolean;
}

/** The attributes that tie an input to its error (or, without one, to its hint). */
export function invalid(name: FieldKey, errors: FieldErrors, hint?: string) {
  if (errors[name]) return { "aria-invalid": "true" as const, "aria-describedby": `field-${name}-error` };
  return hint ? { "aria-describedby": `field-${name}-hint` } : {};
}

export function FieldError({ name, errors }: { name: FieldKey; errors: FieldErrors }) {
  const message = errors[name];
  if (!message) return null;
  return (
    <p id={`field-${name}-error`} class="error settings-field-error">
      {message}
    </p>
  );
}

function Hint({ name, hint }: { name: FieldKey; hint: string | undefined }) {
  return hint ? (
    <p id={`field-${name}-hint`} class="settings-hint">
      {hint}
    </p>
  ) : null;
}

type TextKey = Exclude<FieldKey, "background" | "omit_claude_md">;

export function TextField({
  form,
  errors,
  disabled,
  set,
  name,
  label,
  hint: hintText,
  showHints,
  readOnlyText = false,
  inputMode,
}: FieldProps & { name: TextKey; readOnlyText?: boolean; inputMode?: "numeric" }) {
  const hint = showHints ? (hintText ?? HINTS[name]) : undefined;
  return (
    <div class="settings-field">
      <label for={`field-${name}`}>{label}</label>
      <input
        id={`field-${name}`}
        type="text"
        value={form[name]}
        disabled={disabled}
        readOnly={readOnlyText}
        inputMode={inputMode}
        autoComplete="off"
        spellcheck={false}
        {...invalid(name, errors, hint)}
        onInput={(e) => set(name, e.currentTarget.value)}
      />
      <Hint name={name} hint={hint} />
      <FieldError name={name} errors={errors} />
    </div>
  );
}

export function TextArea({
  form,
  errors,
  disabled,
  set,
  name,
  label,
  hint: hintText,
  showHints,
  rows,
  mono = false,
}: FieldProps & { name: TextKey; rows: number; mono?: boolean }) {
  const hint = showHints ? (hintText ?? HINTS[name]) : undefined;
  return (
    <div class="settings-field">
      <label for={`field-${name}`}>{label}</label>
      <textarea
        id={`field-${name}`}
        rows={rows}
        class={mono ? "settings-mono" : undefined}
        value={form[name]}
        disabled={disabled}
        spellcheck={!mono}
        {...invalid(name, errors, hint)}
        onInput={(e) => set(name, e.currentTarget.value)}
      />
      <Hint name={name} hint={hint} />
      <FieldError name={name} errors={errors} />
    </div>
  );
}

export function CheckField({
  form,
  errors,
  disabled,
  set,
  name,
  label,
}: FieldProps & { name: "background" | "omit_claude_md" }) {
  return (
    <div class="settings-field settings-check">
      <input
        id={`field-${name}`}
        type="checkbox"
        checked={form[name]}
        disabled={disabled}
        {...invalid(name, errors)}
        onChange={(e) => set(name, e.currentTarget.checked)}
      />
      <label for={`field-${name}`}>{label}</label>
      <FieldError name={name} errors={errors} />
    </div>
  );
}
