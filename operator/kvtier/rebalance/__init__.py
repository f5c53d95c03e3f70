"""Rebalancing a pool between deployments, every ``spec.rebalance.interval``.

- :mod:`~kvtier.rebalance.estimator`: each deployment's demand curve (storage hit tokens per
  second at every quota) from its probe's stack-distance histogram, else its engine counters,
  with a confidence and a stale flag.
- :mod:`~kvtier.rebalance.allocator` (pure): curves, values, weights and bounds -> quotas.
- :mod:`~kvtier.rebalance.loop` (pure): one round's :class:`~kvtier.rebalance.loop.Decision`
  under the safety rules (minGain, maxStep, cooldown, dryRun, Static, frozen deployments) and the
  shrinks-first order of its quota changes.
- :mod:`~kvtier.rebalance.actuator`: the quota API calls and the readiness gate.
"""
