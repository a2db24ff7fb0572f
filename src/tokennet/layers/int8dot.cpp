// int8 x int8 linear layers with VNNI integer dot products, for decoding a few rows at a time on x86 CPUs: int8
// weights with per-channel scales (linear), GGUF's Q8_0 / Q4_0 / Q4_1 / Q5_0 blocks (blocks) and its Q4_K / Q5_K / Q6_K
// super-blocks (kblocks).
// See int8dot.py for the formula, the weight layout and how it is built and registered.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <algorithm>
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

// Both kernels ask for the weights this far ahead into L2 (software prefetch, within the thread's rows): the stream
// of weights then keeps more misses in flight than the hardware prefetcher alone. Measured, one thread, the 151
// layers of SmolLM2 in turn (thread CPU time, a loaded machine, medians of 60 passes against none): Q4_1/Q8_0
// blocks (96 MB a pass) 10-18% less time at 16-64 KiB ahead, int8 (135 MB) 5-10%.
constexpr int64_t PREFETCH = 32768;

// One row of x (float32 or bf16), K = G * 32 -> x_q (int8) and one scale per group of 32:
// s_g = max_{k in g} |x_k| / 127 (1 for an all-zero group), x_q = round(x / s_g) (ties to even) in [-127, 127].
template <typename T>
void round_row(const T* x_in, int64_t K, int8_t* xq, float* scales) {
  float x[GROUP];
  for (int64_t g = 0; g < K / GROUP; ++g) {
    for (int64_t i = 0; i < GROUP; ++i) x[i] = static_cast<float>(x_in[g * GROUP + i]);  // exact from bf16
    float amax = 0.f;
    for (int64_t i = 0; i < GROUP; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float s = amax == 0.f ? 1.f : amax / 127.f;
    scales[g] = s;
    for (int64_t i = 0; i < GROUP; ++i) {
      float q = std::nearbyint(x[i] / s);  // the default rounding mode: to nearest, ties to even
      q = std::fmin(std::fmax(q, -127.f), 127.f);
      xq[g * GROUP + i] = static_cast<int8_t>(q);
    }
  }
}

// The same rounding as |x_q| (u8) and the sign bits of x_q (bit k of signs[k / 64]).
template <typename T>
void quantize_row(const T* x_in, int64_t K, uint8_t* mag, uint64_t* signs, float* scales) {
  std::vector<int8_t> xq(K);
  round_row(x_in, K, xq.data(), scales);
  std::memset(signs, 0, sizeof(uint64_t) * ((K + 63) / 64));
  for (int64_t k = 0; k < K; ++k) {
    const int32_t qi = xq[k];
    mag[k] = static_cast<uint8_t>(qi < 0 ? -qi : qi);
    if (qi < 0) signs[k / 64] |= uint64_t(1) << (k % 64);
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
    const int8_t* end = wp + b1 * steps * NB * 4;  // this thread's last byte: no prefetch past it
    for (int64_t b = b0; b < b1; ++b) {
      const int8_t* blk = wp + b * steps * NB * 4;
      const int64_t rows = std::min(NB, N - b * NB);
      for (int64_t m = 0; m < M; ++m) {
        const int32_t* xm = reinterpret_cast<const int32_t*>(mag.data() + m * K);  // 4 u8 values per int32
        const uint64_t* neg = negate.data() + m * steps;
        const float* sg = sx.data() + m * G;
        __m512 fa = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
          const int8_t* ahead = blk + g * 8 * 64 + PREFETCH;
          if (m == 0 && ahead < end)
            for (int64_t o = 0; o < 8 * 64; o += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + o), _MM_HINT_T1);
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

// ---- GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0) x int8 activations --------------------------------------------------------
// packed (nb, G, C) uint8: for each block of 16 output rows and each group g of 32 weights along K, one chunk of C
// bytes that the kernel reads in order (see int8dot.py, pack_blocks):
//   Q4_0, Q4_1: 4 steps of 64 bytes; byte 4r + c of step j holds q[16b + r, 32g + 8j + c] in its low nibble and
//               q[16b + r, 32g + 8j + 4 + c] in its high nibble (q in [0, 15]); then d (16 float16), then for
//               Q4_1 m (16 float16): C = 288 (Q4_0) or 320 (Q4_1).
//   Q8_0:       8 steps of 64 bytes; byte 4r + c of step j holds q[16b + r, 32g + 4j + c] (int8); then d: C = 544.
//   Q5_0:       as Q4_0 (the low 4 bits of q in [0, 31]), then 64 bytes H: bit j of byte 4r + c = bit 4 of the
//               low-nibble weight of step j, bit 4 + j that of the high-nibble one; then d: C = 352.
constexpr int64_t FMT_Q8_0 = 0, FMT_Q4_0 = 1, FMT_Q4_1 = 2, FMT_Q5_0 = 6;

constexpr int64_t chunk_bytes(int64_t fmt) {
  return fmt == FMT_Q8_0 ? 16 * 32 + 32 : fmt == FMT_Q4_0 ? 16 * 16 + 32 : fmt == FMT_Q5_0 ? 16 * 16 + 96
                                                                                             : 16 * 16 + 64;
}

struct BlockArgs {
  const uint8_t* wp;  // packed chunks
  const int8_t* xq;   // x_q (x_q + 128 as unsigned bytes for Q8_0), (M, K)
  const float *sx, *cx;
  const int32_t* xs;
  const float* bp;  // bias or nullptr
  float* yp;
  int64_t M, N, K, G;
};

// Blocks of rows b0 .. b1 - 1 of y. ONE: a single row of x, its 16 sums kept in a register across the groups.
template <int64_t FMT, bool ONE>
void block_rows(const BlockArgs& a, int64_t b0, int64_t b1) {
  constexpr int64_t C = chunk_bytes(FMT);
  const int64_t M = a.M, K = a.K, G = a.G;
  const __m512i low4 = _mm512_set1_epi8(0x0F), ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
  const uint8_t* end = a.wp + b1 * G * C;  // this thread's last byte: no prefetch past it
  std::vector<float> accv(ONE ? 0 : M * NB);
  float* acc = accv.data();
  for (int64_t b = b0; b < b1; ++b) {
    __m512 acc1 = _mm512_setzero_ps();
    if (!ONE) std::fill(accv.begin(), accv.end(), 0.f);
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* c = a.wp + (b * G + g) * C;
      if (c + PREFETCH < end)
        for (int64_t o = 0; o < C; o += 64) _mm_prefetch(reinterpret_cast<const char*>(c + PREFETCH + o), _MM_HINT_T1);
      // the group's integer sums I (16 rows), as the formula needs them per row m of x
      auto term = [&](int64_t m, __m512i isum, __m512 d, __m512 mn) {
        const float s = a.sx[m * G + g];
        if (FMT == FMT_Q4_0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(8 * a.xs[m * G + g]));
        if (FMT == FMT_Q5_0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(16 * a.xs[m * G + g]));
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(s)), _mm512_cvtepi32_ps(isum));
        if (FMT == FMT_Q4_1) t = _mm512_add_ps(t, _mm512_mul_ps(mn, _mm512_set1_ps(a.cx[m * G + g])));
        if (ONE)
          acc1 = _mm512_add_ps(acc1, t);
        else
          _mm512_storeu_ps(acc + m * NB, _mm512_add_ps(_mm512_loadu_ps(acc + m * NB), t));
      };
      if (FMT == FMT_Q8_0) {
        __m512i w[8];
        __m512i ws0 = zero, ws1 = zero;  // sum_k q_nk over the group, for the +128 of x
        for (int j = 0; j < 8; j += 2) {
          w[j] = _mm512_loadu_si512(c + j * 64);
          w[j + 1] = _mm512_loadu_si512(c + (j + 1) * 64);
          ws0 = _mm512_dpbusd_epi32(ws0, ones, w[j]);
          ws1 = _mm512_dpbusd_epi32(ws1, ones, w[j + 1]);
        }
        const __m512i off = _mm512_slli_epi32(_mm512_add_epi32(ws0, ws1), 7);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 512)));
        for (int64_t m = 0; m < M; ++m) {
          const int32_t* xm = reinterpret_cast<const int32_t*>(a.xq + m * K + g * GROUP);
          __m512i a0 = zero, a1 = zero;
          for (int j = 0; j < 8; j += 2) {
            a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(xm[j]), w[j]);
            a1 = _mm512_dpbusd_epi32(a1, _mm512_set1_epi32(xm[j + 1]), w[j + 1]);
          }
          term(m, _mm512_sub_epi32(_mm512_add_epi32(a0, a1), off), d, d);
        }
      } else {
        __m512i lo[4], hi[4];
        for (int j = 0; j < 4; ++j) {
          const __m512i v = _mm512_loadu_si512(c + j * 64);
          lo[j] = _mm512_and_si512(v, low4);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        if (FMT == FMT_Q5_0) {  // the fifth bits (shifts in 16-bit lanes; the mask keeps bit 4 of each byte)
          const __m512i h = _mm512_loadu_si512(c + 256), bit4 = _mm512_set1_epi8(0x10);
          lo[0] = _mm512_or_si512(lo[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), bit4));
          lo[1] = _mm512_or_si512(lo[1], _mm512_and_si512(_mm512_slli_epi16(h, 3), bit4));
          lo[2] = _mm512_or_si512(lo[2], _mm512_and_si512(_mm512_slli_epi16(h, 2), bit4));
          lo[3] = _mm512_or_si512(lo[3], _mm512_and_si512(_mm512_slli_epi16(h, 1), bit4));
          hi[0] = _mm512_or_si512(hi[0], _mm512_and_si512(h, bit4));
          hi[1] = _mm512_or_si512(hi[1], _mm512_and_si512(_mm512_srli_epi16(h, 1), bit4));
          hi[2] = _mm512_or_si512(hi[2], _mm512_and_si512(_mm512_srli_epi16(h, 2), bit4));
          hi[3] = _mm512_or_si512(hi[3], _mm512_and_si512(_mm512_srli_epi16(h, 3), bit4));
        }
        const __m512 d = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + (FMT == FMT_Q5_0 ? 320 : 256))));
        const __m512 mn = FMT == FMT_Q4_1
            ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 288))) : d;
        for (int64_t m = 0; m < M; ++m) {
          const int32_t* xm = reinterpret_cast<const int32_t*>(a.xq + m * K + g * GROUP);
          __m512i a0 = zero, a1 = zero;
          for (int j = 0; j < 4; ++j) {
            a0 = _mm512_dpbusd_epi32(a0, lo[j], _mm512_set1_epi32(xm[2 * j]));
            a1 = _mm512_dpbusd_epi32(a1, hi[j], _mm512_set1_epi32(xm[2 * j + 1]));
          }
          term(m, _mm512_add_epi32(a0, a1), d, mn);
        }
      }
    }
    alignas(64) float one[NB];
    if (ONE) {
      _mm512_store_ps(one, acc1);
      acc = one;
    }
    const int64_t rows = std::min(NB, a.N - b * NB);
    for (int64_t m = 0; m < M; ++m) {
      float* ym = a.yp + m * a.N + b * NB;
      for (int64_t r = 0; r < rows; ++r) ym[r] = a.bp ? acc[m * NB + r] + a.bp[b * NB + r] : acc[m * NB + r];
    }
    if (ONE) acc = accv.data();
  }
}

