// The console's entry: sign-in, the signed-in shell (header, navigation), and the routes.
import { render } from "preact";
import { useCallback, useEffect, useMemo, useState } from "preact/hooks";
import { Api, ApiError } from "./api";
import { ApprovalsContext, usePendingApprovals } from "./approvals";
import { AppContext } from "./context";
import type { Me } from "./types";
import { Link } from "./ui";
import { AgentsPage } from "./views/agents";
import { ApprovalsPage } from "./views/approvals";
import { ChatPage } from "./views/chat";
import { PluginsPage } from "./views/plugins";
import { SchedulesPage } from "./views/schedules";
import { SkillsPage } from "./views/skills";
import { TranscriptPage } from "./views/transcript";
import "./styles.css";

/** Kept for this browser tab only: gone when the tab closes, never in a URL or a cookie. */
const TOKEN_KEY = "ongrid.token";

type Route =
  | { view: "chat"; sessionId?: string }
  | { view: "approvals"; focus?: string }
  | { view: "spawn"; spawnId: string }
  | { view: "agents"; name?: string }
  | { view: "skills" }
  | { view: "plugins" }
  | { view: "schedules" }
  | { view: "missing"; path: string };

function parse(path: string): Route {
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const [first, second, third] = parts;
  if (!first || (first === "chat" && parts.length <= 2)) {
    return second ? { view: "chat", sessionId: second } : { view: "chat" };
  }
  if (first === "approvals" && parts.length === 1) return { view: "approvals" };
  // A notification's link to one request's card: /approvals/<spawn id>/<call id>.
  if (first === "approvals" && parts.length === 3) {
    return { view: "approvals", focus: `${second}/${third}` };
  }
  if (first === "spawns" && second && parts.length === 2) return { view: "spawn", spawnId: second };
  if (first === "schedules" && parts.length === 1) return { view: "schedules" };
  if (first === "settings") {
    if (!second || second === "agents") {
      return parts.length <= 3 && third ? { view: "agents", name: third } : { view: "agents" };
    }
    if (second === "skills") return { view: "skills" };
    if (second === "plugins" && parts.length === 2) return { view: "plugins" };
  }
  return { view: "missing", path };
}

function usePath(): [string, (path: string, replace?: boolean) => void] {
  const [path, setPath] = useState(location.pathname);
  useEffect(() => {
    const onPop = () => setPath(location.pathname);
    addEventListener("popstate", onPop);
    return () => removeEventListener("popstate", onPop);
  }, []);
  const navigate = useCallback((to: string, replace = false) => {
    if (to === location.pathname) return;
    if (replace) history.replaceState(null, "", to);
    else history.pushState(null, "", to);
    setPath(to);
    scrollTo(0, 0);
  }, []);
  return [path, navigate];
}

