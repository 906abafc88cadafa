// A tool call as a card: its name, arguments, and its result folded past a few lines.
import { Folded, pretty } from "../ui";

export interface ToolCardProps {
  name: string;
  arguments: string;
  result: string | null;
  isError: boolean;
}

export function ToolCard({ name, arguments: args, result, isError }: ToolCardProps) {
  return (
    <div class={`tool-card${isError ? " is-error" : ""}`} data-testid="tool-card" data-tool={name}
      data-error={isError ? "true" : "false"}>
      <div class="tool-head">
        <code>{name}</code>
        {isError && <span class="badge badge-failed">error</span>}
        {result === null && <span class="badge badge-running">no result yet</span>}
      </div>
      <div class="tool-label">Arguments</div>
      <pre class="block args" data-testid="tool-args">
        {pretty(args)}
      </pre>
      {result !== null && (
        <>
          <div class="tool-label">{isError ? "Error" : "Result"}</div>
          <Folded text={result} testid="tool-result" />
        </>
      )}
    </div>
  );
}
