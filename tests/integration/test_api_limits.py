"""One person cannot take the API down: a real ``ongrid api`` process (uvicorn) with a real
Redis, SQLite, a real worker and the fake LLM.

First, the API of a deployment that lets ten viewers hold 110 streams each: a thousand event
streams stay open while another user's requests are answered, live events reach every stream
of a session, the API's Redis connections and file descriptors do not grow with the streams,
and closing the streams gives everything back. The API starts with a soft limit of 1,024 open
files, as many systems set it, and raises it to the hard limit.

Then the API with the default limits: the 33rd stream of one user, the 31st turn of a minute,
a session beyond ``sessions_per_user`` and a spawn beyond ``spawns_per_minute`` (counted with
the spawns another process started for the same user) are each refused with a 429 that names
the limit, and nothing is written.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from harness import MODEL, Cluster, Proc, final, wait_for
from procs import api_client, free_port, ongrid

from coordinator.api.stream_hub import CLIENT_NAME, POOL_SIZE
from coordinator.storage.chats import ChatStore
from coordinator.storage.engine import make_engine
from workers.limits import LimitExceeded

#: Liveness bound of one request, stream or wait: only so that nothing hangs forever.
DEADLINE = 120.0
#: The users of the thousand streams, and how many each holds.
WATCHERS, STREAMS_EACH = [f"watcher{i}" for i in range(10)], 100
#: The API process's soft limit of open files when it starts (what it must raise).
SOFT_FILES = 1024
#: Threads the API runs blocking work on (anyio's default): they bound how many connections
#: its blocking Redis clients (spawn store, probe) can hold, however many streams are open.
API_THREADS = 40
PROMPT = "Is db1 healthy?"
ANSWER = "db1 is healthy."
#: A stream that ends after a quiet second (a request that must be answered 200 to end).
ONCE = {"until_idle": 1}
#: A turn's body: a new chat's, and a message's to a session of the caller.
CHAT = {"prompt": PROMPT, "agent": "probe"}
MESSAGE = {"content": PROMPT, "agent": "probe"}
TOKENS = {
    **{user: (f"limits-{user}-viewer-token", "viewer") for user in WATCHERS},
    "alice": ("limits-alice-admin-token-0", "admin"),
    "bob": ("limits-bob-viewer-token-00", "viewer"),
    "carol": ("limits-carol-viewer-token-0", "viewer"),
    "dave": ("limits-dave-viewer-token-00", "viewer"),
    "erin": ("limits-erin-viewer-token-00", "viewer"),
}


# -- the API process ---------------------------------------------------------------------------


class Api:
    """An ``ongrid api`` process on the cluster, started with a soft limit of open files of
    :data:`SOFT_FILES`, and clients of its users."""

    def __init__(self, cluster: Cluster, name: str, config: dict[str, Any]) -> None:
        self.db_url = f"sqlite:///{cluster.root / f'{name}.db'}"
        path = cluster.root / f"{name}.yaml"
        grants = {token: {"user": user, "role": role} for user, (token, role) in TOKENS.items()}
        path.write_text(yaml.safe_dump({"auth": {"tokens": grants}, **config}))
        env = {
            **cluster.env,
            "ONGRID_CONFIG": str(path),
            "ONGRID_DATABASE_URL": self.db_url,
            "ONGRID_DEFAULT_MODEL": MODEL,
        }
        self.port = free_port()
        argv = ["sh", "-c", f'ulimit -Sn {SOFT_FILES} && exec "$@"', "sh"]
        self.proc = Proc(name, [*argv, *ongrid("api", f"--port={self.port}")], cluster.root, env)
        cluster.workers.append(self.proc)  # type: ignore[arg-type]  # killed and logged on close
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._clients = [api_client(self.proc, self.port, TOKENS["alice"][0], DEADLINE)]

    def client(self, user: str) -> httpx.Client:
        made = httpx.Client(base_url=self.base_url, headers=auth(user), timeout=DEADLINE)
        self._clients.append(made)
        return made

    def close(self) -> None:
        for made in self._clients:
            made.close()
        self.proc.stop()


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user][0]}"}


@contextmanager
def running(cluster: Cluster, name: str, config: dict[str, Any]) -> Iterator[Api]:
    api = Api(cluster, name, config)
    try:
        yield api
    finally:
        api.close()


# -- SSE -----------------------------------------------------------------------------------------


def sse_ids(lines: list[str]) -> list[tuple[int, str]]:
    """``(id, event)`` of each SSE message in ``lines``."""
    found, fields = [], {}
    for line in lines:
        if not line:
            if "id" in fields:
                found.append((int(fields["id"]), fields["event"]))
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            fields[key] = value.removeprefix(" ")
    return found


def turn(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[str, list[int]]:
    """Run one turn to its end: the session id and the ids of the turn's events."""
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        got = sse_ids(list(response.iter_lines()))
    assert got[-1][1] == "task_notification", got
    return response.headers["X-Session-Id"], [seq for seq, _ in got]


