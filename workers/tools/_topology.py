"""The service/device topology: ``find_topology_node``, ``expand_topology``, ``query_devices``.

The topology is a YAML file (setting ``topology_file``) of the shape
``{nodes: [{id, name, kind, labels: {}}], edges: [{from, to, kind}]}``; an edge ``from -> to``
reads "from depends on / contains to", so walking ``down`` follows edges and ``up`` reverses them.
It is read on every call, so an edited file is seen at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._common import error, not_configured, setting, to_json

__all__ = ["TOOLS", "Topology", "TopologyError", "load_topology"]

MAX_RESULTS = 200


class TopologyError(Exception):
    """The topology file is missing or not of the expected shape."""


@dataclass(frozen=True)
class Topology:
    """Nodes by id, and edges as ``(from, to, kind)``."""

    nodes: dict[str, dict[str, Any]]
    edges: list[tuple[str, str, str]]

    def neighbours(self, node_id: str, direction: str) -> list[tuple[str, dict[str, str]]]:
        """Adjacent node ids with the edge that leads there, in file order."""
        found = []
        for src, dst, kind in self.edges:
            if direction in ("down", "both") and src == node_id:
                found.append((dst, {"from": src, "to": dst, "kind": kind}))
            if direction in ("up", "both") and dst == node_id:
                found.append((src, {"from": src, "to": dst, "kind": kind}))
        return found


def _node(raw: Any, index: int) -> dict[str, Any]:
    if not isinstance(raw, dict) or not raw.get("id"):
        raise TopologyError(f"nodes[{index}] needs an id")
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict):
        raise TopologyError(f"nodes[{index}].labels must be a mapping")
    return {
        "id": str(raw["id"]),
        "name": str(raw.get("name") or raw["id"]),
        "kind": str(raw.get("kind") or ""),
        "labels": {str(k): str(v) for k, v in labels.items()},
    }


def _edge(raw: Any, index: int) -> tuple[str, str, str]:
    if not isinstance(raw, dict) or not raw.get("from") or not raw.get("to"):
        raise TopologyError(f"edges[{index}] needs from and to")
    return str(raw["from"]), str(raw["to"]), str(raw.get("kind") or "")


def load_topology(path: str) -> Topology:
    """Read and check the file; :class:`TopologyError` names the file and the problem."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
        if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
            raise TopologyError("expected a mapping with a 'nodes' list")
        nodes = [_node(raw, i) for i, raw in enumerate(doc["nodes"])]
        edges = [_edge(raw, i) for i, raw in enumerate(doc.get("edges") or [])]
    except (OSError, yaml.YAMLError, TopologyError) as exc:
        raise TopologyError(f"topology file {path}: {exc}") from None
    return Topology({n["id"]: n for n in nodes}, edges)


def _load(context: ToolContext, tool: str) -> Topology | ToolResult:
    path = setting(context, "topology_file")
    if not path:
        return not_configured(tool, "ONGRID_TOPOLOGY_FILE", "path of the topology YAML file")
    try:
        return load_topology(str(path))
    except TopologyError as exc:
        return error(str(exc))


def _haystack(node: dict[str, Any]) -> list[str]:
    labels = node["labels"]
    fields = [node["id"], node["name"], *labels.values(), *(f"{k}={v}" for k, v in labels.items())]
    return [f.lower() for f in fields]


def _listing(nodes: list[dict[str, Any]], what: str) -> ToolResult:
    shown = nodes[:MAX_RESULTS]
    text = to_json({"count": len(nodes), "nodes": shown})
    if len(nodes) > MAX_RESULTS:
        text += f"\n[{len(nodes) - MAX_RESULTS} more {what} not shown; narrow the query]"
    return ToolResult(content=text, data=nodes)


