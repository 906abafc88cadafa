// A persona's tool bag as a role gets it (GET /api/v1/skills?agent=&role=), and the tools it
// asked for that were dropped, with why.
import { useEffect, useState } from "preact/hooks";
import { useApp } from "../context";
import type { Me, SkillsOut } from "../types";
import { Badge, ErrorNote } from "../ui";

/** The tools ``agent`` gets for a role (the saved persona, not unsaved edits), and those dropped. */
export function ToolBag({ agent, me }: { agent: string; me: Me }) {
  const { api } = useApp();
  const [role, setRole] = useState(me.role);
  const [bag, setBag] = useState<SkillsOut | null>(null);
  const [error, setError] = useState<unknown>(null);

  useEffect(() => {
    let current = true;
    const query = new URLSearchParams({ agent });
    // The caller's own role is the default; naming it is left out for servers without `role`.
    if (role !== me.role) query.set("role", role);
    setError(null);
    api.get<SkillsOut>(`/api/v1/skills?${query}`).then(
      (out) => current && setBag(out),
      (exc: unknown) => {
        if (!current) return;
        setBag(null);
        setError(exc);
      },
    );
    return () => {
      current = false;
    };
  }, [api, agent, role, me.role]);

  const roles = me.roles.length ? me.roles : [me.role];
  return (
    <section class="settings-bag">
      {/* Not labelled by its heading: "Tool bag for role" would be a second match for the label "Role". */}
      <h3>Tool bag for role</h3>
      <div class="settings-field settings-inline">
        <label for="settings-bag-role">Role</label>
        <select id="settings-bag-role" value={role} onChange={(e) => setRole(e.currentTarget.value)}>
          {roles.map((r) => (
            <option key={r} value={r}>
              {r}
            </option>
          ))}
        </select>
      </div>
      <ErrorNote error={error} />
      {bag && (
        <>
          {bag.tools.length === 0 ? (
            <p class="muted">No tools: '{agent}' gets none for role '{bag.role}'.</p>
          ) : (
            <ul class="settings-bag-list">
              {bag.tools.map((tool) => (
                <li key={tool.name} data-testid="bag-tool" data-name={tool.name}>
                  <code>{tool.name}</code> <Badge kind={tool.class}>{tool.class}</Badge>
                  {typeof tool["confirmation"] === "string" && tool["confirmation"] !== "none" && (
                    <span class="muted">
                      {" "}
                      {tool["confirmation"] === "dual" ? "needs two approvals" : "needs one approval"}
                    </span>
                  )}
                </li>
              ))}
            </ul>
          )}
          {bag.dropped.length > 0 && (
            <>
              <h4>Asked for, not in the bag</h4>
              <ul class="settings-bag-list">
                {bag.dropped.map((drop) => (
                  <li key={drop.name} data-testid="bag-dropped" data-name={drop.name}>
                    <code>{drop.name}</code> <span class="muted">{drop.reason}</span>
                  </li>
                ))}
              </ul>
            </>
          )}
        </>
      )}
    </section>
  );
}
