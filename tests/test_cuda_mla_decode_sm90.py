"""Batched MLA decode, the sm_90a wgmma arm (cuda/mla_decode_sm90.cu; its launches and split
merges in cuda/mla_decode_sm90_launch.cu): dense bf16 caches at H = 64, R = 512, selected by
KernelOptions.mla_decode_variant = 1 (the default; 0 = the mma.sync kernel of
cuda/mla_decode_tc.cu). Inputs, the call and the bf16 limits against the CPU oracle (BF16_REL,
BF16_QROUND_REL): tests/test_cuda_mla_decode.py's docstring.

Against the mma.sync kernel on the same inputs, WGMMA_VS_MMA_REL = 5e-3: both arms round q and p
to bf16 the same way and differ in the order of the f32 sums inside the tensor cores (a score
moves by ~1e-7 relative, so now and then a p rounds to the neighbouring bf16 value in one arm and
not the other) and in the max p is taken against (the wgmma arm's may lag the tile maxima by up
to 8 in log2 units, which scales a row's p by one factor before rounding: the same relative
precision, other roundings); each arm is 0.9e-3..1.3e-3 from the CPU on the bf16-rounded q (the
float64 emulation of tests/test_cuda_mla_decode.py), so their difference stays below ~2.6e-3.
Diagnostic tests isolate the two products: q = 0 makes every weight exactly 1, so the output is
the mean of the visible rows whatever S is (the PV product and its N-major operand); q_h = c_{r_h}
makes row r_h win by > 200 in log2 units, every other weight underflows to exactly 0 and the output
is c_{r_h} bit for bit (the QK product and its K-major operands). Every split merge form
(KernelOptions.mla_merge) runs at 2, 8, 16 and 64 splits, the kernel census naming the form;
the grid barrier's merge at 2 to 32 active splits (its one-trip forms and the general one).

A small shape for ``compute-sanitizer`` (racecheck / memcheck / synccheck), every merge form:
``python -m pytest tests/test_cuda_mla_decode_sm90.py -k sanitizer``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_round, engine_with, f32, kernel_names
from mla_decode_batch import BF16_QROUND_REL, BF16_REL, Batch, close_per_seq, random_lists

pytestmark = pytest.mark.cuda


WGMMA_VARIANTS = [1]  # the wgmma kernel (0 is the mma.sync kernel it is compared with)
WGMMA_VS_MMA_REL = 5e-3
# t_kv per case, chosen around the 64-row tile (and 48) and the split chunks; 0 = idle row.
WGMMA_EDGES = [1, 63, 64, 65, 4095, 4096, 0, 47, 48, 49, 95, 96, 97, 200, 2047, 2049]
WGMMA_CASES = {
    "b1_4096": [4096],
    "b1_1": [1],
    "b3_tile_edges": [63, 64, 65],
    "b3_long_one_idle": [4095, 1, 0],
    "b64_mixed": [WGMMA_EDGES[(b * 5) % len(WGMMA_EDGES)] for b in range(64)],
}
_wgmma_cpu = {}  # (case, rounded q) -> CPU output: the oracle is the slow part, shared by variants


@pytest.fixture(params=WGMMA_VARIANTS, ids=lambda v: f"v{v}")
def variant(request):
    return request.param


def arm(variant: int) -> memra.Engine:
    """A CUDA engine whose dense bf16 H 64 R 512 decode runs arm `variant` (0: mma.sync)."""
    return engine_with(mla_decode_variant=variant)


def wgmma_batch(case, seed):
    return Batch(WGMMA_CASES[case], 64, 512, "bfloat16", seed=seed)


@pytest.mark.parametrize("bound", ["max_t_kv", "max_len"])
@pytest.mark.parametrize("case", list(WGMMA_CASES))
def test_wgmma_dense_matches_cpu_and_mma_kernel(variant, case, bound):
    """The wgmma arm against the CPU (q as given and bf16-rounded) and against the mma.sync arm;
    bound max_len: max_t_kv = max(t_kv) + 3001 (a decode graph passes the cache length), so the
    split plan differs and every row ends before the plan's last split."""
    bt = wgmma_batch(case, seed=len(case) * 7 + len(WGMMA_CASES[case]))
    kw = {"max_t_kv": max(bt.t_kv) + 3001} if bound == "max_len" else {}
    got = bt.gpu(arm(variant), **kw)
    mma = bt.gpu(arm(0), **kw)
    bt.exact_rows(got)
    if (case, False) not in _wgmma_cpu:
        _wgmma_cpu[(case, False)] = bt.cpu()
        _wgmma_cpu[(case, True)] = bt.cpu(q=bf16_round(bt.q))
    close_per_seq(got, _wgmma_cpu[(case, False)], BF16_REL)
    close_per_seq(got, _wgmma_cpu[(case, True)], BF16_QROUND_REL)
    close_per_seq(got, mma, WGMMA_VS_MMA_REL)