// y (M, N) float32, per output n, over the groups g in order, starting from 0 (float32, no fused multiply-add):
//   Q8_0: acc += (d_ng * s_g) * float(I_ng)
//   Q4_0: acc += (d_ng * s_g) * float(I_ng - 8 X_g)
//   Q5_0: acc += (d_ng * s_g) * float(I_ng - 16 X_g)
//   Q4_1: acc += (d_ng * s_g) * float(I_ng) + m_ng * (s_g * float(X_g))
// with I_ng = sum_{k in g} x_q,k q_nk and X_g = sum_{k in g} x_q,k exact in int32; then y_n = acc (+ bias_n).
// Q4: vpdpbusd takes the nibbles as its unsigned bytes and x_q as its signed ones. Q8_0: it takes x_q + 128 (in
// [1, 255]) as the unsigned bytes and q as the signed ones, and I_ng = sum (x_q + 128) q - 128 sum q.
at::Tensor blocks(const at::Tensor& x, const at::Tensor& packed, int64_t fmt, const c10::optional<at::Tensor>& bias,
                  int64_t N) {
  TORCH_CHECK(fmt == FMT_Q8_0 || fmt == FMT_Q4_0 || fmt == FMT_Q4_1 || fmt == FMT_Q5_0,
              "int8dot.blocks: unknown format");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.scalar_type() == at::kByte, "int8dot.blocks: bad shapes");
  const int64_t M = x.size(0), K = x.size(1), nb = packed.size(0), G = packed.size(1), C = chunk_bytes(fmt);
  TORCH_CHECK(K == G * GROUP && packed.size(2) == C && nb * NB >= N, "int8dot.blocks: shapes differ");
  TORCH_CHECK(packed.is_contiguous(), "int8dot.blocks: packed must be contiguous");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  auto xf = bf16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  at::Tensor bf;
  if (bias.has_value() && bias->defined()) bf = bias->to(at::kFloat).contiguous();
  std::vector<int8_t> xq(M * K);
  std::vector<float> sx(M * G), cx(M * G);  // s_g and s_g * float(X_g)
  std::vector<int32_t> xs(M * G);           // X_g
  for (int64_t m = 0; m < M; ++m) {
    if (bf16)
      round_row(xf.data_ptr<at::BFloat16>() + m * K, K, xq.data() + m * K, sx.data() + m * G);
    else
      round_row(xf.data_ptr<float>() + m * K, K, xq.data() + m * K, sx.data() + m * G);
    for (int64_t g = 0; g < G; ++g) {
      int32_t t = 0;
      for (int64_t i = 0; i < GROUP; ++i) t += xq[m * K + g * GROUP + i];
      xs[m * G + g] = t;
      cx[m * G + g] = sx[m * G + g] * static_cast<float>(t);
    }
  }
  if (fmt == FMT_Q8_0)  // x_q + 128 as unsigned bytes, in place
    for (auto& v : xq) v = static_cast<int8_t>(static_cast<uint8_t>(static_cast<int32_t>(v) + 128));
  auto y = at::empty({M, N}, xf.options().dtype(at::kFloat));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const BlockArgs a{wp, xq.data(), sx.data(), cx.data(), xs.data(), bp, yp, M, N, K, G};
  at::parallel_for(0, nb, 16, [&](int64_t b0, int64_t b1) {
    if (M == 1) {
      if (fmt == FMT_Q8_0) block_rows<FMT_Q8_0, true>(a, b0, b1);
      else if (fmt == FMT_Q4_0) block_rows<FMT_Q4_0, true>(a, b0, b1);
      else if (fmt == FMT_Q5_0) block_rows<FMT_Q5_0, true>(a, b0, b1);
      else block_rows<FMT_Q4_1, true>(a, b0, b1);
    } else {
      if (fmt == FMT_Q8_0) block_rows<FMT_Q8_0, false>(a, b0, b1);
      else if (fmt == FMT_Q4_0) block_rows<FMT_Q4_0, false>(a, b0, b1);
      else if (fmt == FMT_Q5_0) block_rows<FMT_Q5_0, false>(a, b0, b1);
      else block_rows<FMT_Q4_1, false>(a, b0, b1);
    }
  });
  return y;
}

