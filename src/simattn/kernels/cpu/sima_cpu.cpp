// SimA's q̂(k̂ᵀv) for CPU inference in one call: the per-channel l1 norms of q and k, kᵀv, the division of kᵀv by
// both norms and q·(kᵀv) for every (batch, head), without autograd. Eager PyTorch launches about ten ops for this and
// copies strided views of a fused qkv projection; here each block of tokens is read while it is in cache, the two
// products run as BLAS calls on the strided views, and the output is written token-major, (B, N, H, e) in memory,
// so merging the heads afterwards is a view.
//
// Work is split into tasks of (batch item, group of heads, chunk of tokens), enough for every thread. Each task sums
// its norms and its part of kᵀv; then each task adds its item's chunks, divides kᵀv by s_k and then by s_q (each norm
// on its own, as the torch path does) and writes its rows of the output. With one chunk per item both steps run in
// one parallel region.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

constexpr int64_t kBlock = 128;    // tokens per step: the step's rows of q, k and v stay in cache between passes
constexpr int64_t kMinChunk = 64;  // the fewest tokens a task takes when tokens are split between threads

// Row-major c (m×n) = a (m×k, or its transpose) · b (k×n) + beta · c, through column-major BLAS: cᵀ = bᵀ · aᵀ.
void gemm_rm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = 'N', tb = trans_a ? 'T' : 'N';
  const int m_ = static_cast<int>(n), n_ = static_cast<int>(m), k_ = static_cast<int>(k);
  const int lda_ = static_cast<int>(ldb), ldb_ = static_cast<int>(lda), ldc_ = static_cast<int>(ldc);
  const float one = 1.f;
  sgemm_(&ta, &tb, &m_, &n_, &k_, &one, b, &lda_, a, &ldb_, &beta, c, &ldc_);
}

struct View {  // a (B, H, N, d) tensor with unit stride along d
  const float* data;
  int64_t sb, sh, sn;
  const float* row(int64_t b, int64_t h, int64_t n) const { return data + b * sb + h * sh + n * sn; }
};

View view(const at::Tensor& t) { return {t.data_ptr<float>(), t.stride(0), t.stride(1), t.stride(2)}; }

// Adds |x| over rows [n0, n1) of heads [h0, h1) into acc (heads × d, head-major).
void add_abs(const View& x, int64_t b, int64_t h0, int64_t h1, int64_t n0, int64_t n1, int64_t d, float* acc) {
  const int64_t width = (h1 - h0) * d;
  if (x.sh == d) {  // the heads of a token lie side by side (a fused projection): one run of (h1 - h0)·d floats
    for (int64_t n = n0; n < n1; ++n) {
      const float* r = x.row(b, h0, n);
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) acc[j] += std::fabs(r[j]);
    }
    return;
  }
  for (int64_t h = h0; h < h1; ++h) {
    float* a = acc + (h - h0) * d;
    for (int64_t n = n0; n < n1; ++n) {
      const float* r = x.row(b, h, n);
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) a[c] += std::fabs(r[c]);
    }
  }
}