def refusal(response: httpx.Response, limit: str, value: int) -> dict[str, Any]:
    """The 429 of ``limit``: its error names the limit, the value and the setting."""
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded"
    details = error["details"]
    assert {k: details[k] for k in ("limit", "value", "setting")} == {
        "limit": limit,
        "value": value,
        "setting": f"limits.{limit}",
    }
    assert f"limits.{limit}" in error["message"] and str(value) in error["message"]
    return details


class Watch:
    """One ``GET …/events`` stream, read in a task: the ids it got, until cancelled."""

    def __init__(self, client: httpx.AsyncClient, session_id: str) -> None:
        self.ids: list[int] = []
        self.status: int | None = None
        self.task = asyncio.create_task(self._read(client, session_id))

    async def _read(self, client: httpx.AsyncClient, session_id: str) -> None:
        async with client.stream("GET", f"/api/v1/chat/sessions/{session_id}/events") as response:
            self.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                return
            lines: list[str] = []
            async for line in response.aiter_lines():
                lines.append(line)
                if not line:
                    self.ids += [seq for seq, _ in sse_ids(lines)]
                    lines = []

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@asynccontextmanager
async def async_clients(api: Api, users: list[str]) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    unbounded = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    made = {
        user: httpx.AsyncClient(
            base_url=api.base_url, headers=auth(user), timeout=DEADLINE, limits=unbounded
        )
        for user in users
    }
    try:
        yield made
    finally:
        for client in made.values():
            await client.aclose()


async def until(check: Any, what: str, state: Any = None) -> None:
    """Poll ``check`` (a plain function) on the loop until true, within DEADLINE; ``state``
    says where things stood when it was not."""
    try:
        async with asyncio.timeout(DEADLINE):
            while not check():  # noqa: ASYNC110 - the condition is the streams' own state
                await asyncio.sleep(0.05)
    except TimeoutError:
        where = f" ({state()})" if state is not None else ""
        raise AssertionError(f"not within {DEADLINE:g} s: {what}{where}") from None


def progress(watches: dict[str, list[Watch]], sessions: dict[str, tuple[str, list[int]]]) -> str:
    """How far the streams got: answered or not, and with all, some or none of their events."""
    every = [(w, sessions[user][1]) for user, ws in watches.items() for w in ws]
    unanswered = sum(w.status is None for w, _ in every)
    done = sum(w.ids == want for w, want in every)
    partial = sum(bool(w.ids) and w.ids != want for w, want in every)
    ended = [w for w, want in every if w.task.done() and w.ids != want]
    why = {repr(w.task.exception()) if not w.task.cancelled() else "cancelled" for w in ended}
    return (
        f"{len(every)} streams: {unanswered} not answered, {done} complete, {partial} partial, "
        f"{len(ended)} ended short: {sorted(why)[:3]}"
    )


