"""Revision files, ``<rev>_<slug>.py``, revision ids ``0001``, ``0002``…"""
