"""How long parsing the Claude Code corpus takes, with the C YAML loader and without it.

    python bench/parse_corpus.py [CORPUS_DIR] [--repeat N]

Reports the best of N runs for each loader and their ratio, all measured in this one run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from registry import parser
from registry.errors import PersonaError

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared/corpus/claude-code-agents"


def _files(root: Path) -> list[Path]:
    return sorted(f for f in root.rglob("*.md") if f.name != "SOURCES.md")


def _run(files: list[Path], texts: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    loaded = 0
    for path, text in zip(files, texts, strict=True):
        try:
            parser.parse_persona(text, path=str(path))
            loaded += 1
        except PersonaError:
            pass  # most corpus files lack when_to_use: rejected after a full parse
    return time.perf_counter() - start, loaded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    files = _files(args.corpus)
    texts = [f.read_text(encoding="utf-8") for f in files]
    results = {}
    loaders = {
        "C (CSafeLoader)": getattr(yaml, "CSafeLoader", None),
        "pure Python": yaml.SafeLoader,
    }
    for label, loader in loaders.items():
        if loader is None:
            print(f"{label}: not available in this PyYAML build")
            continue
        parser._Loader = loader
        runs = [_run(files, texts) for _ in range(args.repeat)]
        results[label] = min(r[0] for r in runs)
        print(
            f"{label:>16}: {len(files)} files in {results[label] * 1000:7.1f} ms (best of "
            f"{args.repeat}), {results[label] / len(files) * 1e6:6.1f} µs/file"
        )
    if len(results) == 2:
        c, py = results.values()
        print(f"pure Python / C = {py / c:.2f}x")


if __name__ == "__main__":
    main()
