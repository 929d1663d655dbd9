// Semi-Markov CRF, CPU: layout of the workspace, threads, and the fast path
// (Tr of shape (C, C)): logZ, its gradients and the posterior marginals.
//
// Fast path. With Ã[s,c] = A[s,c] − S[s,c], where A[s,c] is P[c] at s = 0
// and the transition logsumexp lse_c'(α[s,c'] + Tr[c',c]) after it (computed
// once per position, O(C²)):
//   α[t,c] = S[t,c] + lse_{k=1..min(K,t)} (Ã[t−k,c] + D[k−1,c])
// so the inner loop is a windowed logsumexp over k of two contiguous arrays
// (the ring column of label c and D's column c), O(T·K·C) in all. The
// backward sweep is its mirror image with B̃[e,c] = β[e,c] + S[e,c]:
//   γ[s,c] = −S[s,c] + lse_k (B̃[s+k,c] + D[k−1,c]),  β[s,c'] = lse_c (Tr[c',c] + γ[s,c]).
// Gradients (μ = posterior of a segment, g = d loss / d logZ):
//   dD[k−1,c] = g Σ_s μ(s,k,c)   (accumulated inside the γ window loop),
//   dS[s,c]   = g (end[s,c] − start[s,c]), end = e^{α+β−logZ}, start = e^{A+γ−logZ},
//   dTr[c',c] = g Σ_{s≥1} e^{α[s,c']+Tr[c',c]+γ[s,c]−logZ},  dP[c] = g start[0,c].
//
// Precision. Ring values are stored in the input dtype relative to an f64
// base per label and per lap of Ke positions (the first value of the lap), so
// an f32 ring holds local differences, not values that grow like logZ; they
// still grow to Ke times the per-position rate, so an f32 slot also keeps
// the value's rounding error as bf16 (ring_column, put) and the window adds
// it back (docs/design.md, "Precision of the f32 rings"). The window max and
// the exp arguments are formed in the input dtype; window sums
// are accumulated per SIMD lane in the input dtype over at most K/16 terms
// and then in f64; everything per position (bases, logsumexps over labels, α,
// β, γ, logZ, marginals, gradient partial sums) is f64.
#include "ops/semicrf_cpu.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "core/graph_impl.hpp"
#include "ops/semicrf_math.hpp"

