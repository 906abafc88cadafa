"""Test modules here share the marketplace writers of ``test_layer`` (``Market``, ``agent``…)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
