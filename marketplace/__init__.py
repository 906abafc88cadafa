"""Marketplace bundles: Claude Code plugin marketplaces installed as they are.

A marketplace (``.claude-plugin/marketplace.json``) lists plugins; a plugin carries Claude Code
subagent files (personas), Agent Skills, Ongrid skill manifests (tools without code) and MCP
servers. Installing copies a plugin into the marketplace root without running any of it; the
registry reads what is installed on every reload (:mod:`marketplace.layer`).
"""
