"""How long the persona loader takes on hostile files and on a random sample of broken ones.

    python bench/fuzz_loader.py [--samples N] [--seed S] [--loader c|python]

Each hostile file is parsed several times (best, worst and median reported) and its outcome
printed (loaded, or the reason it was refused); the random sample (seeded, no hypothesis) reports
its slowest files and the peak memory (tracemalloc) of the worst one. Figures are of this one run.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import string
import time
import tracemalloc
from collections.abc import Callable

import yaml

from registry import parser
from registry.errors import PersonaError

HEAD = "---\nname: hostile\ndescription: Hostile.\nwhen_to_use: Never.\n"


def _laughs(levels: int, width: int, key: str = "metadata") -> str:
    lines = [f"{key}:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def hostile() -> dict[str, str]:
    """Named frontmatters (between the head and the closing line) built to be expensive."""
    big = parser.MAX_FRONTMATTER_BYTES - 200
    return {
        "billion laughs (9 x 9)": _laughs(9, 9),
        "laughs, fallback path": _laughs(9, 9).replace("metadata:", "color: a: b\nmetadata:"),
        "laughs of text": "s: &s " + "x" * 5000 + "\nl: [" + ", ".join(["*s"] * 40) + "]\n",
        "recursive alias": "metadata: &m {a: *m, b: [*m, *m]}\n",
        "deep flow nesting": "x: " + "[" * 3000 + "]" * 3000 + "\n",
        "deep block nesting": "x:\n  " + "- " * 3000 + "a\n",
        "sexagesimal integer": "max_turns: 1" + ":1" * (big // 2 - 10) + "\n",
        "64 KiB of '{{'": "initial_prompt: '" + "{{" * (big // 2) + "'\n",
        "64 KiB flow list": "tools: [" + ", ".join(["a"] * (big // 3)) + "]\n",
        "64 KiB one line": "description2: " + "word " * (big // 5) + "\n",
        "64 KiB of keys": "".join(f"k{i}: v\n" for i in range(big // 8)),
        "unclosed list, 64 KiB": "tools: [" + "a, " * (big // 3) + "\n",
        "past the byte bound": "x: " + "y" * (parser.MAX_FRONTMATTER_BYTES + 10) + "\n",
    }


def _outcome(text: str) -> str:
    try:
        parsed = parser.parse_persona(text, path="bench.md")
    except PersonaError as exc:
        return f"refused: {exc.reason[:90]}"
    return f"loaded ({len(parsed.notes)} note(s))"


def _time(call: Callable[[], object], repeat: int) -> list[float]:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        runs.append(time.perf_counter() - start)
    return runs


def _parse(text: str) -> None:
    with contextlib.suppress(PersonaError):
        parser.parse_persona(text)


_PIECES = [
    "tools: [", "metadata:", "  - ", "  key: ", "&a ", "*a", "{", "}", "]", ": ", "'", '"', "\t",
    "# c", "!!binary /w==", "2021-13-01", "|", "**x**", "é日🙂", "1:2:3", "---",
]  # fmt: skip


def _random_frontmatter(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 30)):
        parts = [rng.choice(_PIECES) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.3:
            parts.append("".join(rng.choices(string.printable, k=rng.randint(0, 200))))
        if rng.random() < 0.02:
            parts.append("x" * rng.randint(1000, 20_000))
        lines.append("".join(parts))
    if rng.random() < 0.1:
        lines.append(_laughs(rng.randint(2, 10), rng.randint(2, 12), key=f"k{rng.randint(0, 9)}"))
    return "\n".join(lines) + "\n"


def _peak(text: str) -> int:
    tracemalloc.start()
    try:
        _parse(text)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--loader", choices=["c", "python"], default="c")
    args = ap.parse_args()
    if args.loader == "python":
        parser._Loader = yaml.SafeLoader
    print(f"YAML loader: {parser._Loader.__name__}")

    print(f"\nhostile files (best / median / worst of {args.repeat}):")
    for name, front in hostile().items():
        text = HEAD + front + "---\nBody.\n"
        runs = _time(lambda text=text: _parse(text), args.repeat)
        print(
            f"  {name:<24} {len(text) / 1024:6.1f} KiB  {min(runs) * 1000:8.2f} / "
            f"{statistics.median(runs) * 1000:8.2f} / {max(runs) * 1000:8.2f} ms  {_outcome(text)}"
        )

    rng = random.Random(args.seed)
    texts = [HEAD + _random_frontmatter(rng) + "---\nBody.\n" for _ in range(args.samples)]
    timed = sorted(((_time(lambda t=t: _parse(t), 1)[0], t) for t in texts), reverse=True)
    total = sum(seconds for seconds, _ in timed)
    loaded = sum(1 for t in texts if _outcome(t).startswith("loaded"))
    print(f"\nrandom sample: {len(texts)} files (seed {args.seed}), {loaded} loaded")
    print(f"  total {total * 1000:.1f} ms, mean {total / len(texts) * 1e6:.1f} µs/file")
    for seconds, text in timed[:3]:
        print(f"  slow: {seconds * 1000:7.2f} ms  {len(text) / 1024:6.1f} KiB  {_outcome(text)}")
    worst = timed[0][1]
    print(f"  peak memory of the slowest file: {_peak(worst) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