namespace ad::semicrf {

// ---- threads ----
namespace detail {
namespace {
inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace
// Spins briefly (the partner is usually a few microseconds away), then
// yields, so an oversubscribed machine hands the core to the thread waited for.
void Barrier::wait() {
  if (n_ <= 1) return;
  int g = gen_.load(std::memory_order_acquire);
  if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
    count_.store(0, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  for (int spins = 0; gen_.load(std::memory_order_acquire) == g; ++spins) {
    if (spins < 200) cpu_pause();
    else std::this_thread::yield();
  }
}
void wait_ticket(const std::atomic<std::int64_t>& ticket, std::int64_t mine) {
  for (int spins = 0; ticket.load(std::memory_order_acquire) != mine; ++spins)
    if (spins > 256) std::this_thread::yield();
}
}  // namespace detail

// ---- sizes ----
std::int64_t interval(std::int64_t T, std::int64_t ke) {
  auto r = static_cast<std::int64_t>(std::floor(std::sqrt(static_cast<double>(T) * static_cast<double>(ke))));
  while (r * r > T * ke) --r;  // exact floor
  while ((r + 1) * (r + 1) <= T * ke) ++r;
  return std::min(T + 1, std::max(ke, r));
}
std::int64_t checkpoints(std::int64_t L, std::int64_t I) { return checkpoint_count(L, I); }
int default_threads() {
  unsigned h = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(h, 1, 64));
}

using detail::Layout;
using detail::win_max;
using detail::win_sum;
using detail::win_sum_grad;

// Labels are split over a team (one barrier per position) only when a
// position's window work is large: Ke·C terms.
constexpr std::int64_t kTeamWork = 16384;

Layout detail::make_layout(const Dims& d, Pass pass, int threads) {
  Layout y;
  y.ke = d.ke();
  y.I = interval(d.T, y.ke);
  y.slots = std::max<std::int64_t>(checkpoints(d.T, y.I), 1);
  threads = std::max(threads, 1);
  y.lanes = static_cast<int>(std::min<std::int64_t>(d.B > 0 ? d.B : 1, threads));
  y.team = 1;
  if (!d.general && pass != Pass::viterbi && y.ke * d.C >= kTeamWork && d.C >= 2)
    y.team = static_cast<int>(std::min<std::int64_t>(threads / y.lanes, d.C));
  y.team = std::max(y.team, 1);
  const std::int64_t C = d.C, ke = y.ke;
  const std::int64_t re = d.general || pass == Pass::viterbi ? 8 : static_cast<std::int64_t>(d.esize);  // ring element
  const std::int64_t bk = re == 4 ? detail::kBlock<float> : detail::kBlock<double>;
  // a ring column in elements: the fast path's f32 rings keep hi + lo (ring_column)
  const std::int64_t rke = !d.general && pass != Pass::viterbi && re == 4 ? detail::ring_column<float>(ke) : ke;
  y.nblk = (ke + bk - 1) / bk;
  auto take = [](std::int64_t& cur, std::int64_t bytes) { std::int64_t o = cur; cur += detail::align64(bytes); return o; };
  std::int64_t sh = 0;
  if (!d.general && pass != Pass::viterbi) {
    y.Dt = take(sh, C * ke * re);
    y.eA = take(sh, C * C * 8);
    y.eB = take(sh, C * C * 8);
    y.colmax = take(sh, C * 8);
    y.rowmax = take(sh, C * 8);
    y.dbm = take(sh, C * y.nblk * re);
  }
  if (!d.general && pass == Pass::viterbi) y.Dt = take(sh, C * ke * 8);
  y.shared_bytes = sh;
  std::int64_t ln = 0;
  if (pass == Pass::logz) {
    y.ck_ring = take(ln, C * rke * re);
    if (!d.general) y.rbm_a = take(ln, 2 * C * y.nblk * re);
  } else if (pass == Pass::viterbi) {
    y.ck_ring = take(ln, C * ke * re);
    y.bk = take(ln, (d.T + 1) * C * 4);
    y.bc = take(ln, (d.T + 1) * C * 4);
  } else {
    y.ck_ring_stride = detail::align64(C * rke * re);
    // α bases [2][C] and row [C] (f64), ring block maxima [2][C][nblk] (E), the lap's moves [C] (u32)
    y.ck_meta_stride = detail::align64(3 * C * 8 + 2 * C * y.nblk * re + 4 * C);
    y.ck_ring = take(ln, y.ck_ring_stride * y.slots);
    y.ck_meta = take(ln, y.ck_meta_stride * y.slots);
    y.ival = take(ln, y.I * C * re);
    y.nu = take(ln, y.I * 8);
    y.bring = take(ln, C * rke * re);
    y.bbase = take(ln, 2 * C * 8);
    if (!d.general) {
      y.rbm_a = take(ln, 2 * C * y.nblk * re);
      y.rbm_b = take(ln, 2 * C * y.nblk * re);
    }
  }
  if (pass == Pass::backward) {
    if (!d.general) y.dDt = take(ln, C * ke * re);
    y.gD = take(ln, C * ke * 8);
    y.gTr = take(ln, (d.general ? ke : 1) * C * C * 8);
    y.gP = take(ln, C * 8);
  }
  y.scr = take(ln, 12 * C * 8);
  y.tstride = detail::align64(7 * C * 8 + (2 * y.nblk + 4) * static_cast<std::int64_t>(sizeof(detail::WinBlock)));
  y.tscr = take(ln, y.tstride * y.team);
  y.lane_bytes = ln;
  y.total = y.shared_bytes + y.lane_bytes * y.lanes;
  return y;
}

std::int64_t workspace_bytes(const Dims& d, Pass pass, int threads) { return detail::make_layout(d, pass, threads).total; }

std::int64_t sequence_values(const Dims& d) {
  std::int64_t ke = d.ke(), I = interval(d.T, ke), n = checkpoints(d.T, I);
  // f32 fast path: a ring slot is hi (f32) + lo (bf16), 1.5 elements
  const std::int64_t col = !d.general && d.esize == 4 ? detail::ring_column<float>(ke) : ke;
  return (std::max<std::int64_t>(n, 1) + 1) * col * d.C + I * d.C;
}

void check_lengths(const char* op, const Args& a) {
  for (std::int64_t b = 0; b < a.d.B; ++b)
    if (a.L[b] < 1 || a.L[b] > a.d.T)
      kernel_fail(op, fmt::format("L[{}] = {} is outside 1..T = 1..{}", b, a.L[b], a.d.T));
}

namespace {
template <class E> void check_scores_t(const char* op, const Args& a, bool s) {
  const Dims& d = a.d;
  if (s) {
    const E* S = static_cast<const E*>(a.S);
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t i = 0; i < (a.L[b] + 1) * d.C; ++i) {
        const E v = S[b * (d.T + 1) * d.C + i];
        if (!std::isfinite(static_cast<double>(v))) fail_non_finite_s(op, b, i / d.C, i % d.C, static_cast<double>(v));
      }
  }
  auto model = [&](const char* name, const void* p, std::int64_t n, auto index) {
    const E* x = static_cast<const E*>(p);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<double>(x[i]);
      if (std::isnan(v) || v == std::numeric_limits<double>::infinity())
        kernel_fail(op, fmt::format("{}[{}] = {}: a model score must be finite, or -inf to forbid", name, index(i), v));
    }
  };
  const std::int64_t C = d.C;
  if (d.general) model("Tr", a.Tr, d.K * C * C, [&](std::int64_t i) { return fmt::format("{}, {}, {}", i / (C * C), i / C % C, i % C); });
  else model("Tr", a.Tr, C * C, [&](std::int64_t i) { return fmt::format("{}, {}", i / C, i % C); });
  model("D", a.D, d.K * C, [&](std::int64_t i) { return fmt::format("{}, {}", i / C, i % C); });
  model("P", a.P, C, [&](std::int64_t i) { return fmt::format("{}", i); });
}
}  // namespace

void fail_non_finite_s(const char* op, std::int64_t b, std::int64_t t, std::int64_t c, double v) {
  kernel_fail(op, fmt::format("S[{}, {}, {}] = {} is not finite: cumulative scores must be (forbid segments with "
                              "-inf in Tr, D or P)",
                              b, t, c, v));
}
void check_scores(const char* op, const Args& a, bool s) {
  if (a.dtype == DType::f64) check_scores_t<double>(op, a, s);
  else check_scores_t<float>(op, a, s);
}

