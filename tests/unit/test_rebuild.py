"""scripts/rebuild.py's pure parts: the batches it reads Bronze in, and the gaps between ranges it reports."""
from __future__ import annotations

from app.sink.bronze import BronzeRange
from scripts.rebuild import batches_of, gaps_of


def _r(topic: str, partition: int, first: int, last: int) -> BronzeRange:
    return BronzeRange(topic, partition, first, last)


def test_each_round_takes_the_next_range_of_every_partition_and_a_batch_closes_at_its_size() -> None:
    ranges = {
        ("t", 0): [_r("t", 0, 0, 9), _r("t", 0, 10, 19), _r("t", 0, 20, 24)],
        ("t", 1): [_r("t", 1, 0, 4)],
        ("u", 0): [_r("u", 0, 0, 99), _r("u", 0, 100, 109)],
    }
    batches = batches_of(ranges, batch_records=100)
    assert [[(r.topic, r.partition, r.first) for r in b] for b in batches] == [
        [("t", 0, 0), ("t", 1, 0), ("u", 0, 0)],  # 115 records: closes after the first round
        [("t", 0, 10), ("u", 0, 100), ("t", 0, 20)],  # the rest, in offset order per partition
    ]
    # Every range once, and within a partition one batch after another.
    flat = [r for b in batches for r in b]
    assert sorted(flat, key=lambda r: (r.topic, r.partition, r.first)) == sorted(
        [r for rs in ranges.values() for r in rs], key=lambda r: (r.topic, r.partition, r.first))
    assert len(batches_of(ranges, batch_records=1)) == 6  # a range each
    assert batches_of({}, 10) == []


def test_gaps_are_the_offsets_between_ranges_no_range_holds() -> None:
    ranges = [_r("t", 0, 0, 9), _r("t", 0, 10, 19), _r("t", 0, 22, 30), _r("t", 0, 40, 40)]
    assert gaps_of(ranges) == [[20, 21], [31, 39]]
    assert gaps_of(ranges[:2]) == []
