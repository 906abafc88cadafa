"""Skill manifests: tools declared in YAML (``ongrid-tools.yaml``), run without new code.

A manifest sits next to a ``SKILL.md`` or at a plugin's root and declares tools: a name ending in
``_skill``, a description, a class, a JSON schema of the arguments, and one executor — a script of
the bundle's ``scripts/`` run with an argv template, or an HTTP request template. The format is
documented in ``docs/skill-manifests.md``.

Everything that can be checked is checked when the manifest is loaded (a reload), not when the
model calls the tool: shell metacharacters in a template, a script outside the bundle, a schema
that is not one, a placeholder that names no declared argument. A manifest that fails any check
is refused whole, with the file and the reason. At call time the arguments are validated against
the declared schema, each placeholder becomes exactly one argv element (never split, never seen
by a shell), and the script runs with a clean environment, a timeout and an output cap.

A tool's class is bounded by what it does, whatever the manifest declares (:func:`least_class`):
an HTTP request other than GET or HEAD, or a script granted the network, changes what it
reaches, so it is at least ``write`` and needs a person's approval. Read from an installed
plugin, each tool is named after it (:func:`qualified_name`: ``<plugin>__<tool>``), so two
plugins can never shadow each other's tools.

The checks are in :mod:`marketplace._manifest_checks`, the executors that run a tool in
:mod:`marketplace._executors`; their public names are importable from here.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable

from marketplace._executors import (
    CLEAN_PATH,
    DEFAULT_OUTPUT_BYTES,
    HttpExecutor,
    ScriptExecutor,
    _run_http,
    _run_script,
)
from marketplace._manifest_checks import (
    SHELL_METACHARACTERS,
    _check_body,
    _check_headers,
    _check_names,
    _check_schema,
    _check_url,
    _inside,
    _no_metacharacters,
    _placeholders,
    _Problem,
    _script,
)
from marketplace.model import BundleError
from registry._bounds import Oversized, measure_nodes
from registry.errors import ToolArgumentError
from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult, _argument_problem

__all__ = [
    "CLEAN_PATH",
    "INTERPRETERS",
    "MANIFEST_NAME",
    "SHELL_METACHARACTERS",
    "HttpExecutor",
    "ManifestArguments",
    "ManifestError",
    "ManifestTool",
    "ScriptExecutor",
    "least_class",
    "load_manifest",
    "qualified_name",
]

#: The file name a manifest has, next to a ``SKILL.md`` or at a plugin's root.
MANIFEST_NAME = "ongrid-tools.yaml"
#: A larger manifest is refused unread.
MAX_MANIFEST_BYTES = 256 * 1024
#: Interpreters a script may name; anything else runs as an executable file.
INTERPRETERS = ("python3", "sh", "bash")
#: The most a manifest may ask for: a tool's timeout, and its output (or response) cap.
MAX_TIMEOUT_SECONDS = 300.0
MAX_OUTPUT_BYTES = 1024 * 1024
_TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}_skill$")
#: The skill tools of :mod:`marketplace.skills`; a manifest may not shadow them.
_RESERVED = frozenset({"load_skill", "read_file_skill"})
#: Between a plugin's name and its tool's in the catalog; no tool name of a manifest holds it.
SEPARATOR = "__"
#: Longest tool name the model APIs accept (OpenAI and Anthropic both cap function names at 64).
_MAX_NAME = 64
_CLASS_ORDER = (ToolClass.READ, ToolClass.WRITE, ToolClass.DESTRUCTIVE)
#: HTTP methods that only read (RFC 9110 safe methods a manifest may use).
_SAFE_METHODS = frozenset({"GET", "HEAD"})
_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ManifestError(BundleError):
    """A skill manifest that cannot be used: names the file and what is wrong with it."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(str(path), reason)


# -- the format --------------------------------------------------------------------------------