// ---- GGUF K-quants (Q4_K, Q5_K, Q6_K) x int8 activations ------------------------------------------------------
// packed (nb, T, S) uint8: for each block of 16 output rows and each super-block t of 256 weights along K, a header
// and 8 chunks (one per group g of 32 weights) that the kernel reads in order (see int8dot.py, pack_kblocks):
//   header: d (16 float16), for Q4_K/Q5_K then dmin (16 float16);
//   chunk:  4 steps of 64 bytes of nibbles as in Q4_0 (low 4 bits of q[16b + r, 256t + 32g + 8j + c] and of
//           q[.., 8j + 4 + c]); Q5_K: 64 bytes H, bit j of byte 4r + c = bit 4 of the low-nibble weight of step j, bit
//           4 + j that of the high-nibble one; Q6_K: 64 bytes H0, bits 2j, 2j + 1 of byte 4r + c = bits 4, 5 of the
//           low-nibble weight of step j, 64 bytes H1 the same for the high-nibble ones; then the 16 rows' sub-block
//           scales (uint8) and mins (uint8) for Q4_K/Q5_K, or the scales of weights 0-15 and of 16-31 (int8) for Q6_K.
constexpr int64_t FMT_Q4_K = 3, FMT_Q5_K = 4, FMT_Q6_K = 5, SUPER = 256;

constexpr int64_t kchunk_bytes(int64_t fmt) { return fmt == FMT_Q4_K ? 288 : fmt == FMT_Q5_K ? 352 : 416; }
constexpr int64_t khead_bytes(int64_t fmt) { return fmt == FMT_Q6_K ? 32 : 64; }
constexpr int64_t ksuper_bytes(int64_t fmt) { return khead_bytes(fmt) + 8 * kchunk_bytes(fmt); }

struct KArgs {
  const uint8_t* wp;
  const int8_t* xq;   // (M, K)
  const float *sx, *cx;  // (M, K/32): s_g and s_g * float(X_g)
  const int32_t* x16;  // (M, K/16): sums of x_q over each 16
  const float* bp;
  float* yp;
  int64_t M, N, K, T;
};

// v << s (s > 0) or v >> -s, in 16-bit lanes (the callers mask whole bytes after it)
inline __m512i shift16(__m512i v, int s) {
  return s >= 0 ? _mm512_slli_epi16(v, static_cast<unsigned>(s)) : _mm512_srli_epi16(v, static_cast<unsigned>(-s));
}

