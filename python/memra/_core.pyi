"""
memra's C++ runtime: CPU reference ops, Engine, Cache and layer objects.
"""

from collections.abc import Mapping, Sequence
from typing import Annotated, Final, NoReturn, overload

import numpy
from numpy.typing import NDArray


class status:
    """
    Status codes of memra's bands (cpp/include/memra/status.h); memra.MemraError.code holds one of these, or a CUDA_BASE / LIBRARY_BASE band's base plus the library's own status.
    """

    OK: int = 0

    CUDA_BASE: int = 10000

    LIBRARY_BASE: int = 20000

    OUT_OF_MEMORY: int = 30001

    CACHE_FULL: int = 30002

    CONTRACT_SHAPE: int = 40000

    CONTRACT_ODD_ROPE: int = 40001

    CONTRACT_QUERY_SUFFIX: int = 40004

    CONTRACT_POOL: int = 40010

    CONTRACT_INDEX_WIDTH: int = 40014

    CONTRACT_DTYPE: int = 40020

    CONTRACT_DEVICE: int = 40021

    CONTRACT_STRIDE: int = 40022

    CONTRACT_RANGE: int = 40023

    CONTRACT_MISSING: int = 40024

    CONTRACT_VALUE: int = 40025

    CONTRACT_SLOT_HELD: int = 40026

    UNSUPPORTED: int = 50000

    UNSUPPORTED_NO_CUDA: int = 50001

    UNSUPPORTED_GEOMETRY: int = 50002

    UNSUPPORTED_IN_CAPTURE: int = 50003

    UNSUPPORTED_AT_EXIT: int = 50004

    NON_FINITE: int = 60001

class Weight:
    """
    A weight tensor (rank 1..4) copied once into memra, kept in its file dtype (float32, float16 or bfloat16) and converted to f32 per row by the ops.
    """

    def __init__(self, array: Annotated[NDArray, dict(writable=False)], *, dtype: str = '', name: str = 'weight') -> None:
        """
        array: host array of float32/float16/bfloat16, or uint16 raw bfloat16 bits with dtype='bfloat16'. Raises ContractError on another dtype, a device array, a non-contiguous array or rank outside 1..4.
        """

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> list[int]: ...

    @property
    def nbytes(self) -> int: ...

    def to_numpy(self) -> NDArray[numpy.float32]:
        """The weight converted to a float32 numpy array."""

    def __repr__(self) -> str: ...

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

def embedding(table: object, ids: Annotated[NDArray, dict(writable=False)], *, check_range: bool = True, expand: int | None = None, engine: Engine | None = None) -> object:
    """
    Rows of `table` [vocab, D] for `ids` [T] int32 -> [T, D] float32 (with expand = hc: [T, hc, D], each row repeated hc times, hc_expand(embedding(...), hc) in one launch: a hyper-connection model's residual streams).

    table: memra.Weight (CPU) or memra.DeviceWeight (CUDA; float32 or bfloat16, converted exactly to float32). ids and the result live on the engine's device.
    check_range (CUDA only): copy the ids to the host to range-check them (one wait on the engine's stream); with False an id outside the vocabulary gives a zero row. The CPU always checks.
    Raises ContractError (CONTRACT_RANGE for an id outside [0, vocab); CONTRACT_VALUE for expand outside [1, 2^31); CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE for a bad argument).
    Reference: nn.Embedding.
    """

def linear(x: Annotated[NDArray, dict(writable=False)], w: object, bias: Annotated[NDArray, dict(writable=False)] | None = None, *, engine: Engine | None = None) -> object:
    """
    y [T, N] = x [T, K] @ w [N, K]^T (+ bias [N]), float32 in and out.

    CPU: w a memra.Weight (any stored dtype, converted exactly per row), f32 accumulation.
    CUDA: w a memra.DeviceWeight; float32 w: SGEMM with TF32 off; bfloat16 w: x is rounded to bfloat16 (RNE) and multiplied on the tensor cores with f32 accumulation and output (so it equals the CPU op on x rounded to bfloat16 up to the summation order).
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE), LibraryError for a cuBLAS failure. Reference: nn.Linear.
    """

def linear_ex(x: Annotated[NDArray, dict(writable=False)], w: object, bias: Annotated[NDArray, dict(writable=False)] | None = None, *, col0: int = 0, engine: Engine | None = None) -> object:
    """
    CUDA only: y [T, N] = x[:, col0:col0+K] @ w [N, K]^T (+ bias [N]) read in place from the rows of x [T, L] (row stride L; the layers' GEMM over a column block of a fused projection's output, or over an input rounded once for several GEMMs).

    x: float32, bfloat16 (DLPack bfloat16 or uint16 raw bits) or float16, C-contiguous on the engine's device. w: memra.DeviceWeight. x in w's dtype is multiplied as it is (no rounding); float32 x against a bfloat16 w is rounded to bfloat16 (RNE) first, as linear does; any other pair raises ContractError (CONTRACT_DTYPE). Raises ContractError (CONTRACT_SHAPE when the columns do not fit in x, CONTRACT_STRIDE, CONTRACT_DEVICE), UnsupportedError without a CUDA engine.
    """

def linear_ex_pair(x: Annotated[NDArray, dict(writable=False)], w0: object, w1: object, *, col0: int = 0, col1: int = 0, engine: Engine | None = None) -> tuple:
    """
    CUDA only: (linear_ex(x, w0, col0=col0), linear_ex(x, w1, col1=col1)) -> (y0 [T, N0], y1 [T, N1]) float32 with the bytes of the two calls; one launch at a single row when both weights have short rows (K <= 32 vectors of 16 bytes; KDA's f_b and g_b).

    x, w0, w1 as linear_ex (w0 [N0, K] and w1 [N1, K], one dtype). Raises ContractError (CONTRACT_SHAPE when the weights differ in K or dtype or the columns do not fit in x, CONTRACT_DTYPE, CONTRACT_STRIDE, CONTRACT_DEVICE), UnsupportedError without a CUDA engine.
    """

def rms_norm(x: Annotated[NDArray, dict(writable=False)], weight: Annotated[NDArray, dict(writable=False)] | None = None, *, eps: float, engine: Engine | None = None) -> object:
    """
    RMSNorm over the last dim of x [T, D] float32: (weight *) x / sqrt(mean(x^2) + eps); unweighted when weight is None. Arrays on the engine's device (host for the CPU).
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is negative or not finite).
    Reference: Glm5NextTextRMSNorm / Glm5NextTextUnweightedRMSNorm.
    """

def add_rms_norm(x: Annotated[NDArray, dict(writable=False)], y: Annotated[NDArray, dict(writable=False)], weight: Annotated[NDArray, dict(writable=False)] | None = None, *, eps: float, engine: Engine | None = None) -> tuple:
    """
    The plain pre-norm residual step: (residual, normed) = (x + y, rms_norm(x + y, weight, eps)), both [T, D] float32, the bytes of an f32 add followed by rms_norm. x (the residual stream) and y (a sublayer's output) [T, D] float32 and weight [D] (None: unweighted) on the engine's device.
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is negative or not finite).
    Reference: the decoder layers of transformers' Kimi-Linear and Qwen3.5 (residual + hidden_states, then the next RMSNorm).
    """

def rms_norm_gated(x: Annotated[NDArray, dict(writable=False)], gate: Annotated[NDArray, dict(writable=False)], weight: Annotated[NDArray, dict(writable=False)], *, eps: float, engine: Engine | None = None) -> object:
    """
    weight * rmsnorm(x) * sigmoid(gate); x, gate [T, D], weight [D], float32 on the engine's device.
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is negative or not finite).
    Reference: Glm5NextTextRMSNormGated.
    """

def layer_norm(x: Annotated[NDArray, dict(writable=False)], weight: Annotated[NDArray, dict(writable=False)], bias: Annotated[NDArray, dict(writable=False)], *, eps: float, engine: Engine | None = None) -> object:
    """
    LayerNorm with weight and bias over the last dim of x [T, D] float32 (two-pass mean and variance), arrays on the engine's device.
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is negative or not finite).
    Reference: nn.LayerNorm.
    """

def norm_rows(x0: Annotated[NDArray, dict(writable=False)], w0: Annotated[NDArray, dict(writable=False)] | None, x1: Annotated[NDArray, dict(writable=False)], w1: Annotated[NDArray, dict(writable=False)] | None, x2: Annotated[NDArray, dict(writable=False)] | None = None, w2: Annotated[NDArray, dict(writable=False)] | None = None, b2: Annotated[NDArray, dict(writable=False)] | None = None, *, eps0: float, eps1: float, eps2: float = 9.999999974752427e-07, engine: Engine | None = None) -> tuple:
    """
    The MLA projections' norms of one decode row in one launch: (rms_norm(x0, w0, eps0), rms_norm(x1, w1, eps1), layer_norm(x2, w2, b2, eps2)) -> (y0 [1, D0], y1 [1, D1], y2 [1, D2]) float32, each the bytes of its own rms_norm / layer_norm call; x_i [1, D_i] float32 on the engine's device, w0 / w1 may be None (unweighted), x2 None: no third row (y2 [1, 0]).
    Raises ContractError (CONTRACT_MISSING when x2, w2, b2 do not come together, CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an eps_i that is negative or not finite).
    Reference: Glm5NextTextRMSNorm (q_a_layernorm, kv_a_layernorm) and nn.LayerNorm (the indexer's k_norm).
    """

def l2norm_heads(x: Annotated[NDArray, dict(writable=False)], *, eps: float = 9.999999974752427e-07, engine: Engine | None = None) -> object:
    """
    x [T, H, d] / sqrt(sum(x^2, -1) + eps), float32 on the engine's device (a new array).
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for an eps that is negative or not finite).
    Reference: modeling_glm5_next.l2norm.
    """

def rope_interleaved(x: Annotated[NDArray, dict(writable=False)], positions: Annotated[NDArray, dict(writable=False)], *, base: float = 10000.0, engine: Engine | None = None) -> object:
    """
    Interleaved RoPE: rotates pairs (2j, 2j+1) of x [T, n_vec, d_rope] float32 by pos * base^(-2j/d_rope) (angles in double, rounded once); positions [T] int32; both on the engine's device. Returns a new array. ContractError (CONTRACT_ODD_ROPE, 40001) for odd d_rope, CONTRACT_VALUE for a base that is not finite and > 0; d_rope == 0 returns the input unchanged. Only applied where the model family rotates (glm5_next and Kimi-Linear never do).
    """

def sigmoid(x: Annotated[NDArray, dict(writable=False)], *, engine: Engine | None = None) -> object:
    """
    y = 1 / (1 + exp(-x)) elementwise; x [n] float32 (reshape(-1) first) on the engine's device.
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE). Reference: torch.sigmoid.
    """

def kda_conv(x: Annotated[NDArray, dict(writable=False)], w: Annotated[NDArray, dict(writable=False)], ring: Annotated[NDArray, dict(writable=False)], *, arm: str = 'auto', batch: bool = False, l2_dk: int = 0, engine: Engine | None = None) -> tuple[object, object]:
    """
    Causal depthwise conv + SiLU over the fused q|k|v channels, continuing from a ring.

    x [T, C] float32 pre-conv projections; w [C, K] float32 taps (tap 0 meets the oldest
    input); ring [C, K-1] float32, the previous K-1 inputs of each channel, oldest first
    (zeros for a fresh sequence). Returns (y [T, C], ring_out [C, K-1]) where
    y = silu(conv(ring ++ x)) and ring_out = the last K-1 inputs of ring ++ x (for T < K-1
    it still holds some old ring values). arm='auto' runs the decode arm at T == 1 and the
    prefill arm otherwise; 'prefill' / 'decode' force one ('decode' needs T == 1). The arms
    agree bit for bit, so kda_conv(x[:T-1]) then kda_conv(x[T-1:]) == kda_conv(x).
    batch=True: B sequences of one token each through the decode arm (one launch on CUDA):
    x [B, C], ring [B, C, K-1] -> (y [B, C], ring_out [B, C, K-1]); row b equals
    kda_conv(x[b:b+1], w, ring[b]) bit for bit.
    l2_dk != 0: each row of y L2-normalised in heads of l2_dk channels after the conv, as
    l2norm_heads(y.reshape(T, C // l2_dk, l2_dk), eps=1e-6) (KdaLayer's q and k; C % l2_dk
    == 0, else CONTRACT_SHAPE); on CUDA the decode arm does it in its launch when l2_dk ==
    128, with the same bytes.
    engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs
    cuda/kda_conv.cu on arrays of its device and returns CUDA arrays (kernels built for K in
    2..8: another K raises UnsupportedError (UNSUPPORTED_GEOMETRY); the CPU takes any K >= 1).
    Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /
    CONTRACT_DEVICE) for a non-float32, mis-shaped, non-C-contiguous or wrong-device array,
    CONTRACT_VALUE for an unknown arm. Reference: modeling_glm5_next.causal_conv1d_fn /
    causal_conv1d_update with activation='silu' and the cache's conv state.
    """

def kda_gate(f: Annotated[NDArray, dict(writable=False)], dt_bias: Annotated[NDArray, dict(writable=False)], A_log: Annotated[NDArray, dict(writable=False)], *, form: str = 'lower_bound', lower_bound: float = -5.0, engine: Engine | None = None) -> object:
    """
    KDA log forget gate g [T, H*dk] float32 from f [T, H*dk] = f_b(f_a(x)), dt_bias [H*dk]
    (per channel) and A_log [H] (per head), all float32.

    form='lower_bound' (glm5_next): g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)).
    form='softplus' (kimi_linear): g = -exp(A_log) * softplus(f + dt_bias) with
    softplus(x) = x if x > 20 else log(1 + exp(x)); lower_bound is ignored.
    engine: None or a CPU Engine runs the C++ reference; a CUDA Engine runs cuda/kda_scan.cu
    on arrays of its device (any dk; same operations, CUDA's expf/logf within 2 ulp).
    Raises ContractError: CONTRACT_VALUE for another form, a non-finite lower_bound or (form
    'lower_bound') one above 0 (the log decay would grow the state),
    CONTRACT_SHAPE when the last dim of f is not a multiple of len(A_log) or dt_bias does
    not match it, CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE as usual.
    Reference: Glm5NextTextForgetGate.forward.
    """

