"""Rebalancing a pool between deployments: demand curves -> allocator (pure) -> actuator."""
