"""Skill manifests for real: scripts run as processes, requests sent to a local HTTP server,
and every refusal checked at load with its reason."""

from __future__ import annotations

import json
import os
import socket
import textwrap
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from processes import wait_for
from servers import QuietHandler, local_http

from marketplace.manifest import (
    MANIFEST_NAME,
    HttpExecutor,
    ManifestError,
    ManifestTool,
    ScriptExecutor,
    load_manifest,
    qualified_name,
)
from marketplace.model import BundleError
from registry.errors import ToolArgumentError, UserError, WorkerDraining
from registry.tools import ToolClass, ToolContext, ToolResult

ECHO = '#!/bin/sh\nfor a in "$@"; do printf "<%s>\\n" "$a"; done\necho "to stderr" >&2\n'
PATH_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "A directory."}},
    "required": ["path"],
    "additionalProperties": False,
}


@dataclass
class Bundle:
    """A plugin directory with one skill folder holding a manifest and its scripts."""

    root: Path
    skill_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.skill_dir = self.root / "skills" / "probe"
        (self.skill_dir / "scripts").mkdir(parents=True)
        (self.skill_dir / "SKILL.md").write_text("---\nname: probe\n---\nProbe things.\n")

    def script(self, name: str, text: str, *, executable: bool = True) -> str:
        path = self.skill_dir / "scripts" / name
        path.write_text(textwrap.dedent(text))
        path.chmod(0o755 if executable else 0o644)
        return f"scripts/{name}"

    def manifest(self, tools: list[dict[str, Any]] | str, **top: Any) -> Path:
        path = self.skill_dir / MANIFEST_NAME
        text = tools if isinstance(tools, str) else json.dumps({**top, "tools": tools})
        path.write_text(text)  # JSON is YAML
        return path

    def load(self, tools: list[dict[str, Any]] | str, **top: Any) -> list[ManifestTool]:
        return load_manifest(self.manifest(tools, **top), self.root, skill="ops:probe")

    def refusal(self, tools: list[dict[str, Any]] | str, **top: Any) -> str:
        with pytest.raises(ManifestError) as caught:
            self.load(tools, **top)
        message = str(caught.value)
        assert message.startswith(str(self.skill_dir / MANIFEST_NAME) + ": ")
        return message


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return Bundle(tmp_path / "ops")


def script_tool(command: str, args: list[str], **overrides: Any) -> dict[str, Any]:
    run = {"command": command, "args": args, **overrides.pop("run", {})}
    return {
        "name": "probe_skill",
        "description": "Probe one directory.",
        "class": "read",
        "parameters": PATH_SCHEMA,
        "run": run,
        **overrides,
    }


def call(tool: ManifestTool, context: ToolContext | None = None, **arguments: Any) -> ToolResult:
    return tool.run(tool.validate_arguments(arguments), context or ToolContext())


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for a reaper does not count). A process sent
    SIGKILL runs until the kernel schedules its death, so tests wait for this to turn False."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


# -- script tools ------------------------------------------------------------------------------


