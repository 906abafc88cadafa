// Settings → Plugins: the marketplaces added (add one from a directory or a git repository,
// remove one), the plugins a marketplace lists (install one, choosing the most its personas may
// do), and the installed plugins with what each brought (update, remove). Each change is a
// registry reload on the server, so every list is read again after it: what is shown is what the
// server now holds, not what the page guessed.
import type { ComponentChildren } from "preact";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError } from "../api";
import { useApp } from "../context";
import type {
  AllowMode,
  InstallOutcome,
  InstalledPlugin,
  Marketplace,
  MarketplacePlugin,
  UpdateResult,
} from "../types";
import { Badge, Description, ErrorNote, Link, useProgressive } from "../ui";
import "./settings.css";

const MARKETPLACES = "/api/v1/marketplaces";
const PLUGINS = "/api/v1/plugins";
/** Adding a git marketplace clones it and an install or update copies the plugin before the
 * server answers: as long as the server's own git timeout (120 s), and some. */
const SLOW_MS = 180_000;
const ALLOW_MODES: readonly AllowMode[] = ["read-only", "mutating-with-confirm", "dual-sign-required"];

const marketPath = (name: string) => `${MARKETPLACES}/${encodeURIComponent(name)}`;
const pluginPath = (name: string) => `${PLUGINS}/${encodeURIComponent(name)}`;
const agentRoute = (name: string) => `/settings/agents/${encodeURIComponent(name)}`;

function messageOf(exc: unknown): string {
  if (exc instanceof ApiError && exc.problems.length > 0) {
    const fields = exc.problems.map((p) => (p.field ? `${p.field}: ${p.message}` : p.message));
    return `${exc.message} (${fields.join("; ")})`;
  }
  return exc instanceof Error ? exc.message : String(exc);
}

