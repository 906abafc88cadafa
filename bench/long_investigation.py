"""A long investigation, managed against naive: input tokens billed, peak request, compactions.

    .venv/bin/python bench/long_investigation.py [--turns 10,30,60] [--window 60000]
                                                 [--json FILE]

The same investigation at each length: a persona pages through a log with ``read_repo``, one
window of about 16 KB a turn, noting what it finds, then answers
(:mod:`workers.testing.investigator`). It runs through the runtime's own loop and litellm's real
Anthropic adapter against the fake Messages API (:mod:`workers.testing.fake_anthropic`), which
refuses what Anthropic refuses and caches prompt prefixes as Anthropic does. Two ways:

- **managed**: the runtime as it ships (:mod:`workers.context`: results stored and shrunk to
  previews, compaction, an output limit, cache breakpoints), in a ``--window`` window;
- **naive**: the same loop resending everything, with no breakpoints and no output limit, in a
  window large enough for it (its peak request shows the window it would need).

Tokens are the server's counts (four characters of each block's JSON a token). *Billed* input
is priced as Anthropic prices it: uncached input at 1, cache writes at 1.25, cache reads at 0.1.
Wall time is this machine's, fake model included; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from registry.persona import PermissionMode, Persona  # noqa: E402
from registry.policy import resolve_bag  # noqa: E402
from registry.settings import Settings  # noqa: E402
from registry.tools import ToolContext  # noqa: E402
from workers._litellm import LitellmModel  # noqa: E402
from workers.context import ContextPolicy, MemoryResults, Window  # noqa: E402
from workers.loop import LoopSetup, LoopState, run_loop  # noqa: E402
from workers.messages import ContextCompacted, Message  # noqa: E402
from workers.model import Model, ModelRequest  # noqa: E402
from workers.testing.fake_anthropic import FakeAnthropic, Usage  # noqa: E402
from workers.testing.investigator import investigator, log_file  # noqa: E402
from workers.tools import default_catalog  # noqa: E402

MODEL = "anthropic/claude-sonnet-4-5"
CULPRIT = 7
#: What Anthropic bills a cache write and a cache read, against an uncached input token.
WRITE_PRICE, READ_PRICE = 1.25, 0.1
#: The naive loop's window: as large as it needs.
UNBOUNDED = 10_000_000
SYSTEM = (
    "You are an incident investigator for the SRE team. Read the evidence before you conclude; "
    "cite the exact tool call and line for every finding; say what you ruled out. "
) * 12


@dataclass
class Figures:
    way: str
    turns: int
    finished: bool
    found: bool
    sent: int
    billed: float
    cache_written: int
    cache_read: int
    refused: int
    peak_request: int
    window: int
    compactions: int
    model_calls: int
    seconds: float


class Naive:
    """The model as a naive loop calls it: no cache key, no output limit."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner

    def stream(self, request: ModelRequest) -> Any:
        return self.inner.stream(replace(request, stable=0, cache_key="", max_tokens=None))


def billed(usage: Usage) -> float:
    """A request's input as Anthropic bills it, in uncached-token equivalents."""
    return (
        usage.input_tokens
        + WRITE_PRICE * usage.cache_creation_input_tokens
        + READ_PRICE * usage.cache_read_input_tokens
    )


def run(turns: int, window: int, managed: bool, repo: Path) -> Figures:
    (repo / "logs").mkdir(parents=True, exist_ok=True)
    (repo / "logs" / "db-1.log").write_text(log_file(turns, min(CULPRIT, turns)))
    settings = Settings.load(environ={"ONGRID_REPO_ROOT": str(repo)})
    persona = Persona(
        name="log_reader",
        description="Reads logs.",
        when_to_use="Logs.",
        tools=["read_repo"],
        permission_mode=PermissionMode.READ_ONLY,
    )
    bag = resolve_bag(persona, default_catalog(), ["*"])
    events: list[Any] = []
    with FakeAnthropic(
        policy=investigator(turns), context_window=window if managed else UNBOUNDED
    ) as fake:
        base: Model = LitellmModel(api_base=fake.base_url, api_key="sk-ant-bench")
        model = base if managed else Naive(base)
        policy = ContextPolicy(
            window=Window(window, 64_000), store=MemoryResults(), reply_tokens=4096
        )
        setup = LoopSetup(
            session_id="bench",
            spawn_id=f"bench-{turns}-{managed}",
            model_id=MODEL,
            max_turns=turns + 5,
            reminder="Answer in en-GB. Tools: read_repo.",
            bag=bag,
            tool_context=ToolContext(
                session_id="bench", spawn_id="bench", user="u", role="admin", settings=settings
            ),
            context=policy if managed else None,
        )
        state = LoopState(
            messages=[
                Message(role="system", content=SYSTEM),
                Message(role="user", content="db-1 failed overnight: when, and why?"),
            ]
        )

        async def save(_: LoopState) -> None:
            return None

        started = time.perf_counter()
        outcome = asyncio.run(run_loop(setup, state, model, lambda e, _i: events.append(e), save))
        seconds = time.perf_counter() - started
        usages = fake.usages()
        refused = len(fake.rejections())
    sizes = [u.prompt_tokens for u in usages]
    return Figures(
        way="managed" if managed else "naive",
        turns=turns,
        finished=outcome.kind == "final",
        found="ENOSPC" in outcome.text,
        sent=sum(sizes),
        billed=sum(billed(u) for u in usages),
        cache_written=sum(u.cache_creation_input_tokens for u in usages),
        cache_read=sum(u.cache_read_input_tokens for u in usages),
        refused=refused,
        peak_request=max(sizes),
        window=window if managed else UNBOUNDED,
        compactions=sum(isinstance(e, ContextCompacted) for e in events),
        model_calls=state.usage.model_calls,
        seconds=seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="10,30,60")
    parser.add_argument("--window", type=int, default=60_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows: list[Figures] = []
    print(
        f"{'turns':>5} {'way':>8} {'done':>5} {'found':>5} {'input sent':>11} {'billed':>11} "
        f"{'written':>9} {'read':>9} {'refused':>7} {'peak req':>9} {'window':>10} "
        f"{'compact':>7} {'calls':>5} {'wall s':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for turns in [int(t) for t in args.turns.split(",")]:
            pair = [
                run(turns, args.window, managed, Path(tmp) / str(turns))
                for managed in (False, True)
            ]
            for f in pair:
                rows.append(f)
                print(
                    f"{f.turns:>5} {f.way:>8} {str(f.finished):>5} {str(f.found):>5} "
                    f"{f.sent:>11,} {f.billed:>11,.0f} {f.cache_written:>9,} {f.cache_read:>9,} "
                    f"{f.refused:>7} {f.peak_request:>9,} {f.window:>10,} {f.compactions:>7} "
                    f"{f.model_calls:>5} {f.seconds:>7.1f}"
                )
            naive, managed = pair
            print(
                f"{turns:>5}   managed ÷ naive: billed {managed.billed / naive.billed:.3f}, "
                f"sent {managed.sent / naive.sent:.3f}; peak request "
                f"{managed.peak_request / args.window:.0%} of the {args.window:,} window (naive "
                f"{naive.peak_request / args.window:.0%})"
            )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
