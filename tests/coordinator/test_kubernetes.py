"""deploy/kubernetes held against the Kubernetes API, KEDA and the code, offline.

No cluster runs here. Each kustomization is rendered by ``kubectl kustomize`` (the overlays
with their example secrets), every object is validated against the Kubernetes API's schemas
(``kubernetes-validate``, strict: an unknown field fails) and KEDA's objects against KEDA's own
CRD schemas (tests/fixtures/keda, copied from KEDA's repository), and the manifests are held
against the code as ``test_compose.py`` holds the Compose file: every ``ongrid`` command parses,
every variable is one the code reads, every queue has a worker Deployment, each ScaledObject
scales the Deployment that serves the queue it measures, and the probes ask what the API serves.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compose import (  # noqa: E402 - the Compose checks' own readers
    OTHER_READERS,
    SETTINGS_VARIABLES,
    parse_ongrid,
    served_queues,
)

from coordinator.api import health  # noqa: E402
from workers.celery_app import QUEUES  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
KEDA_SCHEMAS = REPO / "tests" / "fixtures" / "keda"
#: The Kubernetes version the manifests are validated for (kubernetes-validate's schemas).
KUBERNETES_VERSION = "1.32"
#: Seconds a worker gets to drain before it is killed, at least.
DRAIN_GRACE = 120


def render(tmp_path: Path, target: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` makes of ``target`` (the overlays with the example
    secrets, in a copy of the tree)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is needed to render the kustomizations (`kubectl kustomize`)")
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, tree)
    for example in tree.glob("overlays/*/secrets.env.example"):
        shutil.copy(example, example.with_name("secrets.env"))
    done = subprocess.run(
        [kubectl, "kustomize", str(tree / target)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def keda_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("keda"), "overlays/keda")


def _keda_schema(kind: str) -> dict[str, Any]:
    name = {"ScaledObject": "scaledobjects", "TriggerAuthentication": "triggerauthentications"}
    crd = yaml.safe_load((KEDA_SCHEMAS / f"keda.sh_{name[kind]}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def schema_problems(objects: list[dict[str, Any]]) -> list[str]:
    problems = []
    for obj in objects:
        where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        try:
            if obj.get("apiVersion", "").startswith("keda.sh/"):
                jsonschema.validate(obj, _keda_schema(obj["kind"]))
            else:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            problems.append(f"{where}: {getattr(exc, 'message', exc)}")
    return problems


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return containers


def _deployments(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}


@pytest.mark.parametrize("target", ["base", "overlays/external-services", "overlays/keda"])
def test_every_manifest_is_valid_for_kubernetes_and_keda(tmp_path: Path, target: str) -> None:
    objects = render(tmp_path, target)
    assert objects
    assert schema_problems(objects) == []


def test_the_validation_can_fail() -> None:
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replicas": "two", "selector": {}, "template": {}},
    }
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "y"},
        "spec": {"triggers": [{"type": "redis"}]},  # no scaleTargetRef
    }
    problems = schema_problems([bad, scaled])
    assert len(problems) == 2 and "Deployment x" in problems[0] and "ScaledObject y" in problems[1]


def test_every_command_parses_and_every_variable_is_read(
    keda_objects: list[dict[str, Any]],
) -> None:
    for name, deployment in _deployments(keda_objects).items():
        (container,) = _containers(deployment)
        argv = container["command"]
        assert argv[0] == "ongrid", name
        command = parse_ongrid(argv[1:]).command.name
        for variable in (e["name"] for e in container.get("env", [])):
            reader = OTHER_READERS.get(variable)
            assert variable in SETTINGS_VARIABLES or reader is not None, f"{name}: {variable}"
            if reader is not None and reader.commands is not None:
                assert command in reader.commands, f"{name}: {variable} with ongrid {command}"


def test_each_queue_has_its_deployment_and_its_scaler(keda_objects: list[dict[str, Any]]) -> None:
    deployments = _deployments(keda_objects)
    serving: dict[str, set[str]] = {}
    for name, deployment in deployments.items():
        (container,) = _containers(deployment)
        ctx = parse_ongrid(container["command"][1:])
        if ctx.command.name == "worker":
            serving[name] = served_queues(ctx)
    assert sorted(q for queues in serving.values() for q in queues) == sorted(QUEUES.values())
    scaled = [o for o in keda_objects if o["kind"] == "ScaledObject"]
    assert {o["spec"]["scaleTargetRef"]["name"] for o in scaled} == set(serving)
    for obj in scaled:
        target = obj["spec"]["scaleTargetRef"]["name"]
        (redis_trigger,) = [t for t in obj["spec"]["triggers"] if t["type"] == "redis"]
        assert {redis_trigger["metadata"]["listName"]} == serving[target], target
    # A queue that scales to zero is one the runtime accepts spawns for without a worker.
    from_zero = {
        q
        for o in scaled
        if o["spec"].get("minReplicaCount") == 0
        for q in serving[o["spec"]["scaleTargetRef"]["name"]]
    }
    assert from_zero == {QUEUES["background"]}
    for name, deployment in deployments.items():
        (container,) = _containers(deployment)
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert set(env["ONGRID_AUTOSCALED_QUEUES"].split(",")) == from_zero, name


def test_probes_grace_and_the_sandbox(keda_objects: list[dict[str, Any]]) -> None:
    paths = {getattr(route, "path", "") for route in health.router.routes}
    for name, deployment in _deployments(keda_objects).items():
        spec = deployment["spec"]["template"]["spec"]
        (container,) = _containers(deployment)
        command = parse_ongrid(container["command"][1:])
        for probe in ("livenessProbe", "readinessProbe"):
            path = container.get(probe, {}).get("httpGet", {}).get("path")
            if path and command.command.name == "api":
                assert path in paths, f"{name}: {probe} asks {path}"
        if command.command.name == "worker":
            assert spec["terminationGracePeriodSeconds"] >= DRAIN_GRACE, name
            context = container["securityContext"]
            runs_commands = served_queues(command) & {QUEUES["interactive"], QUEUES["background"]}
            unconfined = context["seccompProfile"]["type"] == "Unconfined"
            assert unconfined == bool(runs_commands), name
            assert (context.get("procMount") == "Unmasked") == bool(runs_commands), name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert spec["securityContext"]["runAsNonRoot"] is True, name
    api = _deployments(keda_objects)["ongrid-api"]
    (container,) = _containers(api)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
