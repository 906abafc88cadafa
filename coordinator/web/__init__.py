"""Where the web console's built assets live: ``dist/``, made by ``node web/build.mjs``.

The build is committed and shipped with the package, so ``ongrid api`` serves the console with
no Node.js on the machine (see :mod:`coordinator.api.console`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DIST"]

#: The built console: ``index.html``, ``assets/app.js``, ``assets/app.css``, ``licenses.txt``.
DIST = Path(__file__).parent / "dist"
