"""Reading a Hudi table's timeline from its files (Hudi 1.x layout: .hoodie/timeline/<begin>_<end>.<action>)."""
from __future__ import annotations

from pathlib import Path

COMMIT_ACTIONS = ("commit", "deltacommit", "replacecommit")


def completed_instants(table_path: str | Path, actions: tuple[str, ...] = COMMIT_ACTIONS) -> list[str]:
    """Begin times of the completed instants of the given actions, oldest first."""
    timeline = Path(table_path) / ".hoodie" / "timeline"
    instants = []
    for f in timeline.glob("*_*.*"):
        stem, _, action = f.name.partition(".")
        if action in actions:
            instants.append(stem.split("_")[0])
    return sorted(instants)
