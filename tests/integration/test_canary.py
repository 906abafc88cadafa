"""A canary secret in a real worker's environment and config file never comes out.

The worker process starts with the canary as its model provider key and inside its config file
(an API token, the ClickHouse password), the file placed in the repository root, which the
command tools may read. A scripted model then makes the worker run the hostile commands of the
security review through ``bash``. Afterwards everything the system wrote is searched: every key
of the Redis database (spawn records, event streams), the worker's log, and every request the
model provider received. The canary must be in none of them, while the provider still got the key
(its digest) on every call: the key left the environment without breaking the model calls.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import redis
from harness import Cluster, call, final


def _everything_in(client: redis.Redis) -> bytes:
    """Every value of every key of the database, whatever its type."""
    out = []
    for key in client.scan_iter():
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            out.extend(k + b"=" + v for k, v in client.hgetall(key).items())
        elif kind == b"stream":
            out.extend(repr(entry).encode() for entry in client.xrange(key))
        elif kind in (b"list",):
            out.extend(client.lrange(key, 0, -1))
        elif kind in (b"set",):
            out.extend(client.smembers(key))
        elif kind == b"zset":
            out.extend(m for m, _ in client.zrange(key, 0, -1, withscores=True))
        out.append(key)
    return b"\n".join(out)


def test_the_canary_never_leaves_the_worker(cluster: Cluster, open_dir: Path):
    canary = f"sk-canary-{uuid.uuid4().hex}"
    token = f"canary-token-{uuid.uuid4().hex}"
    repo = open_dir / "repo"
    repo.mkdir(mode=0o755)
    config = repo / "ongrid.yaml"
    config.write_text(
        f"auth:\n  tokens:\n    {token}: {{user: alice, role: admin}}\n"
        f"clickhouse_password: {canary}\n"
    )
    (repo / "runbook.md").write_text("restart nginx when it is stuck\n")
    for path in (config, repo / "runbook.md"):
        path.chmod(0o644)  # readable to the sandbox user: only the sandbox may hide them
    cluster.persona("prober", tools=["bash"], max_turns=60)
    worker = cluster.start_worker(
        env={
            "OPENAI_API_KEY": canary,
            "ONGRID_CONFIG": str(config),
            "ONGRID_REPO_ROOT": str(repo),
        },
        fork=False,  # exec'd: its /proc/<pid>/environ is the one it started with, canary included
    )
    pid = worker.pid
    commands = [
        f"du --files0-from=/proc/{pid}/environ",
        f"cat /proc/{pid}/environ",
        "cat /proc/1/environ",
        f"stat /proc/{pid}/environ",
        f"dmesg -F {config}",
        f"cat {config}",
        f"grep -r {canary[:14]} {repo}",
        f"grep -r canary {repo} /etc",
        f"head -c 4096 {config}",
        f"ls -la {repo} {cluster.root}",  # the worker's working directory: hidden
        f"ls -la /proc/{pid}",
        "systemctl --message status --root=/tmp enable foo",
        "date --s=2020-01-01",
        "tail --f /var/log/dpkg.log",
        "ps e",
        f"cat {repo}/runbook.md",
        "id",
    ]
    cluster.fake.script(
        [call("bash", {"command": c}, turn=i) for i, c in enumerate(commands)]
        + [final("Nothing secret found.", turn=len(commands))]
    )
    record = cluster.client.spawn("prober", "Find the API keys of this worker.")
    done = cluster.client.wait(record.spawn_id, timeout=120)
    assert done.status == "ok", done.error

    results = [m.content for m in done.state.messages if m.role == "tool"]
    assert len(results) == len(commands)
    assert "restart nginx when it is stuck" in results[-2]  # the repository is readable
    listing = results[commands.index(f"ls -la {repo} {cluster.root}")]
    assert "runbook.md" in listing and "agents" not in listing  # the working directory is not
    assert "uid=65534" in results[-1] or "nobody" in results[-1]
    written = _everything_in(cluster.redis) + worker.log().encode()
    written += repr(cluster.fake.requests()).encode()
    for secret in (canary, token, canary[10:], token[13:]):
        assert secret.encode() not in written, f"{secret[:16]}… leaked"
    digest = hashlib.sha256(canary.encode()).hexdigest()
    keys = cluster.fake.key_digests()
    assert keys and set(keys) == {digest}, "the provider did not get the key on every call"
    assert os.path.exists(config)  # nothing was changed on the host either