// ---- the fast path, one sequence at a time per lane, labels split over a team ----
namespace {

template <class E> E ninf() { return -std::numeric_limits<E>::infinity(); }

// One contiguous run of a window: ring slots [slot0, slot0 + n) of one lap
// (values stored relative to `base`) against D indices [k0, k0 + n).
template <class E> struct Piece {
  const E* a = nullptr;    // ring column + slot0
  const std::uint16_t* l = nullptr;  // its low parts (bf16 bits; f32 rings), or nullptr
  const E* d = nullptr;    // D column + k0
  std::int64_t n = 0, slot0 = 0, k0 = 0;
  double base = 0;
  const E* rbm = nullptr;  // the lap's ring block maxima (by slot block)
};
using detail::WinBlock;

// The shift for the window's exp-sum: an upper bound of x + base within
// kLooseShift of the true maximum, or the exact maximum. For the exact one,
// blocks whose upper bound (ring block max + D block max) stays kSkipBelow
// under the running maximum are never read; the others get their exact
// maximum (blk[].ub, exact = 1).
template <class E>
double window_max(const Piece<E>* pc, const E* dbm, WinBlock* blk, int& nb) {
  constexpr std::int64_t Bk = detail::kBlock<E>;
  nb = 0;
  int best = -1;
  for (int p = 0; p < 2; ++p) {
    const Piece<E>& P = pc[p];
    if (P.n <= 0) continue;
    for (std::int64_t q = P.slot0 / Bk; q <= (P.slot0 + P.n - 1) / Bk; ++q) {
      std::int64_t i0 = std::max(P.slot0, q * Bk) - P.slot0, i1 = std::min(P.slot0 + P.n, (q + 1) * Bk) - P.slot0;
      E dm = std::max(dbm[(P.k0 + i0) / Bk], dbm[(P.k0 + i1 - 1) / Bk]);
      double ub = static_cast<double>(P.rbm[q]) + static_cast<double>(dm) + P.base;
      if (ub != ub) ub = kNegInf;  // -inf + inf cannot happen; keep the bound well defined anyway
      blk[nb] = WinBlock{p, 0, i0, i1, ub};
      if (best < 0 || ub > blk[best].ub) best = nb;
      ++nb;
    }
  }
  if (best < 0) return kNegInf;
  // Shift by the largest bound U instead of the exact maximum when the first
  // term (k = 1, usually near the maximum) proves the maximum within kLooseShift
  // of U: the sum's largest term is then >= e^{-kLooseShift}, far from
  // underflow, and no block needs its exact maximum.
  const double U = blk[best].ub;
  for (int p = 0; p < 2; ++p) {
    const Piece<E>& P = pc[p];
    if (P.n <= 0) continue;
    double first = static_cast<double>(P.a[0] + P.d[0]) + P.base;
    if (U - first <= detail::kLooseShift<E>) return U;
    break;
  }
  auto exact = [&](WinBlock& b) {
    const Piece<E>& P = pc[b.piece];
    E m = win_max(P.a + b.i0, P.d + b.i0, b.i1 - b.i0);
    b.ub = m == -std::numeric_limits<E>::infinity() ? kNegInf : static_cast<double>(m) + P.base;
    b.exact = 1;
    return b.ub;
  };
  double M = exact(blk[best]);
  for (int j = 0; j < nb; ++j)
    if (j != best && !(blk[j].ub - M < detail::kSkipBelow<E>)) M = std::max(M, exact(blk[j]));
  return M;
}
// Σ e^{x + base − M} over the blocks that can contribute; with dd, also
// dd[k] += e·f (dd indexed like D). Skipped terms are exactly 0 in exp_win.
// Each piece's shift M − base is rounded to E; the sums are scaled back by
// e^{shift − (M − base)} (and f with them), so the rounding, which for an f32
// ring is an ulp of the lap's growth, does not reach the result.
template <class E>
double window_sum(const Piece<E>* pc, const WinBlock* blk, int nb, double M, E f, E* dd) {
  E shift[2], fp[2];
  double corr[2];
  for (int p = 0; p < 2; ++p) {
    const double sh = M - pc[p].base;
    shift[p] = static_cast<E>(sh);
    corr[p] = static_cast<double>(shift[p]) == sh ? 1.0 : std::exp(static_cast<double>(shift[p]) - sh);
    fp[p] = static_cast<E>(static_cast<double>(f) * corr[p]);
  }
  double sum = 0;
  for (int j = 0; j < nb; ++j) {
    const WinBlock& b = blk[j];
    if (b.ub - M < detail::kSkipBelow<E>) continue;
    const Piece<E>& P = pc[b.piece];
    const std::uint16_t* l = P.l ? P.l + b.i0 : nullptr;
    const double part =
        dd ? win_sum_grad(P.a + b.i0, l, P.d + b.i0, b.i1 - b.i0, shift[b.piece], fp[b.piece], dd + P.k0 + b.i0)
           : win_sum(P.a + b.i0, l, P.d + b.i0, b.i1 - b.i0, shift[b.piece]);
    sum += part * corr[b.piece];
  }
  return sum;
}

// Context shared by every lane.
template <class E> struct FastCtx {
  std::int64_t T, K, C, ke, I;
  const E *S, *Tr, *D, *P;
  const std::int64_t* L;
  E* Dt;   // [C][ke]: D transposed so each label's column is contiguous
  E* dbm;  // [C][nblk]: maxima of D's column blocks
  double *eA, *eB, *colmax, *rowmax;
  Pass pass;
  const E* dlogz;
  E* out;
};

template <class E> struct FastSeq {
  const FastCtx<E>& X;
  const Layout& Y;
  char* lane;
  int tid, team;
  detail::Barrier* bar;
  std::int64_t lo, hi;  // own labels
  std::int64_t b = 0, L = 0;
  const E* Sb = nullptr;  // S[b] (T+1, C)
  double g = 1, logz = 0;

  // buffers
  template <class U> U* at(std::int64_t off) const { return reinterpret_cast<U*>(lane + off); }
  E* ck_ring(std::int64_t j) const { return at<E>(Y.ck_ring + j * Y.ck_ring_stride); }
  double* ck_meta(std::int64_t j) const { return at<double>(Y.ck_meta + j * Y.ck_meta_stride); }
  // a checkpoint's copy of amoves (after its bases, row and block maxima)
  template <class M> auto moves_in(M* meta) const {
    using U = std::conditional_t<std::is_const_v<M>, const std::uint32_t, std::uint32_t>;
    using B = std::conditional_t<std::is_const_v<M>, const char, char>;
    return reinterpret_cast<U*>(reinterpret_cast<B*>(meta) + 3 * X.C * 8 + 2 * X.C * Y.nblk * static_cast<std::int64_t>(sizeof(E)));
  }
  double* scr() const { return at<double>(Y.scr); }
  double* al(std::int64_t t) const { return scr() + (t & 1) * X.C; }        // α rows, by parity
  double* gam(std::int64_t s) const { return scr() + (2 + (s & 1)) * X.C; }  // γ rows, by parity
  // per label, but only the owning thread touches them: kept in the thread's
  // own scratch (no cache line shared between threads)
  double* sm() const { return ea() + 3 * X.C; }    // start marginals
  double* run() const { return ea() + 4 * X.C; }   // marginals running sum
  double* A() const { return ea() + 5 * X.C; }     // A[s,c]
  double* sumA() const { return ea() + 6 * X.C; }  // linear-domain sums
  double* abase() const { return scr() + 8 * X.C; }                           // α ring bases [2][C]
  // slots moved so far in the current lap by lap_base, per label (α, β): the budget of cheap moves
  double* amoves() const { return scr() + 4 * X.C; }
  double* bmoves() const { return scr() + 5 * X.C; }
  // lap_base's moves are cheap while a lap has moved at most kMoveBudget·Ke slots (its windows read Ke
  // terms or more per position, far more where they are not skipped); past that the bound grows with n
  bool cheap(double moved, std::int64_t n) const { return moved + static_cast<double>(n) <= kMoveBudget * static_cast<double>(X.ke); }
  static constexpr double kMoveBudget = 8.0;
  double* ea() const { return at<double>(Y.tscr + tid * Y.tstride); }  // per thread
  double* eg() const { return ea() + X.C; }
  double* arow() const { return ea() + 2 * X.C; }
  WinBlock* blocks() const { return reinterpret_cast<WinBlock*>(ea() + 7 * X.C); }
  E* rbm_a(std::int64_t lap, std::int64_t c) const { return at<E>(Y.rbm_a) + ((lap & 1) * X.C + c) * Y.nblk; }
  E* rbm_b(std::int64_t lap, std::int64_t c) const { return at<E>(Y.rbm_b) + ((lap & 1) * X.C + c) * Y.nblk; }
  // keeps the block maximum of a ring slot up to date; the first write of a
  // lap into a block resets it
  void block_max(E* rbm, std::int64_t slot, E v, bool first_of_lap) const {
    constexpr std::int64_t Bk = detail::kBlock<E>;
    std::int64_t q = slot / Bk;
    bool first = first_of_lap || slot == std::min((q + 1) * Bk - 1, X.ke - 1);
    rbm[q] = first || v > rbm[q] ? v : rbm[q];
  }
  E* ival() const { return at<E>(Y.ival); }
  double* nu() const { return at<double>(Y.nu); }
  E* bring() const { return at<E>(Y.bring); }
  double* bbase() const { return at<double>(Y.bbase); }
  E* dDt() const { return at<E>(Y.dDt); }
  double* gD() const { return at<double>(Y.gD); }
  double* gTr() const { return at<double>(Y.gTr); }
  double* gP() const { return at<double>(Y.gP); }
  void sync() const { bar->wait(); }
  double Sv(std::int64_t t, std::int64_t c) const { return static_cast<double>(Sb[t * X.C + c]); }

  // A ring column per label: ke slots, then (f32) their ke low parts as bf16.
  std::int64_t rke() const { return detail::ring_column<E>(X.ke); }
  const std::uint16_t* low(const E* col) const {
    if constexpr (sizeof(E) == 4) return reinterpret_cast<const std::uint16_t*>(col + X.ke);
    return nullptr;
  }
  // x (a difference from the lap's base, in f64) into slot i of column col (hi + lo: ring_put)
  E put(E* col, std::int64_t i, double x) const { return ring_put(col, X.ke, i, x); }

  // ---- α ----
  // ring slot of position s: reversed, so the window t-1, t-2, ... runs upward
  std::int64_t aslot(std::int64_t s) const { return X.ke - 1 - s % X.ke; }
  // The value of slot i (hi + lo), relative to its lap's base.
  double get(const E* col, std::int64_t i) const { return ring_get(col, X.ke, i); }
  // A lap's base moved up by `shift` (lap_base): the lap's stored slots
  // [from, to) of column col take value - shift, and their block maxima
  // (rbm, by slot block; no slot of the lap lies outside [from, to)) are
  // taken again from the new values.
  void shift_lap(E* col, std::int64_t from, std::int64_t to, double shift, E* rbm) const {
    if (from >= to) return;
    constexpr std::int64_t Bk = detail::kBlock<E>;
    for (std::int64_t i = from; i < to; ++i) put(col, i, to_lap(get(col, i), shift));
    for (std::int64_t q = from / Bk; q <= (to - 1) / Bk; ++q) {
      E m = -std::numeric_limits<E>::infinity();
      for (std::int64_t i = std::max(from, q * Bk); i < std::min(to, (q + 1) * Bk); ++i) m = std::max(m, col[i]);
      rbm[q] = m;
    }
  }
  void write_aring(E* ring, std::int64_t t, std::int64_t c, double at_) const {
    double* base = abase();
    std::int64_t lap = t / X.ke;
    double& bs = base[(lap & 1) * X.C + c];
    E* col = ring + c * rke();
    // this lap's slots so far: positions lap·ke .. t−1, slots aslot(t)+1 .. ke−1
    const std::int64_t n = t % X.ke;
    double& mv = amoves()[c];
    if (n == 0) mv = 0;
    if (double sh = lap_base(bs, n == 0, at_, n, cheap(mv, n)); sh != 0) {
      shift_lap(col, aslot(t) + 1, X.ke, sh, rbm_a(lap, c));
      mv += static_cast<double>(n);
    }
    E v = put(col, aslot(t), to_lap(at_, bs));
    block_max(rbm_a(lap, c), aslot(t), v, false);
  }
  void init_aring(E* ring) const {
    double* base = abase();
    for (std::int64_t c = lo; c < hi; ++c) {
      double a0 = static_cast<double>(X.P[c]) - Sv(0, c);
      lap_base(base[c], true, a0, 0, true);
      amoves()[c] = 0;
      base[X.C + c] = 0.0;
      E v = put(ring + c * rke(), aslot(0), to_lap(a0, base[c]));
      block_max(rbm_a(0, c), aslot(0), v, true);
    }
  }
  // α[t, own c] from the ring (t >= 1)
  void alpha_at(const E* ring, std::int64_t t, double* row) const {
    const double* base = abase();
    std::int64_t m = std::min(X.ke, t), r = (t - 1) % X.ke, p1 = std::min(m, r + 1);
    std::int64_t lap = (t - 1) / X.ke;
    for (std::int64_t c = lo; c < hi; ++c) {
      const E* col = ring + c * rke();
      const std::uint16_t* cl = low(col);
      const E* dc = X.Dt + c * X.ke;
      Piece<E> pc[2];
      pc[0] = {col + (X.ke - 1 - r), cl ? cl + (X.ke - 1 - r) : nullptr, dc, p1, X.ke - 1 - r, 0,
               base[(lap & 1) * X.C + c], rbm_a(lap, c)};
      pc[1] = {col, cl, dc + p1, m - p1, 0, p1, base[((lap + 1) & 1) * X.C + c], rbm_a(lap + 1, c)};
      int nb = 0;
      double M = window_max(pc, X.dbm + c * Y.nblk, blocks(), nb);
      if (M == kNegInf) { row[c] = kNegInf; continue; }
      double sum = window_sum<E>(pc, blocks(), nb, M, E(0), nullptr);
      row[c] = Sv(t, c) + M + std::log(sum);
    }
  }
  // A[own c] = lse_c'(row[c'] + Tr[c',c]); sumA > 0 when the linear-domain sum was used
  void trans_in(const double* row) const {
    double* e = ea();
    double amax = kNegInf;
    for (std::int64_t c = 0; c < X.C; ++c) amax = std::max(amax, row[c]);
    double *Ao = A(), *so = sumA();
    if (amax == kNegInf) {
      for (std::int64_t c = lo; c < hi; ++c) { Ao[c] = kNegInf; so[c] = 0; }
      return;
    }
    for (std::int64_t c = 0; c < X.C; ++c) e[c] = exp_win(row[c] - amax);
    for (std::int64_t c = lo; c < hi; ++c) {
      if (X.colmax[c] == kNegInf) { Ao[c] = kNegInf; so[c] = 0; continue; }
      const double* ec = X.eA + c * X.C;
      double s = 0;
      for (std::int64_t cp = 0; cp < X.C; ++cp) s += e[cp] * ec[cp];
      if (s > 1e-250) { Ao[c] = amax + X.colmax[c] + std::log(s); so[c] = s; continue; }
      LseAcc acc;  // exact, for sums the linear domain cannot hold
      for (std::int64_t cp = 0; cp < X.C; ++cp) acc.add(row[cp] + static_cast<double>(X.Tr[cp * X.C + c]));
      Ao[c] = acc.value();
      so[c] = 0;
    }
  }
  void alpha_ring_from_A(E* ring, std::int64_t t) const {
    for (std::int64_t c = lo; c < hi; ++c) write_aring(ring, t, c, A()[c] - Sv(t, c));
  }
  void store_ival(std::int64_t i, const double* row) const {
    double nv = kNegInf;
    for (std::int64_t c = 0; c < X.C; ++c) nv = std::max(nv, row[c]);
    if (nv == kNegInf) nv = 0;
    if (tid == 0) nu()[i] = nv;
    E* dst = ival() + i * X.C;
    for (std::int64_t c = lo; c < hi; ++c) dst[c] = static_cast<E>(row[c] - nv);
  }
  void load_ival(std::int64_t i, double* row) const {
    const E* src = ival() + i * X.C;
    double nv = nu()[i];
    for (std::int64_t c = 0; c < X.C; ++c) row[c] = static_cast<double>(src[c]) + nv;
  }

  // The forward sweep t = 0..L. Stores checkpoints (backward) and α rows from
  // position `ival_from` on (-1: none). Returns logZ.
  double forward(E* ring, bool store_ck, std::int64_t nck, std::int64_t ival_from) {
    init_aring(ring);
    if (ival_from == 0) {
      double* r0 = al(0);
      for (std::int64_t c = lo; c < hi; ++c) r0[c] = kNegInf;
      sync();
      store_ival(0, r0);
    }
    for (std::int64_t t = 1; t <= L; ++t) {
      double* row = al(t);
      alpha_at(ring, t, row);
      sync();
      if (store_ck && t % X.I == 0 && t / X.I < nck) {
        std::int64_t j = t / X.I;
        E* dst = ck_ring(j - 1);
        double* meta = ck_meta(j - 1);
        for (std::int64_t c = lo; c < hi; ++c) {
          std::memcpy(dst + c * rke(), ring + c * rke(), static_cast<std::size_t>(rke()) * sizeof(E));
          meta[c] = abase()[c];
          meta[X.C + c] = abase()[X.C + c];
          meta[2 * X.C + c] = row[c];
          E* mb = reinterpret_cast<E*>(meta + 3 * X.C);
          std::memcpy(mb + c * Y.nblk, rbm_a(0, c), static_cast<std::size_t>(Y.nblk) * sizeof(E));
          std::memcpy(mb + (X.C + c) * Y.nblk, rbm_a(1, c), static_cast<std::size_t>(Y.nblk) * sizeof(E));
          moves_in(meta)[c] = static_cast<std::uint32_t>(std::min(amoves()[c], 4294967295.0));
        }
      }
      if (ival_from >= 0 && t >= ival_from) store_ival(t - ival_from, row);
      if (t < L) {
        trans_in(row);
        alpha_ring_from_A(ring, t);
      }
    }
    LseAcc z;
    const double* last = al(L);
    for (std::int64_t c = 0; c < X.C; ++c) z.add(last[c]);
    return z.value();
  }

  // ---- β ----
  void write_bring(std::int64_t s, std::int64_t c, double v) const {
    double& bs = bbase()[((s / X.ke) & 1) * X.C + c];
    E* col = bring() + c * rke();
    // this lap's slots so far: positions s+1 .. min(L, its last), slots s % ke + 1 ..
    const std::int64_t from = s % X.ke + 1, to = std::min(L, (s / X.ke + 1) * X.ke - 1) % X.ke + 1;
    const bool start = s == L || s % X.ke == X.ke - 1;
    double& mv = bmoves()[c];
    if (start) mv = 0;
    if (double sh = lap_base(bs, start, v, to - from, cheap(mv, to - from)); sh != 0) {
      shift_lap(col, from, to, sh, rbm_b(s / X.ke, c));
      mv += static_cast<double>(to - from);
    }
    E x = put(col, s % X.ke, to_lap(v, bs));
    block_max(rbm_b(s / X.ke, c), s % X.ke, x, s == L);
  }
  // γ[s, own c], start marginals, dD and dTr contributions (s < L)
  void gamma_at(std::int64_t s, bool grads) {
    const double* base = bbase();
    std::int64_t m = std::min(X.ke, L - s), p0 = (s + 1) % X.ke, p1 = std::min(m, X.ke - p0);
    std::int64_t lap = (s + 1) / X.ke;
    double* gr = gam(s);
    for (std::int64_t c = lo; c < hi; ++c) {
      const E* col = bring() + c * rke();
      const std::uint16_t* cl = low(col);
      const E* dc = X.Dt + c * X.ke;
      Piece<E> pc[2];
      pc[0] = {col + p0, cl ? cl + p0 : nullptr, dc, p1, p0, 0, base[(lap & 1) * X.C + c], rbm_b(lap, c)};
      pc[1] = {col, cl, dc + p1, m - p1, 0, p1, base[((lap + 1) & 1) * X.C + c], rbm_b(lap + 1, c)};
      int nb = 0;
      double M = window_max(pc, X.dbm + c * Y.nblk, blocks(), nb);
      double Ac = A()[c], Ssc = Sv(s, c);
      if (M == kNegInf) { gr[c] = kNegInf; sm()[c] = 0; continue; }
      double f = grads && Ac != kNegInf ? g * std::exp(M - Ssc + Ac - logz) : 0.0;
      E* dd = static_cast<E>(f) != E(0) ? dDt() + c * X.ke : nullptr;
      double sum = window_sum<E>(pc, blocks(), nb, M, static_cast<E>(f), dd);
      gr[c] = M - Ssc + std::log(sum);
      double st = Ac != kNegInf ? std::exp(Ac + gr[c] - logz) : 0.0;
      sm()[c] = st;
      if (!grads || s == 0 || st == 0) continue;
      // dTr[c', c] += g e^{α[s,c'] + Tr[c',c] − A[s,c]} start[s,c]
      double w = g * st;
      double* gt = gTr();
      if (sumA()[c] > 0) {
        const double* ec = X.eA + c * X.C;
        double f2 = w / sumA()[c];
        for (std::int64_t cp = 0; cp < X.C; ++cp) gt[cp * X.C + c] += ea()[cp] * ec[cp] * f2;
      } else {
        const double* row = arow();
        for (std::int64_t cp = 0; cp < X.C; ++cp) {
          double x = row[cp] + static_cast<double>(X.Tr[cp * X.C + c]) - Ac;
          if (x != kNegInf) gt[cp * X.C + c] += std::exp(x) * w;
        }
      }
    }
  }
  // The backward pass of sequence b: gradients (grads) or marginals.
  void backward(bool grads, E* dS, E* marg) {
    const std::int64_t C = X.C, I = X.I;
    const std::int64_t nck = checkpoints(L, I), nint = nck + 1;
    E* live = ck_ring(nck >= 1 ? nck - 1 : 0);
    logz = forward(live, true, nck, nck * I);
    if (!(logz > kNegInf) || g == 0 || !std::isfinite(logz)) {
      for (std::int64_t s = 0; s <= L; ++s)
        for (std::int64_t c = lo; c < hi; ++c) {
          if (dS) dS[s * C + c] = E(0);
          if (marg && s < L) marg[s * C + c] = E(0);
        }
      return;
    }
    for (std::int64_t c = lo; c < hi; ++c) {
      run()[c] = 0;
      bbase()[c] = 0;
      bbase()[X.C + c] = 0;
    }
    double* egm = eg();
    for (std::int64_t j = nint - 1; j >= 0; --j) {
      const std::int64_t a = j * I, e = std::min(a + I, L + 1);
      if (j < nint - 1) {  // restore the ring and recompute α over the interval
        sync();            // everyone is done reading the previous interval's rows
        E* ring = ck_ring(j >= 1 ? j - 1 : 0);
        double* r0 = arow();
        if (j >= 1) {
          const double* meta = ck_meta(j - 1);
          const E* mb = reinterpret_cast<const E*>(meta + 3 * C);
          for (std::int64_t c = lo; c < hi; ++c) {
            abase()[c] = meta[c];
            abase()[C + c] = meta[C + c];
            std::memcpy(rbm_a(0, c), mb + c * Y.nblk, static_cast<std::size_t>(Y.nblk) * sizeof(E));
            std::memcpy(rbm_a(1, c), mb + (C + c) * Y.nblk, static_cast<std::size_t>(Y.nblk) * sizeof(E));
            amoves()[c] = static_cast<double>(moves_in(meta)[c]);
          }
          for (std::int64_t c = 0; c < C; ++c) r0[c] = meta[2 * C + c];
          store_ival(0, r0);
          if (a < L) { trans_in(r0); alpha_ring_from_A(ring, a); }
        } else {
          init_aring(ring);
          for (std::int64_t c = 0; c < C; ++c) r0[c] = kNegInf;
          store_ival(0, r0);
        }
        for (std::int64_t t = a + 1; t < e; ++t) {
          double* row = al(t);
          alpha_at(ring, t, row);
          sync();
          store_ival(t - a, row);
          if (t < L) { trans_in(row); alpha_ring_from_A(ring, t); }
        }
      }
      sync();  // the interval's α rows are complete
      for (std::int64_t s = e - 1; s >= a; --s) {
        double* row = arow();  // α[s], all labels, private to the thread
        if (s == L) {
          load_ival(s - a, row);
          for (std::int64_t c = lo; c < hi; ++c) {
            write_bring(L, c, Sv(L, c));
            double en = row[c] != kNegInf ? std::exp(row[c] - logz) : 0.0;
            if (dS) dS[L * C + c] = static_cast<E>(g * en);
            run()[c] = en;
          }
          continue;
        }
        load_ival(s - a, row);
        if (s == 0) for (std::int64_t c = lo; c < hi; ++c) A()[c] = static_cast<double>(X.P[c]);
        else trans_in(row);
        gamma_at(s, grads);
        sync();  // γ[s] complete
        if (s == 0) {
          for (std::int64_t c = lo; c < hi; ++c) {
            if (marg) marg[c] = static_cast<E>(run()[c]);
            if (dS) dS[c] = static_cast<E>(-g * sm()[c]);
            if (grads) gP()[c] += g * sm()[c];
          }
          continue;
        }
        const double* gr = gam(s);
        double gm = kNegInf;
        for (std::int64_t c = 0; c < C; ++c) gm = std::max(gm, gr[c]);
        if (gm != kNegInf)
          for (std::int64_t c = 0; c < C; ++c) egm[c] = exp_win(gr[c] - gm);
        for (std::int64_t cp = lo; cp < hi; ++cp) {
          double beta = kNegInf;
          if (gm != kNegInf && X.rowmax[cp] != kNegInf) {
            const double* eb = X.eB + cp * C;
            double s2 = 0;
            for (std::int64_t c = 0; c < C; ++c) s2 += eb[c] * egm[c];
            if (s2 > 1e-250) beta = gm + X.rowmax[cp] + std::log(s2);
            else {
              LseAcc acc;
              for (std::int64_t c = 0; c < C; ++c) acc.add(static_cast<double>(X.Tr[cp * C + c]) + gr[c]);
              beta = acc.value();
            }
          }
          double en = row[cp] != kNegInf && beta != kNegInf ? std::exp(row[cp] + beta - logz) : 0.0;
          if (dS) dS[s * C + cp] = static_cast<E>(g * (en - sm()[cp]));
          if (marg) marg[s * C + cp] = static_cast<E>(run()[cp]);
          run()[cp] += en - sm()[cp];
          write_bring(s, cp, beta + Sv(s, cp));
        }
      }
      if (grads) {  // flush the interval's dD partial sums into f64
        for (std::int64_t c = lo; c < hi; ++c) {
          E* dd = dDt() + c * X.ke;
          double* gd = gD() + c * X.ke;
          for (std::int64_t k = 0; k < X.ke; ++k) { gd[k] += static_cast<double>(dd[k]); dd[k] = E(0); }
        }
      }
    }
  }
};

// Labels split over a team pay only if a barrier is cheap next to a
// position's work (microseconds). On an oversubscribed machine a barrier
// waits for a descheduled thread (milliseconds), and one thread is faster. So
// the team first times a few hundred barriers (at most ~2 ms) and keeps the
// team only if one costs under 1.5 µs. Results do not depend on the choice.
int calibrate_team(int n) {
  detail::Barrier bar(n);
  std::atomic<bool> stop{false};
  double per = 0;
  detail::run_threads(n, [&](int tid) {
    auto t0 = std::chrono::steady_clock::now();
    int r = 0;
    for (;;) {
      if (tid == 0) {
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++r;
        if (r >= 200 || el > 2e-3) {
          per = el / (2.0 * r);
          stop.store(true, std::memory_order_release);
        }
      }
      bar.wait();
      bool st = stop.load(std::memory_order_acquire);
      bar.wait();
      if (st) break;
    }
  });
  return per < 1.5e-6 ? n : 1;
}

template <class E> void fast_run(const Args& a, Pass pass, const E* dlogz, E* out, void* ws, int threads) {
  const Dims& d = a.d;
  const Layout Y = detail::make_layout(d, pass, threads);
  const std::int64_t C = d.C, ke = Y.ke, T = d.T;
  char* base = static_cast<char*>(ws);
  FastCtx<E> X{};
  X.T = T; X.K = d.K; X.C = C; X.ke = ke; X.I = Y.I;
  X.S = static_cast<const E*>(a.S); X.Tr = static_cast<const E*>(a.Tr);
  X.D = static_cast<const E*>(a.D); X.P = static_cast<const E*>(a.P);
  X.L = a.L; X.pass = pass; X.dlogz = dlogz; X.out = out;
  X.Dt = reinterpret_cast<E*>(base + Y.Dt);
  X.eA = reinterpret_cast<double*>(base + Y.eA);
  X.eB = reinterpret_cast<double*>(base + Y.eB);
  X.colmax = reinterpret_cast<double*>(base + Y.colmax);
  X.rowmax = reinterpret_cast<double*>(base + Y.rowmax);
  X.dbm = reinterpret_cast<E*>(base + Y.dbm);
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t k = 0; k < ke; ++k) X.Dt[c * ke + k] = X.D[k * C + c];
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t q = 0; q < Y.nblk; ++q) {
      E m = -std::numeric_limits<E>::infinity();
      for (std::int64_t k = q * detail::kBlock<E>; k < std::min(ke, (q + 1) * detail::kBlock<E>); ++k)
        m = std::max(m, X.Dt[c * ke + k]);
      X.dbm[c * Y.nblk + q] = m;
    }
  for (std::int64_t c = 0; c < C; ++c) {
    double cm = kNegInf, rm = kNegInf;
    for (std::int64_t o = 0; o < C; ++o) {
      cm = std::max(cm, static_cast<double>(X.Tr[o * C + c]));
      rm = std::max(rm, static_cast<double>(X.Tr[c * C + o]));
    }
    X.colmax[c] = cm;
    X.rowmax[c] = rm;
  }
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t o = 0; o < C; ++o) {
      X.eA[c * C + o] = X.colmax[c] == kNegInf ? 0.0 : std::exp(static_cast<double>(X.Tr[o * C + c]) - X.colmax[c]);
      X.eB[c * C + o] = X.rowmax[c] == kNegInf ? 0.0 : std::exp(static_cast<double>(X.Tr[c * C + o]) - X.rowmax[c]);
    }
  const std::int64_t nS = d.B * (T + 1) * C, nTr = d.tr_numel(), nD = d.K * C;
  if (pass == Pass::backward) std::fill(out + nS, out + nS + nTr + nD + C, E(0));
  std::atomic<std::int64_t> ticket{0};
  const int team = Y.team > 1 && !a.force_team ? calibrate_team(Y.team) : Y.team;
  std::vector<std::unique_ptr<detail::Barrier>> bars;
  for (int l = 0; l < Y.lanes; ++l) bars.push_back(std::make_unique<detail::Barrier>(team));
  detail::run_threads(Y.lanes * team, [&](int id) {
    const int lane = id / team, tid = id % team;
    char* lb = base + Y.shared_bytes + lane * Y.lane_bytes;
    FastSeq<E> q{X, Y, lb, tid, team, bars[static_cast<std::size_t>(lane)].get(), C * tid / team,
                 C * (tid + 1) / team};
    if (pass == Pass::backward) {
      for (std::int64_t c = q.lo; c < q.hi; ++c) {
        for (std::int64_t k = 0; k < ke; ++k) { q.dDt()[c * ke + k] = E(0); q.gD()[c * ke + k] = 0; }
        for (std::int64_t o = 0; o < C; ++o) q.gTr()[o * C + c] = 0;
        q.gP()[c] = 0;
      }
    }
    for (std::int64_t b = lane; b < d.B; b += Y.lanes) {
      q.sync();  // the previous sequence's shared rows are no longer read
      q.b = b;
      q.L = a.L[b];
      q.Sb = X.S + b * (T + 1) * C;
      if (pass == Pass::logz) {
        double z = q.forward(q.ck_ring(0), false, 0, -1);
        if (tid == 0) out[b] = static_cast<E>(z);
        continue;
      }
      if (pass == Pass::marginals) {
        E* marg = out + b * T * C;
        for (std::int64_t t = q.L; t < T; ++t)
          for (std::int64_t c = q.lo; c < q.hi; ++c) marg[t * C + c] = E(0);
        q.g = 1;
        q.backward(false, nullptr, marg);
        continue;
      }
      E* dS = out + b * (T + 1) * C;
      for (std::int64_t t = q.L + 1; t <= T; ++t)
        for (std::int64_t c = q.lo; c < q.hi; ++c) dS[t * C + c] = E(0);
      q.g = static_cast<double>(dlogz[b]);
      q.backward(true, dS, nullptr);
      q.sync();
      if (tid == 0) {  // add this sequence's parameter gradients in batch order
        detail::wait_ticket(ticket, b);
        E* oTr = out + nS;
        E* oD = oTr + nTr;
        E* oP = oD + nD;
        for (std::int64_t c = 0; c < C; ++c)
          for (std::int64_t k = 0; k < ke; ++k) {
            oD[k * C + c] += static_cast<E>(q.gD()[c * ke + k]);
            q.gD()[c * ke + k] = 0;
          }
        for (std::int64_t i = 0; i < C * C; ++i) { oTr[i] += static_cast<E>(q.gTr()[i]); q.gTr()[i] = 0; }
        for (std::int64_t c = 0; c < C; ++c) { oP[c] += static_cast<E>(q.gP()[c]); q.gP()[c] = 0; }
        ticket.store(b + 1, std::memory_order_release);
      }
    }
  });
}

