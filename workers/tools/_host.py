"""Host facts from psutil: ``host_probe`` (the full report), ``get_edge_summary`` (a few lines)."""

from __future__ import annotations

import os
import platform
import socket
import time
from typing import Annotated, Any, Literal

import psutil
from pydantic import Field

from registry.tools import ToolClass, ToolResult, function_tool
from workers.tools._common import to_json

__all__ = ["TOOLS", "collect_disks", "collect_memory", "collect_system"]

Section = Literal["all", "cpu", "memory", "disk", "processes", "network"]

#: Sampling window for CPU percentages: long enough to mean something, short enough for a turn.
_CPU_SAMPLE_SECONDS = 0.3
_TOP_PROCESSES = 10


def _gib(n: float) -> float:
    return round(n / 1024**3, 2)


def _duration(seconds: float) -> str:
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}d {hours}h {rest // 60}m"


def collect_system() -> dict[str, Any]:
    """Hostname, OS, uptime and load average."""
    uptime = time.time() - psutil.boot_time()
    load = [round(x, 2) for x in os.getloadavg()]
    return {
        "hostname": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "uptime_seconds": int(uptime),
        "uptime": _duration(uptime),
        "load_average": {"1m": load[0], "5m": load[1], "15m": load[2]},
    }


def collect_cpu() -> dict[str, Any]:
    """CPU counts, busy percentage over a short window, and load per core."""
    logical = psutil.cpu_count() or 1
    times = psutil.cpu_times_percent(interval=_CPU_SAMPLE_SECONDS)
    return {
        "logical_cpus": logical,
        "physical_cpus": psutil.cpu_count(logical=False),
        "percent": round(100.0 - times.idle, 1),
        "iowait_percent": getattr(times, "iowait", None),
        "steal_percent": getattr(times, "steal", None),
        "load_per_cpu_1m": round(os.getloadavg()[0] / logical, 2),
    }


def collect_memory() -> dict[str, Any]:
    """RAM and swap, in GiB and percent."""
    mem, swap = psutil.virtual_memory(), psutil.swap_memory()
    return {
        "memory": {
            "total_gib": _gib(mem.total),
            "available_gib": _gib(mem.available),
            "used_gib": _gib(mem.used),
            "percent": mem.percent,
        },
        "swap": {
            "total_gib": _gib(swap.total),
            "used_gib": _gib(swap.used),
            "percent": swap.percent,
        },
    }


def _filesystem(mountpoint: str, device: str, fstype: str) -> dict[str, Any]:
    usage = psutil.disk_usage(mountpoint)
    st = os.statvfs(mountpoint)
    inodes_used = st.f_files - st.f_ffree
    return {
        "mountpoint": mountpoint,
        "device": device,
        "fstype": fstype,
        "total_gib": _gib(usage.total),
        "used_gib": _gib(usage.used),
        "free_gib": _gib(usage.free),
        "used_percent": usage.percent,
        "inodes_total": st.f_files,
        "inodes_used": inodes_used,
        # Filesystems without fixed inode tables (btrfs, some overlays) report 0 inodes.
        "inodes_used_percent": round(100.0 * inodes_used / st.f_files, 1) if st.f_files else None,
    }


def collect_disks() -> list[dict[str, Any]]:
    """Usage and inode usage of every mounted device filesystem, ``/`` always included."""
    # all=False keeps filesystems backed by a device; pseudo and bind mounts only add noise.
    mounts = {"/": ("rootfs", "")}
    for part in psutil.disk_partitions(all=False):
        mounts[part.mountpoint] = (part.device, part.fstype)
    # A bind mount (``ip netns`` makes one of /run/netns, containers many) shows the same
    # filesystem again: each is reported once, at its shortest mount point.
    shown: dict[int, str] = {}
    for mountpoint in sorted(mounts, key=lambda m: (len(m), m)):
        try:
            shown.setdefault(os.stat(mountpoint).st_dev, mountpoint)
        except OSError:
            continue
    disks = []
    for mountpoint, (device, fstype) in sorted(mounts.items()):
        if mountpoint not in shown.values():
            continue
        try:
            disks.append(_filesystem(mountpoint, device, fstype))
        except OSError:  # stale NFS handles, unreadable mounts: skip rather than fail the probe
            continue
    return disks


def collect_processes(limit: int = _TOP_PROCESSES) -> dict[str, Any]:
    """The busiest processes by CPU (sampled over a short window) and by resident memory."""
    procs = list(psutil.process_iter(["pid", "name", "username", "memory_percent", "memory_info"]))
    for proc in procs:  # the first cpu_percent() call only starts the measurement
        try:
            proc.cpu_percent(None)
        except psutil.Error:
            continue
    time.sleep(_CPU_SAMPLE_SECONDS)
    rows = []
    for proc in procs:
        try:
            cpu = proc.cpu_percent(None)
        except psutil.Error:
            continue
        info = proc.info
        rss = info["memory_info"].rss if info.get("memory_info") else 0
        rows.append(
            {
                "pid": info["pid"],
                "name": info["name"],
                "user": info["username"],
                "cpu_percent": cpu,
                "rss_mib": round(rss / 1024**2, 1),
                "memory_percent": round(info.get("memory_percent") or 0.0, 2),
            }
        )
    return {
        "top_cpu": sorted(rows, key=lambda r: r["cpu_percent"], reverse=True)[:limit],
        "top_memory": sorted(rows, key=lambda r: r["rss_mib"], reverse=True)[:limit],
        "process_count": len(rows),
    }


def _io_counters(io: Any) -> dict[str, int | None]:
    fields = {
        "bytes_sent": "bytes_sent",
        "bytes_recv": "bytes_recv",
        "errors_in": "errin",
        "errors_out": "errout",
        "drops_in": "dropin",
        "drops_out": "dropout",
    }
    return {key: getattr(io, attr, None) for key, attr in fields.items()}


def collect_network() -> list[dict[str, Any]]:
    """Per-interface state, addresses and byte/error/drop counters."""
    stats, addrs = psutil.net_if_stats(), psutil.net_if_addrs()
    counters = psutil.net_io_counters(pernic=True)
    interfaces = []
    for name in sorted(set(stats) | set(addrs)):
        stat = stats.get(name)
        interfaces.append(
            {
                "interface": name,
                "up": stat.isup if stat else None,
                "speed_mbps": stat.speed if stat else None,
                "addresses": [
                    a.address
                    for a in addrs.get(name, [])
                    if a.family in (socket.AF_INET, socket.AF_INET6)
                ],
                **_io_counters(counters.get(name)),
            }
        )
    return interfaces


def _report(section: Section) -> dict[str, Any]:
    report: dict[str, Any] = collect_system()
    if section in ("all", "cpu"):
        report["cpu"] = collect_cpu()
    if section in ("all", "memory"):
        report.update(collect_memory())
    if section in ("all", "disk"):
        report["filesystems"] = collect_disks()
    if section in ("all", "processes"):
        report["processes"] = collect_processes()
    if section in ("all", "network"):
        report["network"] = collect_network()
    return report


@function_tool(ToolClass.READ, name="host_probe")
def host_probe(
    section: Annotated[Section, Field(description="Which part of the report to collect.")] = "all",
) -> ToolResult:
    """Probe the host this worker runs on and return JSON facts.

    Always includes hostname, OS, uptime and load average (1/5/15 min). Sections:
    `cpu` (CPU count, busy %, iowait/steal %, load per core), `memory` (RAM and swap in GiB and %),
    `disk` (every mounted filesystem: size, used, free, used %, inode totals and inode used % -
    a filesystem can be "full" on inodes with free bytes), `processes` (top 10 by CPU over a 0.3 s
    sample and top 10 by resident memory), `network` (interfaces, addresses, byte/error/drop
    counters), or `all`. Numbers are measured live, not cached.
    """
    report = _report(section)
    return ToolResult(content=to_json(report), data=report)


def _busiest(disks: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(disks, key=lambda d: d["used_percent"], default=None)


@function_tool(ToolClass.READ, name="get_edge_summary")
def get_edge_summary() -> ToolResult:
    """A five-line health summary of this host: hostname, uptime, load average per CPU count,
    memory used %, and the fullest filesystem (bytes and inodes). Use it for a first look;
    call `host_probe` for the detail behind any number that looks wrong."""
    system, memory, disks = collect_system(), collect_memory(), collect_disks()
    load = system["load_average"]
    busiest = _busiest(disks)
    lines = [
        f"host: {system['hostname']} ({system['os']})",
        f"uptime: {system['uptime']}",
        f"load: {load['1m']} / {load['5m']} / {load['15m']} on {psutil.cpu_count() or 1} CPUs",
        f"memory: {memory['memory']['percent']}% used of {memory['memory']['total_gib']} GiB, "
        f"swap {memory['swap']['percent']}% used",
    ]
    if busiest:
        lines.append(
            f"fullest filesystem: {busiest['mountpoint']} {busiest['used_percent']}% used "
            f"({busiest['free_gib']} GiB free), inodes {busiest['inodes_used_percent']}% used"
        )
    summary = {"system": system, **memory, "busiest_filesystem": busiest}
    return ToolResult(content="\n".join(lines), data=summary)


TOOLS = (host_probe, get_edge_summary)