template <int64_t FMT>
void kblock_rows(const KArgs& a, int64_t b0, int64_t b1) {
  constexpr int64_t S = ksuper_bytes(FMT), C = kchunk_bytes(FMT), H = khead_bytes(FMT);
  const int64_t M = a.M, K = a.K, T = a.T, G = K / GROUP;
  const __m512i low4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
  const __m512i bit4 = _mm512_set1_epi8(0x10), bits45 = _mm512_set1_epi8(0x30);
  const uint8_t* end = a.wp + b1 * T * S;  // this thread's last byte: no prefetch past it
  std::vector<float> accv(M * NB), Av(M * NB), Bv(M * NB);
  float *acc = accv.data(), *A = Av.data(), *B = Bv.data();
  for (int64_t b = b0; b < b1; ++b) {
    std::fill(accv.begin(), accv.end(), 0.f);
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* sb = a.wp + (b * T + t) * S;
      std::fill(Av.begin(), Av.end(), 0.f);
      if (FMT != FMT_Q6_K) std::fill(Bv.begin(), Bv.end(), 0.f);
      for (int64_t gi = 0; gi < 8; ++gi) {
        const uint8_t* c = sb + H + gi * C;
        const int64_t g = t * 8 + gi;
        if (c + PREFETCH < end)
          for (int64_t o = 0; o < C; o += 64) _mm_prefetch(reinterpret_cast<const char*>(c + PREFETCH + o), _MM_HINT_T1);
        __m512i lo[4], hi[4];
        for (int j = 0; j < 4; ++j) {
          const __m512i v = _mm512_loadu_si512(c + j * 64);
          lo[j] = _mm512_and_si512(v, low4);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        if (FMT == FMT_Q5_K) {
          const __m512i h = _mm512_loadu_si512(c + 256);
          for (int j = 0; j < 4; ++j) {
            lo[j] = _mm512_or_si512(lo[j], _mm512_and_si512(shift16(h, 4 - j), bit4));
            hi[j] = _mm512_or_si512(hi[j], _mm512_and_si512(shift16(h, -j), bit4));
          }
        } else if (FMT == FMT_Q6_K) {
          const __m512i h0 = _mm512_loadu_si512(c + 256), h1 = _mm512_loadu_si512(c + 320);
          for (int j = 0; j < 4; ++j) {
            lo[j] = _mm512_or_si512(lo[j], _mm512_and_si512(shift16(h0, 4 - 2 * j), bits45));
            hi[j] = _mm512_or_si512(hi[j], _mm512_and_si512(shift16(h1, 4 - 2 * j), bits45));
          }
        }
        const uint8_t* scp = c + C - 32;
        const __m512i sc0 = FMT == FMT_Q6_K
            ? _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp)))
            : _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp)));
        const __m512i sc1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp + 16)));
        const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp + 16))));
        for (int64_t m = 0; m < M; ++m) {
          const int32_t* xm = reinterpret_cast<const int32_t*>(a.xq + m * K + g * GROUP);
          __m512i a0 = zero, a1 = zero, a2 = zero, a3 = zero;
          for (int j = 0; j < 2; ++j) {  // weights 0-15 (a0, a1) and 16-31 (a2, a3)
            a0 = _mm512_dpbusd_epi32(a0, lo[j], _mm512_set1_epi32(xm[2 * j]));
            a1 = _mm512_dpbusd_epi32(a1, hi[j], _mm512_set1_epi32(xm[2 * j + 1]));
            a2 = _mm512_dpbusd_epi32(a2, lo[j + 2], _mm512_set1_epi32(xm[2 * j + 4]));
            a3 = _mm512_dpbusd_epi32(a3, hi[j + 2], _mm512_set1_epi32(xm[2 * j + 5]));
          }
          __m512i J;
          if (FMT == FMT_Q6_K) {  // J = sc_a (P_a - 32 X_a) + sc_b (P_b - 32 X_b)
            const __m512i ia = _mm512_sub_epi32(_mm512_add_epi32(a0, a1), _mm512_set1_epi32(32 * a.x16[m * 2 * G + 2 * g]));
            const __m512i ib = _mm512_sub_epi32(_mm512_add_epi32(a2, a3),
                                                _mm512_set1_epi32(32 * a.x16[m * 2 * G + 2 * g + 1]));
            J = _mm512_add_epi32(_mm512_mullo_epi32(ia, sc0), _mm512_mullo_epi32(ib, sc1));
          } else {  // J = sc I
            J = _mm512_mullo_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)), sc0);
          }
          const __m512 tA = _mm512_mul_ps(_mm512_set1_ps(a.sx[m * G + g]), _mm512_cvtepi32_ps(J));  // exact J
          _mm512_storeu_ps(A + m * NB, _mm512_add_ps(_mm512_loadu_ps(A + m * NB), tA));
          if (FMT != FMT_Q6_K) {
            const __m512 tB = _mm512_mul_ps(mn, _mm512_set1_ps(a.cx[m * G + g]));
            _mm512_storeu_ps(B + m * NB, _mm512_add_ps(_mm512_loadu_ps(B + m * NB), tB));
          }
        }
      }
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb)));
      const __m512 dmin = FMT == FMT_Q6_K ? d : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 32)));
      for (int64_t m = 0; m < M; ++m) {
        __m512 u = _mm512_mul_ps(d, _mm512_loadu_ps(A + m * NB));
        if (FMT != FMT_Q6_K) u = _mm512_sub_ps(u, _mm512_mul_ps(dmin, _mm512_loadu_ps(B + m * NB)));
        _mm512_storeu_ps(acc + m * NB, _mm512_add_ps(_mm512_loadu_ps(acc + m * NB), u));
      }
    }
    const int64_t rows = std::min(NB, a.N - b * NB);
    for (int64_t m = 0; m < M; ++m) {
      float* ym = a.yp + m * a.N + b * NB;
      for (int64_t r = 0; r < rows; ++r) ym[r] = a.bp ? acc[m * NB + r] + a.bp[b * NB + r] : acc[m * NB + r];
    }
  }
}

