"""How a simulated engine is configured: sizes, clock speed and the trace it replays by itself.

The ``kvtier sim serve`` options and the environment of a simulated pod's vLLM container use
the same names: an option ``--hbm-blocks`` is the variable ``KVSIM_HBM_BLOCKS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from kvtier.sim.engine import EngineParams

#: Environment variables that configure a simulated engine: ``KVSIM_`` + an option name in upper case.
ENV_PREFIX = "KVSIM_"


@dataclass(frozen=True)
class TraceLoad:
    """A trace a server replays by itself: arrivals shifted by ``time_shift`` seconds (requests
    that would arrive before the server started are skipped); with ``loop`` the trace starts
    over after its last request, one second later."""

    path: str
    time_shift: float = 0.0
    loop: bool = False
    salt: str = ""


#: A served replica's sizes unless told otherwise: a HBM prefix cache and a CPU tier (L2 comes from quotas).
SERVE_DEFAULTS = EngineParams(hbm_blocks=1024, cpu_blocks=2048)


def settings_from_env(
    env: Mapping[str, str], base: EngineParams = SERVE_DEFAULTS
) -> tuple[EngineParams, float, TraceLoad | None]:
    """Engine parameters, clock speed and trace load from ``KVSIM_*`` variables (the ``sim serve`` options).

    ``KVSIM_<ENGINEPARAMS FIELD>`` (e.g. ``KVSIM_HBM_BLOCKS``) over ``base``,
    ``KVSIM_SPEED``, and for a trace ``KVSIM_TRACE``, ``KVSIM_TIME_SHIFT``, ``KVSIM_LOOP``
    (true/false) and ``KVSIM_TRACE_SALT``. Raises ``ValueError`` for a value of the wrong type.
    """
    values = {key[len(ENV_PREFIX) :].lower(): value for key, value in env.items() if key.startswith(ENV_PREFIX)}
    overrides = {}
    for spec in fields(EngineParams):
        if spec.name in values:
            overrides[spec.name] = type(spec.default)(values[spec.name])
    params = replace(base, **overrides)
    speed = float(values.get("speed", 1.0))
    load = None
    if values.get("trace"):
        load = TraceLoad(
            path=values["trace"],
            time_shift=float(values.get("time_shift", 0.0)),
            loop=values.get("loop", "false").strip().lower() in ("1", "true", "yes"),
            salt=values.get("trace_salt", ""),
        )
    return params, speed, load