@function_tool(ToolClass.READ, name="find_topology_node", requires=("topology_file",))
def find_topology_node(
    query: Annotated[
        str,
        Field(
            description="Text to look for: a node id, a name, a label value "
            "or key=value (case-insensitive substring)."
        ),
    ],
    context: ToolContext,
) -> ToolResult:
    """Find nodes of the service/device topology whose id, name or labels contain `query`
    (case-insensitive). Exact id or name matches come first. Use the returned `id` with
    `expand_topology` to see what a node depends on and what depends on it."""
    topo = _load(context, "find_topology_node")
    if isinstance(topo, ToolResult):
        return topo
    needle = query.strip().lower()
    matches = [n for n in topo.nodes.values() if any(needle in f for f in _haystack(n))]
    matches.sort(key=lambda n: needle not in (n["id"].lower(), n["name"].lower()))
    return _listing(matches, "nodes")


def _resolve(topo: Topology, node_id: str) -> str | None:
    if node_id in topo.nodes:
        return node_id
    wanted = node_id.strip().lower()
    return next(
        (n["id"] for n in topo.nodes.values() if wanted in (n["id"].lower(), n["name"].lower())),
        None,
    )


def _walk(topo: Topology, start: str, depth: int, direction: str) -> dict[str, Any]:
    distance = {start: 0}
    edges: list[dict[str, str]] = []
    seen_edges: set[tuple[str, ...]] = set()
    queue = deque([start])
    while queue:
        current = queue.popleft()
        if distance[current] == depth:
            continue
        for neighbour, edge in topo.neighbours(current, direction):
            key = tuple(edge.values())
            if key not in seen_edges:
                seen_edges.add(key)
                edges.append(edge)
            if neighbour not in distance:
                distance[neighbour] = distance[current] + 1
                queue.append(neighbour)
    nodes = [
        {**topo.nodes.get(n, {"id": n, "name": n, "kind": "unknown", "labels": {}}), "distance": d}
        for n, d in distance.items()
    ]
    return {"root": start, "direction": direction, "depth": depth, "nodes": nodes, "edges": edges}


@function_tool(ToolClass.READ, name="expand_topology", requires=("topology_file",))
def expand_topology(
    node_id: Annotated[str, Field(description="Node id (or exact name) to start from.")],
    context: ToolContext,
    depth: Annotated[int, Field(ge=1, le=6, description="How many hops to walk.")] = 1,
    direction: Annotated[
        Literal["up", "down", "both"],
        Field(
            description="down: what the node depends on / contains; up: what "
            "depends on it (blast radius); both."
        ),
    ] = "both",
) -> ToolResult:
    """Walk the topology breadth-first from one node, up to `depth` hops, and return the nodes
    reached (with their distance) and the edges walked (from, to, kind). Use `up` to find what an
    outage of this node affects, `down` to find the components it relies on."""
    topo = _load(context, "expand_topology")
    if isinstance(topo, ToolResult):
        return topo
    start = _resolve(topo, node_id)
    if start is None:
        return error(f"no topology node {node_id!r}; search with find_topology_node first")
    walk = _walk(topo, start, depth, direction)
    return ToolResult(content=to_json(walk), data=walk)


def _has_label(node: dict[str, Any], label: str) -> bool:
    key, eq, value = label.partition("=")
    labels = {k.lower(): v.lower() for k, v in node["labels"].items()}
    key = key.strip().lower()
    return key in labels and (not eq or labels[key] == value.strip().lower())


@function_tool(ToolClass.READ, name="query_devices", requires=("topology_file",))
def query_devices(
    context: ToolContext,
    kind: Annotated[
        str | None,
        Field(
            description="Only nodes of this kind (e.g. host, switch, service); case-insensitive."
        ),
    ] = None,
    label: Annotated[
        str | None,
        Field(description="Only nodes with this label: 'key' or 'key=value'; case-insensitive."),
    ] = None,
) -> ToolResult:
    """List topology nodes (devices, hosts, services), optionally filtered by `kind` and by a
    label. With no filter it lists every node (up to 200); use it to enumerate, e.g. all hosts
    in site=lisbon."""
    topo = _load(context, "query_devices")
    if isinstance(topo, ToolResult):
        return topo
    nodes = [
        n
        for n in topo.nodes.values()
        if (not kind or n["kind"].lower() == kind.strip().lower())
        and (not label or _has_label(n, label))
    ]
    return _listing(nodes, "nodes")


TOOLS = (find_topology_node, expand_topology, query_devices)