function SignIn({ onSignedIn, notice }: { onSignedIn: (api: Api, me: Me) => void; notice: string }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState(notice);
  const [busy, setBusy] = useState(false);
  const submit = async (event: Event) => {
    event.preventDefault();
    const api = new Api(token.trim());
    setBusy(true);
    try {
      onSignedIn(api, await api.get<Me>("/api/v1/me"));
    } catch (exc) {
      setError(exc instanceof ApiError ? exc.message : String(exc));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main class="signin">
      <form onSubmit={submit} aria-label="Sign in">
        <h1>Ongrid console</h1>
        <p>Sign in with your API token (the bearer token of `ongrid up` or of your config file).</p>
        <label for="token">Access token</label>
        <input
          id="token"
          type="password"
          autoComplete="off"
          spellcheck={false}
          value={token}
          onInput={(e) => setToken(e.currentTarget.value)}
          required
        />
        {error && (
          <p class="error" role="alert">
            {error}
          </p>
        )}
        <button type="submit" disabled={busy || !token.trim()}>
          Sign in
        </button>
      </form>
    </main>
  );
}

function Shell({ api, me, onSignOut }: { api: Api; me: Me; onSignOut: () => void }) {
  const [path, navigate] = usePath();
  const route = parse(path);
  const approvals = usePendingApprovals(api, me);
  const context = useMemo(() => ({ api, me, navigate }), [api, me, navigate]);
  useEffect(() => {
    if (path === "/" || path === "/settings") {
      navigate(path === "/" ? "/chat" : "/settings/agents", true);
    }
  }, [path, navigate]);
  const current = (view: Route["view"]) => (route.view === view ? "page" : undefined);
  return (
    <AppContext.Provider value={context}>
      <ApprovalsContext.Provider value={approvals}>
        <header class="top">
          <span class="brand">Ongrid</span>
          <nav aria-label="Main">
            <Link href="/chat" aria-current={current("chat")}>
              Chat
            </Link>
            <Link href="/approvals" aria-current={current("approvals")}>
              Approvals
              {approvals.pending.length > 0 && (
                <span class="count" data-testid="approvals-count">
                  {" "}
                  {approvals.pending.length}
                  <span class="visually-hidden"> waiting</span>
                </span>
              )}
            </Link>
            <Link href="/schedules" aria-current={current("schedules")}>
              Schedules
            </Link>
            <Link href="/settings/agents" aria-current={current("agents")}>
              Agents
            </Link>
            <Link href="/settings/skills" aria-current={current("skills")}>
              Skills
            </Link>
            {me.permissions.manage_plugins && (
              <Link href="/settings/plugins" aria-current={current("plugins")}>
                Plugins
              </Link>
            )}
          </nav>
          <span class="who" aria-label="Signed in as">
            {me.user} · {me.role}
          </span>
          <button type="button" class="quiet" onClick={onSignOut}>
            Sign out
          </button>
        </header>
        {route.view === "chat" && <ChatPage sessionId={route.sessionId} />}
        {route.view === "approvals" && <ApprovalsPage focus={route.focus} />}
        {route.view === "spawn" && <TranscriptPage spawnId={route.spawnId} />}
        {route.view === "agents" && <AgentsPage name={route.name} />}
        {route.view === "skills" && <SkillsPage />}
        {route.view === "plugins" && <PluginsPage />}
        {route.view === "schedules" && <SchedulesPage />}
        {route.view === "missing" && (
          <main class="page">
            <h1>Not found</h1>
            <p>
              Nothing lives at <code>{route.path}</code>. <Link href="/chat">Go to the chat</Link>.
            </p>
          </main>
        )}
      </ApprovalsContext.Provider>
    </AppContext.Provider>
  );
}

function App() {
  const [signedIn, setSignedIn] = useState<{ api: Api; me: Me } | null>(null);
  const [checking, setChecking] = useState(() => !!sessionStorage.getItem(TOKEN_KEY));
  const [notice, setNotice] = useState("");

  useEffect(() => {
    const stored = sessionStorage.getItem(TOKEN_KEY);
    if (!stored) return;
    const api = new Api(stored);
    api
      .get<Me>("/api/v1/me")
      .then((me) => setSignedIn({ api, me }))
      .catch((exc: unknown) => {
        if (exc instanceof ApiError && exc.status === 401) sessionStorage.removeItem(TOKEN_KEY);
        setNotice(exc instanceof Error ? exc.message : String(exc));
      })
      .finally(() => setChecking(false));
  }, []);

  if (checking) return <p class="page" role="status">Signing in…</p>;
  if (!signedIn) {
    return (
      <SignIn
        notice={notice}
        onSignedIn={(api, me) => {
          sessionStorage.setItem(TOKEN_KEY, api.token);
          setSignedIn({ api, me });
        }}
      />
    );
  }
  return (
    <Shell
      api={signedIn.api}
      me={signedIn.me}
      onSignOut={() => {
        sessionStorage.removeItem(TOKEN_KEY);
        setSignedIn(null);
        setNotice("");
      }}
    />
  );
}

const root = document.getElementById("app");
if (root) render(<App />, root);