// y (M, N) float32, per output n, over the super-blocks t in order from acc = 0 (float32, no fused multiply-add):
//   A = sum_{g in t} s_g * float(J_ng)  (in order from 0),  B = sum_{g in t} float(m_ng) * (s_g * float(X_g))
//   Q4_K, Q5_K: acc += d_nt * A - dmin_nt * B,   J_ng = sc_ng * I_ng
//   Q6_K:       acc += d_nt * A,                 J_ng = sc_na (I_na - 32 X_a) + sc_nb (I_nb - 32 X_b)
// with I = sum x_q,k q_nk (q unsigned: 4, 5 or 6 bits) over the group (Q6_K: over each half a, b of 16) and X the
// sum of x_q over the same weights, all exact in int32 and |J| < 2^24 (so float(J) is exact); then y_n = acc (+ b_n).
at::Tensor kblocks(const at::Tensor& x, const at::Tensor& packed, int64_t fmt, const c10::optional<at::Tensor>& bias,
                   int64_t N) {
  TORCH_CHECK(fmt == FMT_Q4_K || fmt == FMT_Q5_K || fmt == FMT_Q6_K, "int8dot.kblocks: unknown format");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.scalar_type() == at::kByte, "int8dot.kblocks: bad shapes");
  const int64_t M = x.size(0), K = x.size(1), nb = packed.size(0), T = packed.size(1), G = K / GROUP;
  TORCH_CHECK(K == T * SUPER && packed.size(2) == ksuper_bytes(fmt) && nb * NB >= N, "int8dot.kblocks: shapes differ");
  TORCH_CHECK(packed.is_contiguous(), "int8dot.kblocks: packed must be contiguous");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  auto xf = bf16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  at::Tensor bf;
  if (bias.has_value() && bias->defined()) bf = bias->to(at::kFloat).contiguous();
  std::vector<int8_t> xq(M * K);
  std::vector<float> sx(M * G), cx(M * G);
  std::vector<int32_t> x16(M * 2 * G);
  for (int64_t m = 0; m < M; ++m) {
    if (bf16)
      round_row(xf.data_ptr<at::BFloat16>() + m * K, K, xq.data() + m * K, sx.data() + m * G);
    else
      round_row(xf.data_ptr<float>() + m * K, K, xq.data() + m * K, sx.data() + m * G);
    for (int64_t h = 0; h < 2 * G; ++h) {
      int32_t s = 0;
      for (int64_t i = 0; i < 16; ++i) s += xq[m * K + h * 16 + i];
      x16[m * 2 * G + h] = s;
    }
    for (int64_t g = 0; g < G; ++g)
      cx[m * G + g] = sx[m * G + g] * static_cast<float>(x16[m * 2 * G + 2 * g] + x16[m * 2 * G + 2 * g + 1]);
  }
  auto y = at::empty({M, N}, xf.options().dtype(at::kFloat));
  const KArgs a{packed.data_ptr<uint8_t>(), xq.data(), sx.data(), cx.data(), x16.data(),
                bf.defined() ? bf.data_ptr<float>() : nullptr, y.data_ptr<float>(), M, N, K, T};
  at::parallel_for(0, nb, 4, [&](int64_t b0, int64_t b1) {
    if (fmt == FMT_Q4_K) kblock_rows<FMT_Q4_K>(a, b0, b1);
    else if (fmt == FMT_Q5_K) kblock_rows<FMT_Q5_K>(a, b0, b1);
    else kblock_rows<FMT_Q6_K>(a, b0, b1);
  });
  return y;
}

// ---- The float steps between the integer products (pinned.py) ----------------------------------------------------
// A decoding step rounds its activations to int8 before every product, so a float one ulp apart on either side of a
// rounding boundary gives another integer and, a few steps later, maybe another token. These are the float steps
// whose results such a rounding meets (a norm, RoPE's angles, attention, the MLP's activation), written once here
// with a fixed order of every sum, and called both eagerly and from a compiled step (an opaque operation there):
// both paths give the same floats, bit for bit. The rest of a step (residual sums, RoPE's rotation, the gate's
// product) is one rounding per element, the same in both (Inductor fuses no multiply-add: ffp-contract=off).

// y = (x * r) * (w + offset) per row of x (M, D) float32, r = 1 / sqrt(sum_d x_d^2 / D + eps), the squares added
// in order in double.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, double offset) {
  TORCH_CHECK(x.dtype() == at::kFloat && w.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "rms_norm: x (M, D) float32 contiguous");
  const int64_t M = x.size(0), D = x.size(1);
  TORCH_CHECK(w.numel() == D, "rms_norm: w of D floats");
  auto wc = w.contiguous();
  auto y = at::empty({M, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  std::vector<float> scale(D);
  for (int64_t d = 0; d < D; ++d) scale[d] = wp[d] + static_cast<float>(offset);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* row = xp + m * D;
      double ss = 0.0;
      for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(row[d]) * row[d];
      const float r = static_cast<float>(1.0 / std::sqrt(ss / D + eps));
      for (int64_t d = 0; d < D; ++d) yp[m * D + d] = (row[d] * r) * scale[d];
    }
  });
  return y;
}

// RoPE's tables from its angles: freqs (R, E/2) float32 -> cos, sin (R, E), channel j and j + E/2 sharing an angle.
std::tuple<at::Tensor, at::Tensor> cos_sin(const at::Tensor& freqs) {
  TORCH_CHECK(freqs.dtype() == at::kFloat && freqs.dim() == 2 && freqs.is_contiguous(),
              "cos_sin: freqs (R, E/2) float32 contiguous");
  const int64_t R = freqs.size(0), half = freqs.size(1);
  auto c = at::empty({R, 2 * half}, freqs.options()), s = at::empty({R, 2 * half}, freqs.options());
  const float* f = freqs.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < half; ++j) {
      const float a = f[r * half + j];
      cp[r * 2 * half + j] = cp[r * 2 * half + half + j] = std::cos(a);
      sp[r * 2 * half + j] = sp[r * 2 * half + half + j] = std::sin(a);
    }
  return {c, s};
}

