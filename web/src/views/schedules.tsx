// Schedules: every scheduled investigation with its cadence, owner, last and next run, and its
// recent results (each a link to the run's transcript). Editors enable and disable them; the
// config file's are read-only here.
import { useCallback, useEffect, useState } from "preact/hooks";
import { useApp } from "../context";
import { Badge, ErrorNote, Link } from "../ui";
import "./settings.css";

interface ScheduleRun {
  due_at: string;
  spawn_id: string | null;
  status: "started" | "skipped" | "failed";
  reason: string;
  created_at: string;
  /** A started run's spawn: queued, running, ok, failed… */
  spawn_status?: string | null;
}

interface Schedule {
  name: string;
  persona: string;
  prompt: string;
  cadence: string;
  owner: string;
  role: string;
  channels: string[];
  enabled: boolean;
  source: "config" | "api";
  next_run_at: string | null;
  last_run: ScheduleRun | null;
  runs: ScheduleRun[];
}

/** Refreshed this often while the page is open (runs come from the beat, not from here). */
const REFRESH_MS = 10_000;

function when(iso: string | null): string {
  return iso ? new Date(iso).toLocaleString() : "—";
}

function Run({ run }: { run: ScheduleRun }) {
  return (
    <span data-testid="schedule-run" title={run.reason || undefined}>
      <Badge kind={run.status === "started" ? "ok" : run.status === "failed" ? "failed" : "waiting"}>
        {run.status}
      </Badge>{" "}
      {run.spawn_id ? <Link href={`/spawns/${run.spawn_id}`}>{when(run.due_at)}</Link> : when(run.due_at)}
      {run.spawn_status && (
        <span data-testid="schedule-run-result">
          {" "}
          <Badge kind={run.spawn_status === "ok" ? "ok" : run.spawn_status === "failed" ? "failed" : "waiting"}>
            {run.spawn_status}
          </Badge>
        </span>
      )}
      {run.reason && <span class="muted"> — {run.reason}</span>}
    </span>
  );
}

export function SchedulesPage() {
  const { api, me } = useApp();
  const [schedules, setSchedules] = useState<Schedule[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState("");

  const load = useCallback(
    () =>
      api.get<Schedule[]>("/api/v1/schedules").then(
        (out) => {
          setSchedules(out);
          setError(null);
        },
        (exc: unknown) => setError(exc),
      ),
    [api],
  );

  useEffect(() => {
    void load();
    const timer = setInterval(() => void load(), REFRESH_MS);
    return () => clearInterval(timer);
  }, [load]);

  const toggle = async (schedule: Schedule) => {
    setBusy(schedule.name);
    try {
      await api.patch(`/api/v1/schedules/${encodeURIComponent(schedule.name)}`, { enabled: !schedule.enabled });
      await load();
    } catch (exc) {
      setError(exc);
    } finally {
      setBusy("");
    }
  };

  return (
    <main class="page settings-page">
      <header class="settings-header">
        <h1>Schedules</h1>
      </header>
      <ErrorNote error={error} />
      {!schedules && !error && <p>Loading schedules…</p>}
      {schedules && schedules.length === 0 && (
        <p class="muted">
          No schedules. Define them under <code>schedules:</code> in the config file or with{" "}
          <code>POST /api/v1/schedules</code>.
        </p>
      )}
      {schedules && schedules.length > 0 && (
        <div class="settings-scroll">
          <table class="settings-table">
            <caption>Scheduled investigations (times in your browser's time zone)</caption>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Persona</th>
                <th scope="col">Cadence</th>
                <th scope="col">Owner</th>
                <th scope="col">Enabled</th>
                <th scope="col">Last run</th>
                <th scope="col">Next run</th>
                <th scope="col">Recent results</th>
              </tr>
            </thead>
            <tbody>
              {schedules.map((schedule) => (
                <tr key={schedule.name} data-testid="schedule-row" data-name={schedule.name}>
                  <th scope="row">
                    <code>{schedule.name}</code>
                    {schedule.source === "config" && (
                      <>
                        {" "}
                        <Badge kind="disk">config file</Badge>
                      </>
                    )}
                  </th>
                  <td>{schedule.persona}</td>
                  <td>{schedule.cadence}</td>
                  <td>
                    {schedule.owner} · {schedule.role}
                  </td>
                  <td>
                    {schedule.enabled ? "yes" : "no"}
                    {me.permissions.edit_personas && schedule.source === "api" && (
                      <>
                        {" "}
                        <button
                          type="button"
                          class="quiet"
                          data-testid="schedule-toggle"
                          disabled={busy === schedule.name}
                          onClick={() => void toggle(schedule)}
                        >
                          {schedule.enabled ? "Disable" : "Enable"}
                        </button>
                      </>
                    )}
                  </td>
                  <td>{schedule.last_run ? <Run run={schedule.last_run} /> : "—"}</td>
                  <td>{schedule.enabled ? when(schedule.next_run_at) : "—"}</td>
                  <td>
                    <ul class="plain">
                      {schedule.runs.slice(1).map((run) => (
                        <li key={run.due_at}>
                          <Run run={run} />
                        </li>
                      ))}
                    </ul>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </main>
  );
}