at::Tensor sima_kv_first(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double eps) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "sima_kv_first: CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "sima_kv_first: float32 only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "sima_kv_first: q, k, v must be (B, H, N, d)");
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3), e = v.size(3);
  TORCH_CHECK(k.sizes() == q.sizes() && v.size(0) == B && v.size(1) == H && v.size(2) == N,
              "sima_kv_first: q and k must have one shape, and v the same (B, H, N)");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "sima_kv_first: unit stride along d");
  TORCH_CHECK(d > 0, "sima_kv_first: q and k need at least one channel");
  TORCH_CHECK(q.stride(2) >= d && k.stride(2) >= d && v.stride(2) >= e,
              "sima_kv_first: token rows must not overlap (BLAS leading dimensions)");
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TORCH_CHECK(std::max({N, d, e, q.stride(2), k.stride(2), v.stride(2), H * e}) <= kIntMax,
              "sima_kv_first: sizes past BLAS's 32-bit integers");
  auto out = at::empty({B, N, H, e}, q.options());
  if (out.numel() == 0) return out.permute({0, 2, 1, 3});
  const View qs = view(q), ks = view(k), vs = view(v);
  float* od = out.data_ptr<float>();

  // tasks: B items × chunks of tokens × groups of heads, enough to give every thread work where there is any. Tokens
  // are split before heads (measured faster from a few hundred tokens: each task streams whole rows of the fused
  // projection), heads where the tokens are too few to split.
  const int64_t threads = at::get_num_threads();
  const int64_t chunks = std::clamp<int64_t>((threads + B - 1) / B, 1, std::max<int64_t>(1, N / kMinChunk));
  const int64_t groups = std::clamp<int64_t>((threads + B * chunks - 1) / (B * chunks), 1, H);
  const int64_t tasks = B * groups * chunks;
  const int64_t per_head = 2 * d + d * e;  // s_q, s_k, kᵀv
  auto acc = at::empty({B, chunks, H, per_head}, q.options());
  float* ad = acc.data_ptr<float>();
  auto split = [&](int64_t t, int64_t& b, int64_t& h0, int64_t& h1, int64_t& n0, int64_t& n1) {
    const int64_t c = t % chunks, g = (t / chunks) % groups;
    b = t / (chunks * groups);
    h0 = H * g / groups, h1 = H * (g + 1) / groups;
    n0 = N * c / chunks, n1 = N * (c + 1) / chunks;
    return c;
  };
  auto slot = [&](int64_t b, int64_t c, int64_t h) { return ad + ((b * chunks + c) * H + h) * per_head; };

  // the task's norms and its part of kᵀv, for its heads over its tokens
  auto sum_chunk = [&](int64_t t, std::vector<float>& sums) {
    int64_t b, h0, h1, n0, n1;
    const int64_t c = split(t, b, h0, h1, n0, n1);
    sums.assign(2 * (h1 - h0) * d, 0.f);  // |q| then |k|, head-major
    for (int64_t s = n0; s < n1; s += kBlock) {
      const int64_t rows = std::min(kBlock, n1 - s);
      add_abs(qs, b, h0, h1, s, s + rows, d, sums.data());
      add_abs(ks, b, h0, h1, s, s + rows, d, sums.data() + (h1 - h0) * d);
      for (int64_t h = h0; h < h1; ++h)  // kᵀv (d×e) += k_blockᵀ v_block
        gemm_rm(true, d, e, rows, ks.row(b, h, s), ks.sn, vs.row(b, h, s), vs.sn, s == n0 ? 0.f : 1.f,
                slot(b, c, h) + 2 * d, e);
    }
    for (int64_t h = h0; h < h1; ++h) {
      std::copy_n(sums.data() + (h - h0) * d, d, slot(b, c, h));
      std::copy_n(sums.data() + (h1 - h0 + h - h0) * d, d, slot(b, c, h) + d);
    }
  };
  // the whole kᵀv of the task's heads (its item's chunks added), divided by s_k and then by s_q, times its rows of q
  const float eps_f = static_cast<float>(eps);
  auto finish = [&](int64_t t, std::vector<float>& total) {
    int64_t b, h0, h1, n0, n1;
    split(t, b, h0, h1, n0, n1);
    if (chunks > 1) {  // into a copy: the other tasks of this item read the same chunks
      total.assign(slot(b, 0, h0), slot(b, 0, h1));
      for (int64_t c = 1; c < chunks; ++c) {
        const float* other = slot(b, c, h0);
        const int64_t size = (h1 - h0) * per_head;
#pragma omp simd
        for (int64_t j = 0; j < size; ++j) total[j] += other[j];
      }
    }
    float* first = chunks > 1 ? total.data() : slot(b, 0, h0);  // heads h0..h1, per_head floats each
    for (int64_t h = 0; h < h1 - h0; ++h) {
      float* kv = first + h * per_head;
      for (int64_t ch = 0; ch < d; ++ch) {
        const float s_q = std::max(kv[ch], eps_f), s_k = std::max(kv[d + ch], eps_f);
        float* row = kv + 2 * d + ch * e;
#pragma omp simd
        for (int64_t j = 0; j < e; ++j) row[j] = row[j] / s_k / s_q;
      }
    }
    // out rows (rows×e) = q_block · kv, a block of every head at a time, last block first: the blocks the first
    // pass read last are the ones still in cache
    const int64_t last = n0 + (n1 - n0 - 1) / kBlock * kBlock;
    for (int64_t s = last; s >= n0; s -= kBlock) {
      const int64_t rows = std::min(kBlock, n1 - s);
      for (int64_t h = h0; h < h1; ++h)
        gemm_rm(false, rows, e, d, qs.row(b, h, s), qs.sn, first + (h - h0) * per_head + 2 * d, e, 0.f,
                od + ((b * N + s) * H + h) * e, H * e);
    }
  };
  if (chunks == 1) {  // each task owns whole items' heads: one pass, no barrier
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> sums, total;
      for (int64_t t = begin; t < end; ++t) {
        sum_chunk(t, sums);
        finish(t, total);
      }
    });
  } else {
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> sums;
      for (int64_t t = begin; t < end; ++t) sum_chunk(t, sums);
    });
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> total;
      for (int64_t t = begin; t < end; ++t) finish(t, total);
    });
  }
  return out.permute({0, 2, 1, 3});
}

}  // namespace

TORCH_LIBRARY(simattn, m) { m.def("sima_kv_first(Tensor q, Tensor k, Tensor v, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(simattn, CPU, m) { m.impl("sima_kv_first", &sima_kv_first); }
