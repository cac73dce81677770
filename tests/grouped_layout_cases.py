"""Grouping-tensor layouts with malformed values and the documented rules of what the kernel computes for them,
written out per row (independently of deepgemm.reference), shared by tests/cpu/test_grouped_layouts.py and
tests/gpu/test_grouped_layouts_gpu.py."""

from __future__ import annotations

import random

SEGMENT = 128


def rule_m_indices(m_indices: list[int], groups: int, lookup: int) -> list[int]:
    """Row r is computed with e = m_indices at the first row of its `lookup`-row chunk (128: block_m 128 / 256;
    64: block_m 64) when both e and m_indices[r] are in [0, groups); otherwise it is zero (-1)."""
    rows = []
    for r, value in enumerate(m_indices):
        head = m_indices[r // lookup * lookup]
        rows.append(head if 0 <= value < groups and 0 <= head < groups else -1)
    return rows


def rule_psum(psum: list[int], m_total: int) -> list[int]:
    """ContiguousPsumTileScheduler::group_at, transcribed: ends clamped to [0, M_total]; a forward cursor to the first
    group ending past row r; that group's start is the largest earlier end rounded up to 128."""
    ends = [min(max(v, 0), m_total) for v in psum]
    rows = []
    for r in range(m_total):
        group, previous = 0, 0
        while group < len(ends) and ends[group] <= r:
            previous = max(previous, ends[group])
            group += 1
        start = -(-previous // SEGMENT) * SEGMENT
        rows.append(group if group < len(ends) and r >= start else -1)
    return rows


def rule_masked(masked_m: list[int], max_m: int) -> list[tuple[int, int]]:
    """(rows computed, rows the kernel writes at all) per expert: masked_m clamped to [0, max_m], and the 64-row
    blocks holding those rows (the rest of the last block gets unspecified values; later blocks stay untouched)."""
    spans = []
    for count in masked_m:
        valid = min(max(count, 0), max_m)
        spans.append((valid, min(-(-valid // 64) * 64, max_m)))
    return spans


# ---------------------------------------------------------------- layouts


def _segments(*parts: list[int]) -> list[int]:
    rows = sum(parts, [])
    assert len(rows) % SEGMENT == 0
    return rows


M_INDICES_CASES = {
    "well formed": (3, _segments([0] * 100 + [-1] * 28, [1] * 128, [-1] * 128, [2] * 5 + [-1] * 123)),
    "two experts in one segment": (3, _segments([0] * 100 + [1] * 28, [1] * 128)),
    "segment starting with -1": (3, _segments([-1] * 10 + [2] * 118, [0] * 128)),
    "second half of another expert": (2, _segments([0] * 64 + [1] * 64)),
    "second half starting with -1": (2, _segments([0] * 64 + [-1] + [0] * 63, [1] * 20 + [-1] * 108)),
    "second half starting with -1, first half padding": (2, _segments([-1] * 64 + [-1] + [1] * 63)),
    "out-of-range experts": (3, _segments([0] * 50 + [3] * 20 + [-7] * 10 + [0] * 48, [5] * 128, [-2] + [1] * 127)),
    "padding inside an expert's rows": (2, _segments([0] * 10 + [-1] * 5 + [0] * 113, [1] * 70 + [-1] * 58)),
}

PSUM_CASES = {
    "well formed, an empty expert at its start": ([200, 256, 312], 384),
    "decreasing": ([300, 100, 500], 640),
    "negative ends": ([-5, 130, -1], 256),
    "past M_total": ([100, 900, 50], 256),
    "an end inside the previous expert's padding": ([100, 120, 300], 384),
    "all empty": ([0, 0], 128),
}

MASKED_CASES = {
    "in range": ([0, 1, 64, 65, 128], 128),
    "negative and past max_m": ([-3, 200, 70, -1, 129], 128),
    "one block": ([-100, 64, 65, 1000], 64),
}


def random_m_indices(rng: random.Random, groups: int, segments: int) -> list[int]:
    """Segments of every kind: well formed, two experts, -1 first, -1 at the second half's start, bad ids."""
    rows: list[int] = []
    for _ in range(segments):
        kind = rng.randrange(6)
        expert = rng.randrange(groups)
        count = rng.randint(0, SEGMENT)
        segment = [expert] * count + [-1] * (SEGMENT - count)
        if kind == 1:
            cut = rng.randint(1, SEGMENT - 1)
            segment[cut:] = [rng.randrange(groups)] * (SEGMENT - cut)
        elif kind == 2:
            segment[0] = -1
        elif kind == 3:
            segment = [expert] * SEGMENT
            segment[64] = -1
        elif kind == 4:
            for _ in range(rng.randint(1, 5)):
                segment[rng.randrange(SEGMENT)] = rng.choice([-3, -1, groups, groups + 7])
        rows += segment
    return rows
