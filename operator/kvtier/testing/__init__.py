"""The embedded cluster: a Kubernetes API emulator, a pod simulator and simulated engines (tests, demo, benchmarks)."""
