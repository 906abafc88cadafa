"""The one way out of the sandbox for bundle code granted the network: a filtering HTTP proxy.

Bundle code (skill-manifest scripts, plugins' MCP stdio servers) runs in a network namespace of
its own (:mod:`workers.sandbox`), where nothing but its own loopback exists. A plugin the
administrator granted the network at install gets, in that namespace, a bridge on
``127.0.0.1`` (:mod:`workers._egress_bridge`) to this proxy's Unix socket, and the standard
proxy variables pointing at it; nothing else leaves.

The proxy speaks HTTP/1.1 ``CONNECT`` (any TCP, HTTPS end to end) and absolute-form plain HTTP
requests (forwarded with ``Connection: close``). It resolves every destination itself, checks
**every** address the name resolves to against :class:`EgressPolicy`, and connects only to an
address it checked: a name that resolves to a refused address is refused whole, and no second
lookup happens (no rebinding). Refused: loopback, link-local (cloud metadata included),
unspecified, multicast and reserved ranges; every address of this host's interfaces (the API,
Redis, PostgreSQL, the metrics, whatever they bind); the addresses of the runtime's own Redis and
database wherever they are; and ``egress_deny``. A refusal is a ``403`` whose body says why in
one line, and a warning in the worker's log naming who asked.

Everything is bounded: the request head (16 KiB, 10 s), the lookup and the connect (10 s), the
connections at once (per socket), an idle tunnel (5 minutes).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["EgressPolicy", "EgressProxy", "Refused"]

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Ranges no bundle code ever reaches, whatever the configuration.
_ALWAYS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, and the clouds' metadata services
        "224.0.0.0/4",
        "240.0.0.0/4",
        "255.255.255.255/32",
        "100.100.100.200/32",  # a cloud metadata service outside link-local
        "::/128",
        "::1/128",
        "fe80::/10",
        "ff00::/8",
        "fd00:ec2::254/128",  # the IPv6 address of a cloud metadata service
    )
)
_HEAD_LIMIT = 16 * 1024
_HEAD_SECONDS = 10.0
_CONNECT_SECONDS = 10.0
_IDLE_SECONDS = 300.0
#: Connections one socket serves at once; the next ones wait in the listen backlog.
_MAX_CONNECTIONS = 64
#: How long this host's own addresses and the runtime's resolved ones are kept before a new look.
_REFRESH_SECONDS = 30.0
_REQUEST_LINE = re.compile(rb"^([A-Z]+) (\S+) HTTP/1\.[01]\r?$")


class Refused(Exception):
    """A destination the policy refuses; the message says why in a few words."""


@dataclass(frozen=True)
class _Resolved:
    at: float
    addresses: frozenset[Address]


class EgressPolicy:
    """Which addresses bundle code may reach (see the module docstring).

    ``services`` are the runtime's own (its Redis and database URLs): their hosts' addresses are
    refused whatever the port. ``deny`` holds more: IPs, CIDR ranges or host names.
    ``resolve`` and ``own_addresses`` are the system's by default (tests hand others in).
    """

    def __init__(
        self,
        *,
        services: Iterable[str] = (),
        deny: Iterable[str] = (),
        resolve: Callable[[str, int], list[Address]] | None = None,
        own_addresses: Callable[[], Iterable[Address]] | None = None,
    ) -> None:
        self._resolve = resolve or _resolve
        self._own_addresses = own_addresses or _interface_addresses
        self._networks: list[Network] = list(_ALWAYS)
        self._names: list[str] = []
        for entry in deny:
            entry = entry.strip()
            if not entry:
                continue
            try:
                self._networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self._names.append(entry.lower().rstrip("."))
        for url in services:
            host = _host_of(url)
            if host is None:
                continue
            try:
                self._networks.append(ipaddress.ip_network(host))
            except ValueError:
                self._names.append(host.lower())
        self._lock = threading.Lock()
        self._cache: dict[str, _Resolved] = {}

    @classmethod
    def for_settings(cls, settings: Any) -> EgressPolicy:
        services = [getattr(settings, "redis_url", ""), getattr(settings, "database_url", "")]
        return cls(services=[s for s in services if s], deny=settings.egress_deny)

    def check(self, host: str, port: int) -> Address:
        """The one address to connect to for ``host:port``; :class:`Refused` saying why when
        any address the name resolves to is refused, or it resolves to none."""
        if not 0 < port < 65536:
            raise Refused(f"port {port} is not a TCP port")
        name = host.strip("[]").lower().rstrip(".")
        if name in self._names:
            raise Refused(f"{host} is a host the runtime's configuration refuses")
        try:
            addresses = self._resolve(name, port)
        except OSError as exc:
            raise Refused(f"{host} does not resolve: {exc.strerror or exc}") from None
        if not addresses:
            raise Refused(f"{host} resolves to no address")
        refused = self._refused()
        for address in addresses:
            why = self._why(_plain(address), refused)
            if why:
                raise Refused(f"{host} resolves to {address}, {why}")
        return addresses[0]

    def _why(self, address: Address, refused: tuple[set[Address], list[Network]]) -> str:
        own, networks = refused
        if address in own:
            return "an address of this host (the runtime's own services listen there)"
        if address.is_reserved or address.is_unspecified or address.is_multicast:
            return "a reserved address"
        for network in networks:
            if address.version == network.version and address in network:
                if network in _ALWAYS:
                    return f"in {network}, which bundle code never reaches"
                return f"in {network}, refused here (the Redis, the database, egress_deny)"
        return ""

    def _refused(self) -> tuple[set[Address], list[Network]]:
        """This host's addresses and those of the refused names, looked up again now and then."""
        own = set(self._cached("\0own", lambda: list(self._own_addresses())))
        networks = list(self._networks)
        for name in self._names:
            for address in self._cached(name, partial(self._lookup, name)):
                networks.append(ipaddress.ip_network(address))
        return own, networks

    def _lookup(self, name: str) -> list[Address]:
        try:
            return self._resolve(name, 0)
        except OSError:
            return []

    def _cached(self, key: str, look: Callable[[], list[Address]]) -> frozenset[Address]:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit.at < _REFRESH_SECONDS:
            return hit.addresses
        found = _Resolved(now, frozenset(_plain(a) for a in look()))
        with self._lock:
            self._cache[key] = found
        return found.addresses