def test_loads_a_script_tool(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    [tool] = bundle.load([script_tool(command, ["-s", "{path}"])])
    assert tool.name == "probe_skill" and tool.tool_class is ToolClass.READ
    assert tool.skill == "ops:probe" and tool.manifest == bundle.skill_dir / MANIFEST_NAME
    assert tool.parameters == PATH_SCHEMA
    assert tool.describe()["parameters"] == PATH_SCHEMA
    assert isinstance(tool.executor, ScriptExecutor)
    assert tool.executor.script == (bundle.skill_dir / command).resolve()
    assert (tool.executor.timeout_seconds, tool.executor.max_output_bytes) == (30.0, 65536)


def test_each_argument_arrives_as_one_literal_argv_element(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    [tool] = bundle.load([script_tool(command, ["-s", "--path={path}", "{path}"])])
    hostile = "a b; rm -rf / $(id) `id` | cat > /tmp/x *"
    result = call(tool, path=hostile)
    assert not result.is_error, result.content
    assert result.data["stdout"] == f"<-s>\n<--path={hostile}>\n<{hostile}>\n"
    assert result.data["stderr"] == "to stderr\n"
    assert result.content.startswith("exit code: 0\n--- stdout ---\n<-s>")


def test_non_string_arguments_and_defaults(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    schema = {
        "type": "object",
        "properties": {
            "depth": {"type": "integer", "default": 2},
            "human": {"type": "boolean"},
            "path": {"type": "string"},
        },
        "required": ["human", "path"],
    }
    spec = script_tool(command, ["{depth}", "{human}", "{path}"], parameters=schema)
    [tool] = bundle.load([spec])
    assert call(tool, human=True, path="/").data["stdout"] == "<2>\n<true>\n</>\n"
    assert call(tool, human=False, path="x", depth=5).data["stdout"] == "<5>\n<false>\n<x>\n"


def test_arguments_are_validated_against_the_manifest_schema(bundle: Bundle) -> None:
    [tool] = bundle.load([script_tool(bundle.script("echo.sh", ECHO), ["{path}"])])
    with pytest.raises(ToolArgumentError, match="'path' is a required property"):
        tool.validate_arguments({})
    with pytest.raises(ToolArgumentError, match="3 is not of type 'string'"):
        tool.validate_arguments({"path": 3})
    with pytest.raises(ToolArgumentError, match="Additional properties"):
        tool.validate_arguments({"path": "/", "other": 1})
    with pytest.raises(ToolArgumentError, match="NUL"):  # the bounds of every tool come first
        tool.validate_arguments({"path": "a\0b"})


def test_a_failing_script_is_an_error_with_its_exit_code(bundle: Bundle) -> None:
    command = bundle.script("fail.sh", '#!/bin/sh\necho "no such dir: $1" >&2\nexit 3\n')
    [tool] = bundle.load([script_tool(command, ["{path}"])])
    result = call(tool, path="/nope")
    assert result.is_error
    assert result.content.startswith("exit code: 3\n")
    assert "no such dir: /nope" in result.content


def test_the_environment_is_clean_and_cwd_is_the_manifest_folder(
    bundle: Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONGRID_TEST_SECRET", "hunter2")
    command = bundle.script(
        "env.py",
        """
        import json, os
        print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}))
        """,
        executable=False,
    )
    [tool] = bundle.load([script_tool(command, [], run={"interpreter": "python3"})])
    result = call(tool, path="/")
    assert not result.is_error, result.content
    seen = json.loads(result.data["stdout"])
    assert set(seen["env"]) == {"PATH", "LANG", "HOME"}
    assert seen["env"]["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert seen["env"]["LANG"] == "C.UTF-8"
    assert seen["cwd"] == str(bundle.skill_dir.resolve())
    assert not Path(seen["env"]["HOME"]).exists()  # a fresh home, removed after the call


def test_a_timeout_kills_the_script_and_its_children(bundle: Bundle, tmp_path: Path) -> None:
    command = bundle.script(
        "slow.sh",
        """\
        #!/bin/sh
        sleep 120 &
        echo $! > "$1"
        echo started
        wait
        """,
    )
    [tool] = bundle.load([script_tool(command, ["{path}"], run={"timeout_seconds": 2})])
    pid_file = tmp_path / "pid"
    result = call(tool, path=str(pid_file))
    assert result.is_error
    assert result.content.startswith("timed out after 2 s: the script was killed")
    assert result.data["status"] == "timeout"
    assert "started" in result.data["stdout"]
    wait_for(lambda: not alive(int(pid_file.read_text())), 10, "the script's background job to die")


def test_background_jobs_do_not_outlive_a_script_that_exits(bundle: Bundle, tmp_path: Path) -> None:
    command = bundle.script("leak.sh", '#!/bin/sh\nsleep 120 > /dev/null 2>&1 &\necho $! > "$1"\n')
    [tool] = bundle.load([script_tool(command, ["{path}"])])
    pid_file = tmp_path / "pid"
    result = call(tool, path=str(pid_file))
    assert not result.is_error, result.content
    wait_for(lambda: not alive(int(pid_file.read_text())), 10, "the script's background job to die")


def test_output_past_the_cap_stops_the_script(bundle: Bundle) -> None:
    command = bundle.script("yes.sh", "#!/bin/sh\nwhile :; do echo 0123456789; done\n")
    run = {"max_output_bytes": 1000, "timeout_seconds": 120}
    [tool] = bundle.load([script_tool(command, [], run=run)])
    result = call(tool, path="/")
    assert result.is_error and result.data["status"] == "overflow"
    assert result.content.startswith("stopped: the script wrote more than 1000 bytes of output")
    expected = ("0123456789\n" * 91)[:1000]
    assert result.data["stdout"] == expected + "\n[stdout truncated at 1000 bytes]"


def test_output_under_the_cap_is_whole(bundle: Bundle) -> None:
    command = bundle.script("some.sh", "#!/bin/sh\nprintf 'x%.0s' $(seq 1 999)\n")
    [tool] = bundle.load([script_tool(command, [], run={"max_output_bytes": 1000})])
    result = call(tool, path="/")
    assert not result.is_error and result.data["stdout"] == "x" * 999


def test_a_worker_shutting_down_stops_the_script(bundle: Bundle, tmp_path: Path) -> None:
    command = bundle.script("slow.sh", '#!/bin/sh\necho $$ > "$1"\nexec sleep 120\n')
    [tool] = bundle.load([script_tool(command, ["{path}"])])
    context = ToolContext()
    pid_file = tmp_path / "pid"

    def stop_once_started() -> None:
        while not pid_file.exists() or not pid_file.read_text().strip():
            context.stopping.wait(0.01)
        context.stopping.set()

    stopper = threading.Thread(target=stop_once_started)
    stopper.start()
    with pytest.raises(WorkerDraining, match="probe_skill was stopped"):
        call(tool, context, path=str(pid_file))
    stopper.join()
    wait_for(lambda: not alive(int(pid_file.read_text())), 10, "the script's background job to die")


# -- refusals at load --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arg",
    ["-s;ls", "$HOME", "a b", "`id`", "{path}|cat", "*.log", "x>y", "(x)", "'q'", "a\\b", "~"],
)
def test_refuses_shell_metacharacters_in_args(bundle: Bundle, arg: str) -> None:
    message = bundle.refusal([script_tool(bundle.script("echo.sh", ECHO), ["{path}", arg])])
    assert "tools[0] (probe_skill).run.args[1]" in message
    assert "contains shell metacharacters" in message


@pytest.mark.parametrize("arg", ["{path", "path}", "{}", "{pa th}", "{{path}}"])
def test_refuses_braces_that_are_not_placeholders(bundle: Bundle, arg: str) -> None:
    message = bundle.refusal([script_tool(bundle.script("echo.sh", ECHO), [arg])])
    assert "run.args[0]" in message and "is not a {param} placeholder" in message


def test_refuses_metacharacters_and_placeholders_in_the_command(bundle: Bundle) -> None:
    bundle.script("echo.sh", ECHO)
    message = bundle.refusal([script_tool("scripts/echo.sh;id", [])])
    assert "run.command" in message and "contains shell metacharacters ';'" in message
    message = bundle.refusal([script_tool("scripts/{path}", [])])
    assert "the command is fixed" in message


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("/bin/sh", "is absolute"),
        ("../probe/scripts/echo.sh", "goes up with '..'"),
        ("scripts/../../../x.sh", "goes up with '..'"),
        ("SKILL.md", "is not under scripts/"),
        ("scripts", "is not under scripts/"),
        ("scripts/missing.sh", "does not exist"),
        ("scripts/sub", "is not a regular file"),
    ],
)
def test_refuses_commands_outside_the_bundle_scripts(
    bundle: Bundle, command: str, reason: str
) -> None:
    bundle.script("echo.sh", ECHO)
    (bundle.skill_dir / "scripts" / "sub").mkdir()
    message = bundle.refusal([script_tool(command, [])])
    assert "run.command" in message and reason in message


def test_refuses_a_script_symlink_out_of_the_bundle(bundle: Bundle, tmp_path: Path) -> None:
    outside = tmp_path / "evil.sh"
    outside.write_text(ECHO)
    outside.chmod(0o755)
    (bundle.skill_dir / "scripts" / "evil.sh").symlink_to(outside)
    (bundle.skill_dir / "scripts" / "sh").symlink_to("/bin/sh")
    for command in ("scripts/evil.sh", "scripts/sh"):
        message = bundle.refusal([script_tool(command, [])])
        assert "leads outside the bundle's scripts/" in message


def test_refuses_a_scripts_folder_that_links_elsewhere(bundle: Bundle) -> None:
    other = bundle.root / "elsewhere"
    other.mkdir()
    (other / "x.sh").write_text(ECHO)
    (other / "x.sh").chmod(0o755)
    (bundle.skill_dir / "scripts").rmdir()
    (bundle.skill_dir / "scripts").symlink_to(other)
    assert "leads outside" in bundle.refusal([script_tool("scripts/x.sh", [])])


def test_refuses_a_non_executable_script_without_interpreter(bundle: Bundle) -> None:
    command = bundle.script("plain.sh", ECHO, executable=False)
    assert "is not executable: set interpreter" in bundle.refusal([script_tool(command, [])])
    [tool] = bundle.load([script_tool(command, ["{path}"], run={"interpreter": "sh"})])
    assert call(tool, path="x y").data["stdout"] == "<x y>\n"


def test_refuses_a_missing_or_invalid_schema(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    spec = script_tool(command, [])
    del spec["parameters"]
    assert "tools[0] (probe_skill).parameters: is required" in bundle.refusal([spec])
    cases = [
        ({"type": "string"}, "parameters: must be a JSON schema with type: object"),
        ({"type": "object"}, "parameters.properties: must map each argument's name"),
        ({"type": "object", "properties": {"a": 1}}, "must map each argument's name"),
        (
            {"type": "object", "properties": {}, "required": ["x"]},
            "parameters.required: must list names of declared properties",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "strng"}}},
            "parameters.properties.a.type: not a valid JSON schema",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}},
            "is not local",
        ),
        (
            {"$schema": "https://example.invalid/dialect", "type": "object", "properties": {}},
            "unknown JSON Schema dialect",
        ),
    ]
    for schema, reason in cases:
        assert reason in bundle.refusal([script_tool(command, [], parameters=schema)])


