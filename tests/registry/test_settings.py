"""registry.settings: ONGRID_CONFIG, environment overrides, path lists and config errors.

Every test passes ``environ=`` explicitly: nothing here reads or changes ``os.environ``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pydantic
import pytest

from registry.errors import UserError
from registry.settings import (
    DEFAULT_MARKETPLACE_ROOT,
    RoleConfig,
    Settings,
    TokenGrant,
    token_digest,
)

CONFIG = """\
roles:
  oncall:
    tools: ["query_*", host_probe, restart_service]
    approve: true
  auditor:
    tools: ["query_*"]
default_role: oncall
prometheus_url: http://prometheus.file:9090
default_model: anthropic/claude-sonnet-4-6
external_dirs: [/srv/agents-from-file]
pagerduty_token: pd-123
grafana:
  url: http://grafana:3000
auth:
  tokens:
    alice-token-0123456789: {user: alice, role: oncall}
"""


def _config(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "ongrid.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _load_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = _config(tmp_path, text)
    with pytest.raises(UserError) as info:
        Settings.load(environ={"ONGRID_CONFIG": str(path)})
    return path, str(info.value)


def test_defaults_without_config_or_environment() -> None:
    s = Settings.load(environ={})
    assert s.agents_dir == Path("agents")
    assert s.external_dirs == []
    assert s.marketplace_root == DEFAULT_MARKETPLACE_ROOT == Path("/var/lib/ongrid/agents")
    assert s.agent_dirs == [Path("agents"), Path("/var/lib/ongrid/agents")]
    assert sorted(s.roles) == ["admin", "operator", "viewer"]
    assert s.roles["admin"] == RoleConfig(
        tools=["*"], edit_personas=True, approve=True, audit=True, manage_plugins=True
    )
    assert s.roles["operator"] == RoleConfig(tools=["*"], approve=True)
    assert s.roles["viewer"].tools[0] == "query_*" and not s.roles["viewer"].approve
    assert (s.default_role, s.default_model, s.redis_url, s.extra) == ("admin", "", "", {})
    # The periods tests shorten through the environment; production keeps these.
    assert (s.lease_seconds, s.presence_ttl_seconds) == (10.0, 10.0)
    assert (s.stranded_grace_seconds, s.stranded_check_seconds) == (15.0, 2.0)


def test_config_file_with_roles_and_extra_keys(tmp_path: Path) -> None:
    s = Settings.load(environ={"ONGRID_CONFIG": str(_config(tmp_path))})
    assert s.roles == {
        "oncall": RoleConfig(tools=["query_*", "host_probe", "restart_service"], approve=True),
        "auditor": RoleConfig(tools=["query_*"]),
    }  # the file's roles replace the defaults
    assert s.default_role == "oncall"
    assert s.prometheus_url == "http://prometheus.file:9090"
    assert s.external_dirs == [Path("/srv/agents-from-file")]
    assert s.extra == {"pagerduty_token": "pd-123", "grafana": {"url": "http://grafana:3000"}}
    assert "auth" not in s.extra  # read by the API's auth layer, not a setting
    assert s.token_grants == {
        token_digest("alice-token-0123456789"): TokenGrant(user="alice", role="oncall")
    }
    assert "alice-token-0123456789" not in repr(s)


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ("auth: {tokens: [a]}", "auth.tokens: expected a mapping of token → {user, role}"),
        ("auth: {tokens: {short: {user: a, role: admin}}}", "at least 16 characters"),
        (
            "auth: {tokens: {long-enough-token-1234: {user: a, role: root}}}",
            "auth.tokens name unknown role(s) root; known: admin, operator, viewer",
        ),
        ("auth: {tokens: {long-enough-token-1234: {user: a}}}", "token_grants"),
    ],
)
def test_bad_auth_is_a_user_error_that_never_echoes_the_token(tmp_path, auth, message) -> None:
    path, error = _load_error(tmp_path, auth + "\n")
    assert message in error and str(path) in error
    assert "long-enough-token-1234" not in error


def test_has_config(tmp_path: Path) -> None:
    s = Settings.load(environ={"ONGRID_CONFIG": str(_config(tmp_path))})
    assert s.has_config("pagerduty_token") is True  # an extra key
    assert s.has_config("grafana") is True
    assert s.has_config("prometheus_url") is True  # a field
    assert s.has_config("loki_url") is False  # a field left empty
    assert s.has_config("slack_webhook") is False  # neither
    assert s.has_config("auth") is False


def test_environment_wins_over_the_file(tmp_path: Path) -> None:
    env = {
        "ONGRID_CONFIG": str(_config(tmp_path)),
        "PROMETHEUS_URL": "http://prometheus.env:9090",
        "ONGRID_DEFAULT_MODEL": "zhipu/glm-4.7",
        "REDIS_URL": "redis://redis:6379/0",
        "ONGRID_AGENTS_DIR": "/opt/agents",
        "ONGRID_MARKETPLACE_ROOT": "/opt/marketplace",
        "ONGRID_DATA_DIR": "/var/lib/ongrid/data",
        "UNRELATED": "ignored",
    }
    s = Settings.load(environ=env)
    assert s.prometheus_url == "http://prometheus.env:9090"
    assert s.default_model == "zhipu/glm-4.7"
    assert s.redis_url == "redis://redis:6379/0"
    assert s.agents_dir == Path("/opt/agents")
    assert s.marketplace_root == Path("/opt/marketplace")
    assert s.data_dir == Path("/var/lib/ongrid/data")
    assert s.default_role == "oncall"  # not named by the environment: the file's value
    assert "UNRELATED" not in s.extra


def test_external_dirs_path_list(tmp_path: Path) -> None:
    value = os.pathsep.join(["/srv/team-a", "", "relative/team-b", "/srv/team-c"])
    env = {"ONGRID_CONFIG": str(_config(tmp_path)), "ONGRID_AGENTS_EXTERNAL_DIRS": value}
    s = Settings.load(environ=env)
    assert s.external_dirs == [Path("/srv/team-a"), Path("relative/team-b"), Path("/srv/team-c")]
    assert s.agent_dirs == [
        Path("agents"),
        Path("/srv/team-a"),
        Path("relative/team-b"),
        Path("/srv/team-c"),
        DEFAULT_MARKETPLACE_ROOT,
    ]


def test_knowledge_dirs_path_list() -> None:
    s = Settings.load(environ={"ONGRID_KNOWLEDGE_DIRS": os.pathsep.join(["/kb/a", "/kb/b"])})
    assert s.knowledge_dirs == [Path("/kb/a"), Path("/kb/b")]


def test_empty_config_file_gives_the_defaults(tmp_path: Path) -> None:
    s = Settings.load(environ={"ONGRID_CONFIG": str(_config(tmp_path, ""))})
    assert s == Settings.load(environ={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("roles:\n  viewer:\n    tools: 5\n", "roles.viewer.tools: Input should be a valid list"),
        ("roles:\n  viewer:\n    colour: red\n", "roles.viewer.colour: Extra inputs are not"),
        ("allow_reboot: perhaps\n", "allow_reboot: Input should be a valid boolean"),
        ("agents_dir: [1]\n", "agents_dir: Input is not a valid path"),
    ],
)
def test_invalid_settings_name_the_file_and_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    path, message = _load_error(tmp_path, text)
    assert message.startswith(f"invalid settings (from {path}): ")
    assert expected in message


def test_config_that_is_not_yaml(tmp_path: Path) -> None:
    path, message = _load_error(tmp_path, "roles: [\n")
    assert message.startswith(f"ONGRID_CONFIG {path} is not valid YAML: ")


def test_config_that_is_not_a_mapping(tmp_path: Path) -> None:
    path, message = _load_error(tmp_path, "- admin\n- viewer\n")
    assert message == f"ONGRID_CONFIG {path} must be a mapping, got list"


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(UserError) as info:
        Settings.load(environ={"ONGRID_CONFIG": str(path)})
    assert str(info.value) == f"cannot read ONGRID_CONFIG {path}: No such file or directory"


def test_non_mapping_extra_is_a_user_error(tmp_path: Path) -> None:
    path, message = _load_error(tmp_path, "extra: 5\n")
    assert str(path) in message and "extra" in message


def test_extra_mapping_in_the_file_merges_with_unknown_keys(tmp_path: Path) -> None:
    path = _config(tmp_path, "extra: {a: 1}\nb: 2\n")
    assert Settings.load(environ={"ONGRID_CONFIG": str(path)}).extra == {"a": 1, "b": 2}


def test_settings_are_frozen() -> None:
    s = Settings.load(environ={})
    with pytest.raises(pydantic.ValidationError):
        s.redis_url = "redis://elsewhere"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        Settings(no_such_setting=1)  # type: ignore[call-arg]
