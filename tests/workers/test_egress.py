"""The way out of the sandbox for bundle code granted the network, and the walls around it.

The policy on its own (every refused range, a name that resolves to a refused address, an
IPv4-mapped address); then the real thing: bundle code confined by bubblewrap reaches nothing
(not the Redis on 127.0.0.1:6379, not this host's other addresses), and, granted the network,
reaches an HTTP server on another host — a network namespace of this machine, as in the
multi-host tests — through the proxy, which refuses the host's own services with a 403 saying
why.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from multihost.netns import IpMissing, NetnsUnavailable, Network
from processes import wait_for

from workers.egress import EgressPolicy, EgressProxy, Refused
from workers.sandbox import Sandbox, run_argv

PUBLIC = ipaddress.ip_address("203.0.113.7")


def _policy(names: dict[str, list[str]], **fields: object) -> EgressPolicy:
    def resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        if host in names:
            return [ipaddress.ip_address(a) for a in names[host]]
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            raise socket.gaierror(-2, "Name or service not known") from None

    own = [ipaddress.ip_address("192.0.2.10")]
    return EgressPolicy(resolve=resolve, own_addresses=lambda: own, **fields)  # type: ignore[arg-type]


def test_the_policy_refuses_every_address_bundle_code_must_not_reach() -> None:
    policy = _policy(
        {
            "redis.internal": ["10.1.2.3"],
            "alias.example": ["10.1.2.3"],  # another name of the runtime's Redis
            "rebound.example": ["203.0.113.8", "127.0.0.1"],
        },
        services=["redis://:pw@redis.internal:6379/0", "postgresql://u:p@10.9.9.9:5432/o"],
        deny=["172.16.0.0/12", "blocked.example"],
    )
    assert policy.check("203.0.113.7", 443) == PUBLIC
    refusals = {
        "127.0.0.1": "in 127.0.0.0/8, which bundle code never reaches",
        "169.254.169.254": "in 169.254.0.0/16, which bundle code never reaches",
        "::ffff:127.0.0.1": "in 127.0.0.0/8",  # an IPv4-mapped address is the IPv4 one
        "::1": "resolves to ::1, a reserved address",
        "0.0.0.0": "0.0.0.0",
        "192.0.2.10": "an address of this host",
        "redis.internal": "a host the runtime's configuration refuses",
        "alias.example": "10.1.2.3, in 10.1.2.3/32, refused here",
        "10.9.9.9": "in 10.9.9.9/32, refused here",
        "172.20.1.1": "in 172.16.0.0/12, refused here",
        "blocked.example": "a host the runtime's configuration refuses",
        "rebound.example": "resolves to 127.0.0.1",  # any refused address refuses the name
    }
    for host, why in refusals.items():
        with pytest.raises(Refused) as refused:
            policy.check(host, 80)
        assert why in str(refused.value), (host, str(refused.value))
    with pytest.raises(Refused, match="not a TCP port"):
        policy.check("203.0.113.7", 0)


# -- the real thing ----------------------------------------------------------------------------

HTTP_SERVER = """
import http.server, sys
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the other host\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Hello).serve_forever()
"""

#: Run in the sandbox: tries a raw connect, and a fetch through whatever proxy it was given.
PROBE = """
import json, socket, sys, urllib.error, urllib.request
out = {}
targets = [("127.0.0.1", 6379)]
targets += [(a, int(p)) for a, p in (x.split(":") for x in sys.argv[1:2])]
for host, port in targets:
    try:
        socket.create_connection((host, port), timeout=3).close()
        out[f"raw {host}:{port}"] = "connected"
    except OSError as exc:
        out[f"raw {host}:{port}"] = type(exc).__name__
for url in sys.argv[2:]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            out[url] = f"{answer.status} {answer.read().decode().strip()}"
    except urllib.error.HTTPError as exc:
        out[url] = f"{exc.code} {exc.read().decode().strip()}"
    except OSError as exc:
        out[url] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def other_host() -> Iterator[tuple[str, int]]:
    """An HTTP server on another host: a network namespace, reached over a veth link."""
    try:
        network = Network.create()
    except (IpMissing, NetnsUnavailable) as exc:
        pytest.fail(f"network namespaces are needed here: {exc}")
    address, port = network.addr("w1"), 8080
    server = subprocess.Popen(
        network.argv("w1", [sys.executable, "-c", HTTP_SERVER, address, str(port)])
    )
    try:
        wait_for(lambda: network.reachable("ctl", address, port, 1.0), 30, "the other host")
        yield address, port
    finally:
        server.kill()
        server.wait()
        network.close()


