"""What a tool is to the runtime: a name, a description, a JSON schema of arguments and a class.

Tools are registered in code (a new tool needs code and a restart, SPEC §7). This module only
describes them; the implementations live in ``workers.tools`` and the policy that decides which of
them a spawn may call lives in :mod:`registry.policy`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from registry.budget import CallLimits
from registry.errors import NotFoundError, ToolArgumentError
from registry.template import walk_json

__all__ = [
    "AGENT_TOOL_NAME",
    "SKILL_TOOL_NAMES",
    "BaseTool",
    "FunctionTool",
    "ToolCatalog",
    "ToolClass",
    "ToolContext",
    "ToolResult",
    "function_tool",
]

#: Bounds on every tool's arguments, whatever its schema says.
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_ARGUMENTS_DEPTH = 16

#: The tools a persona with ``skills`` reads them with (``marketplace.skills``). Every tool that
#: comes from skills ends in ``_skill``, so ``disallowed_tools: ["*_skill"]`` blocks them all.
SKILL_TOOL_NAMES: tuple[str, ...] = ("load_skill", "read_file_skill")

#: The tool that spawns another persona. Never part of a worker's bag: workers cannot spawn workers.
AGENT_TOOL_NAME = "spawn_agent"


class ToolClass(StrEnum):
    """How much a tool can change: gates it against a persona's ``permission_mode``."""

    READ = "read"
    WRITE = "write"
    DESTRUCTIVE = "destructive"

    @classmethod
    def _missing_(cls, value: object) -> ToolClass | None:
        # "safe" is the documented alias of "read".
        return cls.READ if value == "safe" else None


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gives back to the model. ``is_error`` marks an observation of failure."""

    content: str
    is_error: bool = False
    data: Any = None


@dataclass
class ToolContext:
    """What a running tool may use: the spawn it serves and the clients it was handed.

    Dependencies come in here rather than through module globals, so a test can hand a tool a
    different knowledge directory or Prometheus URL without touching the environment.
    """

    session_id: str = ""
    spawn_id: str = ""
    call_id: str = ""
    user: str = ""
    role: str = ""
    settings: Any = None
    #: Where command tools run what the model asks for (a ``workers.sandbox.Sandbox``);
    #: ``None``: they run nothing.
    sandbox: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    #: The spawn's context (its ``incident_id``, ``device_id``, …): the spawns it makes inherit it.
    context: dict[str, Any] = field(default_factory=dict)
    #: Set when the worker running the spawn shuts down: a tool that waits (on a specialist)
    #: stops waiting and raises :class:`~registry.errors.WorkerDraining`.
    stopping: threading.Event = field(default_factory=threading.Event)
    #: The skill secrets (``ONGRID_SKILL_*`` by name) the worker took out of its environment:
    #: a skill manifest's HTTP header reads ``${ONGRID_SKILL_X}`` here, and nowhere else.
    secrets: Mapping[str, str] = field(default_factory=dict)


class BaseTool(ABC):
    """A tool the model may call. Subclasses set the four descriptors and implement :meth:`run`."""

    name: str
    description: str
    tool_class: ToolClass
    args_model: type[BaseModel]
    #: Safe to run again with the same call id after a crash (the loop re-runs it rather than
    #: reporting "outcome unknown"). Only tools that make repeats harmless set this.
    idempotent: bool = False
    #: Where the tool comes from when it is not code of the runtime: the plugin that brought it
    #: (a skill manifest's tool, a plugin's MCP server), or ``config`` (an MCP server of the
    #: config file). A persona gets such a tool only by naming it in ``tools`` (a name or a
    #: pattern), never by inheriting its role's set (:func:`registry.policy.resolve_bag`).
    bundle: str = ""
    #: How many calls of this tool the loop runs per model reply and per spawn; the others get
    #: an error result (``spawn_agent``: the dispatch bounds). ``None``: no bound.
    call_limits: CallLimits | None = None
    #: Settings the tool cannot work without (fields of ``registry.settings.Settings``, or
    #: ``extra`` keys): while one is unset the tool answers "not configured", and
    #: ``ongrid agents lint`` names it for every persona whose bag holds the tool.
    requires: tuple[str, ...] = ()

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments, as sent to the model (a copy: callers may change
        it)."""
        return copy.deepcopy(_schema_of(self.args_model))

    def validate_arguments(self, arguments: Mapping[str, Any] | None) -> BaseModel:
        """Check ``arguments`` against the schema; :class:`ToolArgumentError` says what is wrong.

        Before the schema, every tool's arguments are bounded: at most
        :data:`MAX_ARGUMENTS_BYTES` as JSON, :data:`MAX_ARGUMENTS_DEPTH` levels deep, and no NUL
        character in any string (no path, command or query may carry one).
        """
        raw = dict(arguments or {})
        problem = _argument_problem(raw)
        if problem:
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problem}")
        try:
            return self.args_model.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}") from None

    @abstractmethod
    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        """Execute with already validated arguments. Raising is allowed: the loop reports it."""

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description: name, description, class and argument schema."""
        described = {
            "name": self.name,
            "description": self.description,
            "class": self.tool_class.value,
            "parameters": self.parameters,
        }
        if self.bundle:
            described["bundle"] = self.bundle
        return described

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.tool_class.value})>"


@functools.lru_cache(maxsize=4096)
def _schema_of(args_model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of ``args_model``, generated once: pydantic builds it anew on each call,
    which showed in a worker's profile (every spawn describes its tools)."""
    schema = args_model.model_json_schema()
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return schema