template <class E> void dispatch_fast(const Args& a, Pass pass, const void* dlogz, void* out, void* ws, int threads) {
  fast_run<E>(a, pass, static_cast<const E*>(dlogz), static_cast<E*>(out), ws, threads);
}
void run_pass(const Args& a, Pass pass, const void* dlogz, void* out, void* ws, int threads) {
  if (a.d.general) { detail::general_run(a, pass, dlogz, out, ws, threads); return; }
  if (a.dtype == DType::f64) dispatch_fast<double>(a, pass, dlogz, out, ws, threads);
  else dispatch_fast<float>(a, pass, dlogz, out, ws, threads);
}

}  // namespace

void logz_cpu(const Args& a, void* out, void* ws, int threads) {
  check_lengths("semicrf_logz", a);
  check_scores("semicrf_logz", a);
  run_pass(a, Pass::logz, nullptr, out, ws, threads);
}
void logz_backward_cpu(const Args& a, const void* dlogz, void* out, void* ws, int threads) {
  check_lengths("semicrf_logz_backward", a);
  check_scores("semicrf_logz_backward", a);
  run_pass(a, Pass::backward, dlogz, out, ws, threads);
}
void marginals_cpu(const Args& a, void* out, void* ws, int threads) {
  check_lengths("semicrf_marginals", a);
  check_scores("semicrf_marginals", a);
  run_pass(a, Pass::marginals, nullptr, out, ws, threads);
}

}  // namespace ad::semicrf