def test_local_refs_and_known_dialects_are_fine(bundle: Bundle) -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "definitions": {"dir": {"type": "string", "minLength": 1}},
        "properties": {"path": {"$ref": "#/definitions/dir"}},
        "required": ["path"],
    }
    spec = script_tool(bundle.script("echo.sh", ECHO), ["{path}"], parameters=schema)
    [tool] = bundle.load([spec])
    with pytest.raises(ToolArgumentError, match="should be non-empty|too short"):
        tool.validate_arguments({"path": ""})
    assert call(tool, path="d").data["stdout"] == "<d>\n"


@pytest.mark.parametrize("name", ["disk_usage", "Disk_skill", "_skill", "a-b_skill", "x" * 70])
def test_refuses_a_name_not_ending_in_skill(bundle: Bundle, name: str) -> None:
    spec = script_tool(bundle.script("echo.sh", ECHO), [], name=name)
    assert ".name: must end in _skill" in bundle.refusal([spec])


def test_refuses_the_names_of_the_builtin_skill_tools(bundle: Bundle) -> None:
    spec = script_tool(bundle.script("echo.sh", ECHO), [], name="load_skill")
    assert "is the name of a built-in skill tool" in bundle.refusal([spec])


def test_refuses_placeholders_that_name_no_argument(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    message = bundle.refusal([script_tool(command, ["{pth}"])])
    assert "run.args[0]: placeholder {pth} is not a property of parameters (declared: path)" in (
        message
    )
    optional = {"type": "object", "properties": {"path": {"type": "string"}}}
    message = bundle.refusal([script_tool(command, ["{path}"], parameters=optional)])
    assert "names an optional property without a default" in message


def test_refuses_bad_classes_executors_duplicates_and_unknown_keys(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    spec = script_tool(command, [])
    assert "'admin' is not read, write or destructive" in bundle.refusal(
        [{**spec, "class": "admin"}]
    )
    neither = {k: v for k, v in spec.items() if k != "run"}
    assert "give exactly one executor: run or http" in bundle.refusal([neither])
    both = {**spec, "http": {"url": "http://127.0.0.1:1/"}}
    assert "give exactly one executor" in bundle.refusal([both])
    assert "tools[1] (probe_skill).name: declared twice" in bundle.refusal([spec, spec])
    assert "tools[0] (probe_skill).runner: unknown key" in bundle.refusal([{**spec, "runner": 1}])
    assert "color: unknown key" in bundle.refusal([spec], color="red")
    run = {**spec["run"], "timeout_seconds": 301}
    assert "run.timeout_seconds" in bundle.refusal([{**spec, "run": run}])
    run = {**spec["run"], "interpreter": "perl"}
    assert "run.interpreter" in bundle.refusal([{**spec, "run": run}])
    assert "tools: is required" in bundle.refusal("version: 1\n")


def test_reports_every_bad_tool_at_once(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    message = bundle.refusal(
        [
            script_tool(command, [";"]),
            script_tool(command, [], name="second_skill", **{"class": "x"}),
        ]
    )
    assert "tools[0] (probe_skill).run.args[0]" in message
    assert "tools[1] (second_skill).class" in message


def test_refuses_files_that_are_not_manifests(bundle: Bundle, tmp_path: Path) -> None:
    assert "not valid YAML" in bundle.refusal("tools: [unclosed\n")
    assert "not valid YAML" in bundle.refusal("!!python/object:os.system {}\n")
    assert "must be a mapping" in bundle.refusal("- a\n- b\n")
    assert "the manifest is empty" in bundle.refusal("")
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
        for p, c in zip("abcdefg", "bcdefgh", strict=True)
    )
    assert "too large" in bundle.refusal(laughs)
    bundle.manifest("tools: []\n").write_bytes(b"\xff\xfe")
    with pytest.raises(ManifestError, match="not UTF-8"):
        load_manifest(bundle.skill_dir / MANIFEST_NAME, bundle.root)
    outside = tmp_path / MANIFEST_NAME
    outside.write_text("tools: []\n")
    with pytest.raises(ManifestError, match="outside the bundle"):
        load_manifest(outside, bundle.root)


def test_manifest_errors_are_bundle_errors(bundle: Bundle) -> None:
    with pytest.raises(BundleError) as caught:
        bundle.load("tools: 3\n")
    assert isinstance(caught.value, UserError)
    assert caught.value.where == str(bundle.skill_dir / MANIFEST_NAME)


# -- http tools --------------------------------------------------------------------------------


@dataclass
class Seen:
    requests: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[tuple[str, Seen]]:
    seen = Seen()

    class Handler(QuietHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            seen.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": body,
                }
            )
            path = urllib.parse.urlsplit(self.path).path
            if path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "http://example.invalid/")
                self.end_headers()
                return
            status = 404 if path == "/missing" else 200
            payload = b"y" * 5000 if path == "/big" else json.dumps({"ok": status == 200}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

    with local_http(Handler) as url:
        yield url, seen


def http_tool(url: str, **http: Any) -> dict[str, Any]:
    return {
        "name": "usage_skill",
        "description": "Disk usage from the local agent.",
        "class": "read",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "count": {"type": "integer", "default": 1}},
            "required": ["path"],
        },
        "http": {"url": url, **http},
    }


