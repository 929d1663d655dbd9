#pragma once
// CPU kernels of the semi-Markov CRF (ops in semicrf.cpp). Plain functions
// over raw pointers; the per-element math lives in semicrf_math.hpp.
//
// Memory: α lives in a ring of Ke = min(K, T) slots. The backward pass stores
// the ring every I = min(T+1, max(Ke, ⌊√(T·Ke)⌋)) positions, then walks the
// intervals from last to first: restore the ring, recompute α over the
// interval, sweep β backward with its own ring, accumulate gradients.
// Nothing is ever sized T·K. workspace_bytes() is exactly what a pass uses.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "ad/dtype.hpp"
#include "ops/parallel.hpp"

namespace ad::semicrf {

struct Dims {
  std::int64_t B = 0, T = 0, K = 0, C = 0;  // S (B, T+1, C); D (K, C)
  bool general = false;                     // Tr is (K, C, C) rather than (C, C)
  std::size_t esize = 4;                    // bytes per element of the float dtype
  std::int64_t ke() const { return K < T ? K : T; }
  std::int64_t tr_numel() const { return general ? K * C * C : C * C; }
};

enum class Pass { logz, backward, marginals, viterbi };

// Checkpoint interval I for a padded length T and window Ke.
std::int64_t interval(std::int64_t T, std::int64_t ke);
// Stored checkpoints for a sequence of length L (positions 0..L).
std::int64_t checkpoints(std::int64_t L, std::int64_t I);
// Threads the op kernels use (the machine's cores, at most 64).
int default_threads();
// Workspace bytes of one pass with `threads` threads (the op's `workspace`).
std::int64_t workspace_bytes(const Dims& d, Pass pass, int threads);
// Working memory of one sequence in the backward pass in values (elements of
// the ring dtype): checkpoints + interval buffer + β ring, the quantity the
// design bounds by 2·√(T·K)·C + K·C slots (+ O(C) per checkpoint / position
// bases). An f32 fast-path ring slot is 1.5 elements (hi f32 + lo bf16), so
// in f32 elements the count is at most 1.5·(2·√(T·K)·C + K·C).
std::int64_t sequence_values(const Dims& d);

struct Args {
  Dims d;
  DType dtype = DType::f32;
  const void *S = nullptr, *Tr = nullptr, *D = nullptr, *P = nullptr;
  const std::int64_t* L = nullptr;
  // Tests: use the layout's label team without timing barriers first (the
  // kernels otherwise drop to one thread per sequence when barriers are slow).
  bool force_team = false;
};

// Throws (kernel_fail, naming `op`) unless 1 <= L[b] <= T for all b.
void check_lengths(const char* op, const Args& a);
// Throws (naming `op` and the element) on a NaN or infinite S[b, t, c] for
// t <= L[b] (cumulative scores are finite: semicrf_cumulative), or a NaN or
// +inf in Tr, D or P (-inf forbids; +inf made logZ NaN, NaN was taken as -inf
// in some places and ignored in others). Host pointers; `s` false skips S
// (on a GPU only Tr, D and P are copied to the host; S is checked there by
// cuda_k::semicrf_first_non_finite_s).
void check_scores(const char* op, const Args& a, bool s = true);
// The error check_scores throws for S[b, t, c] = v (also for S found on a GPU).
[[noreturn]] void fail_non_finite_s(const char* op, std::int64_t b, std::int64_t t, std::int64_t c, double v);

// logZ (B) into out (dtype of S).
void logz_cpu(const Args& a, void* out, void* ws, int threads);
// d logZ · dlogz (B) w.r.t. S, Tr, D, P into one flat buffer (dtype of S):
// [dS (B,T+1,C) | dTr | dD (K,C) | dP (C)].
void logz_backward_cpu(const Args& a, const void* dlogz, void* out, void* ws, int threads);
// Posterior marginals (B, T, C): P(position t lies in a segment of label c).
void marginals_cpu(const Args& a, void* out, void* ws, int threads);
// Best segmentation (B, T) in the segments encoding (label at each segment
// start, -1 elsewhere); throws if a sequence has no allowed segmentation.
void viterbi_cpu(const Args& a, std::int64_t* out, void* ws, int threads);
// Score of gold segmentations (B); validates them (kernel_fail naming `op`).
void score_cpu(const Args& a, const std::int64_t* seg, void* out);
// d score · dscore w.r.t. S, Tr, D, P: flat buffer as logz_backward_cpu.
void score_backward_cpu(const Args& a, const std::int64_t* seg, const void* dscore, void* out);
// Validates segments (B, T) against lengths and K, C; throws naming `op`.
void check_segments(const char* op, const Args& a, const std::int64_t* seg);

// ---- internal: shared by the kernel files ----
namespace detail {
// Barrier for a team of n threads (spins briefly, then yields).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait();