class EgressProxy:
    """The worker's proxy: one Unix socket per label (a plugin), each served by its own
    thread, so a refusal in the log names who asked. Sockets are made on first use, in a
    directory only this process's user may enter (the sandbox sees a socket only through the
    bind mount bwrap makes of it)."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._servers: dict[str, _Server] = {}
        self._closed = False

    def socket_for(self, label: str) -> str:
        """The path of ``label``'s socket, serving from now on."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the egress proxy is closed")
            server = self._servers.get(label)
            if server is None:
                if self._dir is None:
                    self._dir = Path(tempfile.mkdtemp(prefix="ongrid-egress-"))
                    os.chmod(self._dir, 0o711)  # traversable, not listable: names stay private
                path = self._dir / f"{len(self._servers)}.sock"
                server = _Server(path, label, self.policy)
                self._servers[label] = server
            return str(server.path)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            servers, self._servers = list(self._servers.values()), {}
            folder, self._dir = self._dir, None
        for server in servers:
            server.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class _Server:
    """One listening socket and its accept thread."""

    def __init__(self, path: Path, label: str, policy: EgressPolicy) -> None:
        self.path, self.label, self.policy = path, label, policy
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        # The sandbox's user connects to it; nobody else can reach the directory's entry.
        os.chmod(path, 0o666)
        self._listener.listen(_MAX_CONNECTIONS)
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._accept, name=f"egress-{label}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._slots.acquire()
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            with client:
                _handle(client, self.policy, self.label)
        except Exception:  # noqa: BLE001 - one broken connection must not end the proxy
            log.exception("egress proxy (%s): a connection failed", self.label)
        finally:
            self._slots.release()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)


