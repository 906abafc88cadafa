"""The fleet: what every worker process runs, compared with this API's registry.

Each worker reports its registry version and digests of its persona set (:mod:`workers.fleet`);
``GET /api/v1/workers`` lists the live ones and flags a worker that lags the cluster's registry
version, one whose personas differ from the API's at the same version (naming them), workers
that disagree among themselves, and this API process when it is behind the cluster or a worker.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from coordinator.api.deps import Caller, Services, Svc
from coordinator.api.schemas import ErrorOut
from workers.fleet import (
    ApiRegistry,
    FleetAssessment,
    FleetReport,
    Status,
    assess_fleet,
    loaded_registry,
    persona_digests,
    read_fleet_at,
)
from workers.reload import cluster_version

__all__ = ["ApiRegistryOut", "FleetOut", "WorkerOut", "assess", "router"]

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 503)}

router = APIRouter(tags=["workers"], responses=_ERRORS)


class WorkerOut(FleetReport):
    """One live worker process: its report and what is wrong with it."""

    status: Status = Field(
        description="`ok`; `lagging`: its registry is behind the cluster's version; `differs`: "
        "its personas differ from the API's at the same version, or from other workers'."
    )
    flags: list[str] = Field(description="Each reason for the status, in words.")


class ApiRegistryOut(BaseModel):
    """The registry of the API process that answered."""

    registry_version: int = Field(description="The cluster version its registry is loaded at.")
    persona_digest: str = Field(description="Digest of its persona set (and plugins).")
    flags: list[str] = Field(
        description="Why it is behind: the cluster's version, or workers already at a later one."
    )


class FleetOut(BaseModel):
    cluster_version: int = Field(description="The cluster's registry version.")
    api: ApiRegistryOut
    workers: list[WorkerOut] = Field(description="The live worker processes, by member.")
    consistent: bool = Field(description="No worker and not the API is flagged.")


def assess(svc: Services) -> FleetAssessment:
    """The live workers' reports compared with this process's registry, caught up first."""
    svc.snapshot()  # a reload this process missed is applied before it judges the others
    version, snapshot = loaded_registry(svc.follower)
    api = ApiRegistry(version, snapshot.digest, persona_digests(snapshot))
    prefix = svc.settings.key_prefix
    now, reports = read_fleet_at(svc.probe, prefix)
    return assess_fleet(cluster_version(svc.probe, prefix), api, reports, now)


def fleet_out(assessment: FleetAssessment) -> FleetOut:
    """The response body of an assessment."""
    api = assessment.api
    return FleetOut(
        cluster_version=assessment.cluster_version,
        api=ApiRegistryOut(
            registry_version=api.registry_version,
            persona_digest=api.persona_digest,
            flags=list(assessment.api_flags),
        ),
        workers=[
            WorkerOut(**w.report.model_dump(), status=w.status, flags=list(w.flags))
            for w in assessment.workers
        ],
        consistent=assessment.consistent,
    )


@router.get("/api/v1/workers", response_model=FleetOut)
def workers(who: Caller, svc: Svc) -> FleetOut:
    """Every live worker process with its registry version and persona digests, flagged when
    it lags the cluster or runs other personas than this API (or than the other workers)."""
    return fleet_out(assess(svc))