function counted(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

const short = (hash: string) => hash.slice(0, 12);

/** An ISO timestamp to the minute, in UTC (the server's clock, whatever the browser's zone). */
function when(iso: string): string {
  const at = new Date(iso);
  return Number.isNaN(at.getTime()) ? iso : `${at.toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

function brought(plugin: InstalledPlugin): string {
  return [
    counted(plugin.agents?.length ?? 0, "persona"),
    counted(plugin.skills?.length ?? 0, "skill"),
    counted(plugin.tools?.length ?? 0, "tool"),
    counted(plugin.mcp_servers?.length ?? 0, "MCP server"),
  ].join(", ");
}

function ownerName(owner: Marketplace["owner"]): string {
  if (!owner) return "";
  if (typeof owner === "string") return owner;
  const name = owner["name"];
  return typeof name === "string" ? name : "";
}

export function PluginsPage() {
  const { me } = useApp();
  if (!me.permissions.manage_plugins) {
    return (
      <main class="page settings-page">
        <header class="settings-header">
          <h1>Plugins</h1>
        </header>
        <p class="settings-read-only" data-testid="read-only-reason">
          Role '{me.role}' may not manage plugins (it needs manage_plugins).
        </p>
      </main>
    );
  }
  return <PluginsAdmin />;
}

function PluginsAdmin() {
  const { api } = useApp();
  const [markets, setMarkets] = useState<Marketplace[] | null>(null);
  const [marketsError, setMarketsError] = useState<unknown>(null);
  const [installed, setInstalled] = useState<InstalledPlugin[] | null>(null);
  const [installedError, setInstalledError] = useState<unknown>(null);
  const [chosen, setChosen] = useState<string | null>(null);
  // Bumped by every refresh: the plugin table of the selected marketplace reads its list again.
  const [generation, setGeneration] = useState(0);
  const [notice, setNotice] = useState<string | null>(null);
  const noticeRef = useRef<HTMLParagraphElement>(null);

  const refresh = useCallback(async () => {
    const [listed, have] = await Promise.allSettled([
      api.get<Marketplace[]>(MARKETPLACES),
      api.get<InstalledPlugin[]>(PLUGINS),
    ]);
    if (listed.status === "fulfilled") {
      setMarkets(listed.value);
      setMarketsError(null);
    } else setMarketsError(listed.reason);
    if (have.status === "fulfilled") {
      setInstalled(have.value);
      setInstalledError(null);
    } else setInstalledError(have.reason);
    setGeneration((n) => n + 1);
  }, [api]);

  useEffect(() => {
    void refresh();
  }, [refresh]);

  /** Says what a change did and reads every list again. The focus goes to the notice: the
   * control that made the change may be gone (an Install button becomes "Installed"). */
  const changed = useCallback(
    async (text: string) => {
      setNotice(text);
      await refresh();
      setTimeout(() => noticeRef.current?.focus(), 0);
    },
    [refresh],
  );

  const readable = (markets ?? []).filter((m) => !m.error);
  const selected = readable.find((m) => m.name === chosen)?.name ?? readable[0]?.name ?? null;

  return (
    <main class="page settings-page plugins-page">
      <header class="settings-header">
        <h1>Plugins</h1>
      </header>
      <p class="muted">
        A plugin brings personas (named <code>plugin:agent</code>), skills and tools from a
        marketplace. Installing copies it and reloads every worker; nothing of it runs at install.
      </p>
      <p role="status" class="settings-notice" tabIndex={-1} ref={noticeRef} hidden={!notice}>
        {notice}
      </p>
      <Marketplaces
        markets={markets}
        error={marketsError}
        selected={selected}
        onSelect={setChosen}
        onChanged={changed}
        onAdded={(name) => setChosen(name)}
      />
      {selected && (
        <AvailablePlugins
          key={selected}
          marketplace={selected}
          generation={generation}
          onChanged={changed}
        />
      )}
      <InstalledPlugins installed={installed} error={installedError} onChanged={changed} />
    </main>
  );
}

// -- marketplaces --------------------------------------------------------------------------------

interface MarketplacesProps {
  markets: Marketplace[] | null;
  error: unknown;
  selected: string | null;
  onSelect: (name: string) => void;
  onChanged: (text: string) => Promise<void>;
  onAdded: (name: string) => void;
}

function Marketplaces({ markets, error, selected, onSelect, onChanged, onAdded }: MarketplacesProps) {
  return (
    <section class="plugins-section" aria-labelledby="plugins-markets-heading">
      <h2 id="plugins-markets-heading">Marketplaces</h2>
      <ErrorNote error={error} />
      {markets === null ? (
        !error && <p>Loading marketplaces…</p>
      ) : markets.length === 0 ? (
        <p class="muted">None added yet: add one below.</p>
      ) : (
        <div class="settings-scroll">
          <table class="settings-table plugins-table" aria-labelledby="plugins-markets-heading">
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Source</th>
                <th scope="col">Plugins</th>
                <th scope="col">
                  <span class="visually-hidden">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {markets.map((market) => (
                <MarketRow
                  key={market.name}
                  market={market}
                  selected={market.name === selected}
                  onSelect={onSelect}
                  onChanged={onChanged}
                />
              ))}
            </tbody>
          </table>
        </div>
      )}
      <AddMarketplace onChanged={onChanged} onAdded={onAdded} />
    </section>
  );
}

function MarketRow({
  market,
  selected,
  onSelect,
  onChanged,
}: {
  market: Marketplace;
  selected: boolean;
  onSelect: (name: string) => void;
  onChanged: (text: string) => Promise<void>;
}) {
  const { api } = useApp();
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const owner = ownerName(market.owner);
  const problems = market.problems ?? [];

  const remove = async () => {
    setBusy(true);
    setError(null);
    try {
      await api.delete(marketPath(market.name));
      await onChanged(`Removed marketplace '${market.name}'.`);
    } catch (exc) {
      setError(messageOf(exc));
    } finally {
      setBusy(false);
    }
  };

  return (
    <tr
      data-testid="marketplace-row"
      data-name={market.name}
      class={selected ? "settings-selected" : undefined}
    >
      <th scope="row">
        <code>{market.name}</code>
        {market.description && <div class="muted">{market.description}</div>}
        {owner && <div class="muted">by {owner}</div>}
      </th>
      <td>
        <div class="settings-path">{market.source}</div>
        <Badge kind={market.kind}>{market.kind}</Badge>
        {market.ref && <span class="muted"> @{short(market.ref)}</span>}
      </td>
      <td>
        {market.error ? (
          <span class="settings-unavailable" data-testid="marketplace-error">
            Cannot be read: {market.error}
          </span>
        ) : (
          <>
            <span data-testid="marketplace-count">{market.plugins ?? 0}</span>
            {problems.length > 0 && (
              <details class="settings-fold" data-testid="marketplace-problems">
                <summary>{counted(problems.length, "entry", "entries")} left out</summary>
                <ul class="plugins-reasons">
                  {problems.map((problem, at) => (
                    <li key={at}>
                      <code>{problem.plugin}</code>: {problem.reason}
                    </li>
                  ))}
                </ul>
              </details>
            )}
          </>
        )}
      </td>
      <td>
        <div class="actions plugins-row-actions">
          {!market.error && (
            <button
              type="button"
              class="quiet"
              aria-pressed={selected}
              onClick={() => onSelect(market.name)}
            >
              Show plugins<span class="visually-hidden"> of {market.name}</span>
            </button>
          )}
          <button type="button" class="danger quiet" disabled={busy} onClick={() => void remove()}>
            Remove<span class="visually-hidden"> marketplace {market.name}</span>
          </button>
        </div>
        {error && (
          <p class="error" role="alert" data-testid="marketplace-remove-error">
            {error}
          </p>
        )}
      </td>
    </tr>
  );
}

function AddMarketplace({
  onChanged,
  onAdded,
}: {
  onChanged: (text: string) => Promise<void>;
  onAdded: (name: string) => void;
}) {
  const { api } = useApp();
  const [source, setSource] = useState("");
  const [name, setName] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  const submit = async (event: Event) => {
    event.preventDefault();
    if (busy || !source.trim()) return;
    setBusy(true);
    setError(null);
    try {
      const body: Record<string, string> = { source: source.trim() };
      if (name.trim()) body["name"] = name.trim();
      const added = await api.post<Marketplace>(MARKETPLACES, body, SLOW_MS);
      setSource("");
      setName("");
      onAdded(added.name);
      await onChanged(
        `Added marketplace '${added.name}': ${counted(added.plugins ?? 0, "plugin")}` +
          (added.problems?.length
            ? `, ${counted(added.problems.length, "entry", "entries")} left out.`
            : "."),
      );
    } catch (exc) {
      setError(messageOf(exc));
    } finally {
      setBusy(false);
    }
  };

  return (
    <form
      class="settings-form plugins-add"
      aria-labelledby="plugins-add-heading"
      noValidate
      onSubmit={(event) => void submit(event)}
    >
      <h3 id="plugins-add-heading">Add marketplace</h3>
      <div class="settings-field">
        <label for="plugins-source">Source</label>
        <input
          id="plugins-source"
          type="text"
          autoComplete="off"
          spellcheck={false}
          value={source}
          aria-describedby="plugins-source-hint"
          aria-invalid={error ? "true" : undefined}
          onInput={(e) => setSource(e.currentTarget.value)}
        />
        <p class="settings-hint" id="plugins-source-hint">
          A directory holding <code>.claude-plugin/marketplace.json</code>, or a git repository (a
          local path or <code>file://</code> URL; a remote one only if the server allows network
          sources). Adding one again reads it again.
        </p>
      </div>
      <div class="settings-field">
        <label for="plugins-market-name">Name (optional)</label>
        <input
          id="plugins-market-name"
          type="text"
          autoComplete="off"
          spellcheck={false}
          value={name}
          aria-describedby="plugins-market-name-hint"
          onInput={(e) => setName(e.currentTarget.value)}
        />
        <p class="settings-hint" id="plugins-market-name-hint">
          Default: the name its marketplace.json gives.
        </p>
      </div>
      {error && (
        <p class="error" role="alert" data-testid="marketplace-add-error">
          {error}
        </p>
      )}
      <div class="actions settings-actions">
        <button type="submit" disabled={busy || !source.trim()}>
          Add
        </button>
        {busy && <span class="muted">Reading the marketplace…</span>}
      </div>
    </form>
  );
}

// -- a marketplace's plugins ---------------------------------------------------------------------

function AvailablePlugins({
  marketplace,
  generation,
  onChanged,
}: {
  marketplace: string;
  generation: number;
  onChanged: (text: string) => Promise<void>;
}) {
  const { api } = useApp();
  const [plugins, setPlugins] = useState<MarketplacePlugin[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [filter, setFilter] = useState("");

  useEffect(() => {
    let current = true;
    api.get<MarketplacePlugin[]>(`${marketPath(marketplace)}/plugins`).then(
      (out) => {
        if (!current) return;
        setPlugins(out);
        setError(null);
      },
      (exc: unknown) => current && setError(exc),
    );
    return () => {
      current = false;
    };
  }, [api, marketplace, generation]);

  const wanted = filter.trim().toLowerCase();
  const matching = (plugins ?? []).filter((p) => p.name.toLowerCase().includes(wanted));
  // A real marketplace lists hundreds: render them over a few frames, not in one long one.
  const shown = useProgressive(matching.length);
  const heading = "plugins-available-heading";

  return (
    <section class="plugins-section" aria-labelledby={heading}>
      <h2 id={heading}>Plugins of {marketplace}</h2>
      <ErrorNote error={error} />
      {!plugins && !error && <p>Loading plugins…</p>}
      {plugins && (
        <>
          <div class="settings-field plugins-filter">
            <label for="plugins-filter">Filter by name</label>
            <input
              id="plugins-filter"
              type="search"
              autoComplete="off"
              spellcheck={false}
              value={filter}
              onInput={(e) => setFilter(e.currentTarget.value)}
            />
          </div>
          <p class="muted" data-testid="plugins-shown">
            {matching.length === plugins.length
              ? counted(plugins.length, "plugin")
              : `${matching.length} of ${counted(plugins.length, "plugin")}`}
            . Allowed mode: the most a plugin's personas may do (a persona never gets more than it
            declares).
          </p>
          {matching.length > 0 && (
            <div class="settings-scroll">
              <table class="settings-table plugins-table" aria-labelledby={heading}>
                <thead>
                  <tr>
                    <th scope="col">Name</th>
                    <th scope="col">Description and source</th>
                    <th scope="col">Category</th>
                    <th scope="col">State</th>
                  </tr>
                </thead>
                <tbody>
                  {matching.slice(0, shown).map((plugin) => (
                    <AvailableRow
                      key={plugin.name}
                      plugin={plugin}
                      marketplace={marketplace}
                      onChanged={onChanged}
                    />
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </>
      )}
    </section>
  );
}

function AvailableRow({
  plugin,
  marketplace,
  onChanged,
}: {
  plugin: MarketplacePlugin;
  marketplace: string;
  onChanged: (text: string) => Promise<void>;
}) {
  const installed = plugin.installed !== null && plugin.installed !== undefined;
  return (
    <tr data-testid="plugin-row" data-name={plugin.name}>
      <th scope="row">
        <code>{plugin.name}</code>
        {plugin.version && <div class="muted">{plugin.version}</div>}
      </th>
      <td class="settings-description">
        <Description text={plugin.description ?? ""} />
        {plugin.source && (
          <div class="muted settings-path" data-testid="plugin-source">
            {plugin.source}
          </div>
        )}
      </td>
      <td>{plugin.category}</td>
      <td class="plugins-state">
        {installed ? (
          <span class="settings-available" data-testid="plugin-state">
            Installed {plugin.installed || "(no version)"}
          </span>
        ) : !plugin.reachable ? (
          <span class="settings-unavailable" data-testid="plugin-state">
            Unreachable: {plugin.unreachable_reason ?? "no reason given"}
          </span>
        ) : (
          <Install plugin={plugin.name} marketplace={marketplace} onChanged={onChanged} />
        )}
      </td>
    </tr>
  );
}

function Install({
  plugin,
  marketplace,
  onChanged,
}: {
  plugin: string;
  marketplace: string;
  onChanged: (text: string) => Promise<void>;
}) {
  const { api } = useApp();
  const [mode, setMode] = useState<AllowMode>("read-only");
  const [mcp, setMcp] = useState(true);
  const [network, setNetwork] = useState(false);
  const [writable, setWritable] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  const install = async () => {
    setBusy(true);
    setError(null);
    try {
      const body = { plugin: `${plugin}@${marketplace}`, allow_mode: mode, mcp, network, writable };
      const out = await api.post<InstallOutcome>(PLUGINS, body, SLOW_MS);
      const version = out.version ? ` ${out.version}` : "";
      await onChanged(
        out.changed
          ? `Installed ${plugin}${version} from ${marketplace}: ${brought(out)} ` +
              `(registry version ${out.registry_version}).`
          : `${plugin} was installed already with these options: nothing changed.`,
      );
    } catch (exc) {
      setError(messageOf(exc));
    } finally {
      setBusy(false);
    }
  };

  return (
    <div class="plugins-install" data-testid="plugin-install">
      <select
        aria-label={`Allowed mode for ${plugin}`}
        value={mode}
        disabled={busy}
        onChange={(e) => setMode(e.currentTarget.value as AllowMode)}
      >
        {ALLOW_MODES.map((value) => (
          <option key={value} value={value}>
            {value}
          </option>
        ))}
      </select>
      <label class="plugins-check" title="Start the plugin's MCP servers on the workers">
        <input
          type="checkbox"
          checked={mcp}
          disabled={busy}
          onChange={(e) => setMcp(e.currentTarget.checked)}
        />{" "}
        MCP servers<span class="visually-hidden"> of {plugin}</span>
      </label>
      <label
        class="plugins-check"
        title="Let its scripts that declare it and its MCP servers reach the network, through the workers' egress proxy (never this cluster's Redis, database or hosts)"
      >
        <input
          type="checkbox"
          checked={network}
          disabled={busy}
          onChange={(e) => setNetwork(e.currentTarget.checked)}
        />{" "}
        Network<span class="visually-hidden"> for {plugin}</span>
      </label>
      <label class="plugins-check" title="Give its MCP servers a writable folder of their own">
        <input
          type="checkbox"
          checked={writable}
          disabled={busy}
          onChange={(e) => setWritable(e.currentTarget.checked)}
        />{" "}
        Writable folder<span class="visually-hidden"> for {plugin}</span>
      </label>
      <button type="button" disabled={busy} onClick={() => void install()}>
        {busy ? "Installing…" : "Install"}
        <span class="visually-hidden"> {plugin}</span>
      </button>
      {error && (
        <p class="error" role="alert" data-testid="plugin-install-error">
          {error}
        </p>
      )}
    </div>
  );
}

// -- installed plugins ---------------------------------------------------------------------------

function InstalledPlugins({
  installed,
  error,
  onChanged,
}: {
  installed: InstalledPlugin[] | null;
  error: unknown;
  onChanged: (text: string) => Promise<void>;
}) {
  return (
    <section class="plugins-section" aria-labelledby="plugins-installed-heading">
      <h2 id="plugins-installed-heading">Installed plugins</h2>
      <ErrorNote error={error} />
      {installed === null ? (
        !error && <p>Loading installed plugins…</p>
      ) : installed.length === 0 ? (
        <p class="muted" data-testid="no-installed-plugins">
          None installed.
        </p>
      ) : (
        <ul class="plugins-cards">
          {installed.map((plugin) => (
            <li key={plugin.name}>
              <InstalledCard plugin={plugin} onChanged={onChanged} />
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

function Names({ names, testid, link }: { names: string[]; testid: string; link?: boolean }) {
  if (names.length === 0) {
    return (
      <span class="muted" data-testid={testid}>
        none
      </span>
    );
  }
  return (
    <ul class="plugins-names" data-testid={testid}>
      {names.map((name) => (
        <li key={name}>
          {link ? (
            <Link href={agentRoute(name)}>
              <code>{name}</code>
            </Link>
          ) : (
            <code>{name}</code>
          )}
        </li>
      ))}
    </ul>
  );
}

function Fact({ term, children }: { term: string; children: ComponentChildren }) {
  return (
    <>
      <dt>{term}</dt>
      <dd>{children}</dd>
    </>
  );
}

function InstalledCard({
  plugin,
  onChanged,
}: {
  plugin: InstalledPlugin;
  onChanged: (text: string) => Promise<void>;
}) {
  const { api } = useApp();
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [confirming, setConfirming] = useState(false);
  const removeRef = useRef<HTMLButtonElement>(null);
  const keepRef = useRef<HTMLButtonElement>(null);
  const asked = useRef(false);
  const unused = plugin.unused ?? [];
  const warnings = plugin.warnings ?? [];

  // The question takes the place of the Remove button: the focus goes to its safe answer, and
  // back to Remove when it is kept.
  useEffect(() => {
    if (confirming) keepRef.current?.focus();
    else if (asked.current) removeRef.current?.focus();
    asked.current = confirming;
  }, [confirming]);

  const update = async () => {
    setBusy(true);
    setError(null);
    try {
      const path = `${pluginPath(plugin.name)}/update`;
      const results = await api.post<UpdateResult[]>(path, undefined, SLOW_MS);
      const result = results.find((r) => r.name === plugin.name) ?? results[0];
      if (!result) throw new Error(`the server reported no update of ${plugin.name}`);
      if (result.error) {
        setError(`Not updated: ${result.error}`);
        return;
      }
      const content = `content ${short(result.content_hash ?? "")}`;
      await onChanged(
        result.updated
          ? `Updated ${plugin.name}: version ${result.version || "(none)"}, ${content}.`
          : `${plugin.name} is up to date (${content}).`,
      );
    } catch (exc) {
      setError(messageOf(exc));
    } finally {
      setBusy(false);
    }
  };

  const remove = async () => {
    setBusy(true);
    setError(null);
    try {
      await api.delete(pluginPath(plugin.name));
      await onChanged(`Removed ${plugin.name}: its personas, skills and tools are gone.`);
    } catch (exc) {
      setConfirming(false);
      setError(messageOf(exc));
    } finally {
      setBusy(false);
    }
  };

  return (
    <article
      class="plugins-card"
      aria-label={`Installed plugin ${plugin.name}`}
      data-testid="installed-plugin"
      data-name={plugin.name}
    >
      <div class="plugins-card-head">
        <h3>
          <code>{plugin.name}</code>
        </h3>
        <span class="muted">
          {plugin.version || "no version"} · from {plugin.marketplace}
        </span>
        <Badge kind={plugin.allowed_mode} testid="plugin-mode">
          {plugin.allowed_mode}
        </Badge>
      </div>
      {plugin.error && (
        <p class="error" data-testid="plugin-error">
          Its installed copy cannot be read: {plugin.error}
        </p>
      )}
      <dl class="plugins-facts">
        <Fact term="Agents">
          <Names names={plugin.agents ?? []} testid="plugin-agents" link />
        </Fact>
        <Fact term="Skills">
          <Names names={plugin.skills ?? []} testid="plugin-skills" />
        </Fact>
        <Fact term="Tools">
          <Names names={plugin.tools ?? []} testid="plugin-tools" />
        </Fact>
        <Fact term="MCP servers">
          <Names names={plugin.mcp_servers ?? []} testid="plugin-mcp" />
          {!plugin.mcp && (plugin.mcp_servers?.length ?? 0) > 0 && (
            <div class="muted">not started: installed without MCP servers</div>
          )}
        </Fact>
        <Fact term="Grants">
          <ul class="plugins-grants" data-testid="plugin-grants">
            {(plugin.grants ?? []).map((grant) => (
              <li key={grant}>{grant}</li>
            ))}
          </ul>
        </Fact>
        <Fact term="Source">
          <span class="settings-path">
            {plugin.source}
            {plugin.ref && ` @${short(plugin.ref)}`}
          </span>
        </Fact>
        <Fact term="Content">
          <code title={plugin.content_hash} data-testid="plugin-hash">
            {short(plugin.content_hash)}
          </code>
        </Fact>
        <Fact term="Installed">
          {plugin.installed_by ? `by ${plugin.installed_by}` : "by (unknown)"}
          {plugin.installed_at && `, ${when(plugin.installed_at)}`}
        </Fact>
      </dl>
      {unused.length > 0 && (
        <p class="muted" data-testid="plugin-unused">
          Kept, not used: {unused.join(", ")}
        </p>
      )}
      {warnings.length > 0 && (
        <details class="settings-fold plugins-warnings" data-testid="plugin-warnings">
          <summary>{counted(warnings.length, "warning")}</summary>
          <ul class="plugins-reasons">
            {warnings.map((warning, at) => (
              <li key={at}>{warning}</li>
            ))}
          </ul>
        </details>
      )}
      {error && (
        <p class="error" role="alert" data-testid="plugin-action-error">
          {error}
        </p>
      )}
      <div class="actions">
        <button type="button" disabled={busy} onClick={() => void update()}>
          Update<span class="visually-hidden"> {plugin.name}</span>
        </button>
        {!confirming ? (
          <button
            type="button"
            class="danger"
            ref={removeRef}
            disabled={busy}
            onClick={() => setConfirming(true)}
          >
            Remove<span class="visually-hidden"> {plugin.name}</span>
          </button>
        ) : (
          <span class="settings-confirm" data-testid="plugin-confirm">
            <span>
              Remove {plugin.name}? Its personas, skills and tools go from every worker.
            </span>
            <button type="button" class="danger" disabled={busy} onClick={() => void remove()}>
              Confirm remove<span class="visually-hidden"> {plugin.name}</span>
            </button>
            <button type="button" class="quiet" ref={keepRef} onClick={() => setConfirming(false)}>
              Keep it
            </button>
          </span>
        )}
      </div>
    </article>
  );
}
