"""Alembic migrations of the coordinator's database (a package so it ships in the wheel).

Run them with :func:`coordinator.storage.engine.upgrade`. To write a new revision against a
scratch database::

    from alembic import command
    from coordinator.storage.engine import alembic_config
    command.revision(alembic_config("sqlite:////tmp/scratch.db"), "add foo",
                     autogenerate=True, rev_id="0002")

then read and fix the generated file in ``versions/`` (autogenerate misses renames and
CHECK constraints) before committing it.
"""
