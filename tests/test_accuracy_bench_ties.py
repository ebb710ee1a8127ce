"""benchmarks/accuracy_bench_model.py's tie check (tie_check): whether memra f32's divergence from
transformers f32 is explained by ties in the DSA pool top-k. Hand-made index_scores and lists on
the CPU; memra's lists from kpool_select (ties to the lower pool), transformers' from the same
scores with one tie broken the other way (what torch.topk may do). torch only (no transformers).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from memra import _core

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import accuracy_bench_model as abm  # noqa: E402

POOL, BUDGET, T = 2, 2, 16  # 8 complete pools at the last row, select 2
WIDTH = BUDGET * POOL + POOL - 1


def lists(score):
    return _core.kpool_select(np.ascontiguousarray(score, np.float32), pool=POOL, select_k=BUDGET,
                              width=WIDTH, first_pos=0)


def scores():
    g = np.random.default_rng(5)
    s = g.permutation(T * 8).reshape(T, 8).astype(np.float32) / 7  # distinct: no ties
    s[9, :5] = [0.0, 3.0, 0.0, 0.0, 0.0]  # row 9 (5 pools visible): pool 1 first, 4 zeros tie
    return s


def store(s, tf_lists, layer=3):
    return {layer: (torch.from_numpy(s), torch.from_numpy(tf_lists), POOL, BUDGET)}


def test_tie_at_the_boundary_explains_the_divergence():
    s = scores()
    memra = lists(s)
    assert {int(x) for x in memra[9] if x >= 0} == {0, 1, 2, 3}  # pools 0, 1 (no tail at row 9)
    bumped = s.copy()
    bumped[9, 4] = 1e-3  # transformers' topk took pool 4 among the tied zeros
    tf_lists = lists(bumped)
    got = abm.tie_check(torch, store(s, tf_lists), {3: memra}, first_over=9)
    assert got["dsa_lists"]["3"] == {"rows_differ": 1, "first_row": 9, "comparable": 1,
                                     "exact_ties": 1, "near_ties": 0}
    assert got["dsa_first_differ"] == {"layer": 3, "row": 9, "kth_score": "0x0.0p+0",
                                       "differing_pools": {"0": "0x0.0p+0", "4": "0x0.0p+0"}}
    assert got["f32_divergence_explained_by_ties"] is True
    # Logits already off before the flipped row: something else moved them.
    assert abm.tie_check(torch, store(s, tf_lists), {3: memra}, first_over=8)[
        "f32_divergence_explained_by_ties"] is False
    # Nothing over 1e-4: nothing to explain.
    assert abm.tie_check(torch, store(s, memra), {3: memra}, first_over=None)[
        "f32_divergence_explained_by_ties"] is None


def test_near_tie_counts_and_a_real_difference_does_not():
    s = scores()
    s[12, :6] = [1.0, 5.0, 2.0, 2.0 + 2 ** -20, 0.5, 0.25]  # pools 2, 3 within f32 rounding
    memra = lists(s)
    near = s.copy()
    near[12, 3] = 2.0 - 2 ** -20  # transformers' scores put pool 2 ahead of pool 3
    got = abm.tie_check(torch, store(near, lists(near)), {3: memra}, first_over=12)
    assert got["dsa_lists"]["3"]["near_ties"] == 1 and got["dsa_untied_rows"] == 0
    assert got["f32_divergence_explained_by_ties"] is True
    # A list that takes a clearly lower-scored pool (a wrong choice, not a tie) is untied.
    wrong = memra.copy()
    wrong[12, :4] = [2, 3, 8, 9]  # pools 1, 4 (score 0.5) in place of pools 1, 3
    got = abm.tie_check(torch, store(near, lists(near)), {3: wrong}, first_over=12)
    assert got["dsa_untied_rows"] == 1 and got["f32_divergence_explained_by_ties"] is False


def test_later_layers_count_only_rows_before_an_earlier_flip():
    """A flip at row r of one DSA layer changes every later layer's input from row r on: those
    rows are not comparable (their differences are consequences, not ties to classify)."""
    s = scores()
    memra = lists(s)
    bumped = s.copy()
    bumped[9, 4] = 1e-3
    later = memra.copy()
    later[13, :4] = [14, 15, 16, 17]  # anything, at a row after the first flip
    tf = {**store(s, lists(bumped), 3), **store(s, memra, 7)}
    got = abm.tie_check(torch, tf, {3: memra, 7: later}, first_over=9)
    assert got["dsa_lists"]["7"] == {"rows_differ": 1, "first_row": 13, "comparable": 0,
                                     "exact_ties": 0, "near_ties": 0}
    assert got["f32_divergence_explained_by_ties"] is True
