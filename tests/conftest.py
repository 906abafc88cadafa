"""Fixtures every test directory shares; ``servers.py`` next to this file starts real backends."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # servers.py
