"""Staged incidents: real faults on this machine, investigated end to end by shipped personas.

Each module stages one incident for real, bounded in time and size and always torn down, and
follows the matching persona's written recipe with a scripted model
(:mod:`workers.testing.recipe_model`): ``disk`` (a filesystem filling up), ``cpu`` (a runaway
process), ``memory`` (a process growing to its cgroup's limit), ``target_down`` (a Prometheus
scrape target down), ``clickhouse_mutation`` (a mutation stuck behind a failing part).
``knowledge/`` holds the playbooks the team would write for them. ``test_scenarios.py`` runs each
through real worker processes and Redis, and records and replays one (:mod:`workers.tool_tape`).
"""