 private:
  int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};
// Runs f(tid) on n concurrent threads (tid 0 on the caller; the others from
// the kernel thread pool) and returns when all are done.
template <class F> void run_threads(int n, F&& f) { parallel::team(n, f); }
// Waits (spin, then yield) until `ticket` equals `mine`.
void wait_ticket(const std::atomic<std::int64_t>& ticket, std::int64_t mine);
// Byte offsets of a pass's workspace: shared part, then one part per lane
// (a lane runs one sequence at a time with a team of threads over labels).
struct Layout {
  int lanes = 1, team = 1;
  std::int64_t ke = 0, I = 0, slots = 0, nblk = 0;
  std::int64_t Dt = 0, eA = 0, eB = 0, colmax = 0, rowmax = 0, dbm = 0, shared_bytes = 0;
  std::int64_t rbm_a = 0, rbm_b = 0, tstride = 0;
  std::int64_t ck_ring = 0, ck_meta = 0, ck_ring_stride = 0, ck_meta_stride = 0, ival = 0, nu = 0, bring = 0,
               bbase = 0, dDt = 0, gD = 0, gTr = 0, gP = 0, bk = 0, bc = 0, scr = 0, tscr = 0, lane_bytes = 0;
  std::int64_t total = 0;
};
Layout make_layout(const Dims& d, Pass pass, int threads);
// Windowed sums over i < n of x[i] = a[i] + d[i] (semicrf_win.cpp, vectorised):
// max x; Σ e^{x − shift}; and the same sum while adding e·f to dd[i].
float win_max(const float* a, const float* d, std::int64_t n);
double win_max(const double* a, const double* d, std::int64_t n);
// lo: the ring values' low parts as bf16 bits (f32 rings), or nullptr
double win_sum(const float* a, const std::uint16_t* lo, const float* d, std::int64_t n, float shift);
double win_sum(const double* a, const std::uint16_t* lo, const double* d, std::int64_t n, double shift);
double win_sum_grad(const float* a, const std::uint16_t* lo, const float* d, std::int64_t n, float shift, float f,
                    float* dd);
double win_sum_grad(const double* a, const std::uint16_t* lo, const double* d, std::int64_t n, double shift, double f,
                    double* dd);
// A ring column of ke slots, in elements of E: an f32 ring keeps each value
// as hi (f32) + lo (bf16, the rounding error of hi: 6 bytes a slot), the lo
// parts after the ke hi parts; an f64 ring keeps the value alone.
template <class E> constexpr std::int64_t ring_column(std::int64_t ke) { return sizeof(E) == 4 ? ke + (ke + 1) / 2 : ke; }
// Window blocks: ring slots and k are grouped in blocks of kBlock; a block's
// upper bound (its ring maximum + the D maximum over its k range) lets the
// windowed logsumexp skip blocks whose terms are all exactly 0 in exp_win.
template <class E> inline constexpr std::int64_t kBlock = sizeof(E) == 4 ? 256 : 128;
// One block of a window: elements [i0, i1) of piece `piece`, and an upper
// bound of x + base over them (exact once the block's max was taken).
struct WinBlock {
  std::int32_t piece, exact;
  std::int64_t i0, i1;
  double ub;
};
// exp_win(x) is exactly 0 for x below this (f32: -88 gives 2^-127 = 0), and a
// safety margin against the rounding of bounds.
template <class E> inline constexpr double kSkipBelow = sizeof(E) == 4 ? -90.0 : -710.0;
// A window may be shifted by an upper bound of its maximum that is at most
// this far above it (the largest term stays >= e^-57 in f32, e^-600 in f64).
template <class E> inline constexpr double kLooseShift = sizeof(E) == 4 ? 57.0 : 600.0;
// The general path (Tr of shape (K, C, C)), semicrf_general_cpu.cpp.
void general_run(const Args& a, Pass pass, const void* dlogz, void* out, void* ws, int threads);
// Bytes rounded up to 64.
inline std::int64_t align64(std::int64_t b) { return (b + 63) / 64 * 64; }
}  // namespace detail

}  // namespace ad::semicrf