def kda_scan(q: Annotated[NDArray, dict(writable=False)], k: Annotated[NDArray, dict(writable=False)], v: Annotated[NDArray, dict(writable=False)], g: Annotated[NDArray, dict(writable=False)], beta: Annotated[NDArray, dict(writable=False)], state: Annotated[NDArray, dict(writable=False)] | None = None, *, scale: float | None = None, batch: bool = False, chunked: bool = False, o_dtype: str = 'float32', engine: Engine | None = None) -> tuple[object, object]:
    """
    KDA delta-rule scan, T steps in order (the recurrent form), from `state` (None = zeros).

    q, k [T, H, dk] float32 (already L2-normalised, see l2norm_heads); v [T, H, dv];
    g [T, H, dk] log forget gate (kda_gate); beta [T, H] (sigmoid of b_proj);
    q, k, v, g may instead all be bfloat16 (fla chunk_kda's inputs; uint16 raw bits
    accepted): read at half the bytes and widened exactly to float32, so the results are
    those of the float32 call on the widened arrays (CUDA: chunked=True only);
    o_dtype='bfloat16' returns o as bfloat16 (fla chunk_kda's output), the float32 o rounded
    to nearest even, a NaN's payload unspecified (CUDA: chunked=True only); the state
    stays float32;
    state [H, dk, dv] float32 or None. Per step and head:
      S = S * exp(g_t)[:, None]; S += k_t (beta_t (v_t - k_t^T S)); o_t = (scale q_t)^T S
    with scale = dk**-0.5 unless given. Returns (o [T, H, dv], state_out [H, dk, dv]); the
    input state is not modified. Chaining calls (one T-step call, or T one-step calls
    passing state_out on) gives the same bits.
    batch=True: B sequences in one call (one launch on CUDA): q, k, g [B, T, H, dk];
    v [B, T, H, dv]; beta [B, T, H]; state [B, H, dk, dv] or None -> (o [B, T, H, dv],
    state_out [B, H, dk, dv]); sequence b equals its own call bit for bit.
    engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs
    cuda/kda_scan.cu on arrays of its device (built for dk = dv = 128 only: another head size
    raises UnsupportedError (UNSUPPORTED_GEOMETRY); its dk-long sums are partial sums plus a
    warp tree, so it matches the CPU to ~1e-5 relative, not bit for bit).
    chunked=True: on CUDA the chunked (WY / UT) form on tensor cores (cuda/kda_chunk.cu, the
    bf16 models' prefill): TF32 operands, f32 accumulation and state, within bf16-input error
    of the scan; the same outputs and state layout. The CPU runs its reference either way.
    Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /
    CONTRACT_DEVICE) for a bad argument (CONTRACT_DTYPE also for k, v or g not of q's
    dtype; CONTRACT_VALUE for another o_dtype or a scale that is not finite; CONTRACT_STRIDE
    also for a CUDA array (q, k,
    v, g, state) whose data does not start on a 16-byte boundary); UnsupportedError for
    bfloat16 inputs or o on CUDA without chunked=True.
    Reference: modeling_glm5_next.recurrent_kimi_delta_attention (equal in exact arithmetic
    to chunk_kimi_delta_attention, which transformers uses for multi-token prefill).
    """

def gdn_gate(a: Annotated[NDArray, dict(writable=False)], b: Annotated[NDArray, dict(writable=False)], dt_bias: Annotated[NDArray, dict(writable=False)], A_log: Annotated[NDArray, dict(writable=False)], *, engine: Engine | None = None) -> tuple[object, object]:
    """
    Gated DeltaNet gates per value head: (g [T, H], beta [T, H]) float32 from a [T, H] =
    in_proj_a(x), b [T, H] = in_proj_b(x), dt_bias [H] and A_log [H], all float32:
      g = -exp(A_log) * softplus(a + dt_bias)   (F.softplus: x above 20, else log1p(exp(x)))
      beta = 1 / (1 + exp(-b))
    engine: None or a CPU Engine runs the C++ reference; a CUDA Engine runs cuda/gdn.cu on
    arrays of its device (the same operations; CUDA's expf / log1pf within 2 ulp).
    Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /
    CONTRACT_DEVICE) for a bad argument.
    Reference: Qwen3_5GatedDeltaNet.forward (beta = b.sigmoid();
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)).
    """

def gdn_l2norm(x: Annotated[NDArray, dict(writable=False)], *, eps: float = 9.999999974752427e-07, engine: Engine | None = None) -> object:
    """
    Per-head L2 norm in Qwen's form: x [T, H, d] * (1 / sqrt(sum(x^2, -1) + eps)), float32 on
    the engine's device (a new array). Differs in rounding from l2norm_heads (KDA's
    x / sqrt(...)). Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE,
    CONTRACT_DEVICE; CONTRACT_VALUE for a negative or non-finite eps).
    Reference: modeling_qwen3_5.l2norm (x * torch.rsqrt((x * x).sum(-1) + eps)).
    """

def gdn_scan(q: Annotated[NDArray, dict(writable=False)], k: Annotated[NDArray, dict(writable=False)], v: Annotated[NDArray, dict(writable=False)], g: Annotated[NDArray, dict(writable=False)], beta: Annotated[NDArray, dict(writable=False)], state: Annotated[NDArray, dict(writable=False)] | None = None, *, scale: float | None = None, batch: bool = False, chunked: bool = False, engine: Engine | None = None) -> tuple[object, object]:
    """
    Gated delta rule with grouped heads, T steps in order (the recurrent form), from `state`
    (None = zeros).

    q, k [T, Hk, dk] float32 (already L2-normalised, see gdn_l2norm); v [T, Hv, dv];
    g [T, Hv] log decay and beta [T, Hv] (gdn_gate); state [Hv, dk, dv] float32 or None.
    Value head h reads key head h // (Hv // Hk) (transformers' repeat_interleave order).
    Per step and value head:
      S = S * exp(g_t); S += k_t (beta_t (v_t - k_t^T S)); o_t = (scale q_t)^T S
    with scale = dk**-0.5 unless given. Returns (o [T, Hv, dv], state_out [Hv, dk, dv]); the
    input state is not modified. Chaining calls (one T-step call, or T one-step calls
    passing state_out on) gives the same bits.
    batch=True: B sequences in one call: q, k [B, T, Hk, dk]; v [B, T, Hv, dv]; g, beta
    [B, T, Hv]; state [B, Hv, dk, dv] or None -> (o [B, T, Hv, dv], state_out [B, Hv, dk, dv]);
    sequence b equals its own call bit for bit.
    engine: None or a CPU Engine runs the C++ reference; a CUDA Engine runs cuda/gdn.cu (the
    key heads expanded to the value heads, then KDA's scan kernels: built for dk = dv = 128
    only, another head size raises UnsupportedError (UNSUPPORTED_GEOMETRY); its dk-long sums
    are partial sums plus a warp tree, so it matches the CPU to ~1e-5 relative).
    chunked=True: on CUDA KDA's chunked tensor-core form after the expansion (the bf16
    models' prefill; kda_scan's chunked=True); the CPU runs its reference either way.
    Raises ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE /
    CONTRACT_DEVICE) for a bad argument, CONTRACT_SHAPE when Hv is not a multiple of Hk,
    CONTRACT_VALUE for a non-finite scale, CONTRACT_STRIDE for a CUDA state whose data does
    not start on a 16-byte boundary.
    Reference: modeling_qwen3_5.torch_recurrent_gated_delta_rule after repeat_interleave of
    q and k (equal in exact arithmetic to torch_chunk_gated_delta_rule, the prefill form).
    """

def rms_norm_gated_silu(x: Annotated[NDArray, dict(writable=False)], gate: Annotated[NDArray, dict(writable=False)], weight: Annotated[NDArray, dict(writable=False)], *, eps: float, engine: Engine | None = None) -> object:
    """
    The Gated DeltaNet output norm: weight * rmsnorm(x) * silu(gate), i.e.
    (weight * (x * (1 / sqrt(mean(x^2) + eps)))) * (gate / (1 + exp(-gate))); x, gate [T, D],
    weight [D] (a plain weight, not zero-centred), float32 on the engine's device.
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE;
    CONTRACT_VALUE for a negative or non-finite eps).
    Reference: Qwen3_5RMSNormGated.forward (models/qwen3_5; Qwen3NextRMSNormGated).
    """

def mla_absorb_q(q_nope: Annotated[NDArray, dict(writable=False)], kv_b: object, *, d_v: int, arm: int = 0, engine: Engine | None = None) -> object:
    """
    Absorb W_uk into the query: q_lat[t, h, :] = W_uk[h]^T q_nope[t, h, :].

    q_nope: [T, H, d_nope] float32, C-contiguous, on the engine's device (host for the CPU). kv_b: [H*(d_nope+d_v), R] (kv_b_proj.weight; head h's rows are d_nope k rows then d_v v rows): a memra.Weight for the CPU, a memra.DeviceWeight (float32 or bfloat16) for CUDA. Returns q_lat [T, H, R] float32 on the same device.
    arm (CUDA only; the CPU ignores it): 0 auto, 1 per-position kernel, 2 streaming kernel (weights of a head's output tile held in shared memory over all positions; bytes equal to arm 1), 3 cuBLASLt bf16 GEMM batched over heads (bf16 kv_b only; q_nope is rounded to bfloat16). Auto takes 3 for bf16 kv_b at T >= 2 (1 when cuBLASLt declines), else 2 (T = 1, or f32 / f16 kv_b below T = 64) or 1. Arms 1/2 do the CPU's operations in its order (n ascending, products and sums rounded separately): the CPU's bytes where the CPU build does not contract into FMAs.
    Raises ContractError: CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE for a bad q_nope, CONTRACT_SHAPE when kv_b's shape does not match, CONTRACT_DEVICE for a kv_b of the wrong kind, CONTRACT_VALUE for d_v < 0 or an arm outside 0..3; UnsupportedError (CUDA) for arm 3 with float32 kv_b; LibraryError when cuBLASLt declines arm 3.
    Reference: Glm5NextTextAttention.expand_kv (k_nope = W_uk c), folded into q.
    """

def mla_decompress_v(o_lat: Annotated[NDArray, dict(writable=False)], kv_b: object, *, d_nope: int, arm: int = 0, engine: Engine | None = None) -> object:
    """
    Decompress the latent attention output: out[t, h, :] = W_uv[h] o_lat[t, h, :].

    o_lat: [T, H, R] float32 on the engine's device (host for the CPU). kv_b: [H*(d_nope+d_v), R], memra.Weight (CPU) or memra.DeviceWeight (CUDA). Returns out [T, H, d_v] float32 (d_v = kv_b rows / H - d_nope) on the same device.
    arm (CUDA only; the CPU ignores it): as mla_absorb_q (3: o_lat rounded to bfloat16, cuBLASLt over heads). Arms 1/2: one thread per output summing r ascending, products and sums rounded separately (the CPU's bytes where the CPU build does not contract).
    Raises ContractError: CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE for a bad o_lat, CONTRACT_SHAPE when kv_b does not match, CONTRACT_VALUE for d_nope < 0 or an arm outside 0..3; UnsupportedError (CUDA) for arm 3 with float32 kv_b; LibraryError when cuBLASLt declines arm 3.
    Reference: Glm5NextTextAttention.expand_kv (value_states = W_uv c), folded into the output.
    """

def mla_latent_append(rows: Annotated[NDArray, dict(writable=False)], cache: object, *, start: int, engine: Engine | None = None) -> object:
    """
    Write latent rows into a cache in place: cache[start + t, :] = rows[t, :].

    rows: [T, W] float32; cache: [max_len, W], float32 (CPU: a writable host array), or on CUDA float32 or bfloat16 (a DLPack bfloat16 array or uint16 raw bits; the rows are rounded to nearest even). Both on the engine's device. Returns the cache (the same object, written in place; a DLPack capsule comes back consumed, as any reader of one leaves it: read the rows through the array it was made from).
    Raises ContractError: CONTRACT_RANGE when [start, start + T) does not fit max_len; CONTRACT_VALUE when rows share memory with the cache or the cache is read-only; CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays. Nothing is written on error.
    Reference: MlaLayer (cpp/src/layers/mla_layer.cpp), the latent rows [normalised latent | k_pe] appended at rows [pos, pos + T).
    """

