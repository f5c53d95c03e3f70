"""Rebalancing a pool between deployments, every ``spec.rebalance.interval``.

- :mod:`~kvtier.rebalance.estimator`: each deployment's demand curve (storage hit tokens per
  second at every quota) from its probe's stack-distance histogram, else its engine counters,
  with a confidence and a stale flag.
- :mod:`~kvtier.rebalance.demand`: the live deployments' estimators, fed every scrape by the
  telemetry loop (probe pages, engine counters), asked for curves in a pool's allocation unit.
- :mod:`~kvtier.rebalance.allocator` (pure): curves, values, weights and bounds -> quotas.
- :mod:`~kvtier.rebalance.loop` (pure): one round's :class:`~kvtier.rebalance.loop.Decision`
  under the safety rules (minGain, maxStep, cooldown, dryRun, Static, frozen deployments) and the
  shrinks-first order of its quota changes.
- :mod:`~kvtier.rebalance.actuator`: the quota API calls and the readiness gate.

The round against the cluster (ledger first, then quotas, Events, ``status.lastRebalance``,
``kvtier_rebalance_*``) is :mod:`kvtier.controllers.rebalancing`, a daemon per KVPool.
"""
