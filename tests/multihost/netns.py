"""Three hosts made of Linux network namespaces, on one bridge, and a link to the test process.

With a prefix ``P`` (``og`` and 4 hex digits, unique per run) and a subnet ``10.X.Y.0/24`` that
nothing on this machine routes yet::

    root namespace (the tests: "lab")      namespace P-ctl               P-w1, P-w2
      P-lab 10.X.Y.254 ═══ veth ═══ lab ─┐
                                         br0 10.X.Y.1 (ctl)
                                    w1 ──┤══ veth ══ eth0 10.X.Y.2 (w1)
                                    w2 ──┘══ veth ══ eth0 10.X.Y.3 (w2)

Every host knows the others' MAC addresses by permanent neighbour entries, so a cut link (the
ctl end of a host's veth set down) drops packets in silence: no ARP failure turns a connect into
"no route to host", TCP just stalls, as it does behind a dead switch port.

A run claims its prefix with an owner file (``/tmp/ongrid-mh-P.owner``: pid and start time)
before it creates anything; a later run removes what a dead owner left (namespaces, the root
end of the lab link, the run directory), and only names of this harness's pattern.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "HOSTS",
    "WORKER_HOSTS",
    "IpMissing",
    "Network",
    "NetnsUnavailable",
    "remove_leftovers",
]

#: The hosts in namespaces of their own.
HOSTS = ("ctl", "w1", "w2")
WORKER_HOSTS = ("w1", "w2")
#: The root namespace, where the test process runs, as a host name.
LAB = "lab"
#: Last octet of each host's address in the run's /24.
_OCTETS = {"ctl": 1, "w1": 2, "w2": 3, LAB: 254}
_BRIDGE = "br0"
_PREFIX = re.compile(r"og[0-9a-f]{4}")
_NAMESPACE = re.compile(rf"({_PREFIX.pattern})-({'|'.join(HOSTS)})")
_LAB_LINK = re.compile(rf"({_PREFIX.pattern})-{LAB}")
_RUN_DIR = re.compile(rf"ongrid-mh-({_PREFIX.pattern})(\.owner)?")
_TMP = Path(tempfile.gettempdir())
#: Held while a run picks its subnet and routes it, so two runs starting at once differ.
_SUBNET_LOCK = _TMP / "ongrid-mh.lock"
#: Seconds any one ``ip`` command may take.
_IP_TIMEOUT = 30.0
#: Seconds the processes a run left behind get to exit on SIGTERM before they are killed.
_TERM_GRACE = 10.0

#: What a host runs to try one TCP connect: prints ``connected``, ``timeout`` or the errno name.
_CONNECT_PROBE = """
import errno, socket, sys
addr, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    socket.create_connection((addr, port), timeout=timeout).close()
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(errno.errorcode.get(exc.errno or 0, type(exc).__name__))
else:
    print("connected")
"""


class IpMissing(RuntimeError):
    """No ``ip`` command (iproute2) on this machine."""


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no permission, no kernel support);
    the message is ``ip``'s own stderr."""


class IpFailed(RuntimeError):
    """An ``ip`` command failed; the message names it and carries its stderr."""

    def __init__(self, argv: list[str], stderr: str) -> None:
        self.stderr = stderr
        super().__init__(f"{' '.join(argv)}: {stderr}")