def mla_attn_absorbed(q_lat: Annotated[NDArray, dict(writable=False)], cache: Annotated[NDArray, dict(writable=False)], q_pe: Annotated[NDArray, dict(writable=False)] | None = None, *, scale: float, tensor_cores: bool = False, engine: Engine | None = None) -> object:
    """
    Causal absorbed MLA attention over a latent cache; the queries are the cache's last t_q rows (query i sits at row t_kv - t_q + i and sees rows <= it).

    q_lat: [t_q, H, R] float32 (from mla_absorb_q). cache: [t_kv, R + d_rope] (kv_a_layernorm'd latent, then the rope part): float32, or on CUDA also bfloat16 (DLPack bfloat16 or uint16 raw bits). q_pe: [t_q, H, d_rope] float32, required when d_rope > 0. All on the engine's device. scale: qk_head_dim**-0.5 (qk_head_dim = d_nope + d_rope). Returns o_lat [t_q, H, R] float32; score = (q_lat . c + q_pe . k_pe) * scale, softmax in f32 (CUDA: online over tiles of 32 rows, split over the rows when the queries alone do not fill the GPU; ~1e-5 relative to the CPU).
    tensor_cores=True (the arm of bf16 models; CUDA, bf16 cache, R in {128, 256, 512}, d_rope 0 or 64; else ignored): the tensor-core kernels, q_lat / q_pe and the softmax weights rounded to bf16, f32 softmax and accumulation (~1e-2 of max|o| from the CPU).
    Raises ContractError: CONTRACT_QUERY_SUFFIX when t_q > t_kv; CONTRACT_MISSING when q_pe is absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays; CONTRACT_VALUE for a non-finite scale. UnsupportedError (CUDA) for R > 8192 or rows too wide for shared memory.
    Reference: Glm5NextTextAttention.forward with a causal mask (eager_attention_forward).
    """

def mla_attn_gathered(q_lat: Annotated[NDArray, dict(writable=False)], cache: Annotated[NDArray, dict(writable=False)], idx: Annotated[NDArray, dict(writable=False)], q_pe: Annotated[NDArray, dict(writable=False)] | None = None, *, scale: float, check_range: bool = True, tensor_cores: bool = False, engine: Engine | None = None) -> object:
    """
    Absorbed MLA attention where query i attends over the cache rows listed in idx[i, :].

    q_lat: [t_q, H, R] float32. cache: [t_kv, R + d_rope] float32, or on CUDA also bfloat16 (DLPack bfloat16 or uint16 raw bits). idx: [t_q, width] int32 (entries -1 are padding; the list is a set: order does not matter and a duplicated row counts once). q_pe: [t_q, H, d_rope] float32, required when d_rope > 0. All on the engine's device. Returns o_lat [t_q, H, R] float32; a query whose list is all -1 gets zeros.
    check_range (CUDA only): copy idx to the host first and refuse an entry outside [-1, t_kv) or after its query's row (t_kv - t_q + i) (one wait on the engine's stream); with False such entries are skipped on the device. The CPU always refuses them. Both require t_q <= t_kv (queries are the cache's last rows).
    tensor_cores=True (the arm of bf16 models; CUDA, bf16 cache, R in {128, 256, 512}, d_rope 0 or 64; else ignored): the tensor-core kernels, q_lat / q_pe and the softmax weights rounded to bf16, f32 softmax and accumulation (~1e-2 of max|o| from the CPU).
    Raises ContractError: CONTRACT_RANGE for an entry >= t_kv or < -1 or after its query's row (nothing written); CONTRACT_QUERY_SUFFIX when t_q > t_kv; CONTRACT_MISSING when q_pe is absent but d_rope > 0; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays (int64 idx is refused, not narrowed); CONTRACT_VALUE for a non-finite scale.
    Reference: Glm5NextTextAttention.build_attention_mask_from_topk + eager_attention_forward.
    """

def mla_attn_decode(q_lat: Annotated[NDArray, dict(writable=False)], caches: object, t_kv: object, *, idx: Annotated[NDArray, dict(writable=False)] | None = None, q_pe: Annotated[NDArray, dict(writable=False)] | None = None, scale: float, max_t_kv: int | None = None, engine: Engine | None = None) -> object:
    """
    Batched absorbed MLA decode: B sequences, one query each, in one launch plan on CUDA.

    q_lat: [B, H, R] float32 (from mla_absorb_q). caches: a list of B arrays [L_b, R + d_rope] (the latent rows, then d_rope rope columns k_pe), all float32 or (CUDA) all bfloat16 (DLPack bfloat16 or uint16 raw bits; 16-byte aligned), on the engine's device; or one C-contiguous array [B, L, R + d_rope] whose slice b is sequence b's cache (L_b = L; one DLPack import instead of B, the cheaper call at large B). t_kv: rows visible to each sequence (its query sits at row t_kv[b] - 1): a host list / int array (checked: 0 <= t_kv[b] <= L_b), or on CUDA a device int32 [B] array (unchecked: t_kv[b] must be <= L_b; values above max_t_kv are clamped). t_kv[b] == 0 is an idle row: o_lat[b] = 0, nothing of it is read. idx: optional [B, width] int32 index lists (gathered attention: -1 and entries outside [0, t_kv[b]) skipped, a row listed twice counts once, an empty list gives zeros). q_pe: [B, H, d_rope] float32, required when d_rope > 0 (the score adds q_pe . k_pe). scale: qk_head_dim**-0.5 (qk_head_dim = d_nope + d_rope). max_t_kv: the host bound the launch is sized from (default max(t_kv) for host t_kv, max L_b for device t_kv); keep it fixed to replay a captured graph at any position. Returns o_lat [B, H, R] float32 on the same device.
    CUDA: a bfloat16 cache with R in {128, 256, 512} and d_rope 0 or 64 runs on tensor cores: q_lat, q_pe and the softmax weights are rounded to bfloat16 for the two products, scores, softmax and accumulation are float32 (3e-3..6e-3 of max|o| against the float32 CPU op on the same cache); float32 caches (and other shapes with R <= 1024) run an exact float32 CUDA-core kernel (~1e-6 relative). The CPU backend runs mla_attn_absorbed / mla_attn_gathered per sequence.
    Raises ContractError: CONTRACT_SHAPE when len(caches) != B or a cache's width differs (one array: not [B, L, W]); CONTRACT_RANGE for a host t_kv outside [0, L_b]; CONTRACT_MISSING when q_pe is absent but d_rope > 0; CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays (CONTRACT_STRIDE also for a bfloat16 cache not 16-byte aligned); CONTRACT_VALUE for a non-finite scale or max_t_kv below max(t_kv). UnsupportedError (UNSUPPORTED_GEOMETRY) on CUDA for R > 1024 outside the tensor-core shapes, or rows too wide for the float32 kernel's shared memory.
    Reference: Glm5NextTextAttention.forward / KimiLinearAttention.forward at decode (one query per sequence), as mla_attn_absorbed / mla_attn_gathered with t_q = 1.
    """

def mla_latent_append_decode(rows: Annotated[NDArray, dict(writable=False)], caches: object, pos: object, *, engine: Engine | None = None) -> None:
    """
    Write one latent row per sequence in place: caches[b][pos[b], :] = rows[b, :].

    rows: [B, W] float32. caches: a list of B arrays [L_b, W], all float32 (CPU: writable host arrays) or, on CUDA, all bfloat16 (DLPack bfloat16 or uint16 raw bits; rounded to nearest even); or one writable C-contiguous array [B, L, W] (slice b: sequence b's cache). pos: a host list / int array (checked: pos[b] < L_b) or on CUDA a device int32 [B] array (unchecked); pos[b] < 0 is an idle row: nothing written. One launch on CUDA. Returns None.
    Raises ContractError: CONTRACT_RANGE for a host pos[b] >= L_b (nothing written); CONTRACT_VALUE when rows share memory with a cache or two caches share memory; CONTRACT_SHAPE when len(caches) != B or widths differ; CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.
    Reference: mla_latent_append per sequence with T = 1.
    """

def swiglu_mlp(x: Annotated[NDArray, dict(writable=False)], gate_w: object, up_w: object, down_w: object, *, limit: float, engine: Engine | None = None) -> object:
    """
    SwiGLU MLP with the clamp: y = (silu(min(x gate_w^T, limit)) * clamp(x up_w^T, +-limit)) down_w^T.

    x [T, D] float32; gate_w, up_w [I, D]; down_w [D, I]; limit > 0 (swiglu_limit; inf for no clamp). Returns y [T, D] float32.
    engine: None or a CPU Engine: memra.Weight arguments, host arrays, the C++ reference (f32 accumulation over the weights widened to f32).
    A CUDA Engine: memra.DeviceWeight arguments of one dtype, arrays on its device; three cuBLAS GEMMs (float32 weights: SGEMM, TF32 off; bfloat16 weights: x and the hidden activation rounded to bfloat16 before each GEMM, f32 accumulation) around the CPU's elementwise clamp/SiLU formula.
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for limit <= 0), LibraryError for a cuBLAS failure.
    Reference: transformers Glm5NextTextMLP.forward.
    """

def moe_route(x: Annotated[NDArray, dict(writable=False)], gate_w: object, corr_bias: Annotated[NDArray, dict(writable=False)] | None = None, *, top_k: int, n_group: int, topk_group: int, norm_topk_prob: bool, scaling: float, scoring: str = 'sigmoid', engine: Engine | None = None) -> tuple:
    """
    The MoE router: the sigmoid router with grouped selection (scoring='sigmoid'), or the softmax router (scoring='softmax': p = softmax of the f32 logits, the top_k experts by p (ties: lower id), weights = p of those, / their sum when norm_topk_prob, times scaling; n_group must be 1 and corr_bias None; reference: Qwen3_5MoeTopKRouter / Qwen3NextTopKRouter).

    Sigmoid form: x [T, D] float32; gate_w [E, D]; corr_bias [E] float32 or None (e_score_correction_bias: used only to choose).
    Logits in f32 -> sigmoid scores s; choice c = s + bias; group score = sum of the top-2 c of each of the n_group groups; keep the best topk_group groups (ties: lower group); top_k experts by c among them (ties: lower id), sorted by c desc. Weights = s of the chosen experts, / (sum + 1e-20) when norm_topk_prob, times scaling.
    Returns (idx [T, top_k] int32, w [T, top_k] float32).
    engine: None or a CPU Engine: gate_w a memra.Weight, host arrays. A CUDA Engine: gate_w a float32 memra.DeviceWeight, arrays on its device; logits by SGEMM (TF32 off; at one token the decode GEMV, in the same launch as the routing), then one warp per token with the CPU's selection rules (sigmoid with CUDA's expf, within 2 ulp).
    Raises ContractError (CONTRACT_DTYPE, also for a bfloat16 DeviceWeight; CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE when n_group does not divide E, topk_group is outside [1, n_group], top_k outside [1, topk_group * E / n_group] or scaling not finite, a scoring other than the two, or scoring='softmax' with groups or a corr_bias).
    Reference: transformers Glm5NextTextTopkRouter.forward.
    """

def moe_shared_gate(x: Annotated[NDArray, dict(writable=False)], gate_w: Annotated[NDArray, dict(writable=False)], shared: Annotated[NDArray, dict(writable=False)], routed: Annotated[NDArray, dict(writable=False)], *, engine: Engine | None = None) -> object:
    """
    The Qwen MoE's shared-expert gate: y[t] = routed[t] + sigmoid(x[t] . gate_w) * shared[t].

    x [T, D] float32 (the MoE block's input); gate_w [D] float32 (shared_expert_gate.weight's row); shared [T, D] float32 (the shared expert's output); routed [T, D] float32 (the routed experts' sum). Returns y [T, D] float32. The dot product in f32 (CUDA: its own summation order), sigmoid 1 / (1 + exp(-g)), then one rounded product and one rounded sum per element.
    engine: None or a CPU Engine (host arrays) or a CUDA Engine (arrays on its device).
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE).
    Reference: transformers Qwen3_5MoeSparseMoeBlock.forward (F.sigmoid(shared_expert_gate(x)) * shared_expert(x) + the experts' output).
    """

def moe_forward(x: Annotated[NDArray, dict(writable=False)], idx: Annotated[NDArray, dict(writable=False)], w: Annotated[NDArray, dict(writable=False)], gate_ws: object, up_ws: object, down_ws: object, *, limit: float, engine: Engine | None = None) -> object:
    """
    Routed experts: y[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]), each expert the clamped SwiGLU MLP; per token the terms are added in ascending expert id. The shared expert is NOT included (add swiglu_mlp of it).

    x [T, D] float32; idx [T, k] int32 in [0, E); w [T, k] float32. Returns y [T, D] float32.
    engine: None or a CPU Engine: gate_ws, up_ws: lists of E memra.Weight [I, D]; down_ws: E memra.Weight [D, I]; host arrays.
    A CUDA Engine: gate_ws, up_ws: one stacked memra.DeviceWeight [E, I, D] each, down_ws one [E, D, I], all of one dtype (float32 or bfloat16); arrays on its device. The ids are copied to the host for the range check (one synchronisation). Kernels read the stacked weights directly: T == 1 one warp per expert row and token slot; T >= 2 grouped by expert (each selected expert's weights are read once per call, its tokens staged in shared memory), bit-identical to running the rows one at a time. Activations stay float32 (bfloat16 weights are widened, x is not rounded), so only the dot products' summation order differs from the CPU.
    Raises ContractError (CONTRACT_RANGE for an expert id outside [0, E); CONTRACT_SHAPE for a mismatched list or weight; CONTRACT_DTYPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for limit <= 0).
    Reference: transformers Glm5NextTextExperts.forward.
    """

