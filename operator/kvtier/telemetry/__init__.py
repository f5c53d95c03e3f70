"""Telemetry: scrape and parse the engines' metrics into per-deployment KV statistics.

- ``metrics``: the operator's own Prometheus metrics (``kvtier_*``).
"""