class _Spec(BaseModel):
    # strict: "10" is not a number and 1 is not a string; a manifest says what it means.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _RunSpec(_Spec):
    command: str
    interpreter: Literal["python3", "sh", "bash"] | None = None
    args: list[str] = Field(default_factory=list)
    #: The script needs the network (through the worker's egress proxy): granted per plugin at
    #: install, and the tool is then at least ``write``.
    network: bool = False
    timeout_seconds: float = Field(default=30.0, gt=0, le=MAX_TIMEOUT_SECONDS)
    max_output_bytes: int = Field(default=DEFAULT_OUTPUT_BYTES, ge=1, le=MAX_OUTPUT_BYTES)


class _HttpSpec(_Spec):
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = None
    timeout_seconds: float = Field(default=10.0, gt=0, le=MAX_TIMEOUT_SECONDS)
    max_response_bytes: int = Field(default=DEFAULT_OUTPUT_BYTES, ge=1, le=MAX_OUTPUT_BYTES)


class _ToolSpec(_Spec):
    name: str
    description: str = Field(min_length=1, max_length=4096)
    tool_class: str = Field(alias="class")
    parameters: dict[str, Any]
    run: _RunSpec | None = None
    http: _HttpSpec | None = None


class _ManifestSpec(_Spec):
    version: Literal[1] = 1
    tools: list[_ToolSpec] = Field(min_length=1)


# -- reading -----------------------------------------------------------------------------------


