"""Price tables for capacity planning: what a pool's capacity costs, bought by the array or by the terabyte.

:func:`price_table` reads the YAML shape (bare, or in a ConfigMap's ``prices.yaml`` key:
manifests/examples/prices-fx100.yaml); :meth:`PriceTable.choose` picks the cheapest option whose read
bandwidth carries the hits' reads (:func:`kvtier.rebalance.planner.priced` uses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The key of a ConfigMap that holds a price table.
PRICES_KEY = "prices.yaml"


@dataclass(frozen=True)
class PriceOption:
    """One way to buy capacity: whole arrays (``array_bytes`` each) or by the terabyte."""

    name: str
    price_per_array: float | None = None
    array_bytes: int | None = None
    array_read_bytes_per_second: float | None = None
    price_per_tb: float | None = None

    def __post_init__(self) -> None:
        per_array = self.price_per_array is not None
        if per_array == (self.price_per_tb is not None):
            raise ValueError(f"price option {self.name!r}: needs exactly one of perArray and perTB")
        if per_array and not (self.array_bytes and self.array_bytes > 0):
            raise ValueError(f"price option {self.name!r}: perArray needs a capacity > 0")

    def arrays(self, capacity_bytes: int) -> int | None:
        return None if self.array_bytes is None else max(1, -(-capacity_bytes // self.array_bytes))

    def arrays_read_bandwidth(self, capacity_bytes: int) -> float | None:
        """Read bytes per second of the arrays that hold ``capacity_bytes``, when the option says."""
        arrays = self.arrays(capacity_bytes)
        if arrays is None or self.array_read_bytes_per_second is None:
            return None
        return arrays * self.array_read_bytes_per_second

    def price(self, capacity_bytes: int) -> float:
        arrays = self.arrays(capacity_bytes)
        if arrays is not None:
            return arrays * (self.price_per_array or 0.0)  # __post_init__: per-array options have a price
        return capacity_bytes / 1e12 * (self.price_per_tb or 0.0)  # and the others a per-TB one


@dataclass(frozen=True)
class PriceTable:
    currency: str
    options: tuple[PriceOption, ...]
    amortization_years: float = 3.0
    """Over how long a purchase is spread when priced per saved GPU-hour."""

    def choose(
        self, capacity_bytes: int, read_bytes_per_second: float, read_bandwidth: float | None = None
    ) -> tuple[PriceOption, float]:
        """The cheapest option whose read bandwidth (the pool's when given, else its arrays') carries
        ``read_bytes_per_second``; the cheapest of all when none does."""

        def carries(option: PriceOption) -> bool:
            arrays_bandwidth = option.arrays_read_bandwidth(capacity_bytes)
            if read_bandwidth is not None or arrays_bandwidth is None:
                return read_bandwidth is None or read_bytes_per_second <= read_bandwidth
            return read_bytes_per_second <= arrays_bandwidth

        priced = sorted(((option.price(capacity_bytes), index, option) for index, option in enumerate(self.options)))
        fitting = [entry for entry in priced if carries(entry[2])] or priced
        price, _, option = fitting[0]
        return option, price


def price_table(data: Mapping[str, Any]) -> PriceTable:
    """A price table from its YAML shape, bare or in a ConfigMap's ``prices.yaml`` key
    (manifests/examples/prices-fx100.yaml); errors name the field."""
    import yaml

    from kvtier.api.units import parse_quantity

    if isinstance(data, Mapping) and data.get("kind") == "ConfigMap":
        text = (data.get("data") or {}).get(PRICES_KEY)
        if not isinstance(text, str):
            raise ValueError(f"data.{PRICES_KEY}: required in a ConfigMap of prices")
        data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError("a price table is a mapping with currency and options")
    options = data.get("options")
    if not isinstance(options, list) or not options:
        raise ValueError("options: needs at least one price option")
    parsed = []
    for index, row in enumerate(options):
        where = f"options[{index}]"
        if not isinstance(row, Mapping) or not row.get("name"):
            raise ValueError(f"{where}.name: required")
        try:
            if "perArray" in row:
                per_array = row["perArray"]
                bandwidth = per_array.get("readBandwidth")
                parsed.append(
                    PriceOption(
                        str(row["name"]),
                        price_per_array=float(per_array["price"]),
                        array_bytes=parse_quantity(per_array["capacity"]),
                        array_read_bytes_per_second=None if bandwidth is None else float(parse_quantity(bandwidth)),
                    )
                )
            else:
                parsed.append(
                    PriceOption(str(row["name"]), price_per_tb=float(row["perTB"]) if "perTB" in row else None)
                )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"{where} ({row.get('name')}): {error}") from error
    return PriceTable(str(data.get("currency", "")), tuple(parsed), float(data.get("amortizationYears", 3.0)))
