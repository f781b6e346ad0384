// One fused decode step's attention on the CPU (neoxlab.serve.native_attention).
//
// Each (row, head) pair has one query token attending to its own slot's keys 0..pos[row].
// SDPA runs a small GEMM pair per (row, head) and reads the keys up to the longest row's
// position; here each pair streams its own keys and values once, up to its own position,
// so the step is bound by reading the KV cache rather than by per-pair call overhead.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace {

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& positions) {
  // q [n, heads, 1, d]; k, v [n, heads, >= max(positions) + 1, d]; positions [n] int64.
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "decode_attention: CPU tensors only");
  TORCH_CHECK(q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat &&
                  v.scalar_type() == torch::kFloat,
              "decode_attention: float32 only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == 1,
              "decode_attention: q [n, heads, 1, d], k and v [n, heads, keys, d]");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "decode_attention: the head dimension must be contiguous");
  const auto pos = positions.to(torch::kLong).contiguous();
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(3), keys = k.size(2);
  TORCH_CHECK(pos.numel() == n, "decode_attention: one position per row");
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(pp[r] >= 0 && pp[r] < keys, "decode_attention: position ", pp[r],
                " outside the ", keys, " keys given");
  }
  auto out = torch::empty({n, heads, 1, d}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  at::parallel_for(0, n * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score;
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t r = pair / heads, h = pair % heads, len = pp[r] + 1;
      const float* qv = qp + r * q.stride(0) + h * q.stride(1);
      const float* kb = kp + r * k.stride(0) + h * k.stride(1);
      const float* vb = vp + r * v.stride(0) + h * v.stride(1);
      score.resize(len);
      for (int64_t s = 0; s < len; ++s) {
        const float* key = kb + s * k.stride(2);
        float dot = 0.f;
        for (int64_t j = 0; j < d; ++j) dot += qv[j] * key[j];
        score[s] = dot * scale;
      }
      float top = score[0];  // len >= 1; no infinities (built with -ffast-math)
      for (int64_t s = 1; s < len; ++s) top = score[s] > top ? score[s] : top;
      float total = 0.f;
      for (int64_t s = 0; s < len; ++s) {
        score[s] = std::exp(score[s] - top);
        total += score[s];
      }
      float* o = op + pair * d;
      for (int64_t j = 0; j < d; ++j) o[j] = 0.f;
      for (int64_t s = 0; s < len; ++s) {
        const float* value = vb + s * v.stride(2);
        const float w = score[s];
        for (int64_t j = 0; j < d; ++j) o[j] += w * value[j];
      }
      const float inv = 1.f / total;
      for (int64_t j = 0; j < d; ++j) o[j] *= inv;
    }
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention,
        "fused decode attention: each row's query over its slot's keys 0..position");
}
