"""``query_knowledge`` / ``search_knowledge``: BM25 over the sections of Markdown runbooks.

Every Markdown file under the ``knowledge_dirs`` setting is split at its headings; each section is
a document. Ranking is Okapi BM25 (k1=1.2, b=0.75, title words counted twice). The score shown is
the same per-term saturation with each term's contribution capped at 1, weighted by IDF and
divided by the query's total IDF: 1.0 means every query word appears in the section at least at
its typical density, and words the knowledge base has never seen pull the score down. Personas
follow a playbook when the score is at least 0.6. Files are read on every call, so a new runbook
is searchable at once; the search is deterministic (ties broken by path and line).
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._common import error, not_configured, path_list, setting

__all__ = ["TOOLS", "Section", "rank_sections", "split_sections"]

K1, B = 1.2, 0.75
TITLE_WEIGHT = 2
EXCERPT_CHARS = 700
MAX_FILES = 5000
MAX_FILE_BYTES = 2 * 1024 * 1024
_EXTENSIONS = (".md", ".markdown")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_WORD = re.compile(r"[^\W_]+")
_STOPWORD_TEXT = (
    "a an and are as at be by can do does for from has have how i if in into is it its me my "
    "no not of on or our should so that the their then there these this to was we what when "
    "where which while who why will with you your"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@dataclass(frozen=True)
class Section:
    """One heading and the text under it (up to the next heading of any level)."""

    path: str
    line: int
    title: str
    body: str


def tokens(text: str) -> list[str]:
    """Lower-cased words without stopwords, plural ``s`` stripped so disk matches disks."""
    words = (w.lower() for w in _WORD.findall(text))
    return [
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
        for w in words
        if len(w) > 1 and w not in _STOPWORDS
    ]


def split_sections(text: str, path: str) -> list[Section]:
    """Cut a Markdown file at its ATX headings (not inside code fences). Titles carry their
    parents ("Disk full > Check inodes"); text before the first heading is titled by the file."""
    stem = os.path.splitext(os.path.basename(path))[0]
    sections: list[Section] = []
    stack: list[tuple[int, str]] = []
    body: list[str] = []
    title, start, in_fence = stem, 1, False

    def flush() -> None:
        # A heading with nothing under it is no answer; its words live on in its children's titles.
        if any(line.strip() for line in body):
            sections.append(Section(path, start, title, "\n".join(body).strip()))

    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else _HEADING.match(line)
        if heading is None:
            body.append(line)
            continue
        flush()
        level = len(heading.group(1))
        stack = [(lvl, t) for lvl, t in stack if lvl < level] + [(level, heading.group(2))]
        title, start, body = " > ".join(t for _, t in stack), number, []
    flush()
    return sections


def _markdown_files(dirs: list[str]) -> Iterator[str]:
    count = 0
    for root in dirs:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.lower().endswith(_EXTENSIONS) and count < MAX_FILES:
                    count += 1
                    yield os.path.join(dirpath, name)


def load_sections(dirs: list[str]) -> list[Section]:
    """Every section of every Markdown file under ``dirs``; unreadable files are skipped."""
    sections = []
    for path in _markdown_files(dirs):
        try:
            if os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            with open(path, encoding="utf-8", errors="replace") as handle:
                sections += split_sections(handle.read(), path)
        except OSError:
            continue
    return sections


def _term_weight(tf: int, length: int, avg_length: float) -> float:
    """The BM25 term-frequency factor: 1.0 for one mention in a section of average length."""
    return tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg_length))


def rank_sections(query: str, sections: list[Section]) -> list[tuple[float, Section]]:
    """``(score in 0..1, section)`` for sections sharing a word with the query, best first."""
    terms = sorted(set(tokens(query)))
    if not terms or not sections:
        return []
    docs = [Counter(tokens(s.body) + tokens(s.title) * TITLE_WEIGHT) for s in sections]
    lengths = [sum(doc.values()) for doc in docs]
    avg_length = max(sum(lengths) / len(docs), 1.0)
    n = len(docs)
    idf = {
        t: math.log(1 + (n - df + 0.5) / (df + 0.5))
        for t in terms
        for df in [sum(1 for doc in docs if t in doc)]
    }
    total_idf = sum(idf.values())
    ranked = []
    for doc, length, section in zip(docs, lengths, sections, strict=True):
        weights = {t: _term_weight(doc[t], length, avg_length) for t in terms if doc[t]}
        if not weights:
            continue
        bm25 = sum(idf[t] * w for t, w in weights.items())
        score = sum(idf[t] * min(1.0, w) for t, w in weights.items()) / total_idf
        ranked.append((round(score, 3), bm25, section))
    ranked.sort(key=lambda r: (-r[0], -r[1], r[2].path, r[2].line))
    return [(score, section) for score, _, section in ranked]


def _excerpt(body: str) -> str:
    text = re.sub(r"\n{3,}", "\n\n", body).strip()
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS].rstrip() + " [...]"


def _search(
    query: Annotated[
        str,
        Field(
            description="What you are looking for, in plain words: the "
            "symptom, component or alert name."
        ),
    ],
    context: ToolContext,
    limit: Annotated[int, Field(ge=1, le=10, description="How many sections to return.")] = 3,
) -> ToolResult:
    """Search the team's knowledge base (runbooks, playbooks, postmortems in Markdown) and return
    the best matching sections: title, file path and line, a relevance score from 0 to 1 and an
    excerpt. A score of 0.6 or more means the section covers the query: follow that playbook and
    cite its path; below 0.6 treat it as background only. Read the whole file with `read_repo`
    when the excerpt is cut."""
    dirs = path_list(setting(context, "knowledge_dirs"))
    if not dirs:
        return not_configured(
            "knowledge search",
            "ONGRID_KNOWLEDGE_DIRS",
            "directories of Markdown runbooks, separated by os.pathsep",
        )
    existing = [d for d in dirs if os.path.isdir(d)]
    if not existing:
        return error(f"none of the knowledge directories exist: {', '.join(dirs)}")
    ranked = rank_sections(query, load_sections(existing))[:limit]
    if not ranked:
        return ToolResult(content=f"no knowledge section matches {query!r}", data=[])
    results: list[dict[str, Any]] = [
        {
            "title": s.title,
            "path": s.path,
            "line": s.line,
            "score": score,
            "excerpt": _excerpt(s.body),
        }
        for score, s in ranked
    ]
    blocks = [
        f"{i}. {r['title']} (score {r['score']:.2f})\n   {r['path']}:{r['line']}\n{r['excerpt']}"
        for i, r in enumerate(results, 1)
    ]
    return ToolResult(content="\n\n".join(blocks), data=results)


query_knowledge = function_tool(
    ToolClass.READ, name="query_knowledge", requires=("knowledge_dirs",)
)(_search)
search_knowledge = function_tool(
    ToolClass.READ, name="search_knowledge", requires=("knowledge_dirs",)
)(_search)

TOOLS = (query_knowledge, search_knowledge)