def sample(logits: Annotated[NDArray, dict(writable=False)], counters: Annotated[NDArray, dict(writable=False)], *, temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int = 0, seeds: Annotated[NDArray, dict(writable=False)] | None = None, nonfinite: object | None = None, engine: Engine | None = None) -> object:
    """
    One token per row.

    logits [B, V] float32; counters [B], the per-row draw index; seeds [B] (same dtype rules as counters), when given, the per-row seed replacing `seed`. nonfinite, when given: an int32 [B] array (on the engine's device; host arrays for the CPU) that the same call (on CUDA the same launches, so inside a captured graph) fills with 1 where the row's logits hold a NaN or +-inf and 0 elsewhere; the token drawn for such a row is the one drawn without it (memra.batch ends that row with NonFiniteError). temperature <= 0: argmax (ties to the lower id; a NaN never wins unless it sits at id 0, which then keeps the row: the CPU scan's v[i] > v[best]). Otherwise softmax(logits / temperature) in f32; keep the top_k most likely (0: all), then the shortest prefix in (p desc, id asc) order whose top-k-renormalised mass reaches top_p (>= 1: all); draw by inverse CDF with u = uniform_from_counter(seed, counter) (splitmix64; the exact formula is in cpu/sample.h). A row whose softmax has no positive finite denominator (every logit -inf, a NaN, or logits / temperature past float32's range, e.g. 3e38 at temperature 0.5) has no distribution to draw from and takes the argmax above instead; only non-finite logits set nonfinite. Every sum (the softmax denominator, the top-k mass, the running top-p mass and CDF) is an f32 sum in cpu/sample.h's blocked order: blocks of 512 terms each summed left to right, then the block sums left to right; the running sum at i is the sum of the blocks before i's plus i's block up to i. Returns int32 [B].
    engine: None or a CPU Engine: host arrays, counters uint64 or int64 (>= 0). A CUDA Engine: arrays on its device, counters uint64; the same f32 arithmetic as the CPU (glibc's expf reproduced bit for bit, the same blocked sums, the blocks summed in parallel), so the same seed and counter give the same token.
    Raises ContractError (CONTRACT_DTYPE for counters not int64/uint64 (uint64 on CUDA), logits not float32 or nonfinite not int32, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE, CONTRACT_RANGE for a negative int64 counter or a seed outside [0, 2^64), CONTRACT_VALUE for top_p <= 0 or NaN, top_k < 0, a temperature that is not finite, or a nonfinite array that is read-only or shares memory with logits, counters or seeds).
    Reference: transformers' temperature / TopK / TopP logits warpers followed by multinomial, with a counter-based draw. One difference, at exact ties only: where several tokens share the top_k-th probability, TopKLogitsWarper (and vLLM) keep all of them and this keeps exactly top_k, lower ids first.
    """

def uniform_from_counter(seed: int, counter: int) -> float:
    """
    The counter-based uniform in [0, 1) that sample draws with: seed and counter are uint64 (ContractError CONTRACT_RANGE outside [0, 2^64)); the float32 made of splitmix64(seed, counter)'s top 24 bits times 2^-24 (the exact formula: cpp/include/memra/cpu/sample.h). Returns a float.
    """

def mhc_pre(streams: Annotated[NDArray, dict(writable=False)], fn: object, base: Annotated[NDArray, dict(writable=False)], scale: Annotated[NDArray, dict(writable=False)], *, sinkhorn_iters: int, hc_eps: float, norm_eps: float, rms_weight: Annotated[NDArray, dict(writable=False)] | None = None, rms_eps: float | None = None, engine: Engine | None = None) -> tuple:
    """
    mHC mapping. streams [T, hc, D] float32; fn [(2+hc)*hc, hc*D] (memra.Weight on the CPU, memra.DeviceWeight on CUDA); base [(2+hc)*hc] float32; scale [3] float32; arrays on the engine's device.
    logits = fn(unweighted RMSNorm(norm_eps) of the flattened streams); pre = sigmoid(.*scale[0] + base) + hc_eps; post = 2 sigmoid(.); comb = softmax over the last dim + hc_eps, one column normalisation, then sinkhorn_iters - 1 rounds of row then column normalisation (denominators + hc_eps).
    Returns (post [T, hc], comb [T, hc, hc], collapsed [T, D] = sum_s pre[s] * streams[:, s]) float32. With rms_eps (and optionally rms_weight [D] float32) the third output is rms_norm(collapsed, rms_weight, eps=rms_eps) instead, the block's input norm (on CUDA at decode rows fused into the mapping's last kernel, byte for byte the two ops).
    CUDA: the RMS factor is applied to the logits (fn(x * r) = r * fn(x)); T <= 64 (decode rows, (2 + hc) * hc < 64, 16-byte rows): a split-K pass over the f32 streams (a bfloat16 fn is widened), otherwise a GEMM that rounds the streams to a bfloat16 fn's dtype. hc up to 64.
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for sinkhorn_iters outside [1, 1000], an eps that is negative or not finite, or rms_weight without rms_eps), UnsupportedError (CUDA, hc > 64).
    Reference: transformers Glm5NextTextHyperConnection.forward.
    """

def mhc_post(y: Annotated[NDArray, dict(writable=False)], post: Annotated[NDArray, dict(writable=False)], comb: Annotated[NDArray, dict(writable=False)], residual: Annotated[NDArray, dict(writable=False)], *, engine: Engine | None = None) -> object:
    """
    mHC expansion after a block: out[t, j] = post[t, j] * y[t] + sum_i comb[t, i, j] * residual[t, i].

    y [T, D]; post [T, hc]; comb [T, hc, hc]; residual [T, hc, D]; all float32 on the engine's device. Returns out [T, hc, D] float32 (CUDA: bit-identical to the CPU).
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for hc = 0).
    Reference: transformers Glm5NextTextDecoderLayer.forward (post * h + comb^T @ residual).
    """

def mhc_post_head_norm(y: Annotated[NDArray, dict(writable=False)], post: Annotated[NDArray, dict(writable=False)], comb: Annotated[NDArray, dict(writable=False)], residual: Annotated[NDArray, dict(writable=False)], weight: Annotated[NDArray, dict(writable=False)] | None = None, *, eps: float, engine: Engine | None = None) -> object:
    """
    The model's head after the last block: rms_norm(hc_head_mean(mhc_post(y, post, comb, residual)), weight, eps=eps), the bytes of those three ops.

    y [T, D]; post [T, hc]; comb [T, hc, hc]; residual [T, hc, D]; weight [D] or None; all float32 on the engine's device. Returns [T, D] float32 (CUDA: one launch for hc <= 8 and D <= 4096, the expanded streams never written).
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for a negative or non-finite eps, hc < 1).
    Reference: transformers Glm5NextTextModel.forward (the hyper head's mean, then the final norm).
    """

def hc_head_mean(streams: Annotated[NDArray, dict(writable=False)], *, engine: Engine | None = None) -> object:
    """
    Final hyper-connection head: the plain mean over the streams.

    streams [T, hc, D] float32 -> [T, D] float32, on the engine's device (CUDA: bit-identical to the CPU).
    Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE).
    Reference: transformers Glm5NextTextHyperHead.
    """

def hc_expand(x: Annotated[NDArray, dict(writable=False)], n: int, *, engine: Engine | None = None) -> object:
    """
    x [T, D] float32 -> [T, n, D]: every residual stream starts as x (reference: Glm5NextTextModel.forward, hidden_states.unsqueeze(2).expand(..., hc_mult, ...)). On a CUDA engine x must live on its device. Raises ContractError for a bad array or n outside [1, 2^31).
    """

def kpool_pool_keys(k: Annotated[NDArray, dict(writable=False)], gate: Annotated[NDArray, dict(writable=False)], ape: Annotated[NDArray, dict(writable=False)], *, engine: Engine | None = None) -> object:
    """
    Pool keys of the complete pools of one sequence: pool p holds rows [p*pool, (p+1)*pool); per channel, softmax over the pool's rows of gate + ape weights the rows of k.

    k: [n_rows, d] float32 (k_norm(wk(x))). gate: [n_rows, d] float32 (x @ index_kpool_compress_gate^T). ape: [pool, d] float32 (index_kpool_compress_ape). Returns keys [n_rows // pool, d] float32 (an incomplete last pool is left out).
    engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs cuda/dsa.cu on arrays of its device (ContractError CONTRACT_DEVICE otherwise) and returns CUDA arrays. On CUDA each key is the same bytes kpool_append gives it (one device routine); it differs from the CPU only through exp (CUDA expf vs the C library's).
    Raises ContractError: CONTRACT_POOL when pool (ape rows) is 0; CONTRACT_RANGE when n_rows overflows int32; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.
    Reference: Glm5NextTextIndexer.get_pooled_states (unpadded: first_key = 0).
    """

def kpool_append(k: Annotated[NDArray, dict(writable=False)], gate: Annotated[NDArray, dict(writable=False)], ape: Annotated[NDArray, dict(writable=False)], tail_k: Annotated[NDArray, dict(writable=False)], tail_gate: Annotated[NDArray, dict(writable=False)], pool_keys: Annotated[NDArray, dict(writable=False)], *, pos: int, engine: Engine | None = None) -> tuple:
    """
    The DSA indexer's per-sequence bookkeeping for rows [pos, pos + T), as MlaLayer::indexer keeps it in the Cache: the key of every pool whose last row lands in [pos, pos + T) (rows before pos come from the tail ring; pools before pos // pool are resident and untouched), then the newest min(T, tail_rows) rows into the ring at row % tail_rows.

    k, gate: [T, d] float32, the new rows (as kpool_pool_keys). ape: [pool, d] float32. tail_k, tail_gate: [tail_rows, d] float32, the ring (tail_rows a positive multiple of pool). pool_keys: [max_pools, d] float32, max_pools >= (pos + T) // pool. pos: rows the sequence held before. Returns new (tail_k, tail_gate, pool_keys) arrays; the inputs are not modified. Feeding a sequence in chunks gives the same arrays as one call.
    engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs cuda/dsa.cu on arrays of its device (ContractError CONTRACT_DEVICE otherwise) and returns CUDA arrays. CUDA pool keys equal kpool_pool_keys(engine=that engine) bytes for bytes.
    Raises ContractError: CONTRACT_POOL for pool < 1 or a bad ring size; CONTRACT_SHAPE when pool_keys is too short or d == 0; CONTRACT_VALUE for pos < 0; CONTRACT_RANGE when pos + T overflows int32; CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.
    Reference: MlaLayer::indexer (cpp/src/layers/mla_layer.cpp).
    """

def kpool_score(q: Annotated[NDArray, dict(writable=False)], w: Annotated[NDArray, dict(writable=False)], pool_keys: Annotated[NDArray, dict(writable=False)], *, pool: int, first_pos: int, qk_scale: float, head_scale: float, reference: bool = False, tensor_cores: bool = False, engine: Engine | None = None) -> object:
    """
    Head-mixed pool scores: score[i, p] = sum_h w[i, h] * head_scale * relu(qk_scale * q[i, h, :] . pool_keys[p, :]) (h ascending), and -inf where pool p's last row p*pool + pool - 1 is after the query's position first_pos + i.

    q: [t_q, Hi, d] float32 (wq_b(q_resid)). w: [t_q, Hi] float32 (weights_proj(x)). pool_keys: [n_pools, d] float32 (kpool_pool_keys). qk_scale: index_head_dim**-0.5; head_scale: index_n_heads**-0.5. Returns score [t_q, n_pools] float32.
    engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs cuda/dsa.cu on arrays of its device (ContractError CONTRACT_DEVICE otherwise) and returns CUDA arrays. CUDA reproduces the CPU's sequential sums without FMA (the same bytes as an x86 CPU build); reference=True runs the one-thread-per-score CUDA scorer instead of the tiled one (same bytes; ignored on the CPU). tensor_cores=True (the arm of bf16 models) runs the tensor-core scorer where d is 64 or 128 and Hi <= 128: q and pool_keys rounded to bf16, f32 sums (ignored on the CPU and with reference=True).
    Raises ContractError: CONTRACT_POOL for pool < 1; CONTRACT_VALUE for first_pos < 0 or a non-finite scale; CONTRACT_RANGE when first_pos + t_q overflows int32; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.
    Reference: Glm5NextTextIndexer.forward (scores, weights, valid_candidates mask).
    """

def kpool_select(score: Annotated[NDArray, dict(writable=False)], *, pool: int, select_k: int, width: int, first_pos: int, reference: bool = False, engine: Engine | None = None) -> object:
    """
    Index lists from pool scores: per query i (position first_pos + i), the top select_k pools among the finite scores by (score desc, pool index asc), expanded to their rows in ascending pool order, then the visible tail rows [(pos+1) - (pos+1) % pool, pos], then -1 up to width. Fewer finite pools than select_k leave more -1 padding.

    score: [t_q, n_pools] float32 (kpool_score). select_k: min(index_topk // pool, n_pools); width: index_topk + pool - 1. Returns idx [t_q, width] int32 (a set of rows per query).
    engine: None or a CPU Engine runs the C++ reference on host arrays; a CUDA Engine runs cuda/dsa.cu on arrays of its device (ContractError CONTRACT_DEVICE otherwise) and returns CUDA arrays. CUDA gives the CPU's lists exactly: a radix select over (score desc, pool asc) keys per query, or with reference=True a rank-counting select (same bytes; ignored on the CPU).
    Raises ContractError: CONTRACT_INDEX_WIDTH when width < select_k*pool + pool - 1; CONTRACT_POOL for pool < 1; CONTRACT_VALUE for select_k < 0 or first_pos < 0; CONTRACT_RANGE when positions overflow int32; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for a bad score.
    Reference: Glm5NextTextIndexer.forward topk + append_visible_tail (index_kpool_always_select_tail = True), compared as sets.
    """

