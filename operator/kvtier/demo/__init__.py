"""`kvtier demo`: the whole idea on one machine, watched live.

An embedded cluster (:mod:`kvtier.testing`) runs the operator and kvsim engines; the packaged
manifests (``manifests/*.yaml.j2``, :mod:`kvtier.demo.manifests`) create one KVPool and three
InferenceDeployments whose simulated loads take turns being busy (:mod:`kvtier.demo.workload`).
:mod:`kvtier.demo.observe` reads what the operator reports through the Kubernetes API only,
:mod:`kvtier.demo.view` shows it, :mod:`kvtier.demo.report` writes the summary and the plot, and
:mod:`kvtier.demo.run` ties them together.
"""

from kvtier.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