def _probe(sandbox: Sandbox, folder: Path, *args: str, network: str = "") -> dict[str, str]:
    (folder / "probe.py").write_text(PROBE)
    (folder / "probe.py").chmod(0o644)
    argv = sandbox.confine(
        ["/usr/bin/python3", "/tmp/bundle/probe.py", *args], workdir=str(folder), network=network
    )
    done = run_argv(argv, 60)
    assert done.exit_code == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_bundle_code_reaches_nothing_and_granted_only_what_the_proxy_allows(
    open_dir: Path, other_host: tuple[str, int]
) -> None:
    sandbox = Sandbox()
    if sandbox.unavailable():
        pytest.fail(f"bubblewrap is needed here: {sandbox.unavailable()}")
    address, port = other_host
    own = socket.gethostbyname(socket.gethostname())
    remote = f"http://{address}:{port}/"
    local = "http://127.0.0.1:6379/"
    metadata = "http://169.254.169.254/latest/meta-data/"
    ungranted = _probe(sandbox, open_dir, f"{address}:{port}", remote)
    assert ungranted == {
        "raw 127.0.0.1:6379": "ConnectionRefusedError",  # its own loopback: empty
        f"raw {address}:{port}": "OSError",  # no route out: the network is unreachable
        remote: "URLError",
    }
    sandbox.egress = EgressProxy(EgressPolicy(services=["redis://127.0.0.1:6379/0"]))
    try:
        granted = _probe(
            sandbox, open_dir, f"{address}:{port}", remote, local, metadata,
            f"http://{own}:6379/", network="probe",
        )  # fmt: skip
    finally:
        sandbox.egress.close()
    assert granted["raw 127.0.0.1:6379"] == "ConnectionRefusedError"
    assert granted[f"raw {address}:{port}"] == "OSError"  # still no route but the proxy
    assert granted[remote] == "200 hello from the other host"
    assert granted[local].startswith("403 refused by the Ongrid worker's egress proxy: 127.0.0.1")
    assert granted[metadata].startswith("403 ") and "169.254.0.0/16" in granted[metadata]
    own_url = f"http://{own}:6379/"
    assert granted[own_url].startswith("403 ") and "an address of this host" in granted[own_url]


def test_without_a_proxy_the_network_cannot_be_granted(open_dir: Path) -> None:
    sandbox = Sandbox()
    with pytest.raises(RuntimeError, match="no egress proxy on this worker"):
        sandbox.confine(["/bin/true"], workdir=str(open_dir), network="probe")


FETCHER = """
import json, os, urllib.request
from mcp.server.mcpserver import MCPServer

server = MCPServer("fetcher", log_level="WARNING")


@server.tool()
def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return f"{answer.status} {answer.read().decode().strip()}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read().decode().strip()}"
    except OSError as exc:
        return type(exc).__name__


@server.tool()
def keep(text: str) -> str:
    folder = os.environ.get("CLAUDE_PLUGIN_DATA", "")
    try:
        with open(os.path.join(folder or "/tmp", "kept.txt"), "w") as out:
            out.write(text)
        return f"kept in {folder}"
    except OSError as exc:
        return type(exc).__name__


server.run()
"""


def test_a_plugins_server_runs_sandboxed_with_what_its_install_granted(
    open_dir: Path, tmp_path: Path, other_host: tuple[str, int]
) -> None:
    """No grant: no network, nothing written. Granted: the network through the proxy (never
    this host) and a folder of its own, which it writes and the worker keeps."""
    from marketplace.mcp import McpHub
    from marketplace.model import McpServerConfig
    from registry.tools import ToolContext

    address, port = other_host
    (open_dir / "fetcher.py").write_text(FETCHER)
    (open_dir / "fetcher.py").chmod(0o644)
    # As a worker's: its home hidden (the interpreter under it shown again), so the sandbox's
    # user runs this venv's Python even where the home is not its to enter.
    sandbox = Sandbox(hide=[Path.home()])
    sandbox.egress = EgressProxy(EgressPolicy())
    data = tmp_path / "plugin-data"
    hub = McpHub(sandbox=sandbox, plugin_data=data, start_timeout=60.0, call_timeout=30.0)

    def server(key: str, **grants: bool) -> McpServerConfig:
        return McpServerConfig(
            key=key,
            transport="stdio",
            command=sys.executable,
            args=("${CLAUDE_PLUGIN_ROOT}/fetcher.py",),
            plugin=key.split("__")[0],
            plugin_root=str(open_dir),
            sandboxed=True,
            **grants,
        )

    def call(name: str, **arguments: str) -> str:
        tool = {t.name: t for t in hub.tools()}[name]
        return tool.run(tool.validate_arguments(arguments), ToolContext()).content

    try:
        hub.reconcile(
            {
                "plain__f": server("plain__f"),
                "granted__f": server("granted__f", network=True, writable=True),
            }
        )
        remote = f"http://{address}:{port}/"
        assert call("mcp__plain__f__fetch", url=remote) == "URLError"
        assert call("mcp__plain__f__keep", text="x") == "OSError"  # read-only, /tmp too
        assert call("mcp__granted__f__fetch", url=remote) == "200 hello from the other host"
        refused = call("mcp__granted__f__fetch", url="http://127.0.0.1:6379/")
        assert refused.startswith("403 refused by the Ongrid worker's egress proxy")
        assert call("mcp__granted__f__keep", text="state") == "kept in /tmp/plugin-data"
        assert (data / "granted" / "kept.txt").read_text() == "state"
        assert not (data / "plain").exists()
    finally:
        hub.close()
        sandbox.egress.close()
