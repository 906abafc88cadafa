// Settings → Skills: the tool catalog the signed-in user's role can see, with each tool's class.
import { useEffect, useState } from "preact/hooks";
import { useApp } from "../context";
import type { SkillsOut } from "../types";
import { Badge, Description, ErrorNote } from "../ui";
import "./settings.css";

export function SkillsPage() {
  const { api } = useApp();
  const [skills, setSkills] = useState<SkillsOut | null>(null);
  const [error, setError] = useState<unknown>(null);

  useEffect(() => {
    let current = true;
    api.get<SkillsOut>("/api/v1/skills").then(
      (out) => current && setSkills(out),
      (exc: unknown) => current && setError(exc),
    );
    return () => {
      current = false;
    };
  }, [api]);

  return (
    <main class="page settings-page">
      <header class="settings-header">
        <h1>Skills</h1>
      </header>
      <ErrorNote error={error} />
      {!skills && !error && <p>Loading tools…</p>}
      {skills && (
        <>
          <p class="muted">
            Role <strong>{skills.role}</strong>: {skills.tools.length} tools. A persona gets the ones its Tools list
            names, within its permission mode.
          </p>
          <div class="settings-scroll">
            <table class="settings-table">
              <caption>Tools your role can see</caption>
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">Class</th>
                  <th scope="col">Description</th>
                </tr>
              </thead>
              <tbody>
                {skills.tools.map((tool) => (
                  <tr key={tool.name} data-testid="skill-row" data-name={tool.name}>
                    <th scope="row">
                      <code>{tool.name}</code>
                    </th>
                    <td>
                      <Badge kind={tool.class}>{tool.class}</Badge>
                    </td>
                    <td class="settings-description">
                      <Description text={tool.description} />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </>
      )}
    </main>
  );
}
