"""How the suite shares the machine between pytest-xdist workers (scripts/test.sh runs `pytest -n <workers>`).

A work unit is a test module: its tests run in file order on one worker (phases build on each other, and module
fixtures start connectors and job runs once). Two exceptions: the crash tests are one unit each (they share no
fixture, and together they are the longest module), and the two modules that run applications on the stack's
standalone cluster share a unit (its two one-core workers serve one application at a time).

Units go out longest first (`WEIGHT_S`, seconds measured in a serial run; others count as 30). A worker gets its
next unit when one test of its current one is left: xdist holds a worker's last test until it has a next one (to
tear fixtures down right), so that test has not started yet. When the unit left is a heavy one (a single long test,
such as a crash test), the worker gets the shortest unit waiting instead of the longest, so that nothing long
queues behind it; the longest units start at once and the short ones fill in.

Every worker has its own run id (tests/conftest.py: RUN_ID), so schemas, topics, connectors, databases and lake
folders never collide; they share the stack.
"""
from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler.loadscope import LoadScopeScheduling
from xdist.workermanage import WorkerController

# A serial run's time per unit (scripts/test.sh prints it: "time per module"), to order them.
WEIGHT_S: dict[str, float] = {
    "tests/e2e/test_crash.py::test_kill_9_at_every_point_loses_and_duplicates_nothing": 760,
    "tests/e2e/test_partitions.py": 436,
    "tests/e2e/test_crash.py::test_kill_9_inside_table_creation_is_repaired_on_restart": 370,
    "tests/e2e/test_schema_changes.py": 700,
    "tests/e2e/test_types.py": 160,
    "tests/e2e/test_outages.py": 640,
    "tests/e2e/test_poison.py": 200,
    "tests/e2e/test_framings.py": 199,
    "tests/e2e/test_pipeline.py": 173,
    "tests/e2e/test_mariadb_types.py": 55,
    "tests/e2e/test_tickit_pipeline.py": 133,
    "tests/e2e/test_toast_deletes.py": 128,
    "tests/e2e/test_key_types.py": 235,
    "tests/e2e/test_column_names.py": 45,
    "tests/e2e/test_wide_table.py": 60,
    "tests/e2e/test_quarantine_replay.py": 110,
    "tests/e2e/test_snapshots.py": 140,
    "tests/e2e/test_source_growth.py": 220,
    "tests/e2e/test_table_layouts.py": 122,
    "standalone-cluster": 100,
    "tests/e2e/test_exactly_once.py": 96,
    "tests/e2e/test_widening_crash.py": 200,
    "tests/e2e/test_bench_smoke.py": 400,
    "tests/e2e/test_verify.py": 150,
    "tests/e2e/test_rebuild.py": 250,
    "tests/e2e/test_unwrap_smt.py": 88,
    "tests/e2e/test_status.py": 60,
    "tests/e2e/test_startup_checks.py": 60,
    "tests/test_creation.py": 51,
    "tests/e2e/test_image.py": 370,  # builds its image (debootstrap, podman) in its set-up
    "tests/e2e/test_sources.py": 42,
}
PER_TEST = {"tests/e2e/test_crash.py"}
SHARED = {"tests/e2e/test_emr_step.py": "standalone-cluster", "tests/e2e/test_standalone.py": "standalone-cluster"}
DEFAULT_WEIGHT_S = 30.0
HEAVY_S = 300.0  # a unit this long takes the shortest unit waiting as the next one of its worker


def unit_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in PER_TEST:
        return nodeid.split("[", 1)[0]
    return SHARED.get(module, module)


class ModuleScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the units, order and pacing of the module docstring."""

    collection: list[str] | None

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        collection = list(next(iter(self.registered_collections.values())))
        self.collection = collection
        units: dict[str, dict[str, bool]] = {}
        for nodeid in collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        order = sorted(units, key=lambda unit: -WEIGHT_S.get(unit, DEFAULT_WEIGHT_S))  # stable: file order after
        self.workqueue = OrderedDict((unit, units[unit]) for unit in order)
        for node in list(self.nodes)[len(self.workqueue):]:  # more workers than units
            self.assigned_work.pop(node, None)
            node.shutdown()
        for node in self.nodes:
            if self.workqueue and not node.shutting_down:
                self._assign_work_unit(node)
        for node in self.nodes:  # a unit of one test waits for a next one (module docstring)
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        assigned = self.assigned_work[node]
        if self._pending_of(assigned) > 1:
            return
        heavy = any(WEIGHT_S.get(unit, DEFAULT_WEIGHT_S) >= HEAVY_S and not all(tests.values())
                    for unit, tests in assigned.items())
        if heavy:
            self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)  # the shortest goes first
        self._assign_work_unit(node)