# -- what the API process holds ------------------------------------------------------------------


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def redis_connections(pid: int, port: int) -> int:
    """The established TCP connections of process ``pid`` to the Redis on ``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port, state, inode = int(fields[2].rsplit(":", 1)[1], 16), fields[3], fields[9]
            count += remote_port == port and state == "01" and inode in inodes
    return count


def soft_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no 'Max open files' in /proc/{pid}/limits")


def numsub(client: redis.Redis, channels: list[str]) -> list[int]:
    return [int(n) for _name, n in client.pubsub_numsub(*channels)]


def hub_connections(client: redis.Redis) -> int:
    return sum(1 for c in client.client_list() if c["name"] == CLIENT_NAME)


# -- the tests -------------------------------------------------------------------------------------


@pytest.fixture
def site(cluster: Cluster) -> Cluster:
    cluster.persona("probe")
    cluster.fake.script([final(ANSWER, match=PROMPT)])
    cluster.start_worker()
    return cluster


@pytest.mark.timeout(600)
def test_a_thousand_streams_leave_the_api_answering_others(site: Cluster) -> None:
    with running(site, "api-wide", {"limits": {"streams_per_user": 110}}) as api:
        pid = api.proc.pid
        assert soft_files_limit(pid) > SOFT_FILES  # raised to the hard limit at start
        wait_for(lambda: "open files limit: " in api.proc.log(), DEADLINE, "the limit logged")
        sessions = {user: turn(api.client(user), "/api/v1/chat", CHAT) for user in WATCHERS}
        channels = [site.client.bus.keys(session_id).channel for session_id, _ in sessions.values()]
        files_before = open_files(pid)
        alice = api.client("alice")

        async def scenario() -> None:
            async with async_clients(api, WATCHERS) as clients:
                watches = {
                    user: [Watch(clients[user], sessions[user][0]) for _ in range(STREAMS_EACH)]
                    for user in WATCHERS
                }
                every = [w for ws in watches.values() for w in ws]
                try:
                    # Open, each with the session's stored events delivered.
                    await until(
                        lambda: all(w.ids == sessions[u][1] for u in WATCHERS for w in watches[u]),
                        "a thousand streams to deliver their sessions' events",
                        lambda: progress(watches, sessions),
                    )
                    await asyncio.to_thread(while_open, every)
                    # A new turn of a watched session reaches all of its hundred streams live.
                    first = WATCHERS[0]
                    path = f"/api/v1/chat/sessions/{sessions[first][0]}/messages"
                    _, more = await asyncio.to_thread(turn, api.client(first), path, MESSAGE)
                    everything = sessions[first][1] + more
                    await until(
                        lambda: all(w.ids == everything for w in watches[first]),
                        "the new turn on the hundred streams of its session",
                    )
                finally:
                    for watch in every:
                        await watch.close()
                assert {w.status for w in every} == {200}

        redis_port = site.redis.connection_pool.connection_kwargs["port"]

        def while_open(every: list[Watch]) -> None:
            assert numsub(site.redis, channels) == [1] * len(channels)  # one subscriber each
            # Others are answered: the agents, and a whole new chat of theirs.
            assert alice.get("/api/v1/agents").status_code == 200
            turn(alice, "/api/v1/chat", CHAT)
            # Connections and descriptors do not grow with the streams.
            assert hub_connections(site.redis) <= POOL_SIZE + 1
            assert 0 < redis_connections(pid, redis_port) <= POOL_SIZE + 1 + API_THREADS + 16
            assert open_files(pid) <= files_before + len(every) + 64

        asyncio.run(scenario())
        # Every stream let go of its channel and its socket.
        wait_for(lambda: numsub(site.redis, channels) == [0] * len(channels), DEADLINE, "none")
        wait_for(lambda: open_files(pid) <= files_before + 64, DEADLINE, "the sockets closed")


@pytest.mark.timeout(600)
def test_past_each_default_limit_the_api_answers_429_and_writes_nothing(site: Cluster) -> None:
    with running(site, "api-default", {}) as api:
        bob, carol, dave, erin = (api.client(u) for u in ("bob", "carol", "dave", "erin"))

        # Streams: 32 of bob's are open; the 33rd is refused until one of them closes.
        bobs_session, _ = turn(bob, "/api/v1/chat", CHAT)
        events = f"/api/v1/chat/sessions/{bobs_session}/events"

        async def streams() -> None:
            async with async_clients(api, ["bob"]) as clients:
                open_ = [Watch(clients["bob"], bobs_session) for _ in range(32)]
                try:
                    await until(lambda: all(w.ids for w in open_), "32 streams open")
                    over = await clients["bob"].get(events)
                    refusal(over, "streams_per_user", 32)
                    assert "Retry-After" not in over.headers
                    # A stream's slot is given back once the API sees its client gone.
                    await open_.pop().close()
                    async with asyncio.timeout(DEADLINE):
                        ask = clients["bob"].get
                        while (await ask(events, params=ONCE)).status_code != 200:  # noqa: ASYNC110
                            await asyncio.sleep(0.05)
                finally:
                    for watch in open_:
                        await watch.close()

        asyncio.run(streams())

        # Turns: carol's 31st turn within the minute is refused, and writes nothing.
        session_id, _ = turn(carol, "/api/v1/chat", CHAT)
        for _ in range(29):
            turn(carol, f"/api/v1/chat/sessions/{session_id}/messages", MESSAGE)
        history = carol.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"]
        over = carol.post(f"/api/v1/chat/sessions/{session_id}/messages", json=MESSAGE)
        details = refusal(over, "turns_per_minute", 30)
        assert over.headers["Retry-After"] == str(details["retry_after"])
        assert 1 <= details["retry_after"] <= 60
        refusal(carol.post("/api/v1/chat", json=CHAT), "turns_per_minute", 30)
        assert carol.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"] == history
        assert len(carol.get("/api/v1/chat/sessions").json()) == 1

        # Sessions: dave keeps 1,000; a new one is refused, his sessions go on.
        store = ChatStore(make_engine(api.db_url))
        kept = [store.create_session("dave", f"old {i}") for i in range(1000)]
        refusal(dave.post("/api/v1/chat", json=CHAT), "sessions_per_user", 1000)
        assert store.count_sessions("dave") == 1000
        turn(dave, f"/api/v1/chat/sessions/{kept[0]}/messages", MESSAGE)

        # Spawns, cluster-wide: another process started erin's 120 of the minute.
        for _ in range(120):
            site.client.spawn(
                "probe", "parked", user="erin", queue="ongrid.parked", require_consumer=False
            )
        with pytest.raises(LimitExceeded, match="limits.spawns_per_minute"):
            site.client.spawn(
                "probe", "parked", user="erin", queue="ongrid.parked", require_consumer=False
            )
        refused = erin.post("/api/v1/chat", json=CHAT)
        assert refusal(refused, "spawns_per_minute", 120)["retry_after"] >= 1
        assert erin.get("/api/v1/chat/sessions").json() == []  # the refused turn left nothing