// exp of 16 floats: Cephes' expf (x = n ln2 + r, |r| <= ln2 / 2, a degree-5 polynomial in r, then 2^n), ~1 ulp; the
// input clamped to where float32's exp is finite and normal.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, n);
}

// The MLP's activation, elementwise on float32, 16 lanes at a time (a masked load for the last few): kind 0 SiLU
// x / (1 + exp(-x)), kind 1 GELU's tanh form 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), with
// tanh(u) = 1 - 2 / (exp(2u) + 1).
at::Tensor activation(const at::Tensor& x, int64_t kind) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.is_contiguous(), "activation: x float32 contiguous");
  TORCH_CHECK(kind == 0 || kind == 1, "activation: kind 0 (silu) or 1 (gelu_tanh)");
  auto y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t total = x.numel();
  const __m512 one = _mm512_set1_ps(1.f), two = _mm512_set1_ps(2.f), half = _mm512_set1_ps(0.5f);
  const __m512 k0 = _mm512_set1_ps(0.7978845608028654f), k1 = _mm512_set1_ps(0.044715f);
  at::parallel_for(0, (total + 15) / 16, 256, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const int64_t left = total - 16 * i;
      const __mmask16 lanes = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(lanes, xp + 16 * i);
      __m512 out;
      if (kind == 0) {
        out = _mm512_div_ps(v, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
      } else {
        const __m512 u = _mm512_mul_ps(k0, _mm512_add_ps(v, _mm512_mul_ps(k1, _mm512_mul_ps(_mm512_mul_ps(v, v), v))));
        const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(exp16(_mm512_mul_ps(two, u)), one)));
        out = _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, t));
      }
      _mm512_mask_storeu_ps(yp + 16 * i, lanes, out);
    }
  });
  return y;
}

// sum_c a_c b_c over E floats: 16 lanes in order of c, then the lanes by _mm512_reduce_add_ps (a fixed tree).
inline float dot_e(const float* a, const float* b, int64_t E) {
  int64_t c = 0;
  float tail = 0.f;
  __m512 acc = _mm512_setzero_ps();
  for (; c + 16 <= E; c += 16) acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + c), _mm512_loadu_ps(b + c)));
  for (; c < E; ++c) tail += a[c] * b[c];
  return _mm512_reduce_add_ps(acc) + tail;
}

// o (E) += p * v (E)
inline void axpy_e(float* o, float p, const float* v, int64_t E) {
  int64_t c = 0;
  const __m512 pv = _mm512_set1_ps(p);
  for (; c + 16 <= E; c += 16)
    _mm512_storeu_ps(o + c, _mm512_add_ps(_mm512_loadu_ps(o + c), _mm512_mul_ps(pv, _mm512_loadu_ps(v + c))));
  for (; c < E; ++c) o[c] += p * v[c];
}

// softmax(q K^T / sqrt(E)) V per row, float32: q (B, H, N, E), k, v (B, Hkv, L, E) (any strides but the last),
// mask (B, N, L) bool (any strides; None: every key), causal: query i sees keys j <= L - N + i. Keys in order:
// scores s_j, m = max_j s_j, e_j = exp(s_j - m), out = (sum_j e_j v_j) / (sum_j e_j); a query with no key gives 0.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& mask,
                  bool causal) {
  TORCH_CHECK(q.dtype() == at::kFloat && k.dtype() == at::kFloat && v.dtype() == at::kFloat && q.dim() == 4 &&
              k.dim() == 4 && v.dim() == 4, "attend: q, k, v 4-D float32");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "attend: the last dim contiguous");
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), E = q.size(3), Hkv = k.size(1), L = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == L && k.size(3) == E &&
              v.size(3) == E && Hkv > 0 && H % Hkv == 0, "attend: shapes do not match");
  const bool* mp = nullptr;
  int64_t ms0 = 0, ms1 = 0, ms2 = 0;
  if (mask.has_value()) {
    const auto& mk = *mask;
    TORCH_CHECK(mk.dtype() == at::kBool && mk.dim() == 3 && mk.size(0) == B && mk.size(1) == N && mk.size(2) == L,
                "attend: mask (B, N, L) bool");
    mp = mk.data_ptr<bool>();
    ms0 = mk.stride(0), ms1 = mk.stride(1), ms2 = mk.stride(2);
  }
  auto out = at::empty({B, H, N, E}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(E)));
  const int64_t group = H / Hkv;
  at::parallel_for(0, B * H * N, 1, [&](int64_t a, int64_t b) {
    std::vector<float> s(L);
    std::vector<char> seen(L);
    for (int64_t t = a; t < b; ++t) {
      const int64_t bi = t / (H * N), h = (t / N) % H, i = t % N, hk = h / group;
      const float* qr = qp + bi * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      const float* kb = kp + bi * k.stride(0) + hk * k.stride(1);
      const float* vb = vp + bi * v.stride(0) + hk * v.stride(1);
      float* o = op + ((bi * H + h) * N + i) * E;
      std::fill(o, o + E, 0.f);
      const int64_t last = causal ? L - N + i : L - 1;
      float m = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        seen[j] = j <= last && (mp == nullptr || mp[bi * ms0 + i * ms1 + j * ms2]);
        if (!seen[j]) continue;
        s[j] = dot_e(qr, kb + j * k.stride(2), E) * scale;
        m = std::fmax(m, s[j]);
      }
      if (m == -INFINITY) continue;  // no key: 0
      float sum = 0.f;
      for (int64_t j = 0; j < L; ++j) {
        if (!seen[j]) continue;
        const float e = std::exp(s[j] - m);
        sum += e;
        axpy_e(o, e, vb + j * v.stride(2), E);
      }
      const float inv = 1.f / sum;
      for (int64_t c = 0; c < E; ++c) o[c] *= inv;
    }
  });
  return out;
}

// A layer's product by its format: the block kernel (Q8_0, Q4_0, Q4_1, Q5_0) or the K-quant one.
at::Tensor product(const at::Tensor& x, const at::Tensor& packed, int64_t fmt, const c10::optional<at::Tensor>& bias,
                   int64_t n) {
  const bool kquant = fmt == FMT_Q4_K || fmt == FMT_Q5_K || fmt == FMT_Q6_K;
  return kquant ? kblocks(x, packed, fmt, bias, n) : blocks(x, packed, fmt, bias, n);
}

