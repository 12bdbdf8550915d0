"""Expected-value helpers shared by the column-type tests: how Silver prints a value, computed independently
of the job's own conversions."""
from __future__ import annotations


def interval_text(micros: int | None) -> str | None:
    """Spark's text of an `interval day to second` of `micros` microseconds, e.g.
    `INTERVAL '-34 22:59:59.999999' DAY TO SECOND` (trailing zeros of the fraction dropped)."""
    if micros is None:
        return None
    sign, rest = ("-" if micros < 0 else ""), abs(micros)
    d, rest = divmod(rest, 86400 * 10**6)
    h, rest = divmod(rest, 3600 * 10**6)
    m, rest = divmod(rest, 60 * 10**6)
    s, frac = divmod(rest, 10**6)
    fraction = f".{frac:06d}".rstrip("0") if frac else ""
    return f"INTERVAL '{sign}{d} {h:02d}:{m:02d}:{s:02d}{fraction}' DAY TO SECOND"
