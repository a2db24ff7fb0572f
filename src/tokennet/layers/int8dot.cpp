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
// rows past N are zero.
at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar, "int8dot.pack: W must be (N, K) int8");
  TORCH_CHECK(w.size(1) % 4 == 0, "int8dot.pack: K must be a multiple of 4");
  auto wc = w.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1), nb = (N + NB - 1) / NB;
  auto packed = at::zeros({nb, K / 4, NB, 4}, wc.options());
  const int8_t* src = wc.data_ptr<int8_t>();
  int8_t* dst = packed.data_ptr<int8_t>();
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r = 0; r < NB && b * NB + r < N; ++r) {
        const int8_t* row = src + (b * NB + r) * K;
        for (int64_t k = 0; k < K; ++k) dst[((b * (K / 4) + k / 4) * NB + r) * 4 + k % 4] = row[k];
      }
    }
  });
  return packed;
}

constexpr int64_t GROUP = 32;  // activations per scale (llama.cpp's Q8_0 blocks)

// One row of x (float32), K = G * 32 -> |x_q| (u8), the sign bits of x_q (bit k of signs[k / 64]), and one scale per
// group of 32: s_g = max_{k in g} |x_k| / 127 (1 for an all-zero group), x_q = round(x / s_g) (ties to even).
template <typename T>
void quantize_row(const T* x_in, int64_t K, uint8_t* mag, uint64_t* signs, float* scales) {
  float x[GROUP];
  std::memset(signs, 0, sizeof(uint64_t) * ((K + 63) / 64));
  for (int64_t g = 0; g < K / GROUP; ++g) {
    for (int64_t i = 0; i < GROUP; ++i) x[i] = static_cast<float>(x_in[g * GROUP + i]);  // exact from bf16
    const float* xg = x;
    float amax = 0.f;
    for (int64_t i = 0; i < GROUP; ++i) amax = std::fmax(amax, std::fabs(xg[i]));
    const float s = amax == 0.f ? 1.f : amax / 127.f;
    scales[g] = s;
    for (int64_t i = 0; i < GROUP; ++i) {
      const int64_t k = g * GROUP + i;
      float q = std::nearbyint(xg[i] / s);  // the default rounding mode: to nearest, ties to even
      q = std::fmin(std::fmax(q, -127.f), 127.f);
      const int32_t qi = static_cast<int32_t>(q);
      mag[k] = static_cast<uint8_t>(qi < 0 ? -qi : qi);
      if (qi < 0) signs[k / 64] |= uint64_t(1) << (k % 64);
    }
  }
}

// y (M, N) float32 = s_w[n] * sum_g s_x[m, g] * (sum_{k in g} x_q[m, k] W[n, k]) (+ bias[n]): each group's integer
// sum exact in int32, the groups added in order in float32 (no fused multiply-add), then the weight scale.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                  const c10::optional<at::Tensor>& bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2, "int8dot.linear: x must be (M, K)");
  const int64_t M = x.size(0), K = x.size(1), nb = packed.size(0), G = K / GROUP;
  TORCH_CHECK(K % GROUP == 0, "int8dot.linear: K must be a multiple of 32");
  TORCH_CHECK(packed.size(1) * 4 == K && packed.size(2) == NB && nb * NB >= N, "int8dot.linear: shapes differ");
  // bf16 and float32 rows are read as they are; another dtype is converted first
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  auto xf = bf16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  auto sw = scale.to(at::kFloat).contiguous();
  at::Tensor bf;
  if (bias.has_value() && bias->defined()) bf = bias->to(at::kFloat).contiguous();
  const int64_t words = (K + 63) / 64;
  std::vector<uint8_t> mag(M * K);
  std::vector<uint64_t> signs(M * words);
  std::vector<float> sx(M * G);
  for (int64_t m = 0; m < M; ++m) {
    if (bf16)
      quantize_row(xf.data_ptr<at::BFloat16>() + m * K, K, mag.data() + m * K, signs.data() + m * words,
                   sx.data() + m * G);
    else
      quantize_row(xf.data_ptr<float>() + m * K, K, mag.data() + m * K, signs.data() + m * words, sx.data() + m * G);
  }
  // The sign of x_q moves onto the weights (vpdpbusd multiplies unsigned by signed bytes): step j (activations
  // 4j .. 4j+3) negates byte 4r + c of the 64-byte weight vector when x_q[4j + c] < 0, for every row r.
  std::vector<uint64_t> negate(M * (K / 4));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < K / 4; ++j) {
      const uint64_t nib = (signs[m * words + (4 * j) / 64] >> ((4 * j) % 64)) & 0xF;
      negate[m * (K / 4) + j] = nib * 0x1111111111111111ULL;
    }
  auto y = at::empty({M, N}, xf.options().dtype(at::kFloat));
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* swp = sw.data_ptr<float>();
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t steps = K / 4;
  const __m512i zero = _mm512_setzero_si512();
  at::parallel_for(0, nb, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int8_t* blk = wp + b * steps * NB * 4;
      const int64_t rows = std::min(NB, N - b * NB);
      for (int64_t m = 0; m < M; ++m) {
        const int32_t* xm = reinterpret_cast<const int32_t*>(mag.data() + m * K);  // 4 u8 values per int32
        const uint64_t* neg = negate.data() + m * steps;
        const float* sg = sx.data() + m * G;
        __m512 fa = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
          __m512i a0 = zero, a1 = zero;
          for (int64_t j = g * 8; j < g * 8 + 8; j += 2) {  // 8 steps of 4 activations: one group
            __m512i w0 = _mm512_loadu_si512(blk + j * 64), w1 = _mm512_loadu_si512(blk + (j + 1) * 64);
            w0 = _mm512_mask_sub_epi8(w0, neg[j], zero, w0);
            w1 = _mm512_mask_sub_epi8(w1, neg[j + 1], zero, w1);
            a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(xm[j]), w0);
            a1 = _mm512_dpbusd_epi32(a1, _mm512_set1_epi32(xm[j + 1]), w1);
          }
          const __m512 part = _mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1));  // exact: |sum| <= 127^2 * 32
          fa = _mm512_add_ps(fa, _mm512_mul_ps(part, _mm512_set1_ps(sg[g])));
        }
        alignas(64) float out[NB];
        _mm512_store_ps(out, fa);
        float* ym = yp + m * N + b * NB;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = b * NB + r;
          const float v = out[r] * swp[n];
          ym[r] = bp ? v + bp[n] : v;
        }
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(tokennet_int8dot, m) {
  m.def("pack(Tensor w) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor scale, Tensor? bias, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokennet_int8dot, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
}