// A pinned block's attention half up to the cache (pinned.PinnedBlock._attention's steps, in its order):
// normed = rms_norm(x); [q k v] = normed W_qkv^T; q, k turned into heads (B, H or Hkv, N, E); per-head RMSNorm of q
// and k where given (Gemma 3); RoPE's x' = x cos + rotate_half(x) sin (each product rounded, then the sum) where
// cos is given (any shape that broadcasts to (B, 1, N, E)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> block_qkv(
    const at::Tensor& x, const at::Tensor& norm_w, double eps, double offset, const at::Tensor& packed, int64_t fmt,
    const c10::optional<at::Tensor>& bias, at::IntArrayRef heads, const c10::optional<at::Tensor>& cos,
    const c10::optional<at::Tensor>& sin, const c10::optional<at::Tensor>& q_norm_w,
    const c10::optional<at::Tensor>& k_norm_w, double qk_eps, double qk_offset) {
  TORCH_CHECK(x.dim() == 3 && x.dtype() == at::kFloat && heads.size() == 3, "block_qkv: x (B, N, D) float32, heads");
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2), H = heads[0], Hkv = heads[1], E = heads[2];
  const int64_t width = (H + 2 * Hkv) * E;
  const auto y = product(rms_norm(x.reshape({B * N, D}).contiguous(), norm_w, eps, offset), packed, fmt, bias, width);
  auto q = at::empty({B, H, N, E}, x.options()), k = at::empty({B, Hkv, N, E}, x.options());
  auto v = at::empty({B, Hkv, N, E}, x.options());
  const float* yp = y.data_ptr<float>();
  float* parts[3] = {q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>()};
  const int64_t count[3] = {H, Hkv, Hkv}, first[3] = {0, H, H + Hkv};
  for (int p = 0; p < 3; ++p)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < N; ++t)
        for (int64_t h = 0; h < count[p]; ++h)
          std::memcpy(parts[p] + ((b * count[p] + h) * N + t) * E, yp + (b * N + t) * width + (first[p] + h) * E,
                      E * sizeof(float));
  if (q_norm_w.has_value() && q_norm_w->defined()) {
    q = rms_norm(q.view({B * H * N, E}), *q_norm_w, qk_eps, qk_offset).view({B, H, N, E});
    k = rms_norm(k.view({B * Hkv * N, E}), *k_norm_w, qk_eps, qk_offset).view({B, Hkv, N, E});
  }
  if (cos.has_value() && cos->defined()) {
    TORCH_CHECK(cos->dtype() == at::kFloat && sin->dtype() == at::kFloat && E % 2 == 0, "block_qkv: cos, sin float32");
    const auto c = cos->expand({B, 1, N, E}), s = sin->expand({B, 1, N, E});
    const float* cp = c.data_ptr<float>();
    const float* sp = s.data_ptr<float>();
    const int64_t half = E / 2;
    std::vector<float> row(E);
    for (auto* t : {&q, &k}) {
      float* base = t->data_ptr<float>();
      const int64_t heads_here = t->size(1);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < heads_here; ++h)
          for (int64_t i = 0; i < N; ++i) {
            float* r = base + ((b * heads_here + h) * N + i) * E;
            const float* cr = cp + b * c.stride(0) + i * c.stride(2);
            const float* sr = sp + b * s.stride(0) + i * s.stride(2);
            std::memcpy(row.data(), r, E * sizeof(float));
            for (int64_t j = 0; j < E; ++j) {
              const float turned = j < half ? -row[j + half] : row[j - half];
              const float a = row[j] * cr[j * c.stride(3)], bb = turned * sr[j * s.stride(3)];
              r[j] = a + bb;
            }
          }
    }
  }
  return {q, k, v};
}

// The rest of a pinned block after the cache (PinnedBlock.forward's steps, in its order): attention of q over the
// cached k, v; its heads joined and projected (W_o), RMSNorm'd where sandwiched; the residual; RMSNorm; the gated MLP
// act(normed W_gate^T) * (normed W_fc1^T), projected (W_fc2), RMSNorm'd where sandwiched; the residual.
at::Tensor block_rest(const at::Tensor& x, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const c10::optional<at::Tensor>& mask, bool causal, const at::Tensor& out_packed, int64_t out_fmt,
                      const c10::optional<at::Tensor>& out_bias, const c10::optional<at::Tensor>& post_attn_w,
                      const at::Tensor& norm2_w, const at::Tensor& gate_packed, int64_t gate_fmt,
                      const c10::optional<at::Tensor>& gate_bias, const at::Tensor& fc1_packed, int64_t fc1_fmt,
                      const c10::optional<at::Tensor>& fc1_bias, const at::Tensor& fc2_packed, int64_t fc2_fmt,
                      const c10::optional<at::Tensor>& fc2_bias, const c10::optional<at::Tensor>& post_mlp_w,
                      int64_t hidden, double eps, double offset, int64_t act) {
  TORCH_CHECK(x.dim() == 3 && x.dtype() == at::kFloat, "block_rest: x (B, N, D) float32");
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2), H = q.size(1), E = q.size(3);
  const auto heads = attend(q, k, v, mask, causal).transpose(1, 2).reshape({B * N, H * E});
  auto out = product(heads, out_packed, out_fmt, out_bias, D);
  if (post_attn_w.has_value() && post_attn_w->defined()) out = rms_norm(out, *post_attn_w, eps, offset);
  const auto x1 = at::add(x.reshape({B * N, D}), out);
  const auto normed = rms_norm(x1, norm2_w, eps, offset);
  const auto gated = at::mul(activation(product(normed, gate_packed, gate_fmt, gate_bias, hidden), act),
                             product(normed, fc1_packed, fc1_fmt, fc1_bias, hidden));
  auto down = product(gated, fc2_packed, fc2_fmt, fc2_bias, D);
  if (post_mlp_w.has_value() && post_mlp_w->defined()) down = rms_norm(down, *post_mlp_w, eps, offset);
  return at::add(x1, down).view({B, N, D});
}

}  // namespace