def kpool_append_decode(k: Annotated[NDArray, dict(writable=False)], gate: Annotated[NDArray, dict(writable=False)], ape: Annotated[NDArray, dict(writable=False)], tail_k: object, tail_gate: object, pool_keys: object, pos: object, *, engine: Engine | None = None) -> None:
    """
    kpool_append for B sequences of one new row each, in place: for each active row b the key of the pool that row pos[b] completes ((pos[b] + 1) % pool == 0; its earlier rows from the ring), then row pos[b] into ring slot pos[b] % tail_rows. The bytes kpool_append(k[b:b+1], gate[b:b+1], ape, ..., pos=pos[b]) gives that sequence.

    k, gate: [B, d] float32 (the new rows). ape: [pool, d] float32. tail_k, tail_gate: lists of B distinct writable [tail_rows, d] float32 rings (one tail_rows, a positive multiple of pool). pool_keys: a list of B writable [max_pools_b, d] float32 arrays, max_pools_b >= (pos[b] + 1) // pool. An idle row's arrays are neither read nor written. Returns None.
    CUDA only (engine: a CUDA Engine; UnsupportedError otherwise): cuda/dsa_decode.cu, one launch for the B sequences, per-sequence arrays reached through a device pointer table. pos: a host list / int array [B] (checked, then uploaded) or a device int32 [B] array (unchecked: the caller keeps each sequence's arrays large enough), pos[b] = tokens sequence b held before this one; pos[b] < 0 is an idle row. Launch shapes depend on B, d, Hi and max_pools only, so a captured CUDA graph replays at any position.
    Raises ContractError: CONTRACT_POOL for pool < 1 or a bad ring size; CONTRACT_SHAPE when a list's length is not B, ring sizes differ, d == 0, or (host pos) a pool_keys array is too short; CONTRACT_RANGE for a host pos of 2^31 - 1 or outside int32; CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays; CONTRACT_VALUE for a read-only array, for written arrays sharing memory, or for k / gate sharing memory with one. Nothing is written when it raises.
    Reference: kpool_append per sequence with T = 1 (MlaLayer::indexer's bookkeeping).
    """

def kpool_score_decode(q: Annotated[NDArray, dict(writable=False)], w: Annotated[NDArray, dict(writable=False)], pool_keys: object, pos: object, *, pool: int, qk_scale: float, head_scale: float, max_pools: int | None = None, engine: Engine | None = None) -> object:
    """
    kpool_score for B sequences of one query each: row b scores the pools the token at pos[b] sees, p < n_b = (pos[b] + 1) // pool (the bytes of kpool_score(q[b:b+1], w[b:b+1], pool_keys[b][:n_b], first_pos=pos[b]), the same summation order), and is -inf for p >= n_b (an idle row: all -inf).

    q: [B, Hi, d] float32. w: [B, Hi] float32. pool_keys: a list of B [rows_b, d] float32 arrays (rows_b >= n_b). qk_scale: index_head_dim**-0.5; head_scale: index_n_heads**-0.5. max_pools: the score width and the host bound the launch is sized from (default: the longest pool_keys array); device positions that see more pools are clamped to it. Returns score [B, max_pools] float32.
    CUDA only (engine: a CUDA Engine; UnsupportedError otherwise): cuda/dsa_decode.cu, one launch for the B sequences, per-sequence arrays reached through a device pointer table. pos: a host list / int array [B] (checked, then uploaded) or a device int32 [B] array (unchecked: the caller keeps each sequence's arrays large enough), pos[b] = tokens sequence b held before this one; pos[b] < 0 is an idle row. Launch shapes depend on B, d, Hi and max_pools only, so a captured CUDA graph replays at any position.
    Raises ContractError: CONTRACT_POOL for pool < 1; CONTRACT_VALUE for a non-finite scale, max_pools outside [0, 2^31) or (host pos) below a row's n_b; CONTRACT_RANGE when (host pos) a pool_keys array is shorter than n_b or pos is 2^31 - 1; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays or a list whose length is not B.
    Reference: kpool_score per sequence with t_q = 1 (Glm5NextTextIndexer.forward at decode).
    """

def kpool_select_decode(score: Annotated[NDArray, dict(writable=False)], pos: object, *, pool: int, select_k: int, width: int, engine: Engine | None = None) -> object:
    """
    kpool_select for B sequences of one query each: row b is kpool_select(score[b:b+1, :n_b], first_pos=pos[b]) with n_b = (pos[b] + 1) // pool, bytes for bytes: the top select_k pools by (score desc, pool asc) among the finite scores, expanded to rows in ascending pool order, the visible tail rows, then -1 up to width. An idle row is all -1.

    score: [B, max_pools] float32 (kpool_score_decode). select_k: index_topk // pool; width: index_topk + pool - 1. Returns idx [B, width] int32.
    CUDA only (engine: a CUDA Engine; UnsupportedError otherwise): cuda/dsa_decode.cu, one launch for the B sequences, per-sequence arrays reached through a device pointer table. pos: a host list / int array [B] (checked, then uploaded) or a device int32 [B] array (unchecked: the caller keeps each sequence's arrays large enough), pos[b] = tokens sequence b held before this one; pos[b] < 0 is an idle row. Launch shapes depend on B, d, Hi and max_pools only, so a captured CUDA graph replays at any position.
    Raises ContractError: CONTRACT_INDEX_WIDTH when width < select_k*pool + pool - 1; CONTRACT_POOL for pool < 1; CONTRACT_VALUE for select_k < 0; CONTRACT_RANGE when max_pools*pool overflows int32 or (host pos) a row sees more pools than score has columns or pos is 2^31 - 1; CONTRACT_SHAPE / CONTRACT_DTYPE / CONTRACT_STRIDE / CONTRACT_DEVICE for bad arrays.
    Reference: kpool_select per sequence with t_q = 1.
    """

def rope_inv_freq(theta: float, dim: int) -> NDArray[numpy.float32]:
    """
    The inverse RoPE frequencies [dim // 2] float32 (host numpy) as transformers computes them (Qwen3_5TextRotaryEmbedding.compute_default_rope_parameters: 1 / base ** (arange(0, dim, 2, float32) / dim) in float32, the power rounded once). dim: the rotated dims, int(head_dim * partial_rotary_factor), even (ContractError CONTRACT_ODD_ROPE otherwise) and >= 0; theta: rope_theta, finite and > 0, and large enough that every frequency is a finite float32 (ContractError CONTRACT_VALUE for a theta or dim outside those).
    """

def attn_prep(qg: Annotated[NDArray, dict(writable=False)], k: Annotated[NDArray, dict(writable=False)], q_norm: Annotated[NDArray, dict(writable=False)], k_norm: Annotated[NDArray, dict(writable=False)], *, eps: float, rotary_dim: int, inv_freq: Annotated[NDArray, dict(writable=False)] | None = None, pos0: int = 0, slots: Annotated[NDArray, dict(writable=False)] | None = None, lengths: Annotated[NDArray, dict(writable=False)] | None = None, engine: Engine | None = None) -> tuple:
    """
    The gated attention's prologue: qg [T, Hq, 2 * hd] float32 (q_proj's output viewed per head: the query, then the gate), k [T, Hkv, hd] float32 (k_proj's output) -> (q [T, Hq, hd], gate [T, Hq, hd], k [T, Hkv, hd]) float32. q and k are RMS-normed per head and multiplied by q_norm / k_norm [hd] (pass 1 + w for Qwen's zero-centred norm), then their first rotary_dim dims rotated in halves (NeoX) by inv_freq [rotary_dim // 2] (rope_inv_freq; None when rotary_dim is 0) at each row's position: pos0 + t, or with slots [T] int32 (-1 idle: position 0) and lengths [n] int32 the position lengths[slots[t]] (read on the device on CUDA: graph-safe). eps: the norms' epsilon.
    Raises ContractError (shapes, dtypes, devices; CONTRACT_ODD_ROPE for an odd rotary_dim; CONTRACT_MISSING for inv_freq None with rotary_dim > 0; CONTRACT_RANGE for a slot outside lengths or a negative pos0, on the CPU), UnsupportedError for hd > 256.
    Reference: Qwen3_5Attention.forward (torch.chunk of the joint projection, Qwen3_5RMSNorm, apply_rotary_pos_emb).
    """

def kv_append(k: Annotated[NDArray, dict(writable=False)], v: Annotated[NDArray, dict(writable=False)], k_cache: object, v_cache: object, *, pos0: int = 0, slots: Annotated[NDArray, dict(writable=False)] | None = None, lengths: Annotated[NDArray, dict(writable=False)] | None = None, engine: Engine | None = None) -> None:
    """
    Write K/V rows into caches in place: k, v [T, Hkv, hd] float32; k_cache, v_cache float32 or bfloat16 (rounded to nearest even; uint16 raw bits accepted), writable, on the engine's device. Direct form: caches [max_len, Hkv, hd], row t at pos0 + t. With slots [T] int32 (-1 idle: nothing written) and lengths [max_batch] int32: caches [max_batch, max_len, Hkv, hd], row t at [slots[t], lengths[slots[t]]] (read on the device on CUDA: graph-safe; a position past max_len writes nothing there).
    Raises ContractError (shapes, dtypes, devices, a read-only cache; CONTRACT_RANGE for rows past max_len, and on the CPU a slot or length out of range; CONTRACT_VALUE for a repeated slot on the CPU, or for k / v sharing memory with a cache or the two caches sharing memory). Nothing is written on error.
    Reference: the cache update of past_key_values.update.
    """

def attention(q: Annotated[NDArray, dict(writable=False)], k_cache: object, v_cache: object, *, scale: float, gate: Annotated[NDArray, dict(writable=False)] | None = None, pos0: int = 0, slots: Annotated[NDArray, dict(writable=False)] | None = None, lengths: Annotated[NDArray, dict(writable=False)] | None = None, engine: Engine | None = None) -> object:
    """
    Causal grouped attention with the sigmoid output gate: q [T, Hq, hd] float32 -> o [T, Hq, hd] float32, query head h reading K/V head h // (Hq // Hkv): o = softmax(scale * q k^T) v over the rows a query sees, times sigmoid(gate [T, Hq, hd]) when gate is given. Caches as kv_append's (float32 or bfloat16). Direct form: query t at position pos0 + t sees rows [0, pos0 + t]. With slots [T] / lengths [max_batch]: row t sees its slot's rows [0, lengths[slots[t]]] (the row appended at its length included), an idle row (-1) gets zeros; on CUDA split over the sequence (memra.KernelOptions.attn_decode_unsplit: one block a row and K/V head). scale: transformers' head_dim ** -0.5, finite.
    Raises ContractError as kv_append, UnsupportedError for hd > 256.
    Reference: eager_attention_forward with repeat_kv, then attn_output * sigmoid(gate) (Qwen3_5Attention.forward).
    """

def take_rows(x: Annotated[NDArray, dict(writable=False)], start: int, count: int, *, engine: Engine | None = None) -> object:
    """
    Rows [start, start + count) of x [T, D] float32 as a new [count, D] array on the same backend. Raises ContractError for rows outside x.
    """

def concat_rows(parts: object, *, engine: Engine | None = None) -> object:
    """
    The arrays of parts (a list of [T_i, D] float32 arrays, one D, on the engine's device) stacked by rows into a new [sum T_i, D] array on the same backend: a batched prefill's per-sequence rows put back at their offsets. Raises ContractError naming a part that is not such an array, or an empty list.
    """