def _argument_problem(arguments: dict[str, Any]) -> str:
    # Depth first: serialising a hostile depth would itself exhaust the recursion limit.
    for item, depth in walk_json(arguments):
        if depth > MAX_ARGUMENTS_DEPTH and isinstance(item, dict | list):
            return f"the arguments nest deeper than {MAX_ARGUMENTS_DEPTH} levels"
        if isinstance(item, str) and "\0" in item:
            return "a string contains a NUL character"
    if len(json.dumps(arguments, default=str)) > MAX_ARGUMENTS_BYTES:
        return f"the arguments are larger than {MAX_ARGUMENTS_BYTES // 1024} KiB"
    return ""


class _StrictArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionTool(BaseTool):
    """A tool made from a plain function by :func:`function_tool`."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str,
        description: str,
        tool_class: ToolClass,
        args_model: type[BaseModel],
        wants_context: bool,
        requires: tuple[str, ...] = (),
    ) -> None:
        self.func = func
        self.name = name
        self.description = description
        self.tool_class = tool_class
        self.args_model = args_model
        self._wants_context = wants_context
        self.requires = requires

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        kwargs = {k: getattr(arguments, k) for k in type(arguments).model_fields}
        if self._wants_context:
            kwargs["context"] = context
        out = self.func(**kwargs)
        return out if isinstance(out, ToolResult) else ToolResult(content=str(out))


def function_tool(
    tool_class: ToolClass | str = ToolClass.READ,
    *,
    name: str | None = None,
    requires: Iterable[str] = (),
) -> Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed function into a tool; the schema comes from its signature, the text from its
    docstring. A parameter named ``context`` receives the :class:`ToolContext` and is not shown to
    the model. Parameters may use ``typing.Annotated[..., pydantic.Field(description=...)]``.
    ``requires`` names the settings the tool needs (:attr:`BaseTool.requires`).
    """

    def decorate(func: Callable[..., Any]) -> FunctionTool:
        hints = get_type_hints(func, include_extras=True)
        fields: dict[str, Any] = {}
        wants_context = False
        for pname, param in inspect.signature(func).parameters.items():
            if pname == "context":
                wants_context = True
                continue
            annotation = hints.get(pname, Any)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (annotation, default)
        tool_name = name or func.__name__
        model = create_model(f"{tool_name}_args", __base__=_StrictArgs, **fields)
        return FunctionTool(
            func,
            name=tool_name,
            description=inspect.cleandoc(func.__doc__ or tool_name),
            tool_class=ToolClass(tool_class),
            args_model=model,
            wants_context=wants_context,
            requires=tuple(requires),
        )

    return decorate


class ToolCatalog:
    """Every tool registered in this process, by name. Built once at start-up."""

    def __init__(self, tools: Iterable[BaseTool] = ()) -> None:
        self._tools: dict[str, BaseTool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: BaseTool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> BaseTool:
        try:
            return self._tools[name]
        except KeyError:
            raise NotFoundError("tool", name, sorted(self._tools)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[BaseTool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)