// pack_blocks: a GGUF run's Q8_0 / Q4_0 / Q4_1 blocks in the layout `blocks` reads (int8dot.pack_blocks' docstring).
// qs (N, K) int8 (Q8_0) or (N, K/2) bytes of GGUF's nibbles (byte i of a block: weight i low, weight i + 16 high);
// d, m (N, G) float16. Chunk [b, g]: the weight bytes in 64-byte steps, byte 4r + c of step j holding row 16b + r's
// weight 32g + 4j + c (Q8_0) or its weights 32g + 8j + c (low nibble) and 32g + 8j + 4 + c (high); then the 16 rows'
// d and (Q4_1) m. Rows past N are zero. A byte shuffle: the same bytes as the Python packer's, bit for bit.
at::Tensor pack_blocks(const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m, int64_t fmt) {
  TORCH_CHECK(fmt == FMT_Q8_0 || fmt == FMT_Q4_0 || fmt == FMT_Q4_1, "int8dot.pack_blocks: Q8_0, Q4_0 or Q4_1 only");
  TORCH_CHECK(qs.dim() == 2 && d.dim() == 2 && qs.size(0) == d.size(0), "int8dot.pack_blocks: bad shapes");
  const bool q8 = fmt == FMT_Q8_0;
  const int64_t N = qs.size(0), G = d.size(1), row_bytes = q8 ? G * GROUP : G * GROUP / 2;
  TORCH_CHECK(qs.size(1) == row_bytes && (qs.scalar_type() == at::kChar || qs.scalar_type() == at::kByte),
              "int8dot.pack_blocks: qs must be (N, K) int8 or (N, K/2) bytes for d's G groups");
  const bool with_m = fmt == FMT_Q4_1;
  TORCH_CHECK(!with_m || (m.has_value() && m->defined() && m->sizes() == d.sizes()), "int8dot.pack_blocks: Q4_1 needs m");
  const auto q = qs.contiguous();
  const auto dh = d.to(at::kHalf).contiguous();
  at::Tensor mh;
  if (with_m) mh = m->to(at::kHalf).contiguous();
  const int64_t nb = (N + NB - 1) / NB, C = chunk_bytes(fmt), W = q8 ? 512 : 256;
  auto out = at::zeros({nb, G, C}, qs.options().dtype(at::kByte));
  const uint8_t* src = reinterpret_cast<const uint8_t*>(q.data_ptr());
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(dh.data_ptr());
  const uint16_t* ms = with_m ? reinterpret_cast<const uint16_t*>(mh.data_ptr()) : nullptr;
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, nb, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t r = 0; r < NB && b * NB + r < N; ++r) {
        const int64_t n = b * NB + r;
        for (int64_t g = 0; g < G; ++g) {
          uint8_t* c = dst + (b * G + g) * C;
          const uint8_t* w = src + n * row_bytes + g * (q8 ? GROUP : GROUP / 2);
          if (q8) {
            for (int j = 0; j < 8; ++j) std::memcpy(c + 64 * j + 4 * r, w + 4 * j, 4);
          } else {
            for (int j = 0; j < 4; ++j)
              for (int i = 0; i < 4; ++i) {
                const int lo = 8 * j + i, hi = 8 * j + 4 + i;  // weight indices within the block of 32
                const uint8_t vlo = lo < 16 ? (w[lo] & 15) : (w[lo - 16] >> 4);
                const uint8_t vhi = hi < 16 ? (w[hi] & 15) : (w[hi - 16] >> 4);
                c[64 * j + 4 * r + i] = static_cast<uint8_t>(vlo | (vhi << 4));
              }
          }
          std::memcpy(c + W + 2 * r, ds + n * G + g, 2);
          if (with_m) std::memcpy(c + W + 32 + 2 * r, ms + n * G + g, 2);
        }
      }
  });
  return out;
}

TORCH_LIBRARY(tokennet_int8dot, m) {
  m.def("pack(Tensor w) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor scale, Tensor? bias, int n) -> Tensor");
  m.def("blocks(Tensor x, Tensor packed, int fmt, Tensor? bias, int n) -> Tensor");
  m.def("kblocks(Tensor x, Tensor packed, int fmt, Tensor? bias, int n) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor w, float eps, float offset) -> Tensor");
  m.def("cos_sin(Tensor freqs) -> (Tensor, Tensor)");
  m.def("activation(Tensor x, int kind) -> Tensor");
  m.def("attend(Tensor q, Tensor k, Tensor v, Tensor? mask, bool causal) -> Tensor");
  m.def("pack_blocks(Tensor qs, Tensor d, Tensor? m, int fmt) -> Tensor");
  m.def("block_qkv(Tensor x, Tensor norm_w, float eps, float offset, Tensor packed, int fmt, Tensor? bias, int[] heads, "
        "Tensor? cos, Tensor? sin, Tensor? q_norm_w, Tensor? k_norm_w, float qk_eps, float qk_offset) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("block_rest(Tensor x, Tensor q, Tensor k, Tensor v, Tensor? mask, bool causal, Tensor out_packed, int out_fmt, "
        "Tensor? out_bias, Tensor? post_attn_w, Tensor norm2_w, Tensor gate_packed, int gate_fmt, Tensor? gate_bias, "
        "Tensor fc1_packed, int fc1_fmt, Tensor? fc1_bias, Tensor fc2_packed, int fc2_fmt, Tensor? fc2_bias, "
        "Tensor? post_mlp_w, int hidden, float eps, float offset, int act) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokennet_int8dot, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
  m.impl("blocks", &blocks);
  m.impl("kblocks", &kblocks);
  m.impl("rms_norm", &rms_norm);
  m.impl("cos_sin", &cos_sin);
  m.impl("activation", &activation);
  m.impl("attend", &attend);
  m.impl("pack_blocks", &pack_blocks);
  m.impl("block_qkv", &block_qkv);
  m.impl("block_rest", &block_rest);
}
