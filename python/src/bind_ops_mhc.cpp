// Functional bindings of the mHC ops (ops.h, cpu/mhc.cpp) over DLPack arrays: the hyper-
// connection mapping, the post-block expansion and the head mean. Arguments are checked
// (ContractError naming the op and the values); the GIL is released while computing.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>
#include "memra/msg.h"
#include <string>
#include <vector>

#include "common.h"
#include "memra/ops.h"

namespace memra::py {

namespace {

using NpU64 = nb::ndarray<nb::numpy, uint64_t>;

std::string shape_of(const Weight& w) { return w.shape_str(); }

// A weight of exactly `rows` x `cols` (as [rows, cols] after folding leading dims).
void check_weight(const Weight& w, const char* op, const char* name, int64_t rows, int64_t cols) {
  if (w.rows() != rows || w.cols() != cols || w.shape().size() != 2) {
    Msg os;
    os << op << ": weight '" << name << "' has shape " << shape_of(w) << ", expected [" << rows
       << ", " << cols << "]";
    raise_contract(kContractShape, os.str());
  }
}

void check_value(bool ok, const char* op, const std::string& what) {
  if (!ok) raise_contract(kContractValue, std::string(op) + ": " + what);
}

// Counters for sampling: int64 or uint64, 1-D [B], C-contiguous, host. int64 values must be
// non-negative (they are reinterpreted as uint64). common.h's checkers cover f32/i32 only.
std::vector<uint64_t> counter_arg(const AnyArray& a, const char* op, const char* name, int64_t B) {
  Msg os;
  if (a.device_type() != nb::device::cpu::value) {
    os << op << ": argument '" << name << "' must live in host memory for the CPU backend, got "
       << "a tensor on DLPack device type " << a.device_type();
    raise_contract(kContractDevice, os.str());
  }
  const auto code = static_cast<nb::dlpack::dtype_code>(a.dtype().code);
  const bool is_i64 = code == nb::dlpack::dtype_code::Int && a.dtype().bits == 64;
  const bool is_u64 = code == nb::dlpack::dtype_code::UInt && a.dtype().bits == 64;
  if (!(is_i64 || is_u64) || a.dtype().lanes != 1) {
    os << op << ": argument '" << name << "' must be int64 or uint64, got a "
       << static_cast<int>(a.dtype().bits) << "-bit array of DLPack type code "
       << static_cast<int>(a.dtype().code);
    raise_contract(kContractDType, os.str());
  }
  if (a.ndim() != 1 || static_cast<int64_t>(a.shape(0)) != B) {
    os << op << ": argument '" << name << "' has shape " << shape_str(a) << ", expected [" << B
       << "]";
    raise_contract(kContractShape, os.str());
  }
  if (B > 1 && a.stride(0) != 1) {
    os << op << ": argument '" << name << "' with shape " << shape_str(a)
       << " must be C-contiguous (call np.ascontiguousarray first)";
    raise_contract(kContractStride, os.str());
  }
  std::vector<uint64_t> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    if (is_i64) {
      const int64_t v = static_cast<const int64_t*>(a.data())[b];
      if (v < 0) {
        os << op << ": argument '" << name << "' holds the negative counter " << v
           << " at row " << b;
        raise_contract(kContractRange, os.str());
      }
      out[b] = static_cast<uint64_t>(v);
    } else {
      out[b] = static_cast<const uint64_t*>(a.data())[b];
    }
  }
  return out;
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void init_ops_mhc(nb::module_& m) {
  m.def(
      "mhc_pre",
      [](const AnyArray& streams, const Weight& fn, const AnyArray& base, const AnyArray& scale,
         int sinkhorn_iters, float hc_eps, float norm_eps) {
        const char* op = "mhc_pre";
        const float* sp = f32_arg(streams, op, "streams", {-1, -1, -1});
        const int64_t T = dim(streams, 0), hc = dim(streams, 1), D = dim(streams, 2);
        const int64_t mix = (2 + hc) * hc;
        check_weight(fn, op, "fn", mix, hc * D);
        const float* bp = f32_arg(base, op, "base", {mix});
        const float* cp = f32_arg(scale, op, "scale", {3});
        check_value(hc >= 1, op, "hc (streams.shape[1]) must be >= 1");
        check_value(sinkhorn_iters >= 1, op,
                    "sinkhorn_iters must be >= 1, got " + std::to_string(sinkhorn_iters));
        NpF32 post = new_f32({sz(T), sz(hc)});
        NpF32 comb = new_f32({sz(T), sz(hc), sz(hc)});
        NpF32 collapsed = new_f32({sz(T), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::mhc_pre(sp, static_cast<int>(T), static_cast<int>(hc), static_cast<int>(D), fn, bp,
                       cp, sinkhorn_iters, hc_eps, norm_eps, post.data(), comb.data(),
                       collapsed.data());
        }
        return nb::make_tuple(post, comb, collapsed);
      },
      nb::arg("streams"), nb::arg("fn"), nb::arg("base"), nb::arg("scale"), nb::kw_only(),
      nb::arg("sinkhorn_iters"), nb::arg("hc_eps"), nb::arg("norm_eps"),
      "mHC mapping. streams [T, hc, D] float32; fn Weight [(2+hc)*hc, hc*D]; base "
      "[(2+hc)*hc] float32; scale [3] float32.\nlogits = fn(unweighted RMSNorm(norm_eps) of the "
      "flattened streams); pre = sigmoid(.*scale[0] + base) + hc_eps; post = 2 sigmoid(.); comb "
      "= softmax over the last dim + hc_eps, one column normalisation, then sinkhorn_iters - 1 "
      "rounds of row then column normalisation (denominators + hc_eps).\nReturns (post [T, hc], "
      "comb [T, hc, hc], collapsed [T, D] = sum_s pre[s] * streams[:, s]) float32.\nRaises "
      "ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE; "
      "CONTRACT_VALUE for sinkhorn_iters < 1).\nReference: transformers "
      "Glm5NextTextHyperConnection.forward.");

  m.def(
      "mhc_post",
      [](const AnyArray& y, const AnyArray& post, const AnyArray& comb, const AnyArray& residual) {
        const char* op = "mhc_post";
        const float* rp = f32_arg(residual, op, "residual", {-1, -1, -1});
        const int64_t T = dim(residual, 0), hc = dim(residual, 1), D = dim(residual, 2);
        const float* yp = f32_arg(y, op, "y", {T, D});
        const float* pp = f32_arg(post, op, "post", {T, hc});
        const float* cp = f32_arg(comb, op, "comb", {T, hc, hc});
        NpF32 out = new_f32({sz(T), sz(hc), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::mhc_post(yp, pp, cp, rp, static_cast<int>(T), static_cast<int>(hc),
                        static_cast<int>(D), out.data());
        }
        return out;
      },
      nb::arg("y"), nb::arg("post"), nb::arg("comb"), nb::arg("residual"),
      "mHC expansion after a block: out[t, j] = post[t, j] * y[t] + sum_i comb[t, i, j] * "
      "residual[t, i].\n\ny [T, D]; post [T, hc]; comb [T, hc, hc]; residual [T, hc, D]; all "
      "float32. Returns out [T, hc, D] float32.\nRaises ContractError (CONTRACT_DTYPE, "
      "CONTRACT_SHAPE, CONTRACT_STRIDE, CONTRACT_DEVICE).\nReference: transformers "
      "Glm5NextTextDecoderLayer.forward (post * h + comb^T @ residual).");

  m.def(
      "hc_head_mean",
      [](const AnyArray& streams) {
        const char* op = "hc_head_mean";
        const float* sp = f32_arg(streams, op, "streams", {-1, -1, -1});
        const int64_t T = dim(streams, 0), hc = dim(streams, 1), D = dim(streams, 2);
        check_value(hc >= 1, op, "hc (streams.shape[1]) must be >= 1");
        NpF32 out = new_f32({sz(T), sz(D)});
        {
          nb::gil_scoped_release nogil;
          cpu::hc_head_mean(sp, static_cast<int>(T), static_cast<int>(hc), static_cast<int>(D),
                            out.data());
        }
        return out;
      },
      nb::arg("streams"),
      "Final hyper-connection head: the plain mean over the streams.\n\nstreams [T, hc, D] "
      "float32 -> [T, D] float32.\nRaises ContractError (CONTRACT_DTYPE, CONTRACT_SHAPE, "
      "CONTRACT_STRIDE, CONTRACT_DEVICE).\nReference: transformers Glm5NextTextHyperHead.");

}

}  // namespace memra::py