def _read_yaml(path: Path) -> Any:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(path, f"cannot read the manifest: {exc.strerror}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(path, f"the manifest is larger than {MAX_MANIFEST_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(path, f"not UTF-8 text (byte {exc.start})") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ManifestError(path, "the manifest is empty: it must declare tools")
        measure_nodes(node)  # aliases counted as expanded, before any value is built
        return loader.construct_document(node)
    except Oversized as exc:
        reason = str(exc.problem).replace("frontmatter", "the manifest")
        raise ManifestError(path, f"the manifest is too large: {reason}") from None
    except RecursionError:
        raise ManifestError(path, "the manifest nests too deeply") from None
    except (yaml.YAMLError, ValueError) as exc:
        raise ManifestError(path, f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _where(loc: tuple[int | str, ...], data: Any) -> str:
    """``tools[1] (disk_usage_skill).run.args[0]``: a pydantic location as a person reads it."""
    out = ""
    for index, part in enumerate(loc):
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
        if index == 1 and loc[0] == "tools" and isinstance(part, int):
            tools = data.get("tools") if isinstance(data, dict) else None
            item = tools[part] if isinstance(tools, list) and part < len(tools) else None
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                out += f" ({item['name'][:64]})"
    return out


def _shape(path: Path, data: Any) -> _ManifestSpec:
    if not isinstance(data, dict):
        raise ManifestError(path, "the manifest must be a mapping with a 'tools' list")
    try:
        return _ManifestSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors()[:10]:
            where = _where(tuple(err["loc"]), data) or "(manifest)"
            if err["type"] == "extra_forbidden":
                message = "unknown key (docs/skill-manifests.md lists the keys)"
            elif err["type"] == "missing":
                message = "is required"
            else:
                message = err["msg"]
            problems.append(f"{where}: {message}")
        raise ManifestError(path, "; ".join(problems)) from None


# -- building the tools ------------------------------------------------------------------------


def _script_executor(
    spec: _RunSpec, schema: dict[str, Any], manifest_dir: Path, bundle_root: Path
) -> ScriptExecutor:
    script = _script(spec.command, manifest_dir, bundle_root, spec.interpreter)
    for index, arg in enumerate(spec.args):
        where = f"run.args[{index}]"
        _check_names(_placeholders(arg, where), schema, where)
        _no_metacharacters(arg, where)
    return ScriptExecutor(
        script=script,
        interpreter=spec.interpreter,
        args=tuple(spec.args),
        cwd=Path(os.path.realpath(manifest_dir)),
        timeout_seconds=spec.timeout_seconds,
        max_output_bytes=spec.max_output_bytes,
        network=spec.network,
    )


def _http_executor(spec: _HttpSpec, schema: dict[str, Any]) -> HttpExecutor:
    _check_url(spec.url, schema)
    _check_headers(spec.headers)
    if spec.body is not None:
        if spec.method in _SAFE_METHODS:
            raise _Problem(
                "http.body", f"a {spec.method} request has no body: use POST, PUT or PATCH"
            )
        _check_body(spec.body, schema)
    return HttpExecutor(
        method=spec.method,
        url=spec.url,
        headers=dict(spec.headers),
        body=copy.deepcopy(spec.body),
        timeout_seconds=spec.timeout_seconds,
        max_response_bytes=spec.max_response_bytes,
    )


def least_class(executor: ScriptExecutor | HttpExecutor) -> tuple[ToolClass, str]:
    """The lowest class a tool with ``executor`` can have, and why it is not ``read``."""
    if isinstance(executor, HttpExecutor) and executor.method not in _SAFE_METHODS:
        return ToolClass.WRITE, f"an HTTP {executor.method} request changes what it reaches"
    if isinstance(executor, ScriptExecutor) and executor.network:
        return ToolClass.WRITE, "a script with the network can change what it reaches"
    return ToolClass.READ, ""


def qualified_name(plugin: str, name: str) -> str:
    """The catalog name of tool ``name`` of ``plugin``: ``<plugin>__<name>``, characters a tool
    name cannot hold replaced by ``_``. Longer than 64 characters, it is cut and keeps its
    ``_skill`` end after 8 hex digits of a hash of the whole, so two long names stay apart."""
    full = f"{re.sub(r'[^A-Za-z0-9_-]', '_', plugin)}{SEPARATOR}{name}"
    if len(full) <= _MAX_NAME:
        return full
    digest = hashlib.sha256(f"{plugin}\0{name}".encode()).hexdigest()[:8]
    tail = f"_{digest}_skill"
    return full.removesuffix("_skill")[: _MAX_NAME - len(tail)] + tail


def _tool(
    spec: _ToolSpec, manifest: Path, bundle_root: Path, skill: str, plugin: str
) -> ManifestTool:
    if not _TOOL_NAME.match(spec.name):
        raise _Problem(
            "name", "must end in _skill: lowercase letters, digits and _, at most 64 characters"
        )
    if SEPARATOR in spec.name:
        raise _Problem("name", f"may not hold {SEPARATOR!r}: it separates a plugin from its tools")
    if spec.name in _RESERVED:
        raise _Problem("name", "is the name of a built-in skill tool")
    try:
        declared = ToolClass(spec.tool_class)
    except ValueError:
        raise _Problem("class", f"{spec.tool_class!r} is not read, write or destructive") from None
    if (spec.run is None) == (spec.http is None):
        raise _Problem("(tool)", "give exactly one executor: run or http")
    validator = _check_schema(spec.parameters)
    executor: ScriptExecutor | HttpExecutor
    if spec.run is not None:
        executor = _script_executor(spec.run, spec.parameters, manifest.parent, bundle_root)
    else:
        assert spec.http is not None
        executor = _http_executor(spec.http, spec.parameters)
    least, why = least_class(executor)
    tool_class = max(declared, least, key=_CLASS_ORDER.index)
    note = ""
    if tool_class != declared:
        note = f"declared class {declared.value}, runs as {tool_class.value}: {why}"
    return ManifestTool(
        name=qualified_name(plugin, spec.name) if plugin else spec.name,
        description=spec.description,
        tool_class=tool_class,
        schema=spec.parameters,
        executor=executor,
        manifest=manifest,
        skill=skill,
        validator=validator,
        bundle=plugin,
        base_name=spec.name,
        class_note=note,
    )


def load_manifest(
    path: Path, bundle_root: Path, *, skill: str = "", plugin: str = ""
) -> list[ManifestTool]:
    """The tools ``path`` declares; :class:`ManifestError` names every problem found.

    ``bundle_root`` is the installed plugin's directory: the manifest and every script it runs
    must be inside it, symlinks resolved. ``skill`` is the qualified name of the skill the
    manifest sits next to (empty for a plugin's own manifest); it is kept on each tool.
    ``plugin`` names the plugin the manifest belongs to: each tool is then named
    ``<plugin>__<tool>`` (:func:`qualified_name`) and marked as that plugin's.
    """
    if not _inside(os.path.realpath(path), os.path.realpath(bundle_root)):
        raise ManifestError(path, f"the manifest is outside the bundle {bundle_root}")
    if not os.path.isfile(path):
        raise ManifestError(path, "the manifest is not a regular file")
    data = _read_yaml(path)
    spec = _shape(path, data)
    tools: list[ManifestTool] = []
    problems: list[str] = []
    seen: set[str] = set()
    for index, item in enumerate(spec.tools):
        label = f"tools[{index}] ({item.name[:64]})"
        if item.name in seen:
            problems.append(f"{label}.name: declared twice in this manifest")
            continue
        seen.add(item.name)
        try:
            tools.append(_tool(item, Path(path), bundle_root, skill, plugin))
        except _Problem as exc:
            where = "" if exc.where == "(tool)" else f".{exc.where}"
            problems.append(f"{label}{where}: {exc}")
    if problems:
        raise ManifestError(path, "; ".join(problems))
    return tools


# -- the tool ----------------------------------------------------------------------------------


class ManifestArguments(BaseModel):
    """Arguments already checked against the manifest's JSON schema, kept as given."""

    model_config = ConfigDict(extra="allow", frozen=True)


class ManifestTool(BaseTool):
    """A tool a skill manifest declares; its schema is the manifest's, its run an executor."""

    args_model = ManifestArguments

    def __init__(
        self,
        *,
        name: str,
        description: str,
        tool_class: ToolClass,
        schema: Mapping[str, Any],
        executor: ScriptExecutor | HttpExecutor,
        manifest: Path,
        skill: str = "",
        validator: type[Any] = Draft202012Validator,
        bundle: str = "",
        base_name: str = "",
        class_note: str = "",
    ) -> None:
        self.name = name
        #: The plugin that brought it ("" when read outside a plugin), the name its manifest
        #: gives it, and why its class is higher than declared ("" when it is not).
        self.bundle = bundle
        self.base_name = base_name or name
        self.class_note = class_note
        self.description = description
        self.tool_class = tool_class
        self.executor = executor
        #: The manifest that declared the tool, and the skill it belongs to ("" for a plugin's).
        self.manifest = manifest
        self.skill = skill
        self._schema = copy.deepcopy(dict(schema))
        # An empty registry: a $ref is resolved inside the schema or not at all, never fetched.
        self._validator = validator(self._schema, registry=Registry())

    @property
    def parameters(self) -> dict[str, Any]:
        return copy.deepcopy(self._schema)

    def validate_arguments(self, arguments: Mapping[str, Any] | None) -> BaseModel:
        """The generic bounds of every tool, then the manifest's own JSON schema."""
        raw = dict(arguments or {})
        problem = _argument_problem(raw)
        if problem:
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problem}")
        try:
            errors = list(self._validator.iter_errors(raw))
        except Unresolvable as exc:
            raise ToolArgumentError(
                f"{self.name}'s schema has an unresolvable $ref: {exc}"
            ) from None
        if errors:
            problems = "; ".join(
                f"{e.json_path}: {e.message[:300]}"
                for e in sorted(errors, key=lambda e: e.json_path)[:10]
            )
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}")
        return ManifestArguments.model_validate(raw)

    def values(self, arguments: BaseModel) -> dict[str, Any]:
        """The arguments with the schema's defaults filled in for those not given."""
        values = {
            key: copy.deepcopy(prop["default"])
            for key, prop in self._schema["properties"].items()
            if "default" in prop
        }
        values.update(arguments.model_extra or {})
        return values

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        values = self.values(arguments)
        if isinstance(self.executor, ScriptExecutor):
            return _run_script(self.name, self.executor, values, context)
        return _run_http(self.name, self.executor, values, context.secrets)
