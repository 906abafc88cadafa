// Small shared pieces: an error line, a status badge, folded long text, a route link.
import type { ComponentChildren, JSX } from "preact";
import { useEffect, useState } from "preact/hooks";
import { useApp } from "./context";

export function ErrorNote({ error }: { error: unknown }) {
  if (!error) return null;
  const message = error instanceof Error ? error.message : String(error);
  return (
    <p class="error" role="alert">
      {message}
    </p>
  );
}

export function Badge({ kind, children, testid }: { kind: string; children: ComponentChildren; testid?: string }) {
  return (
    <span class={`badge badge-${kind}`} data-testid={testid}>
      {children}
    </span>
  );
}

/** Text shown whole up to ``lines`` lines; longer text shows its first lines and unfolds whole. */
export function Folded({ text, lines = 6, testid }: { text: string; lines?: number; testid?: string }) {
  const [open, setOpen] = useState(false);
  const all = text.split("\n");
  if (all.length <= lines) {
    return (
      <pre class="block" data-testid={testid}>
        {text}
      </pre>
    );
  }
  return (
    <div data-testid={testid} class="folded">
      <pre class="block">{open ? text : all.slice(0, lines).join("\n")}</pre>
      <details onToggle={(e) => setOpen((e.currentTarget as HTMLDetailsElement).open)}>
        <summary>{open ? "Show less" : `Show all ${all.length} lines`}</summary>
      </details>
    </div>
  );
}

/** A link to a console route that navigates without reloading the page. */
/** A long description folded after its first sentence (the summary is that sentence, so the
 * cell's text is still the whole description). */
export function Description({ text }: { text: string }) {
  const end = text.search(/[.!?]\s/);
  if (end < 0 || text.length < 160) return <>{text}</>;
  return (
    <details class="settings-fold">
      <summary>{text.slice(0, end + 1)}</summary>
      {text.slice(end + 1)}
    </details>
  );
}

export function Link(props: JSX.HTMLAttributes<HTMLAnchorElement> & { href: string }) {
  const { navigate } = useApp();
  const { href, children, ...rest } = props;
  return (
    <a
      {...rest}
      href={href}
      onClick={(event) => {
        if (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
        event.preventDefault();
        navigate(href);
      }}
    >
      {children}
    </a>
  );
}

export function pretty(json: string): string {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return json;
  }
}

export function money(cost: number): string {
  return `$${cost.toFixed(cost >= 1 ? 2 : 4)}`;
}

/** How many of ``total`` items to render: ``step`` more each animation frame, so a list of
 * thousands appears within a few frames instead of freezing the page for one long one. */
export function useProgressive(total: number, step = 150): number {
  const [shown, setShown] = useState(Math.min(total, step));
  useEffect(() => {
    if (shown >= total) return;
    const frame = requestAnimationFrame(() => setShown((n) => Math.min(total, n + step)));
    return () => cancelAnimationFrame(frame);
  }, [shown, total, step]);
  return Math.min(shown, total);
}
