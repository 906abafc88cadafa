"""Entry module for ``celery -A workers.app worker``: builds the app from the environment."""

from __future__ import annotations

from registry.settings import Settings
from workers.celery_app import make_celery

app = make_celery(Settings.load())
