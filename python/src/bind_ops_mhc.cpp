// Functional bindings of the mHC ops over DLPack arrays, through memra::op (op/mhc.h): the
// hyper-connection mapping (with its fused input norm), the post-block expansion, the model's
// head, the head mean and the streams' expansion from the embedding. CPU backend (engine None or
// a CPU Engine): cpu/mhc.cpp, the oracle. CUDA backend (keyword `engine` = a CUDA Engine):
// cuda/mhc_*.cu, arrays on the engine's device, fn a memra.DeviceWeight, outputs allocated
// there. Arguments are checked (ContractError naming the op and the values) before anything
// runs; the GIL is released while the CPU computes.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include "memra/msg.h"
#include <string>
#include <vector>

#include "common.h"
#include "device_args.h"
#include "memra/engine.h"
#include "memra/op/mhc.h"
#include "op_call.h"

namespace memra::py {

namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void init_ops_mhc(nb::module_& m) {
  m.def(
      "mhc_pre",
      [](const AnyArray& streams, nb::handle fn, const AnyArray& base, const AnyArray& scale,
         int sinkhorn_iters, float hc_eps, float norm_eps, std::optional<AnyArray> rms_weight,
         std::optional<float> rms_eps, const Engine* engine) {
        const char* op = "mhc_pre";
        const float* sp = f32_in(engine, streams, op, "streams", {-1, -1, -1});
        const int64_t T = dim(streams, 0), hc = dim(streams, 1), D = dim(streams, 2);
        const int64_t mix = (2 + hc) * hc;
        const Weight* hw = nullptr;
        const DeviceWeight* dw = nullptr;
        if (on_cuda(engine)) {
          dw = &device_weight(engine, fn, op, "fn");
          check_weight_2d(*dw, op, "fn", mix, hc * D);
        } else {
          hw = &host_weight(fn, op, "fn");
          check_weight_2d(*hw, op, "fn", mix, hc * D);
        }
        const float* bp = f32_in(engine, base, op, "base", {mix});
        const float* cp = f32_in(engine, scale, op, "scale", {3});
        check_value(hc >= 1, op, "hc (streams.shape[1]) must be >= 1");
        check_value(sinkhorn_iters >= 1 && sinkhorn_iters <= op::kMaxSinkhornIters, op,
                    "sinkhorn_iters must be in [1, " + std::to_string(op::kMaxSinkhornIters) +
                        "], got " + std::to_string(sinkhorn_iters));
        check_eps(hc_eps, op, "hc_eps");
        check_eps(norm_eps, op, "norm_eps");
        const float* rw = rms_weight ? f32_in(engine, *rms_weight, op, "rms_weight", {D}) : nullptr;
        check_value(rms_eps || !rms_weight, op, "rms_weight needs rms_eps");
        if (rms_eps) check_eps(*rms_eps, op, "rms_eps");
        Out post = out_f32(engine, {sz(T), sz(hc)});
        Out comb = out_f32(engine, {sz(T), sz(hc), sz(hc)});
        Out collapsed = out_f32(engine, {sz(T), sz(D)});
        MemraMhcParams p = {};
        p.T = int(T);
        p.hc = int(hc);
        p.D = int(D);
        p.pre = 1;
        p.norm = rms_eps ? 1 : 0;
        p.streams = sp;
        p.fn = dw ? dw->data() : hw->data();
        p.fn_dtype = dw ? dw->dtype_code() : static_cast<int>(hw->dtype());
        p.base = bp;
        p.scale = cp;
        p.sinkhorn_iters = sinkhorn_iters;
        p.hc_eps = hc_eps;
        p.norm_eps = norm_eps;
        p.post = post.data<float>();
        p.comb = comb.data<float>();
        p.rms_w = rw;
        p.rms_eps = rms_eps ? *rms_eps : 0.0f;
        p.out = collapsed.data<float>();
        run_op(engine, [&] { return op::mhc(backend(engine), p); });
        return nb::make_tuple(post.obj, comb.obj, collapsed.obj);
      },
      nb::arg("streams"), nb::arg("fn"), nb::arg("base"), nb::arg("scale"), nb::kw_only(),
      nb::arg("sinkhorn_iters"), nb::arg("hc_eps"), nb::arg("norm_eps"),
      nb::arg("rms_weight").none() = nb::none(), nb::arg("rms_eps").none() = nb::none(),
      nb::arg("engine").none() = nb::none(),
      "mHC mapping. streams [T, hc, D] float32; fn [(2+hc)*hc, hc*D] (memra.Weight on the CPU, "
      "memra.DeviceWeight on CUDA); base [(2+hc)*hc] float32; scale [3] float32; arrays on the "
      "engine's device.\nlogits = fn(unweighted RMSNorm(norm_eps) of the "
      "flattened streams); pre = sigmoid(.*scale[0] + base) + hc_eps; post = 2 sigmoid(.); comb "
      "= softmax over the last dim + hc_eps, one column normalisation, then sinkhorn_iters - 1 "
      "rounds of row then column normalisation (denominators + hc_eps).\nReturns (post [T, hc], "
      "comb [T, hc, hc], collapsed [T, D] = sum_s pre[s] * streams[:, s]) float32. With rms_eps "
      "(and optionally rms_weight [D] float32) the third output is rms_norm(collapsed, "
      "rms_weight, eps=rms_eps) instead, the block's input norm (on CUDA at decode rows fused "
      "into the mapping's last kernel, byte for byte the two ops).\nCUDA: the "
      "RMS factor is applied to the logits (fn(x * r) = r * fn(x)); T <= 64 (decode rows, "
      "(2 + hc) * hc < 64, 16-byte rows): a split-K pass over the f32 streams (a bfloat16 fn is "
      "widened), otherwise a GEMM that rounds the streams to a bfloat16 fn's dtype. hc up to "
      "64.\nRaises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, "
      "CONTRACT_DEVICE; CONTRACT_VALUE for sinkhorn_iters outside [1, 1000], an eps that is "
      "negative or not finite, or rms_weight without rms_eps), UnsupportedError (CUDA, hc > "
      "64).\nReference: "
      "transformers Glm5NextTextHyperConnection.forward.");

  m.def(
      "mhc_post",
      [](const AnyArray& y, const AnyArray& post, const AnyArray& comb, const AnyArray& residual,
         const Engine* engine) {
        const char* op = "mhc_post";
        const float* rp = f32_in(engine, residual, op, "residual", {-1, -1, -1});
        const int64_t T = dim32(residual, 0, op, "residual"), hc = dim32(residual, 1, op, "residual"),
                      D = dim32(residual, 2, op, "residual");
        check_value(hc >= 1, op, "hc (residual.shape[1]) must be >= 1");
        check_rows(op, "residual", T, {{"y", &y, 2}, {"post", &post, 2}, {"comb", &comb, 3}});
        const float* yp = f32_in(engine, y, op, "y", {T, D});
        const float* pp = f32_in(engine, post, op, "post", {T, hc});
        const float* cp = f32_in(engine, comb, op, "comb", {T, hc, hc});
        Out out = out_f32_uninit(engine, {sz(T), sz(hc), sz(D)});
        MemraMhcParams p = {};
        p.T = int(T);
        p.hc = int(hc);
        p.D = int(D);
        p.expand = 1;
        p.y = yp;
        p.post_prev = pp;
        p.comb_prev = cp;
        p.residual = rp;
        p.streams_out = out.data<float>();
        run_op(engine, [&] { return op::mhc(backend(engine), p); });
        return out.obj;
      },
      nb::arg("y"), nb::arg("post"), nb::arg("comb"), nb::arg("residual"), nb::kw_only(),
      nb::arg("engine").none() = nb::none(),
      "mHC expansion after a block: out[t, j] = post[t, j] * y[t] + sum_i comb[t, i, j] * "
      "residual[t, i].\n\ny [T, D]; post [T, hc]; comb [T, hc, hc]; residual [T, hc, D]; all "
      "float32 on the engine's device. Returns out [T, hc, D] float32 (CUDA: bit-identical to "
      "the CPU).\nRaises ContractError (CONTRACT_DTYPE, "
      "CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for hc = 0).\nReference: transformers "
      "Glm5NextTextDecoderLayer.forward (post * h + comb^T @ residual).");

  m.def(
      "mhc_post_head_norm",
      [](const AnyArray& y, const AnyArray& post, const AnyArray& comb, const AnyArray& residual,
         std::optional<AnyArray> weight, float eps, const Engine* engine) {
        const char* op = "mhc_post_head_norm";
        check_eps(eps, op);
        const float* rp = f32_in(engine, residual, op, "residual", {-1, -1, -1});
        const int64_t T = dim32(residual, 0, op, "residual"), hc = dim32(residual, 1, op, "residual"),
                      D = dim32(residual, 2, op, "residual");
        check_value(hc >= 1, op, "hc (residual.shape[1]) must be >= 1");
        check_rows(op, "residual", T, {{"y", &y, 2}, {"post", &post, 2}, {"comb", &comb, 3}});
        const float* yp = f32_in(engine, y, op, "y", {T, D});
        const float* pp = f32_in(engine, post, op, "post", {T, hc});
        const float* cp = f32_in(engine, comb, op, "comb", {T, hc, hc});
        const float* wp = weight ? f32_in(engine, *weight, op, "weight", {D}) : nullptr;
        Out out = out_f32_uninit(engine, {sz(T), sz(D)});
        MemraMhcParams p = {};
        p.T = int(T);
        p.hc = int(hc);
        p.D = int(D);
        p.expand = 1;
        p.head = 1;
        p.norm = 1;
        p.y = yp;
        p.post_prev = pp;
        p.comb_prev = cp;
        p.residual = rp;
        p.rms_w = wp;
        p.rms_eps = eps;
        p.out = out.data<float>();
        run_op(engine, [&] { return op::mhc(backend(engine), p); });
        return out.obj;
      },
      nb::arg("y"), nb::arg("post"), nb::arg("comb"), nb::arg("residual"),
      nb::arg("weight") = nb::none(), nb::kw_only(), nb::arg("eps"),
      nb::arg("engine").none() = nb::none(),
      "The model's head after the last block: rms_norm(hc_head_mean(mhc_post(y, post, comb, "
      "residual)), weight, eps=eps), the bytes of those three ops.\n\ny [T, D]; post [T, hc]; "
      "comb [T, hc, hc]; residual [T, hc, D]; weight [D] or None; all float32 on the engine's "
      "device. Returns [T, D] float32 (CUDA: one launch for hc <= 8 and D <= 4096, the expanded "
      "streams never written).\nRaises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, "
      "CONTRACT_STRIDE, CONTRACT_DEVICE; CONTRACT_VALUE for a negative or non-finite eps, hc < "
      "1).\nReference: transformers Glm5NextTextModel.forward (the hyper head's mean, then the "
      "final norm).");

  m.def(
      "hc_head_mean",
      [](const AnyArray& streams, const Engine* engine) {
        const char* op = "hc_head_mean";
        const float* sp = f32_in(engine, streams, op, "streams", {-1, -1, -1});
        const int64_t T = dim(streams, 0), hc = dim(streams, 1), D = dim(streams, 2);
        check_value(hc >= 1, op, "hc (streams.shape[1]) must be >= 1");
        Out out = out_f32_uninit(engine, {sz(T), sz(D)});
        run_op(engine, [&] {
          return op::hc_head_mean(backend(engine), sp, int(T), int(hc), int(D), out.data<float>());
        });
        return out.obj;
      },
      nb::arg("streams"), nb::kw_only(), nb::arg("engine").none() = nb::none(),
      "Final hyper-connection head: the plain mean over the streams.\n\nstreams [T, hc, D] "
      "float32 -> [T, D] float32, on the engine's device (CUDA: bit-identical to the CPU).\n"
      "Raises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, "
      "CONTRACT_STRIDE, CONTRACT_DEVICE).\nReference: transformers Glm5NextTextHyperHead.");

  m.def(
      "hc_expand",
      [](const AnyArray& x, int64_t n64, const Engine* engine) {
        const float* xp = f32_in(engine, x, "hc_expand", "x", {-1, -1});
        const int64_t T = dim(x, 0), D = dim(x, 1);
        if (n64 < 1 || n64 > INT32_MAX) {
          raise_contract(kContractValue, "hc_expand: n must be in [1, 2^31), got " + std::to_string(n64));
        }
        const int n = static_cast<int>(n64);
        Out y = out_f32_uninit(engine, {size_t(T), size_t(n), size_t(D)});
        run_op(engine, [&] {
          return op::hc_expand(backend(engine), xp, int(T), int(D), n, y.data<float>());
        });
        return y.obj;
      },
      nb::arg("x"), nb::arg("n"), nb::kw_only(), nb::arg("engine").none() = nb::none(),
      "x [T, D] float32 -> [T, n, D]: every residual stream starts as x (reference: "
      "Glm5NextTextModel.forward, hidden_states.unsqueeze(2).expand(..., hc_mult, ...)). On a CUDA "
      "engine x must live on its device. Raises ContractError for a bad array or n outside "
      "[1, 2^31).");
}

}  // namespace memra::py