class DecodeSlots:
    """
    A decode batch's slot ids on a CUDA cache's device, at a fixed address (what a captured decode step reads): `size` rows, each a slot or idle (-1). Layers' decode(cache, layer, slots, x) accepts it in place of a host slot array: the rows' positions then come from the cache's device lengths and nothing is copied from the host, so the step can be captured into a CUDA graph (Engine.begin_capture). Idle rows read and write no state. Raises UnsupportedError on a CPU cache, ContractError for size < 1.
    """

    def __init__(self, cache: Cache, size: int) -> None: ...

    def set(self, slots: Annotated[NDArray, dict(writable=False)]) -> None:
        """
        Rows [0, n) take slots [n] (host int32, distinct, in [0, max_batch)); the other rows become idle. Uploaded asynchronously when they changed (not while capturing). Raises ContractError (CONTRACT_SHAPE for more slots than rows, CONTRACT_RANGE for a slot outside the cache, CONTRACT_VALUE for a repeated slot); nothing changes on a refusal.
        """

    @property
    def size(self) -> int:
        """Rows (the batch bucket)."""

    @property
    def active(self) -> int:
        """Rows set by the last set() (the rest idle)."""

    @property
    def slots(self) -> object:
        """A host copy of the rows' slots [size] int32 (-1 = idle)."""

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class CudaGraph:
    """
    A CUDA graph captured from an engine's stream (Engine.begin_capture / end_capture): replay() enqueues the recorded work again, reading whatever the captured device buffers hold at replay time.
    """

    def replay(self) -> None:
        """
        Enqueue the graph on the engine's stream (asynchronous; Engine.synchronize or a host copy waits for it).
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class KernelOptions:
    """
    The CUDA kernels' arms an Engine runs with, chosen once when it is made (Engine(..., options=), memra.load(..., kernel_options=)); immutable. Keyword construction; every field defaults to the arm the A/B runs kept (docs/options.md; prefill_chunk, a memory bound, to 8192 tokens: docs/prefill.md), so KernelOptions() changes nothing. Fields that change numerics (the logits' bytes): gemv, mla_decode_variant, mla_merge, mla_tc_mt, mla_split_tiles, moe_grouped_min_t, attn_decode_unsplit, prefill_chunk (on CUDA), moe_tensor_cores, attn_prefill_tensor_cores; pdl, gemv_rows, gemv_tall_rows and mhc_defer change only speed. An unknown field, a value of the wrong type (switches take bool or numpy's bool, the rest int) or out of its domain is a ContractError (40025) naming the field and the value. A CPU engine keeps the options and ignores them, except prefill_chunk.
    """

    def __init__(self, *, pdl: bool = True, gemv: bool = True, gemv_rows: int = 0, gemv_tall_rows: int = 0, mhc_defer: bool = True, mla_decode_variant: int = 1, mla_merge: int = 0, mla_tc_mt: int = 0, mla_split_tiles: int = 0, moe_grouped_min_t: int = 2, attn_decode_unsplit: bool = False, prefill_chunk: int = 8192, moe_tensor_cores: bool = True, attn_prefill_tensor_cores: bool = True) -> None: ...

    def replace(self, **fields: bool | int) -> KernelOptions:
        """
        A copy with the named fields replaced (validated as the constructor does).
        """

    def to_dict(self) -> dict[str, bool | int]:
        """
        The fields as a dict, in declaration order (KernelOptions(**d) makes the same value).
        """

    def __repr__(self) -> str: ...

    def __getstate__(self) -> dict[str, bool | int]: ...

    def __setstate__(self, state: dict[str, bool | int], /) -> None: ...

    def __eq__(self, other: object, /) -> bool: ...

    def __ne__(self, other: object, /) -> bool: ...

    def __hash__(self) -> int: ...

    @property
    def pdl(self) -> bool:
        """
        Speed only. Programmatic dependent launch: each kernel may start while the one in front of it finishes (the decode GEMV streams its first weight chunk meanwhile); False launches them one after another (the profiling arm: each kernel's own time, no overlap). The bytes are the same either way.
        """

    @property
    def gemv(self) -> bool:
        """
        Changes numerics. The decode GEMV for the one-row GEMMs it takes (bf16 / f32 weights, 16-byte aligned rows); False sends them to cuBLAS, which sums in another order.
        """

    @property
    def gemv_rows(self) -> int:
        """
        Speed only. Weight rows a decode-GEMV block owns: 0 chooses them from the output width; 1, 2, 4 or 8 force that count (a row's sum order depends on K alone).
        """

    @property
    def gemv_tall_rows(self) -> int:
        """
        Speed only. Rows a block of the decode GEMVs over tall rows (K > 4096 bf16 / 2048 f32: the o / down projections): 0 chooses them from the output width; 1, 2, 4 or 8 force that count (gemv_rows, when set, applies instead).
        """

    @property
    def mhc_defer(self) -> bool:
        """
        Speed only. A one-row mHC site leaves its comb's Sinkhorn pending, run by the next decode GEMV in an extra block (or in a launch of its own before any other op); False runs it inside the site's kernel. The same function on the same rows: the same bytes.
        """

    @property
    def mla_decode_variant(self) -> int:
        """
        Changes numerics. The MLA decode kernel over a dense bfloat16 cache at 64 heads and rank 512: 1 the sm_90a wgmma kernel (FlashMLA's seesaw schedule, 64-row TMA blocks), 0 the mma.sync kernel that every other shape runs.
        """

    @property
    def mla_merge(self) -> int:
        """
        Changes numerics (last bits). How the wgmma MLA decode kernel merges a sequence's splits: 0 chooses (a thread-block cluster where every sequence's cluster is resident at once, else a grid barrier where the whole grid is, else a second, combine launch); 1 the combine launch; 2 the cluster (up to 16 splits, more take the combine); 3 the grid barrier (where the whole grid is resident, else the combine).
        """

    @property
    def mla_tc_mt(self) -> int:
        """
        Changes numerics (last bits). Head tiles of 16 a block of the mma.sync MLA decode kernel: 0 chooses from the batch (2 below 32 sequences, 4 from there); 2 or 4 force it (4 only where there are more than 32 heads).
        """

    @property
    def mla_split_tiles(self) -> int:
        """
        Changes numerics. 64-row tiles a split of the batched MLA decode kernels (every arm): 0 chooses the splits from the cost model; n > 0 gives ceil(tiles / n) splits (the wgmma arm at most 1024).
        """

    @property
    def moe_grouped_min_t(self) -> int:
        """
        Changes numerics (MoE layers with a shared expert). Tokens from which moe_forward runs the routed experts grouped by expert instead of one (token, slot) pair at a time (a large value keeps the per-pair kernels). moe_forward's own bytes do not change (the grouped kernels' every product and sum is the per-pair kernels'); but below this token count an MoE layer's shared expert rides in the per-pair kernels, and from it runs as an MLP of its own (cuBLAS above one row), which sums in another order.
        """

    @property
    def attn_decode_unsplit(self) -> bool:
        """
        Changes numerics. The full attention's decode (AttentionLayer, memra._core.attention with slots): False splits each sequence's cache rows over blocks sized from the cache's capacity and merges the splits per head in a second launch; True runs one block per sequence and K/V head over all of its rows (the A/B arm). Where a sequence's rows fit in one split both give the same bytes.
        """

    @property
    def prefill_chunk(self) -> int:
        """
        Changes numerics (CUDA only). Prompt tokens a prefill runs at a time (Model.prefill, logits, generate, stream, generate_batch, the server): a longer prompt is split into chunks of at most this many tokens, each run through every layer and committed before the next, so the prefill's scratch memory grows with the chunk, not with the prompt (a long prompt fits where its one-shot scratch would not). 0 never splits. Unlike the other fields it applies on the CPU too (the Python orchestration reads it), where the chunks give the one-shot bytes; on CUDA a GEMM over fewer rows may sum in another order (docs/prefill.md).
        """

    @property
    def moe_tensor_cores(self) -> bool:
        """
        Changes numerics. The routed experts over bfloat16 / float16 weights from moe_grouped_min_t tokens on: True runs them as grouped GEMMs on tensor cores (x and the SwiGLU output rounded to the weights' type, float32 accumulation, each expert's weights read once per call of up to 16384 token-slot pairs); False keeps the CUDA-core grouped kernels (float32 activations, the per-pair kernels' bytes), the A/B arm. float32 weights always take the CUDA-core kernels.
        """

    @property
    def attn_prefill_tensor_cores(self) -> bool:
        """
        Changes numerics. The full attention's prefill over a bfloat16 K/V cache (more than one token, head widths a multiple of 8): True runs the FlashAttention-2-style tensor-core kernel (the queries and the softmax weights rounded to bfloat16, float32 scores, softmax and accumulation), the default; False the float32 CUDA-core kernel, which float32 caches always take.
        """

class HostRead:
    """
    A device -> host copy in flight, from Engine.to_host_async: wait() returns the numpy array.
    """

    def wait(self) -> object:
        """
        The copy as a numpy array (waits for that copy only, not for work enqueued after it; later calls return the same array). On a CUDA engine, ContractError 40025 when the engine has made Engine.READ_SLOTS newer reads since this one (its slot was reused); a CPU engine's read is complete when to_host_async returns, so it never fails.
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

def cuda_available() -> bool:
    """
    True when memra was built with its CUDA library and a CUDA device is usable here.
    """

def cuda_unavailable_reason() -> str | None:
    """
    None when CUDA is usable, otherwise why not (not built, library missing, no driver, no device).
    """

class Engine:
    """
    Owns one device: 'cpu' (the C++ reference backend) or 'cuda'. options: the CUDA kernels' arms (memra.KernelOptions; None: the defaults), fixed for the engine's life. device: 'cpu' or 'cuda' (the index is device_index; memra.load's 'cuda:N' is its own grammar). Raises UnsupportedError when a CUDA engine cannot be made here, ContractError for an unknown device, a device_index other than 0 on the CPU or out of range (40023), or options that are not a KernelOptions. On a CPU engine copy_into, begin_capture and end_capture raise UnsupportedError (50000): there is no stream to capture.
    """

    def __init__(self, device: str = 'cpu', device_index: int = 0, *, options: KernelOptions | None = None) -> None: ...

    @property
    def device(self) -> str:
        """'cpu' or 'cuda:N'."""

    @property
    def options(self) -> KernelOptions:
        """The KernelOptions this engine was made with (a copy; immutable)."""

    @property
    def is_cuda(self) -> bool: ...

    @property
    def cuda_stream(self) -> int:
        """
        The engine's cudaStream_t as an integer (0 on the CPU), e.g. for torch.cuda.ExternalStream: memra enqueues all of its work there.
        """

    def to_device(self, array: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        Copy a C-contiguous host array (any dtype) to this CUDA engine's device; returns a DLPack CUDA array of the same shape and dtype. Raises UnsupportedError on a CPU engine, ContractError for a device or non-contiguous input.
        """

    def to_host(self, array: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        A numpy copy of a C-contiguous array on this engine's device (waits for the engine's stream). Raises ContractError for an array on another device.
        """

    def to_host_async(self, array: Annotated[NDArray, dict(writable=False)]) -> HostRead:
        """
        Start copying a C-contiguous array of this engine (at most 64 KiB: token ids, not logits) to the host behind the work already enqueued, without waiting (a CPU engine copies at once); returns a memra._core.HostRead whose wait() gives the numpy array. Work enqueued after this call does not delay wait(), which is what lets a decode loop queue its next step before reading this one's tokens. Raises ContractError for an array on another device (40021) or over 64 KiB (40000), UnsupportedError 50003 while capturing.
        """

    READ_SLOTS: Final[int] = ...
    """
    How many to_host_async reads may be pending at once: the next one reuses the oldest one's slot.
    """

    def synchronize(self) -> None:
        """Wait for all work enqueued on this engine's stream."""

    def copy_into(self, dst: object, src: Annotated[NDArray, dict(writable=False)]) -> None:
        """
        Copy src (a host array, or a device array of this engine) into the existing device array dst (same dtype and element count; shapes may differ), asynchronously on the engine's stream. While capturing only device -> device copies are allowed (UnsupportedError 50003 otherwise: a captured host copy would replay stale bytes). Raises ContractError for a dtype / size / device mismatch.
        """

    def begin_capture(self) -> None:
        """
        Start recording this engine's stream into a CUDA graph: memra ops called from now on are recorded, not run, until end_capture() (or abort_capture() after an error). While recording, host <-> device copies and synchronisation raise UnsupportedError 50003; scratch allocated and released inside becomes the graph's own memory. Arrays an op returns while recording must be dropped before end_capture() (copy results into arrays made before the capture with copy_into). ContractError when already recording.
        """

    def end_capture(self) -> CudaGraph:
        """
        Finish the recording and return it as a memra._core.CudaGraph (ContractError when not recording; a CUDA error when the recording was invalidated). The graph holds the device addresses it recorded and no reference to their owners: keep the Cache, the arrays, weights and layers the recorded ops used alive for as long as it is replayed.
        """

    def abort_capture(self) -> None:
        """
        Discard a running recording (no-op when none runs); the engine is usable again.
        """

    def memory(self, *, reset_peak: bool = False) -> dict[str, int] | None:
        """
        Device memory in bytes, read without waiting for the stream (None on a CPU engine): device_total and device_used (cudaMemGetInfo: the whole device, every process and library on it, the CUDA context included); pool_used (memra's live allocations: weights, caches, arrays and kernel scratch all come from the device's stream-ordered pool, which engines on one device share; up to two released arrays above 1 GiB an engine keeps for the next array of their size count too) and pool_used_peak, its high-water mark; pool_reserved / pool_reserved_peak, what the pool holds from the driver (freed blocks are kept for reuse). The peaks count from the engine's creation or the last call with reset_peak=True, which restarts them from the current values after reading them. Reset just before a call, pool_used_peak after it minus the pool_used of the reset is the call's scratch high-water mark.
        """

    @property
    def capturing(self) -> bool:
        """True while this engine's stream is being recorded."""

    def __repr__(self) -> str: ...

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class DeviceArray:
    """
    A C-contiguous array in a CUDA engine's device memory, as memra's ops return it. Consumed zero-copy through DLPack (torch.from_dlpack, cupy.from_dlpack, or any memra op on the same engine); engine.to_host(a) copies it to numpy. The memory stays alive while any consumer holds a view.
    """

    @property
    def shape(self) -> tuple: ...

    @property
    def dtype(self) -> str: ...

    @property
    def device(self) -> str: ...

    def __len__(self) -> int: ...

    def __dlpack__(self, *, stream: object | None = None, max_version: object | None = None, dl_device: object | None = None, copy: object | None = None) -> object: ...

    def __dlpack_device__(self) -> tuple: ...

    def __repr__(self) -> str: ...

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class DeviceWeight:
    """
    A weight on a CUDA engine's device, converted once (on the device) to float32 or bfloat16. Used by the CUDA branch of the functional ops.
    """

    def __init__(self, engine: Engine, weight: Weight, *, dtype: str | None = None) -> None:
        """
        engine: a CUDA Engine; weight: a memra.Weight; dtype: 'float32' or 'bfloat16' (default: float32 stays float32, bfloat16/float16 become bfloat16). Raises UnsupportedError for a CPU engine, ContractError for another dtype, OutOfMemoryError when it does not fit.
        """

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> list[int]: ...

    def __repr__(self) -> str: ...

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class LayerStateSpec:
    """What one layer keeps per slot in a Cache (see cache.h)."""

    @staticmethod
    def none() -> LayerStateSpec:
        """A layer with no per-slot state."""

    @staticmethod
    def kda(*, heads: int, head_dim: int, conv_kernel: int) -> LayerStateSpec:
        """
        Conv ring [3*heads*head_dim, conv_kernel-1] and state [heads, head_dim, head_dim], both f32 ping-pong pairs.
        """

    @staticmethod
    def gdn(*, key_heads: int, value_heads: int, key_head_dim: int, value_head_dim: int, conv_kernel: int) -> LayerStateSpec:
        """
        Gated DeltaNet: conv ring [2*key_heads*key_head_dim + value_heads*value_head_dim, conv_kernel-1] and state [value_heads, key_head_dim, value_head_dim], both f32 ping-pong pairs (GdnLayer.state_spec()).
        """

    @staticmethod
    def mla(*, row_width: int, index_head_dim: int = 0, kpool: int = 0, tail_rows: int = 0) -> LayerStateSpec:
        """
        Latent rows [max_len, row_width]; with index_head_dim > 0 also the DSA pool keys [max_len // kpool, index_head_dim] and a tail ring of tail_rows raw indexer rows.
        """

    @staticmethod
    def attention(*, kv_heads: int, head_dim: int) -> LayerStateSpec:
        """
        Full attention (AttentionLayer): key rows and value rows [max_len, kv_heads, head_dim] each, in the cache's latent dtype (float32, or bfloat16 on a CUDA cache made with latent_dtype='bfloat16').
        """

    @property
    def kind(self) -> str: ...

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class SlotSnapshot:
    """
    An undo point of one slot of a Cache (Cache.snapshot; Cache.restore puts it back).
    """

    @property
    def slot(self) -> int:
        """The slot it was taken of."""

    @property
    def length(self) -> int:
        """Tokens the slot held when it was taken."""

    @property
    def nbytes(self) -> int:
        """Bytes of state it holds (on the cache's device)."""

    def __repr__(self) -> str: ...

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class Cache:
    """
    Per-sequence state of a model: max_batch slots, each with its own length, and one plane per layer. OutOfMemoryError before anything is allocated when it does not fit; ContractError for a bad spec, max_batch or max_len below 1 (40025), a latent_dtype but 'float32' / 'bfloat16' (40025) or 'bfloat16' on a CPU engine (40020). The per-slot methods raise ContractError 40023 for a slot outside [0, max_batch) or a layer outside the specs, 40025 for a layer of another kind than the method reads.
    """

    def __init__(self, engine: Engine, specs: Sequence[LayerStateSpec], *, max_batch: int, max_len: int, latent_dtype: str = 'float32') -> None:
        """
        engine: the Engine whose device holds the planes; specs: one LayerStateSpec per layer; latent_dtype: 'float32' or 'bfloat16' (CUDA engines only) for the MLA latent rows and the attention K/V rows.
        """

    @staticmethod
    def bytes_needed(max_batch: int, max_len: int, specs: Sequence[LayerStateSpec]) -> int:
        """
        Bytes the planes of such a cache take (float32 latent rows); 2**63 - 1 when they pass 2**62 (such a cache never fits: Cache() refuses it with OutOfMemoryError).
        """

    @property
    def max_batch(self) -> int: ...

    @property
    def max_len(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def on_device(self) -> bool: ...

    @property
    def num_layers(self) -> int: ...

    def length(self, slot: int) -> int:
        """Tokens held by `slot`."""

    def cur(self, slot: int) -> int:
        """
        Which KDA ping-pong plane (0 or 1) holds `slot`'s committed state; every commit flips it.
        """

    def device_lengths(self) -> NDArray[numpy.int32] | None:
        """
        A host int32 [max_batch] copy of the cache's device mirror of the slot lengths (waits for the device; the decode graph reads the mirror); None on a CPU cache.
        """

    def device_cur(self) -> NDArray[numpy.int32] | None:
        """
        A host int32 [max_batch] copy of the device mirror of the ping-pong flags (see cur); None on a CPU cache.
        """

    def kda_plane_addresses(self, layer: int, slot: int) -> tuple[int, int, int, int]:
        """
        (conv plane 0, conv plane 1, state plane 0, state plane 1) addresses of `slot` in a KDA layer (device addresses on a CUDA cache), for tests of kda_tables.
        """

    def owner(self, slot: int) -> int:
        """
        The token of the owner holding `slot` (0: free). memra's generations, streams and server requests hold the slots they run in; see hold().
        """

    def hold(self, slot: int) -> int:
        """
        Hold `slot` (its contents are left as they are) and return the owner token, a nonzero int unique in the process. While held, commit / commit_host / free / copy_slot into it refuse with ContractError (CONTRACT_SLOT_HELD) unless given owner=token; reading it stays open; an owner=token that holds no slot there (released, or another cache's) is refused the same way. memra's generations never take a held slot. CONTRACT_SLOT_HELD when another owner holds it already. The layer objects' prefill / decode (the low-level API, which takes no owner) do not check holds: they write a slot's pending planes, which only a commit makes current, so a holder's commit takes what the last layer calls on that slot wrote.
        """

    def release(self, slot: int, token: int) -> None:
        """
        Give back a slot taken with hold() (contents untouched). ContractError (CONTRACT_SLOT_HELD) unless `token` holds it, naming the holder's token and `token`.
        """

    def commit(self, slot: int, n: int, *, owner: int = 0) -> None:
        """
        Advance `slot` by n tokens after every layer ran the step (flips its ping-pong planes). ContractError for a slot outside [0, max_batch) (CONTRACT_RANGE), n < 1 (CONTRACT_VALUE) or a slot held by an owner other than `owner` (CONTRACT_SLOT_HELD); CacheFullError when the slot cannot take n more tokens. Nothing changes on an error.
        """

    def commit_decode(self, slots: DecodeSlots) -> None:
        """
        A decode step's commit on the device (CUDA caches): the device lengths of the active rows of `slots` (memra._core.DecodeSlots) advance by one and their ping-pong flags flip, with no host round trip (capturable). The host's view is NOT advanced: call commit_host(slot, 1) for each active slot after enqueuing the step. UnsupportedError on a CPU cache.
        """

    def commit_host(self, slot: int, n: int, *, owner: int = 0) -> None:
        """
        The host half of commit_decode: advance the host's length of `slot` by n and flip its flag without writing the device (which a device commit already advanced). CacheFullError and CONTRACT_SLOT_HELD as commit.
        """

    def free(self, slot: int, *, owner: int = 0) -> None:
        """
        Forget `slot` (length 0, recurrent state zeroed) without touching other slots. ContractError (CONTRACT_SLOT_HELD) for a slot held by an owner other than `owner`; the slot stays held by its owner.
        """

    def copy_slot(self, src: int, dst: int, *, owner: int = 0) -> None:
        """
        Copy the whole state of `src` into `dst` (prefix reuse). ContractError (CONTRACT_SLOT_HELD) when `dst` is held by an owner other than `owner` (`src` is only read and may be held).
        """

    def snapshot(self, slot: int) -> SlotSnapshot:
        """
        An undo point of `slot` (memra._core.SlotSnapshot): the parts of its state that steps appended to it later may overwrite (the committed recurrent planes, the DSA indexer's tail ring), copied into a buffer of their own on the cache's device, and its length. restore() puts them back. OutOfMemoryError when the buffer cannot be had.
        """

    def restore(self, snapshot: SlotSnapshot, *, owner: int = 0) -> None:
        """
        Put a snapshot() of this cache back into its slot: the slot's length and state are those of the snapshot again, as if the prefills and decodes appended to it since never ran (Model.prefill's undo of a chunked prefill that failed midway). Only appends are undone: ContractError (40025) when the slot was freed, copied into or restored to an earlier point since the snapshot (or holds fewer tokens than then), or the snapshot is another cache's; CONTRACT_SLOT_HELD as commit.
        """

    def kda_state(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """Copy of the committed recurrent state [H, dk, dv]."""

    def kda_conv(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """Copy of the committed conv ring [3*qkv, K-1]."""

    def gdn_state(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """
        Copy of a GDN layer's committed recurrent state [value_heads, key_head_dim, value_head_dim].
        """

    def gdn_conv(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """
        Copy of a GDN layer's committed conv ring [2*Hk*dk + Hv*dv, K-1]: the last K-1 conv inputs of the q | k | v channels, oldest first (transformers' conv_states keep the last K; the oldest of those is never read again).
        """

    def latent_rows(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """Copy of the committed latent rows [length, row_width]."""

    def attn_keys(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """
        Copy of the committed key rows [length, kv_heads, head_dim] float32 of an attention layer.
        """

    def attn_values(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """
        Copy of the committed value rows [length, kv_heads, head_dim] float32 of an attention layer.
        """

    def pool_keys(self, layer: int, slot: int) -> NDArray[numpy.float32]:
        """Copy of the resident pool keys [length // kpool, d]."""

    def __repr__(self) -> str: ...

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

def kda_tables(cache: Cache, layer: int, slots: Annotated[NDArray, dict(writable=False)], cur: Annotated[NDArray, dict(writable=False)] | None = None, *, group: int = 0, sink_slot: int | None = None) -> tuple[object, object, object, object]:
    """
    CUDA caches only (UnsupportedError for a CPU cache): the per-sequence pointer tables of KDA layer `layer` computed on the device (cuda/kda_tables.cu), as KdaLayer builds them on the host: returns (ring_in, ring_out, state_in, state_out), uint64 device arrays [B] of addresses. slots: device int32 [B], slots[b] < 0 an idle row (valid slots unchecked: keep them in [0, max_batch)); cur: device int32 [max_batch] ping-pong flags (None: the cache's own device mirror, Cache.device_cur); group: the channel group (q 0, k 1, v 2) whose conv ring offset is added; sink_slot: idle rows point at plane 0 of that slot (None: null entries). Row b with s = slots[b] >= 0 reads plane cur[s] and writes plane 1 - cur[s].
    """

def commit_decode(slots: Annotated[NDArray, dict(writable=False)], lengths: object, cur: object, *, engine: Engine | None = None) -> None:
    """
    CUDA only (UnsupportedError otherwise): the decode step's commit on the device (cuda/graph_tables.cu), in place: lengths[s] += 1 and cur[s] ^= 1 for each s = slots[b] >= 0 (slots < 0 are idle rows; a repeated slot counts once per occurrence). slots: device int32 [B]; lengths, cur: device int32 [max_batch] (valid slots unchecked: keep them below max_batch; no capacity check). Cache.commit(s, 1) for the same slots gives the same values on the host.
    """

class KdaLayer:
    """
    Kimi Delta Attention mixer (reference: transformers Glm5NextTextLinearAttention.forward; KimiDeltaAttention with the softplus gate). Weights named as on disk below 'self_attn.' (layers.h). Every size argument is at most 2^20 (ContractError naming it).
    """

    def __init__(self, engine: Engine, weights: Mapping[str, Weight], *, hidden: int, heads: int, head_dim: int, conv_kernel: int, gate: str = 'lower_bound', lower_bound: float = -5.0, rms_eps: float = 9.999999747378752e-06, dtype: str = 'bfloat16') -> None:
        """
        engine: where the layer runs; weights: {name below 'self_attn.': Weight}; hidden, heads (linear_num_heads), head_dim (linear_head_dim; dk = dv), conv_kernel (linear_conv_kernel_dim); gate: 'lower_bound' (glm5_next: g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)), lower_bound <= 0 and finite) or 'softplus' (Kimi-Linear: g = -exp(A_log) * softplus(f + dt_bias), lower_bound unused); rms_eps (rms_norm_eps: the gated output norm's epsilon, finite and >= 0); dtype: the projections' compute dtype on CUDA ('float32' or 'bfloat16'). ContractError names a missing or mis-shaped tensor, a bad size, gate, lower_bound, rms_eps or dtype; on CUDA UnsupportedError unless head_dim = 128 and conv_kernel is 2..8.
        """

    def state_spec(self) -> LayerStateSpec:
        """
        The cache plane this layer needs (memra._core.LayerStateSpec: kind 'kda', the conv ring and the recurrent state's sizes), for Cache(...)'s specs.
        """

    def forward(self, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        x [T, hidden] f32 -> y [T, hidden] from a zero state (CPU layers; UnsupportedError on a CUDA layer, which runs against a cache).
        """

    def prefill(self, cache: Cache, layer: int, slot: int, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        Continue `slot` by x [T, hidden]; writes the pending state plane, visible after cache.commit(slot, T). CacheFullError when the slot has no room.
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: Annotated[NDArray, dict(writable=False)], x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        One token for each slot: slots [B] int32, x [B, hidden] -> [B, hidden].
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: DecodeSlots, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): x [slots.size, hidden]; idle rows touch no state and give meaningless finite rows. Capturable into a CUDA graph (no host round trip).
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class MlaLayer:
    """
    Multi-head latent attention (absorbed) with the optional DSA k-pool indexer (reference: transformers Glm5NextTextAttention + Glm5NextTextIndexer; KimiLinearAttention). Weights named as on disk below 'self_attn.'. q_lora_rank 0: no query LoRA, q = q_proj(x). rms_eps: the epsilon of q_a_layernorm and kv_a_layernorm. rotate: whether the d_rope columns are rotated (the family decides, never d_rope > 0). CUDA: UnsupportedError for rotated rope columns (rotate with d_rope > 0; the CPU runs them). Every size argument but tail_rows is at most 2^20 (ContractError naming it).
    """

    def __init__(self, engine: Engine, weights: Mapping[str, Weight], *, hidden: int, heads: int, q_lora_rank: int, kv_rank: int, d_nope: int, d_rope: int, d_v: int, rms_eps: float = 9.999999747378752e-06, sparse: bool = False, index_heads: int = 0, index_head_dim: int = 0, kpool: int = 0, topk: int = 0, tail_rows: int = 0, rotate: bool = False, rope_base: float = 10000.0, dtype: str = 'bfloat16') -> None:
        """
        engine: where the layer runs; weights: {name below 'self_attn.': Weight}; hidden, heads (num_attention_heads), q_lora_rank (0: q_proj), kv_rank (kv_lora_rank), d_nope (qk_nope_head_dim), d_rope (qk_rope_head_dim), d_v (v_head_dim), rms_eps; sparse: whether the layer runs its own DSA indexer (a full DSA layer: weights below 'indexer.'), with index_heads (index_n_heads), index_head_dim, kpool (index_kpool) and topk (index_topk, a multiple of kpool); tail_rows: the incomplete tail rows the indexer's list keeps (its kpool ring); a dense layer (sparse=False) takes none of these sizes (each 0; ContractError otherwise); rotate and rope_base (rope_theta) for rotated rope columns; dtype: the projections' compute dtype on CUDA ('float32' or 'bfloat16'). ContractError names a missing or mis-shaped tensor (40024 / 40000), a bad size, rms_eps, rope_base or dtype (40025).
        """

    def state_spec(self) -> LayerStateSpec:
        """
        The cache plane this layer needs (memra._core.LayerStateSpec: kind 'mla', the latent row width and, with the indexer, the pool keys' and tail ring's), for Cache(...)'s specs.
        """

    @property
    def index_width(self) -> int:
        """
        The index list's row width: index_topk + index_kpool - 1 on a DSA layer, 0 on a dense one.
        """

    @property
    def has_indexer(self) -> bool:
        """Whether the layer runs its own DSA indexer (sparse=True)."""

    def prefill(self, cache: Cache, layer: int, slot: int, x: Annotated[NDArray, dict(writable=False)], topk: Annotated[NDArray, dict(writable=False)] | None = None) -> tuple:
        """
        Continue `slot` by x [T, hidden] -> (y [T, hidden], index list [T, index_width] int32 used by a DSA layer, [T, 0] otherwise). `topk` [T, index_width] int32: required by a shared DSA layer (sparse, no indexer of its own: the index list of the full DSA layer before it; each entry -1 or a row the query sees, checked on the CPU) and refused by any other (ContractError naming topk: a full DSA layer computes its own list, a dense layer attends to every row). Latent rows land past the slot's length and become visible at cache.commit.
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: Annotated[NDArray, dict(writable=False)], x: Annotated[NDArray, dict(writable=False)], topk: Annotated[NDArray, dict(writable=False)] | None = None) -> tuple:
        """
        One token for each of slots [B]: as prefill with T = 1, `topk` [B, index_width] under the same rule (every row's list is checked before any row runs).
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: DecodeSlots, x: Annotated[NDArray, dict(writable=False)], topk: Annotated[NDArray, dict(writable=False)] | None = None) -> tuple:
        """
        The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): each row's position comes from the cache's device length; an idle row appends nothing, gets a zero attention output and an all -1 index list. `topk` as above (its entries are not read back: the kernel skips those outside [0, the row's position]). Capturable into a CUDA graph.
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class MlpLayer:
    """
    Dense SwiGLU MLP with the asymmetric clamp (reference: Glm5NextTextMLP). Weights: gate_proj.weight, up_proj.weight, down_proj.weight. hidden and intermediate at most 2^20 (ContractError naming it).
    """

    def __init__(self, engine: Engine, weights: Mapping[str, Weight], *, hidden: int, intermediate: int, swiglu_limit: float, dtype: str = 'bfloat16') -> None:
        """
        engine: where the layer runs; weights: {name below 'mlp.': Weight}; hidden, intermediate (intermediate_size); swiglu_limit (> 0; inf: no clamp); dtype: the compute dtype on CUDA ('float32' or 'bfloat16'). ContractError for a missing (40024) or mis-shaped (40000) tensor, a bad size, a swiglu_limit <= 0 or another dtype (40025).
        """

    def forward(self, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        x [T, hidden] float32 on the layer's device -> [T, hidden] float32. ContractError (CONTRACT_DTYPE / CONTRACT_SHAPE / CONTRACT_STRIDE / CONTRACT_DEVICE) for a bad x.
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class MoeLayer:
    """
    Routed experts + shared expert (references: Glm5NextTextMoE; with scoring='softmax' and shared_gate, Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock). Weights: gate.weight, gate.e_score_correction_bias (the sigmoid router: required; the softmax one has none), experts.N.{gate,up,down}_proj.weight, shared_experts.{gate,up,down}_proj.weight, shared_expert_gate.weight [1, hidden] (shared_gate). hidden, n_experts, intermediate and shared_intermediate at most 2^20 (ContractError naming it).
    """

    def __init__(self, engine: Engine, weights: Mapping[str, Weight], *, hidden: int, n_experts: int, top_k: int, n_group: int, topk_group: int, intermediate: int, shared_intermediate: int, norm_topk_prob: bool, routed_scaling: float, swiglu_limit: float, scoring: str = 'sigmoid', shared_gate: bool = False, dtype: str = 'bfloat16') -> None:
        """
        scoring: the router's form, 'sigmoid' (grouped, glm5_next / Kimi-Linear) or 'softmax' (Qwen: softmax over the f32 logits, top_k, renormalised when norm_topk_prob; n_group and topk_group 1). shared_gate: y = routed + sigmoid(x . shared_expert_gate) * shared(x) (Qwen). shared_intermediate 0: no shared expert, as transformers' zero-width one adds nothing (the empty shared_experts tensors [0, hidden] / [hidden, 0] its save_pretrained writes, and shared_expert_gate.weight, are taken and dropped). Raises ContractError naming a missing, extra or mis-shaped tensor or a bad count or scoring.
        """

    def forward(self, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        x [T, hidden] float32 -> y [T, hidden] float32, on the layer's device: the same kind of result as MlpLayer.forward, so a decoder loop calls every FFN alike (forward_with_experts also returns the chosen experts).
        """

    def forward_with_experts(self, x: Annotated[NDArray, dict(writable=False)]) -> tuple:
        """
        x [T, hidden] -> (y [T, hidden] float32, chosen experts [T, top_k] int32): forward's y byte for byte, and the router's choice.
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class HyperConnection:
    """
    mHC site (reference: Glm5NextTextHyperConnection). Weights: fn, base, scale (hc_attn_* / hc_ffn_* on disk). sinkhorn_iters in [1, 1000] (a bound on the uninterruptible Sinkhorn loop; the checkpoints use 20); hidden and hc_mult at most 2^20.
    """

    def __init__(self, engine: Engine, weights: Mapping[str, Weight], *, hidden: int, hc_mult: int, sinkhorn_iters: int, hc_eps: float, norm_eps: float, dtype: str = 'bfloat16') -> None:
        """
        engine: where the site runs; weights: {fn, base, scale}; hidden; hc_mult (the residual streams); sinkhorn_iters (hc_sinkhorn_iters); hc_eps (the floor added to pre, comb and each Sinkhorn denominator); norm_eps (rms_norm_eps of the unweighted input norm); dtype: fn's compute dtype on CUDA ('float32' or 'bfloat16'). ContractError for a missing or mis-shaped weight, a bad size, an eps negative or not finite, or another dtype.
        """

    def pre(self, streams: Annotated[NDArray, dict(writable=False)], *, norm: Annotated[NDArray, dict(writable=False)] | None = None, eps: float | None = None) -> tuple:
        """
        streams [T, hc, hidden] float32 -> (post [T, hc], comb [T, hc, hc], collapsed [T, hidden]) float32, on the layer's device.
        With eps (and optionally norm [hidden] float32), the third output is the block's input RMSNorm of collapsed, (norm *) collapsed / sqrt(mean(collapsed^2) + eps): on CUDA at decode rows fused into the mapping's last kernel, byte for byte rms_norm(collapsed, norm, eps=eps).
        Raises ContractError (CONTRACT_SHAPE / DTYPE / DEVICE of streams or norm; CONTRACT_VALUE for a norm without eps or an eps that is negative or not finite).
        Reference: Glm5NextTextHyperConnection.forward, then Glm5NextTextRMSNorm.
        """

    def post_pre(self, y: Annotated[NDArray, dict(writable=False)], post: Annotated[NDArray, dict(writable=False)], comb: Annotated[NDArray, dict(writable=False)], streams: Annotated[NDArray, dict(writable=False)], *, norm: Annotated[NDArray, dict(writable=False)] | None = None, eps: float) -> tuple:
        """
        The previous site's expansion, then this site's pre with the block's input norm: new = mhc_post(y, post, comb, streams), then pre(new, norm=norm, eps=eps).
        y [T, hidden]; post [T, hc] and comb [T, hc, hc] (the previous site's pre outputs); streams [T, hc, hidden] (the residual streams before the sublayer); norm [hidden] or None; all float32 on the layer's device. Returns (new streams [T, hc, hidden], post [T, hc], comb [T, hc, hc], normed [T, hidden]) float32, byte for byte mhc_post followed by pre(norm=, eps=); on CUDA at one decode row (hc 4) one launch.
        Raises ContractError (CONTRACT_SHAPE / DTYPE / DEVICE / STRIDE of any array; CONTRACT_VALUE for an eps that is negative or not finite).
        Reference: Glm5NextTextDecoderLayer.forward (post * h + comb^T @ residual), then Glm5NextTextHyperConnection.forward and Glm5NextTextRMSNorm.
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class AttentionLayer:
    """
    The gated full attention of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next over a K/V cache (reference: transformers 5.17 Qwen3_5Attention / Qwen3NextAttention). Weights named as on disk below 'self_attn.': q_proj.weight [heads * 2 * head_dim, hidden] (per head the query rows, then the gate rows), k_proj.weight and v_proj.weight [kv_heads * head_dim, hidden], o_proj.weight [hidden, heads * head_dim], q_norm.weight and k_norm.weight [head_dim] (zero-centred: the layer multiplies by 1 + w), optional *.bias (attention_bias). Its cache layer is LayerStateSpec.attention(kv_heads=, head_dim=). hidden, heads and kv_heads at most 2^20 (ContractError naming it).
    """

    def __init__(self, engine: Engine, weights: Mapping[str, Weight], *, hidden: int, heads: int, kv_heads: int, head_dim: int, rotary_dim: int, rope_theta: float = 10000.0, rms_eps: float = 9.999999974752427e-07, dtype: str = 'bfloat16') -> None:
        """
        engine: where the layer runs; weights: {name: memra.Weight}; hidden, heads, kv_heads (heads % kv_heads == 0), head_dim (1..256); rotary_dim: int(head_dim * partial_rotary_factor) as transformers computes it (even); rope_theta: rope_parameters['rope_theta'], finite, > 0 and not so small that its largest frequency times an int32 position overflows float32; rms_eps: rms_norm_eps (q_norm / k_norm); dtype: the CUDA weights' compute dtype ('float32' or 'bfloat16'; the CPU keeps the file's).
        Raises ContractError (a missing or mis-shaped tensor named; bad counts; CONTRACT_ODD_ROPE for an odd rotary_dim), UnsupportedError for head_dim > 256.
        """

    def state_spec(self) -> LayerStateSpec:
        """
        LayerStateSpec.attention(kv_heads=, head_dim=): the cache layer this layer needs.
        """

    @property
    def scale(self) -> float:
        """head_dim ** -0.5 (float32), the scores' factor."""

    @property
    def inv_freq(self) -> object:
        """
        The inverse RoPE frequencies [rotary_dim // 2] float32 (rope_inv_freq), host numpy.
        """

    def prefill(self, cache: Cache, layer: int, slot: int, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        Continue `slot` by x [T, hidden] float32 -> y [T, hidden] float32 (positions cache.length(slot) + t); the K/V rows land past the slot's length and become visible at cache.commit(slot, T). CacheFullError when the slot has no room; ContractError for a cache layer of another kind or geometry.
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: Annotated[NDArray, dict(writable=False)], x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        One token for each slot: slots [B] int32 (host, distinct), x [B, hidden] -> [B, hidden], each row at its slot's length.
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: DecodeSlots, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): each row's position is the cache's device length of its slot; an idle row appends nothing and its attention output is zero. Capturable into a CUDA graph.
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...

class GdnLayer:
    """
    Gated DeltaNet mixer of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next (reference: transformers Qwen3_5GatedDeltaNet.forward, Qwen3NextGatedDeltaNet.forward). Weights named as on disk below 'linear_attn.' (gdn_layer.h): Qwen3.5's in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, or Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba (de-interleaved at load), plus conv1d.weight, A_log, dt_bias, norm.weight, out_proj.weight. Every size argument is at most 2^20 (ContractError naming it).
    """

    def __init__(self, engine: Engine, weights: Mapping[str, Weight], *, hidden: int, key_heads: int, value_heads: int, key_head_dim: int, value_head_dim: int, conv_kernel: int = 4, rms_eps: float = 9.999999974752427e-07, dtype: str = 'bfloat16') -> None:
        """
        engine: where the layer runs; weights: {name below 'linear_attn.': Weight}; hidden, key_heads (linear_num_key_heads), value_heads (linear_num_value_heads, a multiple of key_heads), key_head_dim, value_head_dim, conv_kernel (linear_conv_kernel_dim), rms_eps (rms_norm_eps: the output norm's epsilon); dtype: the projections' compute dtype on CUDA ('float32' or 'bfloat16'). ContractError names a missing or mis-shaped tensor or a bad size; on CUDA UnsupportedError unless key_head_dim = value_head_dim = 128 and conv_kernel is 2..8.
        """

    def state_spec(self) -> LayerStateSpec:
        """The LayerStateSpec.gdn(...) a cache layer needs for this layer."""

    @property
    def interleaved(self) -> bool:
        """
        True when loaded from Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba.
        """

    def forward(self, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """x [T, hidden] float32 -> y [T, hidden] from a zero state (CPU layers)."""

    def prefill(self, cache: Cache, layer: int, slot: int, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        Continue `slot` by x [T, hidden] -> y [T, hidden]; writes the pending conv ring and state planes, visible after cache.commit(slot, T). CacheFullError when the slot has no room; ContractError for a cache layer of another kind or geometry.
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: Annotated[NDArray, dict(writable=False)], x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        One token for each slot: slots [B] int32 (host, distinct), x [B, hidden] -> [B, hidden]; each row equals a prefill of that one token.
        """

    @overload
    def decode(self, cache: Cache, layer: int, slots: DecodeSlots, x: Annotated[NDArray, dict(writable=False)]) -> object:
        """
        The same with the rows' slots on the device (memra._core.DecodeSlots of `cache`, CUDA): x [slots.size, hidden]; idle rows touch no state and give meaningless finite rows. Capturable into a CUDA graph (no host round trip).
        """

    def __copy__(self, *args) -> NoReturn: ...

    def __deepcopy__(self, *args) -> NoReturn: ...

    def __reduce_ex__(self, *args) -> NoReturn: ...