def ip_command() -> str:
    """The path of ``ip``: on ``PATH``, or in the sbin directories a non-root ``PATH`` lacks."""
    found = shutil.which("ip")
    for candidate in (found, "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise IpMissing("no `ip` command: install iproute2 (./dev test installs it)")


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip args``; its stdout, or :class:`IpFailed` with its stderr."""
    argv = [ip_command(), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_IP_TIMEOUT)
    if check and done.returncode != 0:
        raise IpFailed(argv, done.stderr.strip())
    return done.stdout


def _json(*args: str) -> list[dict[str, object]]:
    out = ip("-j", *args).strip()
    return json.loads(out) if out else []


# -- owners and leftovers ----------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live owner from a reused pid), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_path(prefix: str) -> Path:
    return _TMP / f"ongrid-mh-{prefix}.owner"


def run_root(prefix: str) -> Path:
    """The directory of a run's hosts: ``/tmp/ongrid-mh-<prefix>``."""
    return _TMP / f"ongrid-mh-{prefix}"


def _owner_alive(prefix: str) -> bool:
    try:
        pid, started = _owner_path(prefix).read_text().split()
    except (OSError, ValueError):
        return False
    return _start_time(int(pid)) == started


def _claim(prefix: str) -> bool:
    """Become the owner of ``prefix``: the owner file appears complete (a hard link of a file
    already written), or not at all if another run has it."""
    me = os.getpid()
    partial = _TMP / f".ongrid-mh-{prefix}.{me}.tmp"
    partial.write_text(f"{me} {_start_time(me)}\n")
    try:
        os.link(partial, _owner_path(prefix))
    except FileExistsError:
        return False
    finally:
        partial.unlink()
    return True


def _claim_fresh_prefix() -> str:
    """A prefix no live run owns, claimed for this one."""
    for _ in range(1000):
        prefix = f"og{secrets.token_hex(2)}"
        if not run_root(prefix).exists() and _claim(prefix):
            return prefix
    raise RuntimeError("no free og<4 hex> prefix: every one tried is owned by another run")


def _namespaces() -> list[str]:
    return [str(entry["name"]) for entry in _json("netns", "list")]


def _root_links() -> list[str]:
    return [str(entry["ifname"]) for entry in _json("link", "show")]


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _end_processes(namespaces: list[str]) -> None:
    """End what runs in ``namespaces``: SIGTERM first, so a server shuts down cleanly (a killed
    PostgreSQL leaves its shared memory behind), then SIGKILL whatever is left after a while."""

    def running() -> list[int]:
        found = (ip("netns", "pids", ns, check=False).split() for ns in namespaces)
        return [int(pid) for pids in found for pid in pids]

    _signal_all(running(), signal.SIGTERM)
    deadline = time.monotonic() + _TERM_GRACE
    while (left := running()) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_all(left, signal.SIGKILL)


def _destroy(prefix: str) -> None:
    """Remove everything of ``prefix``: processes in its namespaces, its links, namespaces and
    run directory; the owner file last, since it is what says the rest may exist."""
    present = set(_namespaces())
    namespaces = [f"{prefix}-{host}" for host in HOSTS if f"{prefix}-{host}" in present]
    _end_processes(namespaces)
    if f"{prefix}-{LAB}" in _root_links():
        ip("link", "delete", f"{prefix}-{LAB}", check=False)  # its peer goes with it
    for namespace in namespaces:
        ip("netns", "delete", namespace, check=False)
    shutil.rmtree(run_root(prefix), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        _owner_path(prefix).unlink()


def remove_leftovers() -> list[str]:
    """Destroy what runs that died left behind (only names of this harness's pattern, only of
    owners no longer alive); returns the prefixes removed."""
    prefixes: set[str] = set()
    for name in _namespaces():
        if found := _NAMESPACE.fullmatch(name):
            prefixes.add(found.group(1))
    for name in _root_links():
        if found := _LAB_LINK.fullmatch(name):
            prefixes.add(found.group(1))
    for path in _TMP.iterdir():
        if found := _RUN_DIR.fullmatch(path.name):
            prefixes.add(found.group(1))
    dead = sorted(p for p in prefixes if not _owner_alive(p))
    for prefix in dead:
        _destroy(prefix)
    return dead


# -- the network -------------------------------------------------------------------------------


def _routed() -> list[ipaddress.IPv4Network]:
    routes = []
    for route in _json("-4", "route", "show", "table", "all"):
        dst = str(route.get("dst", ""))
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                routes.append(ipaddress.IPv4Network(dst, strict=False))
    return routes


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.X.Y.0/24 that overlaps no route of this machine."""
    taken = _routed()
    for _ in range(1000):
        candidate = ipaddress.IPv4Network(
            f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.0/24"
        )
        if not any(candidate.overlaps(route) for route in taken):
            return candidate
    raise RuntimeError("no free 10.X.Y.0/24 subnet: every one tried is routed already")


class Network:
    """The namespaces ``<prefix>-ctl``, ``-w1``, ``-w2``, the bridge, the veth pairs, the lab
    link, and the run directory. Build it with :meth:`create`; :meth:`close` removes it all."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.subnet: ipaddress.IPv4Network | None = None
        self.root = run_root(prefix)

    @classmethod
    def create(cls) -> Network:
        """Claim a fresh prefix and build the network; half a network is removed on failure.

        :class:`IpMissing` without ``ip``; :class:`NetnsUnavailable` (``ip``'s stderr) when
        namespaces cannot be made here.
        """
        ip_command()
        remove_leftovers()
        network = cls(_claim_fresh_prefix())
        try:
            network.root.mkdir(mode=0o755)
            network.root.chmod(0o755)  # PostgreSQL's user must be able to traverse it
            network._build()
        except BaseException:
            network.close()
            raise
        return network

    # -- names and addresses -------------------------------------------------------------------

    def namespace(self, host: str) -> str:
        if host not in HOSTS:
            raise ValueError(f"unknown host {host!r}; hosts: {', '.join(HOSTS)}")
        return f"{self.prefix}-{host}"

    def addr(self, host: str) -> str:
        """The IPv4 address of ``host`` (``ctl``, ``w1``, ``w2``, or ``lab``: this process)."""
        assert self.subnet is not None, "the network is not built"
        return str(self.subnet.network_address + _OCTETS[host])

    def _mac(self, host: str) -> str:
        # Locally administered (02:), "og", the prefix's 4 hex digits, the host's octet.
        digits = self.prefix[2:]
        return f"02:6f:67:{digits[:2]}:{digits[2:]}:{_OCTETS[host]:02x}"

    def _device(self, host: str) -> str:
        """The interface holding ``host``'s address."""
        return {"ctl": _BRIDGE, LAB: f"{self.prefix}-{LAB}"}.get(host, "eth0")

    def _in(self, host: str) -> tuple[str, ...]:
        """``ip`` arguments that address ``host``'s namespace (none for the lab)."""
        return () if host == LAB else ("-n", self.namespace(host))

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run in ``host``'s namespace (``lab``: as it is)."""
        if host == LAB:
            return list(argv)
        return [ip_command(), "netns", "exec", self.namespace(host), *argv]

    # -- building ------------------------------------------------------------------------------

    def _build(self) -> None:
        for host in HOSTS:
            try:
                ip("netns", "add", self.namespace(host))
                ip("netns", "exec", self.namespace(host), "true")
            except IpFailed as exc:
                raise NetnsUnavailable(exc.stderr) from None
            ip("-n", self.namespace(host), "link", "set", "lo", "up")
        with open(_SUBNET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the lab route exists
            self.subnet = _free_subnet()
            self._bridge()
            for host in WORKER_HOSTS:
                self._attach(host)
            self._attach_lab()
        self._pin_neighbours()

    def _address(self, host: str) -> str:
        assert self.subnet is not None
        return f"{self.addr(host)}/{self.subnet.prefixlen}"

    def _bridge(self) -> None:
        ctl = self._in("ctl")
        # An address given at creation stays: the bridge's MAC never follows its ports'.
        ip(*ctl, "link", "add", _BRIDGE, "address", self._mac("ctl"), "type", "bridge")
        ip(*ctl, "addr", "add", self._address("ctl"), "dev", _BRIDGE)
        ip(*ctl, "link", "set", _BRIDGE, "up")

    def _attach(self, host: str) -> None:
        """A veth pair: ``eth0`` in the host's namespace, the end named ``host`` on the bridge."""
        namespace, ctl = self.namespace(host), self.namespace("ctl")
        ip(
            "link",
            "add",
            "eth0",
            "netns",
            namespace,
            "address",
            self._mac(host),
            "type",
            "veth",
            "peer",
            "name",
            host,
            "netns",
            ctl,
        )
        ip("-n", namespace, "addr", "add", self._address(host), "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        ip("-n", ctl, "link", "set", host, "master", _BRIDGE, "up")

    def _attach_lab(self) -> None:
        """The root namespace's leg: ``<prefix>-lab`` here, ``lab`` on the bridge."""
        here, ctl = self._device(LAB), self.namespace("ctl")
        ip(
            "link",
            "add",
            here,
            "address",
            self._mac(LAB),
            "type",
            "veth",
            "peer",
            "name",
            LAB,
            "netns",
            ctl,
        )
        ip("-n", ctl, "link", "set", LAB, "master", _BRIDGE, "up")
        ip("addr", "add", self._address(LAB), "dev", here)
        ip("link", "set", here, "up")

    def _pin_neighbours(self) -> None:
        """Permanent neighbour entries both ways between every pair of hosts."""
        everyone = (*HOSTS, LAB)
        for host in everyone:
            for other in everyone:
                if other != host:
                    ip(
                        *self._in(host),
                        "neigh",
                        "replace",
                        self.addr(other),
                        "lladdr",
                        self._mac(other),
                        "dev",
                        self._device(host),
                        "nud",
                        "permanent",
                    )

    # -- partitions ----------------------------------------------------------------------------

    def _port(self, host: str) -> str:
        if host not in (*WORKER_HOSTS, LAB):
            raise ValueError(f"cannot cut {host!r}: only {', '.join(WORKER_HOSTS)} or {LAB}")
        return host

    def cut(self, host: str) -> None:
        """Partition ``host`` from the others: its bridge port goes down, packets are dropped
        (connections stall; nothing is reset)."""
        ip("-n", self.namespace("ctl"), "link", "set", self._port(host), "down")

    def restore(self, host: str) -> None:
        """Undo :meth:`cut`."""
        ip("-n", self.namespace("ctl"), "link", "set", self._port(host), "up")
        self._pin_neighbours()  # idempotent; in case an entry went with the link

    # -- probes --------------------------------------------------------------------------------

    def connect(self, host: str, addr: str, port: int, timeout: float = 3.0) -> str:
        """One TCP connect from ``host`` to ``addr:port``: ``connected``, ``timeout``, or the
        errno's name (``ECONNREFUSED``, ``EHOSTUNREACH``...)."""
        argv = self.argv(
            host, [sys.executable, "-c", _CONNECT_PROBE, addr, str(port), str(timeout)]
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30)
        if done.returncode != 0:
            raise RuntimeError(f"connect probe on {host} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def reachable(self, host: str, addr: str, port: int, timeout: float = 3.0) -> bool:
        """Whether a TCP connect from ``host`` to ``addr:port`` succeeds within ``timeout``."""
        return self.connect(host, addr, port, timeout) == "connected"

    def pids(self, host: str) -> list[int]:
        """The processes whose network namespace is ``host``'s."""
        return [int(p) for p in ip("netns", "pids", self.namespace(host), check=False).split()]

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what still runs in the namespaces, delete links and namespaces, remove the run
        directory and give up the prefix."""
        _destroy(self.prefix)
