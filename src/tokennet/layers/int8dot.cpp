// int8 x int8 linear layer with VNNI integer dot products, for decoding a few rows at a time on x86 CPUs.
// See int8dot.py for the formula, the weight layout and how it is built and registered.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t NB = 16;  // output rows per block: one zmm of int32 sums

// W (N, K) int8 -> packed (ceil(N/16), K/4, 16, 4) int8: block b, step j holds W[16b + r, 4j + c] at [b, j, r, c];
// rows past N are zero. Also 128 * sum_k W[n, k] (int32, (N,)), the correction of the +128 activation offset.
std::vector<at::Tensor> pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar, "int8dot.pack: W must be (N, K) int8");
  TORCH_CHECK(w.size(1) % 4 == 0, "int8dot.pack: K must be a multiple of 4");
  auto wc = w.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1), nb = (N + NB - 1) / NB;
  auto packed = at::zeros({nb, K / 4, NB, 4}, wc.options());
  auto corr = at::empty({N}, wc.options().dtype(at::kInt));
  const int8_t* src = wc.data_ptr<int8_t>();
  int8_t* dst = packed.data_ptr<int8_t>();
  int32_t* cp = corr.data_ptr<int32_t>();
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r = 0; r < NB && b * NB + r < N; ++r) {
        const int8_t* row = src + (b * NB + r) * K;
        int32_t sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          dst[((b * (K / 4) + k / 4) * NB + r) * 4 + k % 4] = row[k];
          sum += row[k];
        }
        cp[b * NB + r] = 128 * sum;
      }
    }
  });
  return {packed, corr};
}

// One row of x (float32) -> u8 values x_q + 128 with x_q = round(x / s) (half to even), s = max|x| / 127
// (s = 1 for an all-zero row); returns s.
float quantize_row(const float* x, int64_t K, uint8_t* out) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(x[k]));
  const float s = amax == 0.f ? 1.f : amax / 127.f;
  for (int64_t k = 0; k < K; ++k) {
    float q = std::nearbyint(x[k] / s);  // the default rounding mode: to nearest, ties to even
    q = std::fmin(std::fmax(q, -127.f), 127.f);
    out[k] = static_cast<uint8_t>(static_cast<int32_t>(q) + 128);
  }
  return s;
}

// y (M, N) float32 = (x_q W^T) * (s_x[m] * s_w[n]) (+ bias[n]), the integer sums exact in int32.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& corr, const at::Tensor& scale,
                  const c10::optional<at::Tensor>& bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2, "int8dot.linear: x must be (M, K)");
  const int64_t M = x.size(0), K = x.size(1), nb = packed.size(0);
  TORCH_CHECK(packed.size(1) * 4 == K && packed.size(2) == NB && nb * NB >= N, "int8dot.linear: shapes differ");
  auto xf = x.to(at::kFloat).contiguous();
  auto sw = scale.to(at::kFloat).contiguous();
  at::Tensor bf;
  if (bias.has_value() && bias->defined()) bf = bias->to(at::kFloat).contiguous();
  std::vector<uint8_t> xq(M * K);
  std::vector<float> sx(M);
  for (int64_t m = 0; m < M; ++m) sx[m] = quantize_row(xf.data_ptr<float>() + m * K, K, xq.data() + m * K);
  auto y = at::empty({M, N}, xf.options());
  const int8_t* wp = packed.data_ptr<int8_t>();
  const int32_t* cp = corr.data_ptr<int32_t>();
  const float* swp = sw.data_ptr<float>();
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t steps = K / 4;
  // grain: enough blocks per task that a thread streams a long run of weights
  at::parallel_for(0, nb, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int8_t* blk = wp + b * steps * NB * 4;
      const int64_t rows = std::min(NB, N - b * NB);
      for (int64_t m = 0; m < M; ++m) {
        const int32_t* xm = reinterpret_cast<const int32_t*>(xq.data() + m * K);  // 4 u8 values per int32
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        int64_t j = 0;
        for (; j + 4 <= steps; j += 4) {
          a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(xm[j]), _mm512_loadu_si512(blk + j * 64));
          a1 = _mm512_dpbusd_epi32(a1, _mm512_set1_epi32(xm[j + 1]), _mm512_loadu_si512(blk + (j + 1) * 64));
          a2 = _mm512_dpbusd_epi32(a2, _mm512_set1_epi32(xm[j + 2]), _mm512_loadu_si512(blk + (j + 2) * 64));
          a3 = _mm512_dpbusd_epi32(a3, _mm512_set1_epi32(xm[j + 3]), _mm512_loadu_si512(blk + (j + 3) * 64));
        }
        for (; j < steps; ++j)
          a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(xm[j]), _mm512_loadu_si512(blk + j * 64));
        __m512i acc = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
        alignas(64) int32_t out[NB];
        _mm512_store_si512(out, acc);
        float* ym = yp + m * N + b * NB;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = b * NB + r;
          float v = static_cast<float>(out[r] - cp[n]) * (sx[m] * swp[n]);
          ym[r] = bp ? v + bp[n] : v;
        }
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(tokennet_int8dot, m) {
  m.def("pack(Tensor w) -> Tensor[]");
  m.def("linear(Tensor x, Tensor packed, Tensor corr, Tensor scale, Tensor? bias, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokennet_int8dot, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
}
