"""registry.tools: function_tool schemas, argument validation, tool classes and the catalog."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from registry.errors import NotFoundError, ToolArgumentError
from registry.tools import (
    AGENT_TOOL_NAME,
    BaseTool,
    FunctionTool,
    ToolCatalog,
    ToolClass,
    ToolContext,
    ToolResult,
    function_tool,
)


@function_tool("read")
def query_promql(
    query: Annotated[str, Field(description="PromQL expression, e.g. up{job='api'}.")],
    step_seconds: int = 60,
    labels: list[str] | None = None,
    context: ToolContext | None = None,
) -> str:
    """Run a PromQL range query.

    Returns one line per series.
    """
    assert context is not None
    return f"{query}|{step_seconds}|{labels}|{context.session_id}|{context.role}"


@function_tool(ToolClass.DESTRUCTIVE, name="wipe_volume")
def _wipe(volume: str, force: bool = False) -> ToolResult:
    return ToolResult(content=f"wiped {volume}", is_error=not force, data={"force": force})


@function_tool("safe")
def ping():  # no annotations, no docstring
    return 42


def test_schema_from_signature() -> None:
    assert query_promql.parameters == {
        "additionalProperties": False,
        "properties": {
            "query": {
                "description": "PromQL expression, e.g. up{job='api'}.",
                "title": "Query",
                "type": "string",
            },
            "step_seconds": {"default": 60, "title": "Step Seconds", "type": "integer"},
            "labels": {
                "anyOf": [{"items": {"type": "string"}, "type": "array"}, {"type": "null"}],
                "default": None,
                "title": "Labels",
            },
        },
        "required": ["query"],
        "type": "object",
    }


def test_context_parameter_is_hidden_from_the_model() -> None:
    assert "context" not in query_promql.parameters["properties"]
    assert "context" not in query_promql.args_model.model_fields
    with pytest.raises(ToolArgumentError, match="context: Extra inputs are not permitted"):
        query_promql.validate_arguments({"query": "up", "context": "forged"})


def test_context_is_passed_at_run_time() -> None:
    args = query_promql.validate_arguments({"query": "up", "labels": ["job"]})
    result = query_promql.run(args, ToolContext(session_id="s-1", role="viewer"))
    assert result == ToolResult(content="up|60|['job']|s-1|viewer")


def test_tool_result_is_passed_through_and_plain_values_become_text() -> None:
    out = _wipe.run(_wipe.validate_arguments({"volume": "vol-9"}), ToolContext())
    assert out == ToolResult(content="wiped vol-9", is_error=True, data={"force": False})
    assert ping.run(ping.validate_arguments(None), ToolContext()) == ToolResult(content="42")


def test_names_classes_and_descriptions() -> None:
    assert isinstance(query_promql, FunctionTool) and isinstance(query_promql, BaseTool)
    assert (query_promql.name, query_promql.tool_class) == ("query_promql", ToolClass.READ)
    assert query_promql.description == "Run a PromQL range query.\n\nReturns one line per series."
    assert (_wipe.name, _wipe.tool_class) == ("wipe_volume", ToolClass.DESTRUCTIVE)
    assert _wipe.description == "wipe_volume"  # no docstring: the name
    assert ping.tool_class is ToolClass.READ  # "safe" is the alias of "read"
    assert ping.parameters == {"additionalProperties": False, "properties": {}, "type": "object"}
    assert repr(_wipe) == "<FunctionTool wipe_volume (destructive)>"


def test_describe() -> None:
    described = _wipe.describe()
    assert described["name"] == "wipe_volume"
    assert described["class"] == "destructive"
    assert described["description"] == "wipe_volume"
    assert described["parameters"]["required"] == ["volume"]
    assert described["parameters"]["properties"]["force"]["default"] is False


def test_tool_class_values_and_alias() -> None:
    assert [c.value for c in ToolClass] == ["read", "write", "destructive"]
    assert ToolClass("safe") is ToolClass.READ
    with pytest.raises(ValueError):
        ToolClass("dangerous")
    with pytest.raises(ValueError):
        function_tool("admin")(ping.func)


def test_valid_arguments() -> None:
    args = query_promql.validate_arguments({"query": "up", "step_seconds": 15})
    assert args.model_dump() == {"query": "up", "step_seconds": 15, "labels": None}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"query": "up", "bogus": 1}, "bogus: Extra inputs are not permitted"),
        ({"query": "up", "step_seconds": "soon"}, "step_seconds: Input should be a valid integer"),
        ({"query": ["up"]}, "query: Input should be a valid string"),
        ({"query": "up", "labels": "job"}, "labels: Input should be a valid list"),
        ({"step_seconds": 5}, "query: Field required"),
        (None, "query: Field required"),
    ],
)
def test_invalid_arguments_name_the_argument(arguments: Any, message: str) -> None:
    with pytest.raises(ToolArgumentError) as info:
        query_promql.validate_arguments(arguments)
    assert str(info.value).startswith("invalid arguments for query_promql: ")
    assert message in str(info.value)


def test_every_problem_is_listed() -> None:
    with pytest.raises(ToolArgumentError) as info:
        query_promql.validate_arguments({"step_seconds": "x", "extra": 1})
    text = str(info.value)
    assert "query: Field required" in text
    assert "step_seconds: Input should be a valid integer" in text
    assert "extra: Extra inputs are not permitted" in text


class _Args(BaseModel):
    target: str


class EchoTool(BaseTool):
    name = "echo"
    description = "Echo the target."
    tool_class = ToolClass.WRITE
    args_model = _Args

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        assert isinstance(arguments, _Args)
        return ToolResult(content=arguments.target)


def test_a_hand_written_tool() -> None:
    tool = EchoTool()
    assert tool.parameters == {
        "properties": {"target": {"title": "Target", "type": "string"}},
        "required": ["target"],
        "type": "object",
    }
    assert tool.run(tool.validate_arguments({"target": "x"}), ToolContext()).content == "x"


def test_catalog() -> None:
    catalog = ToolCatalog([query_promql, _wipe])
    catalog.register(ping)
    assert catalog.names() == ["query_promql", "wipe_volume", "ping"]
    assert len(catalog) == 3 and list(catalog) == [query_promql, _wipe, ping]
    assert "ping" in catalog and "pong" not in catalog
    assert catalog.get("wipe_volume") is _wipe
    with pytest.raises(NotFoundError) as info:
        catalog.get("pong")
    assert str(info.value) == "unknown tool 'pong'; known: ping, query_promql, wipe_volume"
    with pytest.raises(ValueError, match="tool 'ping' is registered twice"):
        catalog.register(ping)


def test_agent_tool_name() -> None:
    assert AGENT_TOOL_NAME == "spawn_agent"