def test_wgmma_arm_is_selected(e, variant):
    """The option switches arms: long rows give different f32 bits (another summation order),
    each arm is deterministic, and the default engine runs the wgmma arm (variant 1)."""
    bt = Batch([4096, 300, 65], 64, 512, "bfloat16", seed=81)
    new = bt.gpu(arm(variant))
    again = bt.gpu(arm(variant))
    old = bt.gpu(arm(0))
    np.testing.assert_array_equal(new, again)
    assert not np.array_equal(new, old), "mla_decode_variant did not select the wgmma arm"
    np.testing.assert_array_equal(bt.gpu(e), bt.gpu(arm(1)))


# The merge forms of KernelOptions.mla_merge, as the kernel census names them: the attention
# kernel's template argument (cuda/mla_decode_sm90.cuh, Merge) and the combine launch.
MERGE_FORM = {1: "<0>", 2: "<1>", 3: "<2>"}


@pytest.mark.parametrize("B,L", [(64, 4096), (16, 4096), (8, 4096), (2, 4096)])
def test_wgmma_split_merges(B, L, tmp_path):
    """A sequence's splits merged in each form KernelOptions.mla_merge selects (1 the combine
    launch, 2 a thread-block cluster, 3 a grid barrier, 0 the choice) keep the bf16 limits
    against the CPU; rows of various lengths (idle, one-split and partly-split sequences) share
    the launch. On the H200 (132 SMs) these shapes plan 2, 8, 16 and 64 splits: the cluster runs
    up to 16 (16 clusters of 8 or 8 of 16 do not all fit at once: they run in two waves), 64
    splits take the combine instead; the grid barrier runs all four (128 blocks); the choice
    never takes the combine at these four (the cluster at 2 splits, the barrier at 8, 16 and
    64). Each form runs a second call with other queries: the barrier's counters are back at
    zero after a launch."""
    t_kv = [L if b % 3 else max(1, L // (b + 2)) for b in range(B)]
    t_kv[-1] = 0
    bt = Batch(t_kv, 64, 512, "bfloat16", seed=B + L)
    want = bt.cpu()
    torch = pytest.importorskip("torch", reason="the kernel census reads torch.profiler")
    h200 = torch.cuda.get_device_properties(0).multi_processor_count == 132
    got_by = {}
    for merge in (0, 1, 2, 3):
        eng = engine_with(mla_merge=merge)
        got = got_by[merge] = bt.gpu(eng, max_t_kv=L)
        close_per_seq(got, want, BF16_REL)
        # Other queries through the same engine: partials left from the call before (a barrier
        # whose counters were not back at zero would not wait for them) would show here.
        q2 = np.ascontiguousarray(bt.q[::-1])
        close_per_seq(bt.gpu(eng, q=q2, max_t_kv=L), bt.cpu(q=q2), BF16_REL)
        q, cs = eng.to_device(bt.q), bt.caches(eng)

        def call():
            _core.mla_attn_decode(q, cs, t_kv, scale=bt.scale, max_t_kv=L, engine=eng)
            eng.synchronize()

        names = " ".join(kernel_names(call, tmp_path / f"trace{merge}.json"))
        assert "mla_decode_wgmma_kernel" in names, names
        if not h200:
            continue
        combine = "mla_combine_kernel" in names
        if merge == 0:
            assert not combine, names
        elif merge == 2 and B == 2:  # 64 splits: more than a cluster holds
            assert combine and "mla_decode_wgmma_kernel<0>" in names, names
        else:
            assert combine == (merge == 1), names
            assert "mla_decode_wgmma_kernel" + MERGE_FORM[merge] in names, names
    if h200 and B != 2:
        # The cluster and the grid barrier ran the same attention and merge the same partials by
        # the same operations in the same order (merge_heads, or merge_heads_one_trip at 2..32
        # active splits a power of two): a wrong head, split or weight in either shows far above
        # this bound.
        scale = np.abs(got_by[2]).max()
        np.testing.assert_allclose(got_by[3], got_by[2], rtol=0, atol=1e-6 * scale)


def test_wgmma_grid_merge_split_counts(tmp_path):
    """The grid barrier's merge at every active-split count it has a one-trip form for (2, 4, 8,
    16, 32: merge_heads_one_trip) and at counts it has not (3, 5: merge_heads), 128-row splits
    (mla_split_tiles 2) of sequences up to 4096 rows, against the CPU within the bf16 limits."""
    torch = pytest.importorskip("torch", reason="the kernel census reads torch.profiler")
    h200 = torch.cuda.get_device_properties(0).multi_processor_count == 132
    eng = engine_with(mla_split_tiles=2, mla_merge=3)
    # Active splits: 32, 16, 8, 3 and 4, 2, 2, 5 (ceil(t_kv / 128)); 32 splits x 4 sequences =
    # 128 blocks, one wave on the H200's 132 SMs.
    for i, t_kv in enumerate(([4096, 2048, 1000, 300], [512, 256, 129, 640])):
        bt = Batch(t_kv, 64, 512, "bfloat16", seed=40 + i)
        close_per_seq(bt.gpu(eng, max_t_kv=4096), bt.cpu(), BF16_REL)
    if not h200:
        return
    q, cs = eng.to_device(bt.q), bt.caches(eng)

    def call():
        _core.mla_attn_decode(q, cs, bt.t_kv, scale=bt.scale, max_t_kv=4096, engine=eng)
        eng.synchronize()

    names = " ".join(kernel_names(call, tmp_path / "trace.json"))
    assert "mla_decode_wgmma_kernel" + MERGE_FORM[3] in names, names
    assert "mla_combine_kernel" not in names, names


def test_wgmma_uniform_weights_isolate_pv(variant):
    """q = 0: every score is 0 and every weight exactly 1, so o = the mean of the visible rows
    whatever the QK product reads; a wrong row or column of the PV operand shows as O(1)."""
    t_kv = [1, 63, 64, 65, 100, 4096, 47, 49]
    bt = Batch(t_kv, 64, 512, "bfloat16", seed=82)
    q = np.zeros_like(bt.q)
    for kw in ({}, {"max_t_kv": 9000}):
        got = bt.gpu(arm(variant), q=q, **kw)
        want = np.stack([np.broadcast_to(r.astype(np.float64).mean(0), (64, 512)) for r in bt.rows])
        close_per_seq(got, f32(want), 1e-3)  # f32 sums of up to 4096 rows / n
        np.testing.assert_array_equal(got[0], np.broadcast_to(bt.rows[0][0], (64, 512)))


def test_wgmma_peaked_scores_isolate_qk(variant):
    """q_h = c_{r_h} (bf16 values, exact after rounding) with scale 1: row r_h beats every other
    row by > 200 (log2 units), every other weight is exactly 0 and o_h = c_{r_h} bit for bit; a
    wrong row or column of the QK operands selects another row."""
    t_kv = [4096, 65, 150, 48]
    bt = Batch(t_kv, 64, 512, "bfloat16", seed=83)
    q = np.zeros_like(bt.q)
    pick = np.zeros((len(t_kv), 64), np.int64)
    for b, t in enumerate(t_kv):
        pick[b] = (np.arange(64) * 37 + 5 * b + 3) % t
        q[b] = bt.rows[b][pick[b]]
        s = (q[b].astype(np.float64) @ bt.rows[b].astype(np.float64).T) * np.log2(np.e)
        top = s[np.arange(64), pick[b]]
        s[np.arange(64), pick[b]] = -np.inf
        assert (top - s.max(1)).min() > 200, "inputs do not separate the rows enough"
    eng = arm(variant)
    for kw in ({}, {"max_t_kv": 9000}):
        got = eng.to_host(_core.mla_attn_decode(eng.to_device(q), bt.caches(eng), t_kv, scale=1.0,
                                                engine=eng, **kw))
        for b in range(len(t_kv)):
            np.testing.assert_array_equal(got[b], bt.rows[b][pick[b]], err_msg=f"sequence {b}")


def test_wgmma_long_row(variant):
    """32768 rows (many splits and the combine over them) beside a short and an idle row."""
    bt = Batch([32768, 9, 0], 64, 512, "bfloat16", seed=84)
    got = bt.gpu(arm(variant))
    mma = bt.gpu(arm(0))
    close_per_seq(got, bt.cpu(), BF16_REL)
    close_per_seq(got, bt.cpu(q=bf16_round(bt.q)), BF16_QROUND_REL)
    close_per_seq(got, mma, WGMMA_VS_MMA_REL)
    bt.exact_rows(got)


def test_wgmma_graph_form_device_t_kv(variant):
    """The decode-graph call: device t_kv, max_t_kv = the cache length; the same bytes as host
    t_kv under the same bound, idle rows zero and without effect on the other rows' bytes, a
    later step under the same bound still matches the CPU."""
    t_kv = [300, 1, 0, 4096, 129, 64, 65, 2000]
    max_len = 4200
    eng = arm(variant)
    bt = Batch(t_kv, 64, 512, "bfloat16", seed=85, slack=max_len - 4096)
    dev = bt.gpu(eng, t_kv=eng.to_device(np.array(t_kv, np.int32)), max_t_kv=max_len)
    host = bt.gpu(eng, max_t_kv=max_len)
    np.testing.assert_array_equal(dev, host)
    close_per_seq(dev, bt.cpu(), BF16_REL)
    bt.exact_rows(dev)
    idle = [0, 4, 6]
    t_idle = [0 if b in idle else t for b, t in enumerate(t_kv)]
    q = bt.q.copy()
    q[idle] = np.nan  # nothing of an idle row is read
    got = bt.gpu(eng, t_kv=eng.to_device(np.array(t_idle, np.int32)), q=q, max_t_kv=max_len)
    for b in range(len(t_kv)):
        want = np.zeros((64, 512), np.float32) if b in idle else dev[b]
        np.testing.assert_array_equal(got[b], want)
    moved = [t + 1 if t else 0 for t in t_kv]
    bt2 = Batch(moved, 64, 512, "bfloat16", seed=86, slack=max_len - 4097)
    dev2 = bt2.gpu(eng, t_kv=eng.to_device(np.array(moved, np.int32)), max_t_kv=max_len)
    close_per_seq(dev2, bt2.cpu(), BF16_REL)


def test_wgmma_option_leaves_other_forms(variant):
    """Gathered lists, float32 caches and other H / R run the mma.sync / f32 kernels whatever
    mla_decode_variant says: the same bytes as under 0."""
    t_kv = [200, 0, 65]
    cases = [
        (Batch(t_kv, 64, 512, "bfloat16", seed=87), random_lists(t_kv, 70, seed=88)),
        (Batch(t_kv, 64, 512, "float32", seed=89), None),
        (Batch(t_kv, 16, 128, "bfloat16", seed=90), None),
        (Batch(t_kv, 64, 256, "bfloat16", seed=91), None),
    ]
    for bt, idx in cases:
        got = bt.gpu(arm(variant), idx=idx)
        want = bt.gpu(arm(0), idx=idx)
        np.testing.assert_array_equal(got, want)


def test_wgmma_split_tiles_sets_the_plan(tmp_path):
    """KernelOptions.mla_split_tiles sets the wgmma arm's 64-row tiles a split too: at 64 tiles
    a split two sequences of 4096 rows run one split each (the attention kernel alone, no
    combine, no partials), where the cost model plans 64 splits merged by the combine launch;
    both within the bf16 limits of the CPU."""
    pytest.importorskip("torch", reason="the kernel census reads torch.profiler")
    bt = Batch([4096, 4096], 64, 512, "bfloat16", seed=19)
    want = bt.cpu()
    for tiles, one_split in ((64, True), (0, False)):
        eng = engine_with(mla_split_tiles=tiles, mla_merge=1)
        close_per_seq(bt.gpu(eng), want, BF16_REL)
        q, cs = eng.to_device(bt.q), bt.caches(eng)

        def call():
            _core.mla_attn_decode(q, cs, bt.t_kv, scale=bt.scale, engine=eng)
            eng.synchronize()

        names = " ".join(kernel_names(call, tmp_path / f"trace{tiles}.json"))
        assert "mla_decode_wgmma_kernel" in names, names
        assert ("mla_combine_kernel" in names) != one_split, names


def test_sanitizer_wgmma_small_shapes():
    """compute-sanitizer target for the wgmma arm: one split and many, every merge form (the
    choice, the combine, the cluster, the grid barrier; with 64-row splits the grid's one-trip
    merges at 2 and 4 active splits), idle and one-row sequences."""
    t_kv = [200, 0, 1, 65]
    bt = Batch(t_kv, 64, 512, "bfloat16", seed=92)
    engines = [arm(v) for v in WGMMA_VARIANTS] + [engine_with(mla_merge=m) for m in (1, 2, 3)]
    engines.append(engine_with(mla_merge=3, mla_split_tiles=1))  # the grid's one-trip merges
    for eng in engines:
        bt.gpu(eng)
        bt.gpu(eng, t_kv=eng.to_device(np.array(t_kv, np.int32)), max_t_kv=205)
        eng.synchronize()
