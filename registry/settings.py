"""One settings object, built at the entry point from the environment and ``ONGRID_CONFIG``.

Library modules never read ``os.environ`` themselves; they receive a :class:`Settings`. The YAML
file holds what does not fit an environment variable (roles, tokens); environment variables win
over the file for the scalar settings they name.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from registry.budget import OrgBudget
from registry.errors import UserError
from registry.notifications import NotificationSettings
from registry.schedules import ScheduleSpec
from registry.secret_names import is_secret

__all__ = [
    "DEFAULT_MARKETPLACE_ROOT",
    "LOCAL_ADMIN_USER",
    "DEFAULT_API_PORT",
    "LOCAL_TOKEN_ENV",
    "ApiLimits",
    "ModelLimits",
    "RoleConfig",
    "Settings",
    "TokenGrant",
    "env_var_of",
    "token_digest",
]

DEFAULT_MARKETPLACE_ROOT = Path("/var/lib/ongrid/agents")
#: Names a file holding one token that speaks for :data:`LOCAL_ADMIN_USER` with the role
#: ``admin``, besides ``auth.tokens``: ``ongrid up`` writes it and points its API process here.
LOCAL_TOKEN_ENV = "ONGRID_LOCAL_TOKEN_FILE"
#: The API's port unless told otherwise: the one the source documents' calls use.
DEFAULT_API_PORT = 8080
LOCAL_ADMIN_USER = "local-admin"

#: Environment variable → settings field, for the scalar settings.
_ENV: dict[str, str] = {
    "ONGRID_AGENTS_DIR": "agents_dir",
    "ONGRID_MARKETPLACE_ROOT": "marketplace_root",
    "ONGRID_SHIPPED_AGENTS": "shipped_agents",
    "ONGRID_DEFAULT_MODEL": "default_model",
    "ONGRID_COORDINATOR_MODEL": "coordinator_model",
    "ONGRID_DEFAULT_PROVIDER": "default_provider",
    "ONGRID_DEFAULT_LOCALE": "default_locale",
    "REDIS_URL": "redis_url",
    "ONGRID_CLUSTER": "cluster",
    "ONGRID_DATABASE_URL": "database_url",
    "ONGRID_DATA_DIR": "data_dir",
    "PROMETHEUS_URL": "prometheus_url",
    "LOKI_URL": "loki_url",
    "TEMPO_URL": "tempo_url",
    "CLICKHOUSE_URL": "clickhouse_url",
    "CLICKHOUSE_USER": "clickhouse_user",
    "CLICKHOUSE_PASSWORD": "clickhouse_password",
    "PROMETHEUS_USER": "prometheus_user",
    "PROMETHEUS_PASSWORD": "prometheus_password",
    "PROMETHEUS_BEARER_TOKEN": "prometheus_bearer_token",
    "LOKI_USER": "loki_user",
    "LOKI_PASSWORD": "loki_password",
    "LOKI_BEARER_TOKEN": "loki_bearer_token",
    "LOKI_TENANT": "loki_tenant",
    "TEMPO_USER": "tempo_user",
    "TEMPO_PASSWORD": "tempo_password",
    "TEMPO_BEARER_TOKEN": "tempo_bearer_token",
    "ONGRID_BACKEND_TIMEOUT_SECONDS": "backend_timeout_seconds",
    "ONGRID_TOPOLOGY_FILE": "topology_file",
    "ONGRID_REPO_ROOT": "repo_root",
    "ONGRID_LEASE_SECONDS": "lease_seconds",
    "ONGRID_STRANDED_GRACE_SECONDS": "stranded_grace_seconds",
    "ONGRID_STRANDED_CHECK_SECONDS": "stranded_check_seconds",
    "ONGRID_QUEUE_WAIT_LIMIT": "queue_wait_limit",
    "ONGRID_PRESENCE_TTL_SECONDS": "presence_ttl_seconds",
    "ONGRID_APPROVAL_TTL_SECONDS": "approval_ttl_seconds",
    "ONGRID_SANDBOX_USER": "sandbox_user",
    "ONGRID_MODEL_RETRIES": "model_retries",
    "ONGRID_MODEL_RETRY_BASE_SECONDS": "model_retry_base_seconds",
    "ONGRID_MODEL_RETRY_MAX_SECONDS": "model_retry_max_seconds",
    "ONGRID_REPLY_TOKENS": "reply_tokens",
    "ONGRID_SPAWN_TIME_LIMIT_SECONDS": "spawn_time_limit_seconds",
    "ONGRID_TOOL_THREADS": "tool_threads",
    "ONGRID_INTAKE_THREADS": "intake_threads",
    "ONGRID_STREAM_REPLIES": "stream_replies",
    "ONGRID_METRICS_PORT": "metrics_port",
    "ONGRID_METRICS_HOST": "metrics_host",
    "ONGRID_TOOL_TAPE": "tool_tape",
    "ONGRID_PLUGINS_ALLOW_NETWORK": "plugins_allow_network",
    "ONGRID_MAX_DISPATCHES_PER_REPLY": "max_dispatches_per_reply",
    "ONGRID_MAX_DISPATCHES_PER_TURN": "max_dispatches_per_turn",
    "ONGRID_SCHEDULE_POLL_SECONDS": "schedule_poll_seconds",
    "ONGRID_SCHEDULE_CATCH_UP_SECONDS": "schedule_catch_up_seconds",
    # OpenTelemetry's own name for it, which collectors and operators already set.
    "OTEL_EXPORTER_OTLP_ENDPOINT": "otlp_endpoint",
}
#: Environment variables holding a path list (``os.pathsep``-separated).
_ENV_LISTS: dict[str, str] = {
    "ONGRID_AGENTS_EXTERNAL_DIRS": "external_dirs",
    "ONGRID_KNOWLEDGE_DIRS": "knowledge_dirs",
    "ONGRID_SANDBOX_HIDE": "sandbox_hide",
}
#: Environment variables holding a comma-separated list.
_ENV_CSV: dict[str, str] = {
    "ONGRID_TOOL_MODULES": "tool_modules",
    "ONGRID_SANDBOX_GROUPS": "sandbox_groups",
    "ONGRID_MCP_ENV_ALLOW": "mcp_env_allow",
    "ONGRID_EGRESS_DENY": "egress_deny",
    "ONGRID_AUTOSCALED_QUEUES": "autoscaled_queues",
}


def env_var_of(field: str) -> str | None:
    """The environment variable that sets settings field ``field``, if one does."""
    for table in (_ENV, _ENV_LISTS, _ENV_CSV):
        found = next((var for var, name in table.items() if name == field), None)
        if found:
            return found
    return None


class RoleConfig(BaseModel):
    """What a role may see and do. ``tools`` are name patterns with ``*`` wildcards (SPEC §4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tools: list[str] = Field(default_factory=list)
    edit_personas: bool = False
    approve: bool = False
    #: Read the audit trail (``GET /api/v1/audit/approvals``).
    audit: bool = False
    #: Add and remove marketplaces, install, update and remove plugins.
    manage_plugins: bool = False


class TokenGrant(BaseModel):
    """Who a bearer token speaks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str = Field(min_length=1)
    role: str = Field(min_length=1)


def token_digest(token: str) -> str:
    """Tokens are kept only as SHA-256 digests, so settings can be printed or logged safely."""
    return hashlib.sha256(token.encode()).hexdigest()


def _default_roles() -> dict[str, RoleConfig]:
    return {
        "admin": RoleConfig(
            tools=["*"], edit_personas=True, approve=True, audit=True, manage_plugins=True
        ),
        "operator": RoleConfig(tools=["*"], approve=True),
        "viewer": RoleConfig(
            tools=[
                "query_*",
                "search_*",
                "find_*",
                "expand_*",
                "get_*",
                "host_probe",
                "read_repo",
                # reading a skill changes nothing; manifest and MCP tools are not granted
                "load_skill",
                "read_file_skill",
            ]
        ),
    }


class ApiLimits(BaseModel):
    """What one user, and one API process, may hold or start: past a bound the API answers 429
    naming it. ``limits:`` in the config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Event streams (SSE) one user may hold open at once in one API process.
    streams_per_user: int = Field(default=32, ge=1)
    #: Event streams all users together may hold open in one API process.
    streams_per_process: int = Field(default=4096, ge=1)
    #: Chat turns (``POST /api/v1/chat``, ``…/messages``) one user may start per minute.
    turns_per_minute: int = Field(default=30, ge=1)
    #: Spawns one user's requests may start per minute (a turn's coordinator, and each
    #: specialist it dispatches, count).
    spawns_per_minute: int = Field(default=120, ge=1)
    #: Chat sessions one user may keep.
    sessions_per_user: int = Field(default=1000, ge=1)


class ModelLimits(BaseModel):
    """A model's limits in tokens, where litellm's model map lacks them or has them wrong:
    ``models: {"<model id>": {context_window: …, max_output_tokens: …}}`` in the config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Input and output together.
    context_window: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)


class Settings(BaseModel):
    """Everything configurable. Paths relative to the working directory stay relative."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents_dir: Path = Path("agents")
    external_dirs: list[Path] = Field(default_factory=list)
    marketplace_root: Path = DEFAULT_MARKETPLACE_ROOT
    #: Load the personas shipped with the package (before ./agents, which overrides them by
    #: name); false: a site runs only its own personas.
    shipped_agents: bool = True
    roles: dict[str, RoleConfig] = Field(default_factory=_default_roles)
    default_role: str = "admin"
    default_model: str = ""
    #: The coordinator's model; empty: the organisation default.
    coordinator_model: str = ""
    default_provider: str = ""
    default_locale: str = "en"
    redis_url: str = ""
    #: Queues whose workers an autoscaler starts on demand (KEDA on the queue's length, scaling
    #: from zero): a spawn for one is accepted with no live worker and waits for one, and
    #: ``/readyz`` does not require a consumer of it unless asked.
    autoscaled_queues: list[str] = Field(default_factory=list)
    #: Names this stack among others sharing one Redis database: every key, pub/sub channel and
    #: Celery queue of the stack lives under ``ongrid:<cluster>:``. Empty: ``ongrid:`` (stacks
    #: on different databases of one server are kept apart by the database number alone).
    cluster: str = ""
    database_url: str = ""
    data_dir: Path = Path(".ongrid")
    prometheus_url: str = ""
    loki_url: str = ""
    tempo_url: str = ""
    clickhouse_url: str = ""
    clickhouse_user: str = ""
    clickhouse_password: str = ""
    #: Credentials the read tools send to Prometheus, Loki and Tempo: the bearer token when
    #: set, else basic auth with the user and password; all empty: none are sent.
    prometheus_user: str = ""
    prometheus_password: str = Field(default="", repr=False)
    prometheus_bearer_token: str = Field(default="", repr=False)
    loki_user: str = ""
    loki_password: str = Field(default="", repr=False)
    loki_bearer_token: str = Field(default="", repr=False)
    #: ``X-Scope-OrgID`` of a multi-tenant Loki (one with ``auth_enabled``); empty: not sent.
    loki_tenant: str = ""
    tempo_user: str = ""
    tempo_password: str = Field(default="", repr=False)
    tempo_bearer_token: str = Field(default="", repr=False)
    #: Seconds a read tool waits for its backend (Prometheus, Loki, Tempo, ClickHouse) before it
    #: gives up and tells the model to ask for less.
    backend_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    topology_file: str = ""
    knowledge_dirs: list[Path] = Field(default_factory=list)
    repo_root: str = ""
    allow_reboot: bool = False
    #: The unprivileged user diagnostic commands run as when the worker runs as root.
    sandbox_user: str = "nobody"
    #: Supplementary groups of that user inside the sandbox (``adm`` reads /var/log, the journal).
    sandbox_groups: list[str] = Field(default_factory=list)
    #: Paths the sandbox hides besides the worker's own (config file, data dir, cwd, home).
    sandbox_hide: list[Path] = Field(default_factory=list)
    #: How long a worker's claim on a spawn lasts unrenewed: after a worker dies, its spawns are
    #: resumed elsewhere within about this time (renewals and the reaper run faster).
    lease_seconds: float = Field(default=10.0, gt=0)
    #: How long a spawn someone waits on (a chat turn, ``ongrid spawn``) may sit on a queue no
    #: live worker consumes before the person is told (a ``queue_waiting`` event naming the
    #: queue and the command that starts a worker, repeated every minute while it lasts): long
    #: enough for the only worker of a queue to restart in place (a warm shutdown withdraws its
    #: queues at once; the new process needs a few seconds to be ready). A worker that died is
    #: noticed ``presence_ttl_seconds`` later still. The spawn keeps its place meanwhile.
    stranded_grace_seconds: float = Field(default=15.0, gt=0)
    #: Seconds an awaited spawn may wait on a queue no live worker consumes before it is failed
    #: naming the queue (a restarted or replaced worker resumes it any time before); 0: never.
    #: Background spawns, which nobody waits on, are never failed for it.
    queue_wait_limit: float = Field(default=600.0, ge=0)
    #: Seconds between two looks at the queues of the spawns someone waits on.
    stranded_check_seconds: float = Field(default=2.0, gt=0)
    #: How long a worker's presence lasts unrenewed (its advertisement of the queues it consumes
    #: and its fleet report; it renews both every fifth of it): a worker that died stops counting
    #: as a consumer and leaves ``/api/v1/workers`` within this time.
    presence_ttl_seconds: float = Field(default=10.0, gt=0)
    #: How long a tool call put to people waits for its decision; past it the call is not run
    #: and the model is told the request expired.
    approval_ttl_seconds: float = Field(default=3600.0, gt=0)
    #: How many times a model call that failed for a passing reason (429, 5xx, timeout, lost
    #: connection) is tried again before the spawn fails; 0: never.
    model_retries: int = Field(default=4, ge=0, le=100)
    #: The first retry waits up to this long; each next one up to twice as long (full jitter).
    model_retry_base_seconds: float = Field(default=1.0, ge=0)
    #: No wait between attempts is longer, a provider's ``Retry-After`` included.
    model_retry_max_seconds: float = Field(default=30.0, ge=0)
    #: Per model id: its context window and output limit, over litellm's model map.
    models: dict[str, ModelLimits] = Field(default_factory=dict)
    #: The output limit each model call asks for (the model's own limit caps it); the rest of
    #: the window is what the conversation may fill (:mod:`workers.context`).
    reply_tokens: int = Field(default=8192, ge=256)
    #: Longest run of one spawn attempt; past it the spawn is stopped and failed, saying so.
    spawn_time_limit_seconds: float = Field(default=6 * 3600, gt=0)
    #: The organisation's budget of every spawn: finite defaults (:class:`OrgBudget`) that
    #: ``budget:`` in the config file replaces key by key (e.g. ``{max_cost_usd: 2}``); a
    #: persona's ``metadata.ongrid.budget`` and a request's budget can only tighten it.
    budget: OrgBudget = Field(default_factory=OrgBudget)
    #: Threads of a worker's pool for tool calls (blocking work, off the event loop): at most
    #: this many tool calls of the process run at once; the others wait for a thread.
    tool_threads: int = Field(default=64, ge=1, le=4096)
    #: Threads of an API process that start chat turns at once (each a few Redis round trips,
    #: one database transaction and the Celery publish, blocking code); the other turns wait
    #: for one. More threads than cores only fight over the interpreter's lock: at 32 turns
    #: submitted at once on 2 cores, 40 threads cost 3.2 ms of CPU per turn and took 233 per
    #: second, 2 threads 2.1 ms and 343 per second (bench/engine_load.py). Raise it when the
    #: database or Redis is far away (each turn then waits longer on them).
    intake_threads: int = Field(default=2, ge=1, le=256)
    #: When model replies are streamed token by token: ``watched`` (only while someone follows
    #: the session live; otherwise the reply is asked for in one piece, far cheaper, and its
    #: text published as one delta), ``always`` or ``never``.
    stream_replies: Literal["watched", "always", "never"] = "watched"
    #: Port a worker serves its Prometheus metrics on (any path, e.g. ``/metrics``); 0: none.
    #: A plain ``ongrid worker`` serves its coordinator pool's on the next one, ``metrics_port +
    #: 1``. The API serves its own on ``GET /metrics`` whatever this is.
    metrics_port: int = Field(default=0, ge=0, le=65534)
    #: Interface the worker's metrics are served on (``0.0.0.0``: every interface).
    metrics_host: str = "127.0.0.1"
    #: Base URL of an OTLP/HTTP collector (e.g. ``http://127.0.0.1:4318``; spans go to its
    #: ``/v1/traces``); empty: no traces are recorded, and spans cost next to nothing.
    otlp_endpoint: str = ""
    #: ``record:<dir>``: every tool call of a worker is also written to ``<dir>``, one JSON file
    #: per call; ``replay:<dir>``: tools do not run, each call gets the result recorded there for
    #: the same tool and arguments (:mod:`workers.tool_tape`); empty: tools just run.
    tool_tape: str = Field(default="", pattern=r"^((record|replay):.+)?$")
    #: Python modules whose ``TOOLS`` join the catalog (site-specific BaseTools).
    tool_modules: list[str] = Field(default_factory=list)
    #: Marketplaces and plugin sources given as remote git URLs (https, ssh) may be cloned;
    #: false (the default: air-gapped): only directories and local git repositories are used.
    plugins_allow_network: bool = False
    #: MCP servers every worker starts besides those of installed plugins, shaped like
    #: ``.mcp.json``'s ``mcpServers`` (config file only); their tools are ``mcp__<name>__<tool>``.
    mcp_servers: dict[str, Any] = Field(default_factory=dict)
    #: Variables of the worker's environment that ``${NAME}`` in an MCP server's config (the
    #: config file's and plugins') may read; nothing else is expanded, and a secret-named
    #: variable (``*_TOKEN``, ``*_API_KEY``, ``REDIS_URL``…) never is, listed or not.
    mcp_env_allow: list[str] = Field(default_factory=list)
    #: Hosts, addresses and CIDR ranges that bundle code granted the network may not reach,
    #: besides those it never reaches (loopback, link-local, this host's own addresses, the
    #: Redis and database of the runtime).
    egress_deny: list[str] = Field(default_factory=list)
    #: How many ``spawn_agent`` calls of one coordinator reply are dispatched (the rest are
    #: answered with an error), and how many one coordinator turn may dispatch in all.
    max_dispatches_per_reply: int = Field(default=4, ge=1, le=100)
    max_dispatches_per_turn: int = Field(default=16, ge=1, le=1000)
    #: Per-user and per-process bounds of the HTTP API (see :class:`ApiLimits`).
    limits: ApiLimits = Field(default_factory=lambda: ApiLimits())
    #: Channels and routing rules of notifications (config file only; see
    #: :mod:`registry.notifications`).
    notifications: NotificationSettings = Field(default_factory=lambda: NotificationSettings())
    #: Scheduled investigations from the config file (read-only through the API, which adds
    #: its own to the database); see :class:`~registry.schedules.ScheduleSpec`.
    schedules: list[ScheduleSpec] = Field(default_factory=list)
    #: Longest sleep of the beat between two looks at its schedule in Redis: a schedule created
    #: or changed through the API is seen within this time. A beat killed without a clean stop
    #: holds its lock for five times this long, then another beat may take over.
    schedule_poll_seconds: float = Field(default=5.0, gt=0, le=300)
    #: A run due longer ago than this when the beat gets to it (it was down) is not caught up:
    #: the schedule goes on from the next due time. Runs due within it are started one by one.
    schedule_catch_up_seconds: float = Field(default=600.0, ge=0)
    #: Who may see and decide on whose spawns, besides their owner: owner → users (``"*"`` as
    #: the owner: everyone's). Deciding also needs a role with ``approve``.
    approvers: dict[str, list[str]] = Field(default_factory=dict)
    #: Bearer tokens by SHA-256 digest (``auth.tokens`` in the config file holds them in clear).
    token_grants: dict[str, TokenGrant] = Field(default_factory=dict, repr=False)
    #: Free-form keys from the config file, checked by personas' ``metadata.requires.config``.
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, name: str) -> str:
        if name and not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", name):
            raise ValueError(
                f"{name!r} is not a cluster name (ONGRID_CLUSTER): up to 32 lowercase letters, "
                "digits, '-' and '_', starting with a letter or digit"
            )
        return name

    @field_validator("mcp_env_allow")
    @classmethod
    def _no_secret_allowed(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not a variable name")
            if is_secret(name):
                raise ValueError(
                    f"{name} is secret-named: MCP server configurations never read secrets "
                    "(the config file's servers may read skill secrets, ONGRID_SKILL_*, as "
                    "${ONGRID_SKILL_…} without listing them)"
                )
        return names

    @field_validator("schedules")
    @classmethod
    def _unique_schedules(cls, schedules: list[ScheduleSpec]) -> list[ScheduleSpec]:
        seen: set[str] = set()
        for spec in schedules:
            if spec.name in seen:
                raise ValueError(f"two schedules are named {spec.name!r}")
            seen.add(spec.name)
        return schedules

    @property
    def key_prefix(self) -> str:
        """What every Redis key and channel of this stack starts with: see :attr:`cluster`."""
        return f"ongrid:{self.cluster}:" if self.cluster else "ongrid:"

    @property
    def agent_dirs(self) -> list[Path]:
        """Disk roots in load order: ./agents, the external dirs, the marketplace root."""
        return [self.agents_dir, *self.external_dirs, self.marketplace_root]

    def approvers_of(self, owner: str) -> set[str]:
        """The users who may see and decide on ``owner``'s spawns, the owner included."""
        return {owner, *self.approvers.get(owner, ()), *self.approvers.get("*", ())}

    def has_config(self, key: str) -> bool:
        """Whether configuration key ``key`` is set (a field or an ``extra`` entry, non-empty)."""
        value = getattr(self, key, None) if key in type(self).model_fields else None
        if value is None:
            value = self.extra.get(key)
        return value not in (None, "", [], {})

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build from ``ONGRID_CONFIG`` (a YAML file, optional) and the environment."""
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        config_path = env.get("ONGRID_CONFIG")
        if config_path:
            data.update(_read_config(Path(config_path)))
        if not isinstance(data.get("extra", {}), dict):
            raise UserError(f"invalid settings (from {config_path}): extra: expected a mapping")
        known = set(cls.model_fields)
        data["token_grants"] = _token_grants(data.pop("auth", None), config_path)
        data["token_grants"].update(_local_grant(env.get(LOCAL_TOKEN_ENV)))
        extra = {k: data.pop(k) for k in list(data) if k not in known}
        data.setdefault("extra", {}).update(extra)
        for var, field in _ENV.items():
            if env.get(var):
                data[field] = env[var]
        for var, field in _ENV_LISTS.items():
            if env.get(var):
                data[field] = [p for p in env[var].split(os.pathsep) if p]
        for var, field in _ENV_CSV.items():
            if env.get(var):
                data[field] = [p.strip() for p in env[var].split(",") if p.strip()]
        try:
            settings = cls(**data)
        except ValidationError as exc:
            where = f" (from {config_path})" if config_path else ""
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise UserError(f"invalid settings{where}: {problems}") from None
        unknown_roles = {g.role for g in settings.token_grants.values()} - set(settings.roles)
        if unknown_roles:
            raise UserError(
                f"invalid settings (from {config_path}): auth.tokens name unknown role(s) "
                f"{', '.join(sorted(unknown_roles))}; known: {', '.join(settings.roles)}"
            )
        channels = settings.notifications.channels
        for number, spec in enumerate(settings.schedules):
            if spec.role and spec.role not in settings.roles:
                raise UserError(
                    f"invalid settings (from {config_path}): schedules.{number}.role: unknown "
                    f"role {spec.role!r}; known: {', '.join(settings.roles)}"
                )
            if unknown := sorted(set(spec.channels) - set(channels)):
                raise UserError(
                    f"invalid settings (from {config_path}): schedules.{number}.channels: "
                    f"unknown notification channel(s) {', '.join(unknown)}; known: "
                    f"{', '.join(sorted(channels)) or 'none (notifications.channels)'}"
                )
        return settings


def _token_grants(auth: Any, config_path: str | None) -> dict[str, Any]:
    """``auth: {tokens: {<token>: {user, role}}}`` → grants by digest. Never echoes a token."""
    if auth is None:
        return {}
    tokens = auth.get("tokens") if isinstance(auth, dict) else None
    if not isinstance(tokens, dict):
        raise UserError(
            f"invalid settings (from {config_path}): auth.tokens: expected a mapping of "
            "token → {user, role}"
        )
    grants: dict[str, Any] = {}
    for number, (token, grant) in enumerate(tokens.items(), start=1):
        if not isinstance(token, str) or len(token) < 16:
            raise UserError(
                f"invalid settings (from {config_path}): auth.tokens entry {number}: a token "
                "must be a string of at least 16 characters"
            )
        grants[token_digest(token)] = grant
    return grants


def _local_grant(path: str | None) -> dict[str, Any]:
    """The local admin token of :data:`LOCAL_TOKEN_ENV`'s file → its grant by digest."""
    if not path:
        return {}
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"cannot read {LOCAL_TOKEN_ENV} {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise UserError(f"{LOCAL_TOKEN_ENV} {path}: a token must be at least 16 characters")
    return {token_digest(token): {"user": LOCAL_ADMIN_USER, "role": "admin"}}


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read ONGRID_CONFIG {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"ONGRID_CONFIG {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"ONGRID_CONFIG {path} must be a mapping, got {type(data).__name__}")
    return data