# -- one connection ------------------------------------------------------------------------


def _handle(client: socket.socket, policy: EgressPolicy, label: str) -> None:
    head, rest = _read_head(client)
    if head is None:
        return
    lines = head.split(b"\n")
    match = _REQUEST_LINE.match(lines[0])
    if match is None:
        _reply(client, 400, "not an HTTP/1.1 proxy request")
        return
    method, target = match.group(1).decode(), match.group(2).decode("latin-1")
    try:
        host, port, path = _destination(method, target)
    except ValueError as exc:
        _reply(client, 400, str(exc))
        return
    try:
        address = policy.check(host, port)
    except Refused as exc:
        log.warning("egress refused for %s: %s:%d: %s", label, host, port, exc)
        _reply(client, 403, f"refused by the Ongrid worker's egress proxy: {exc}")
        return
    try:
        upstream = socket.create_connection((str(address), port), timeout=_CONNECT_SECONDS)
    except OSError as exc:
        _reply(client, 502, f"cannot connect to {host}:{port}: {exc.strerror or exc}")
        return
    with upstream:
        if method == "CONNECT":
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                upstream.sendall(rest)
        else:
            upstream.sendall(_origin_request(method, path, lines[1:]) + rest)
        _splice(client, upstream)


def _read_head(client: socket.socket) -> tuple[bytes | None, bytes]:
    """The request head (without the blank line) and what came after it."""
    client.settimeout(_HEAD_SECONDS)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            if len(data) > _HEAD_LIMIT:
                _reply(client, 431, f"the request head is longer than {_HEAD_LIMIT} bytes")
                return None, b""
            chunk = client.recv(4096)
            if not chunk:
                return None, b""
            data += chunk
    except (TimeoutError, OSError):
        return None, b""
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _destination(method: str, target: str) -> tuple[str, int, str]:
    """(host, port, origin-form path) of a proxy request; :class:`ValueError` saying why not."""
    if method == "CONNECT":
        host, sep, port = target.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"CONNECT needs host:port, got {target!r}")
        return host, int(port), ""
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(
            f"{target!r}: the proxy forwards http:// URLs; use CONNECT (HTTPS_PROXY) for the rest"
        )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, parts.port or 80, path


def _origin_request(method: str, path: str, headers: Sequence[bytes]) -> bytes:
    kept = [
        h.rstrip(b"\r")
        for h in headers
        if h.strip() and not h.lower().startswith((b"proxy-", b"connection:", b"keep-alive:"))
    ]
    lines = [f"{method} {path} HTTP/1.1".encode(), *kept, b"Connection: close", b"", b""]
    return b"\r\n".join(lines)


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until either side closes or nothing moves for :data:`_IDLE_SECONDS`."""
    a.setblocking(False)
    b.setblocking(False)
    peers = {a: b, b: a}
    while True:
        readable, _, _ = select.select(list(peers), [], [], _IDLE_SECONDS)
        if not readable:
            return
        for source in readable:
            try:
                data = source.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            if not data:
                return
            target = peers[source]
            target.setblocking(True)
            try:
                target.sendall(data)
            except OSError:
                return
            finally:
                target.setblocking(False)


def _reply(client: socket.socket, status: int, reason: str) -> None:
    texts = {400: "Bad Request", 403: "Forbidden", 431: "Too Large", 502: "Bad Gateway"}
    body = (reason + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {texts.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        client.sendall(head.encode() + body)


# -- addresses -----------------------------------------------------------------------------


def _resolve(host: str, port: int) -> list[Address]:
    infos = socket.getaddrinfo(host, port or None, type=socket.SOCK_STREAM)
    seen: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in seen:
            seen.append(address)
    return seen


def _interface_addresses() -> list[Address]:
    import psutil

    found: list[Address] = []
    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(ValueError):
                    found.append(ipaddress.ip_address(entry.address.split("%")[0]))
    return found


def _plain(address: Address) -> Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it is (``::ffff:127.0.0.1``)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _host_of(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None