def test_http_get_percent_encodes_placeholders(bundle: Bundle, server: tuple[str, Seen]) -> None:
    base, seen = server
    [tool] = bundle.load([http_tool(f"{base}/api/usage/{{path}}?path={{path}}&n={{count}}")])
    assert isinstance(tool.executor, HttpExecutor)
    result = call(tool, path="a b/../&x=1#f")
    assert not result.is_error, result.content
    assert result.content == 'HTTP 200\n{"ok": true}'
    assert result.data["status"] == 200
    request = seen.requests[0]
    assert request["method"] == "GET"
    assert request["path"] == (
        "/api/usage/a%20b%2F..%2F%26x%3D1%23f?path=a%20b%2F..%2F%26x%3D1%23f&n=1"
    )
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(request["path"]).query)
    assert query == {"path": ["a b/../&x=1#f"], "n": ["1"]}


def test_http_post_fills_a_json_body_and_secret_headers(
    bundle: Bundle, server: tuple[str, Seen], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, seen = server
    secrets = ToolContext(secrets={"ONGRID_SKILL_AGENT_TOKEN": "s3cret"})
    spec = http_tool(
        f"{base}/api/usage",
        method="POST",
        headers={"Authorization": "Bearer ${ONGRID_SKILL_AGENT_TOKEN}", "X-Price": "$5"},
        body={"path": "{path}", "n": "{count}", "note": "p={path} {{literal}}", "k": [True]},
    )
    [tool] = bundle.load([spec])
    result = call(tool, secrets, path="/var", count=3)
    assert not result.is_error, result.content
    request = seen.requests[0]
    assert request["method"] == "POST"
    assert request["headers"]["Authorization"] == "Bearer s3cret"
    assert request["headers"]["X-Price"] == "$5"
    assert request["headers"]["Content-Type"] == "application/json"
    assert json.loads(request["body"]) == {
        "path": "/var",
        "n": 3,
        "note": "p=/var {literal}",
        "k": [True],
    }
    # The skill secrets are the worker's holder, never its environment (which hardening empties).
    monkeypatch.setenv("ONGRID_SKILL_AGENT_TOKEN", "from-the-environment")
    result = call(tool, path="/var")
    assert result.is_error and "needs ONGRID_SKILL_AGENT_TOKEN, unset on this worker" in (
        result.content
    )
    assert len(seen.requests) == 1  # nothing was sent without it


def test_http_error_statuses_are_errors_with_their_body(
    bundle: Bundle, server: tuple[str, Seen]
) -> None:
    base, _ = server
    [missing] = bundle.load([http_tool(f"{base}/missing?p={{path}}")])
    result = call(missing, path="x")
    assert result.is_error and result.content == 'HTTP 404\n{"ok": false}'
    [redirect] = bundle.load([http_tool(f"{base}/redirect")])
    result = call(redirect, path="x")
    assert result.is_error
    assert "HTTP 302 (redirect to http://example.invalid/ not followed)" in result.content


def test_http_response_is_capped(bundle: Bundle, server: tuple[str, Seen]) -> None:
    base, _ = server
    [tool] = bundle.load([http_tool(f"{base}/big", max_response_bytes=100)])
    result = call(tool, path="x")
    assert not result.is_error
    assert result.content == "HTTP 200\n" + "y" * 100 + "\n[response truncated at 100 bytes]"


def test_http_unreachable_is_an_error_naming_the_origin(bundle: Bundle) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    [tool] = bundle.load([http_tool(f"http://127.0.0.1:{port}/x")])
    result = call(tool, path="x")
    assert result.is_error and f"could not reach http://127.0.0.1:{port}" in result.content


@pytest.mark.parametrize(
    ("url", "http", "reason"),
    [
        ("http://{path}/x", {}, "never the host"),
        ("http://127.0.0.1:{count}/x", {}, "never the host"),
        ("ftp://127.0.0.1/x", {}, "is not an http(s) URL"),
        ("http:///x", {}, "is not an http(s) URL"),
        ("http://u:p@127.0.0.1/x", {}, "no credentials in the URL"),
        ("http://127.0.0.1/x#frag", {}, "fragment"),
        ("http://127.0.0.1/x y", {}, "whitespace"),
        ("http://127.0.0.1/{nope}", {}, "placeholder {nope} is not a property"),
        ("http://127.0.0.1/{path", {}, "is not a {param} placeholder"),
        ("http://127.0.0.1/", {"headers": {"Auth": "${HOME}"}}, "only ONGRID_SKILL_*"),
        ("http://127.0.0.1/", {"headers": {"Auth": "{path}"}}, "headers are fixed"),
        ("http://127.0.0.1/", {"headers": {"Host": "x"}}, "set by the HTTP client"),
        ("http://127.0.0.1/", {"headers": {"Bad Name": "x"}}, "not a valid header name"),
        ("http://127.0.0.1/", {"headers": {"X": "a\nb"}}, "line break"),
        ("http://127.0.0.1/", {"body": {"a": "{path}"}}, "a GET request has no body"),
        ("http://127.0.0.1/", {"method": "POST", "body": {"a": "{x}"}}, "placeholder {x}"),
        ("http://127.0.0.1/", {"method": "POST", "body": "{a"}, "write {{ or }} for a brace"),
        ("http://127.0.0.1/", {"method": "TRACE"}, "http.method"),
        ("http://169.254.169.254/latest/meta-data/", {}, "cloud metadata address"),
        ("http://[fe80::1]/x", {}, "link-local"),
        ("http://metadata.google.internal/x", {}, "cloud metadata address"),
        ("http://100.100.100.200/x", {}, "cloud metadata address"),
    ],
)
def test_refuses_bad_http_templates(
    bundle: Bundle, url: str, http: dict[str, Any], reason: str
) -> None:
    message = bundle.refusal([http_tool(url, **http)])
    assert "tools[0] (usage_skill)" in message and reason in message


def test_a_manifest_may_sit_at_the_plugin_root(bundle: Bundle) -> None:
    (bundle.root / "scripts").mkdir()
    (bundle.root / "scripts" / "echo.sh").write_text(ECHO)
    (bundle.root / "scripts" / "echo.sh").chmod(0o755)
    path = bundle.root / MANIFEST_NAME
    path.write_text(
        textwrap.dedent(
            """\
            version: 1
            tools:
              - name: echo_skill
                description: Echo one path.
                class: write
                parameters:
                  type: object
                  properties: {path: {type: string}}
                  required: [path]
                run:
                  command: scripts/echo.sh
                  args: ["--", "{path}"]
            """
        )
    )
    [tool] = load_manifest(path, bundle.root)
    assert tool.skill == "" and tool.tool_class is ToolClass.WRITE
    assert call(tool, path="-rf").data["stdout"] == "<-->\n<-rf>\n"
    assert isinstance(tool.executor, ScriptExecutor)
    assert tool.executor.cwd == bundle.root.resolve()


def test_script_removed_after_load_is_an_error(bundle: Bundle) -> None:
    command = bundle.script("echo.sh", ECHO)
    [tool] = bundle.load([script_tool(command, [])])
    os.unlink(bundle.skill_dir / command)
    result = call(tool, path="x")
    assert result.is_error and "is gone from the bundle" in result.content


def test_the_documented_example_loads(bundle: Bundle) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "skill-manifests.md"
    example = docs.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    bundle.script("du.sh", '#!/bin/sh\nexec du "$@"\n', executable=False)
    tools = bundle.load(example)
    assert [t.name for t in tools] == [
        "disk_usage_skill",
        "agent_usage_skill",
        "silence_alert_skill",
    ]
    assert [t.tool_class for t in tools] == [ToolClass.READ, ToolClass.READ, ToolClass.WRITE]
    (bundle.skill_dir / "data").mkdir()
    result = call(tools[0], path="data")
    assert not result.is_error, result.content
    assert result.data["stdout"].endswith("\tdata\n")


def test_http_env_values_cannot_add_headers(
    bundle: Bundle, server: tuple[str, Seen], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, seen = server
    [tool] = bundle.load(
        [http_tool(f"{base}/x", headers={"Authorization": "${ONGRID_SKILL_TOKEN}"})]
    )
    result = call(tool, ToolContext(secrets={"ONGRID_SKILL_TOKEN": "x\r\nX-Injected: 1"}), path="x")
    assert result.is_error and "would hold a line break" in result.content
    assert seen.requests == []


def test_http_silence_is_a_timeout(bundle: Bundle) -> None:
    with socket.socket() as listener:  # accepts connections (the backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        [tool] = bundle.load([http_tool(f"http://127.0.0.1:{port}/x", timeout_seconds=0.5)])
        result = call(tool, path="x")
    assert result.is_error
    assert result.content == f"usage_skill: http://127.0.0.1:{port} did not answer within 0.5 s"


def test_a_tools_class_is_at_least_what_it_does(bundle: Bundle) -> None:
    """A manifest cannot call a DELETE or a script with the network ``read``: its class is
    raised (and said), so every call of it needs a person; GET and HEAD stay read."""
    bundle.script("probe.sh", "#!/bin/sh\necho probe\n")
    tools = bundle.load(
        [
            {**http_tool("http://127.0.0.1:9/x", method="DELETE"), "name": "drop_skill"},
            {**http_tool("http://127.0.0.1:9/x", method="HEAD"), "name": "peek_skill"},
            {**script_tool("scripts/probe.sh", [], run={"network": True}), "name": "fetch_skill"},
            script_tool("scripts/probe.sh", []),
        ]
    )
    by_name = {t.name: t for t in tools}
    assert {n: t.tool_class.value for n, t in by_name.items()} == {
        "drop_skill": "write",
        "peek_skill": "read",
        "fetch_skill": "write",
        "probe_skill": "read",
    }
    assert by_name["drop_skill"].class_note == (
        "declared class read, runs as write: an HTTP DELETE request changes what it reaches"
    )
    assert by_name["fetch_skill"].executor.network is True
    assert by_name["probe_skill"].class_note == ""


def test_a_plugins_tools_are_named_after_it(bundle: Bundle) -> None:
    bundle.script("probe.sh", "#!/bin/sh\necho probe\n")
    path = bundle.manifest([script_tool("scripts/probe.sh", [])])
    (tool,) = load_manifest(path, bundle.root, plugin="plugin-dev")
    assert (tool.name, tool.base_name, tool.bundle) == (
        "plugin-dev__probe_skill",
        "probe_skill",
        "plugin-dev",
    )
    long = qualified_name("p" * 60, "probe_skill")
    assert len(long) == 64 and long.endswith("_skill") and long != qualified_name("p" * 61, "x")
    doubled = {**script_tool("scripts/probe.sh", []), "name": "a__b_skill"}
    assert "tools[0] (a__b_skill).name: may not hold '__'" in bundle.refusal([doubled])
