// The host-side arithmetic of GPU launches, checked on the CPU in every build:
// a wrong layout or shared-memory size here shows only on a GPU, and CI has
// none. (A causal scan asking for 50 KB of shared memory at D = 2 was found
// that way on an H200, 2026-11-26: "invalid argument" at launch.)
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "ad/ad.hpp"
#include "cuda/semisep_plan.hpp"
#include "ops/semicrf_gpu.hpp"
#include "ops/sum_layout.hpp"
#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {
// x's shape with 1 at each summed axis
Shape keep_of(const Shape& xs, const std::vector<int>& summed) {
  Shape k = xs;
  for (int a : summed) k[a] = 1;
  return k;
}
}  // namespace

TEST_CASE("gpu plans: sums take the [O][R][I] layouts, with parts only for few outputs") {
  using sumlayout::layout;
  {  // everything: one output, 67 million terms in 1024 parts
    auto L = layout(Shape{8192, 8192}, Shape{1, 1});
    CHECK((!L.general && L.O == 1 && L.R == 8192 * 8192 && L.I == 1 && L.P == 1024));
    CHECK(L.ws_bytes() == 1024 * 8);
  }
  {  // rows: 8192 outputs, enough blocks without parts
    auto L = layout(Shape{8192, 8192}, Shape{8192, 1});
    CHECK((L.O == 8192 && L.R == 8192 && L.I == 1 && L.P == 1 && L.ws_bytes() == 0));
  }
  {  // columns: a thread per column, 8 parts to reach 65536 threads
    auto L = layout(Shape{8192, 8192}, Shape{1, 8192});
    CHECK((L.O == 1 && L.R == 8192 && L.I == 8192 && L.P == 8 && L.ws_bytes() == 8 * 8192 * 8));
  }
  {  // a middle axis: [O][R][I] with all three, size-1 axes ignored
    auto L = layout(Shape{4, 1, 3000, 5}, Shape{4, 1, 1, 5});
    CHECK((!L.general && L.O == 4 && L.R == 3000 && L.I == 5));
  }
  // summed, kept, summed: the generic kernel, no workspace
  CHECK(layout(Shape{40, 6, 300}, Shape{1, 6, 1}).general);
  CHECK(layout(Shape{40, 6, 300}, Shape{1, 6, 1}).ws_bytes() == 0);
  // nothing summed, and a tensor of size-1 axes
  CHECK(layout(Shape{7, 9}, Shape{7, 9}).R == 1);
  CHECK(layout(Shape{1, 1}, Shape{1, 1}).O * layout(Shape{1, 1}, Shape{1, 1}).R == 1);
}

TEST_CASE("gpu plans: the [O][R][I] indexing the sum kernels use gives the CPU's sums") {
  // For every choice of summed axes of a rank-4 shape: where the layout is not
  // general, output (o, i) summed as the GPU kernels index it, x[(o R + r) I + i],
  // each of the P parts in turn, equals the CPU op's result.
  Rng rng(5);
  const Shape xs{2, 130, 3, 33};  // sizes where some layouts take parts (P > 1)
  Tensor x = Tensor::randn(xs, rng, DType::f64);
  const std::vector<double> xv = x.to_vector();
  int checked = 0, with_parts = 0;
  for (int mask = 1; mask < 16; ++mask) {
    std::vector<int> summed;
    for (int a = 0; a < 4; ++a)
      if (mask & (1 << a)) summed.push_back(a);
    const Shape keep = keep_of(xs, summed);
    const sumlayout::Layout L = sumlayout::layout(xs, keep);
    CAPTURE(mask);
    if (L.general) continue;
    CHECK(L.O * L.R * L.I == xs.numel());
    with_parts += L.P > 1;
    Shape axes;
    for (int a : summed) axes.push_back(a);
    Graph g;
    const std::vector<double> want = eval(sum(g.input(x), axes, true)).to_vector();
    REQUIRE(static_cast<std::int64_t>(want.size()) == L.O * L.I);
    for (std::int64_t o = 0; o < L.O; ++o)
      for (std::int64_t i = 0; i < L.I; ++i) {
        double acc = 0;
        for (std::int64_t p = 0; p < L.P; ++p)
          for (std::int64_t r = L.R * p / L.P; r < L.R * (p + 1) / L.P; ++r)
            acc += xv[static_cast<std::size_t>((o * L.R + r) * L.I + i)];
        CHECK(acc == doctest::Approx(want[static_cast<std::size_t>(o * L.I + i)]).epsilon(1e-12));
      }
    ++checked;
  }
  CHECK(checked >= 8);  // of the 15 choices, those with summed axes in one run
  CHECK(with_parts >= 2);
}

TEST_CASE("gpu plans: the semiseparable scan and rows fit their shared memory") {
  namespace sp = cuda_k::semisep_plan;
  for (int es : {4, 8})
    for (int KB : {4, 8, 16, 24, 32})
      for (std::int64_t D = 1; D <= 32; ++D) {
        CAPTURE(es);
        CAPTURE(KB);
        CAPTURE(D);
        const sp::Scan p = sp::scan(D, KB, es);
        CHECK(p.smem_bytes <= sp::kBlockSmem);
        CHECK((p.RB >= 2 && p.RB <= 32));
        CHECK((p.CPW >= 1 && p.CPW * D <= 32));
        CHECK(p.ROW % 4 == 0);
        CHECK(p.ROW >= 2 * KB + D + 2);
        CHECK(p.CH >= p.RB * p.ROW);
        CHECK((p.CH * es) % 16 == 0);  // 16-byte loads stay aligned in every chunk
        if (p.CPW > 1) CHECK((p.CH * es) % 128 == 16);
      }
  // the rows kernel: where it does not fit, the first tiled kernel runs instead
  int over = 0;
  for (int es : {4, 8})
    for (std::int64_t r = 1; r <= 32; ++r)
      for (std::int64_t D = 1; D <= 128; ++D) {
        const sp::Rows p = sp::rows(r, D, es);
        CHECK((p.rpw >= 1 && p.rpw * p.ne <= 32 && p.rs >= r && p.rs % 2 == 1));
        if (!p.fits) {
          ++over;
          CHECK(es == 8);  // f32 always fits
        }
      }
  CHECK(over > 0);  // f64 with r near 32 and D <= 4 does not
  CHECK(sp::rows(22, 16, 4).fits);
  CHECK(sp::sums_tiles(22, 16) == 24);
}

// The staged kernels (f32): every (r, D) they take fits its shared memory, the
// spans they copy 16 bytes at a time start 16-byte aligned in shared memory,
// and the one-pass causal scan's workspace stays within a quarter of x.
TEST_CASE("gpu plans: the staged semiseparable kernels fit and keep their copies aligned") {
  namespace sp = cuda_k::semisep_plan;
  int scan_fits = 0;
  for (std::int64_t r = 1; r <= 64; ++r)
    for (std::int64_t D = 4; D <= 64; D += 4) {
      CAPTURE(r);
      CAPTURE(D);
      REQUIRE(sp::staged_applies(r, D, 4));
      const sp::StagedSums s = sp::staged_sums(r, D);
      CHECK(s.smem_bytes <= sp::kStagedSmem);
      CHECK((s.ntiles <= s.tpg && s.tpg % 16 == 0 && s.G * s.tpg == 256));
      CHECK(s.TE == 4);
      CHECK(s.ne * s.TE == D);
      CHECK(s.stage % 4 == 0);
      CHECK(s.stage >= s.R * D + r * s.R + 3);    // the last tile reads up to 3 past r
      CHECK(s.smem_bytes >= 256 * 4 * s.TE * 4);  // the groups' partials
      const sp::StagedRows w = sp::staged_rows(r, D);
      CHECK(w.smem_bytes <= sp::kStagedSmem);
      CHECK((w.R % 8 == 0 && w.R >= 8 && w.R / 2 <= 256 / (D / 4)));
      CHECK(w.stage % 4 == 0);
      CHECK(w.stage >= (w.R + 2) * D + w.R * r + 3 * w.R + 4);  // lo from t0 - 4
      const sp::StagedScan c = sp::staged_scan(r, D);
      if (!c.fits) continue;
      ++scan_fits;
      CHECK((D == 8 || D == 16 || D == 32 || D == 64));
      CHECK(c.smem_bytes <= sp::kScanSmem);
      CHECK((c.H * c.Dh == 256 && c.HW * c.Dh == 32 && c.Lg == c.H * c.SR && c.SR >= 1));
      for (int o : {c.ox, c.ov, c.ou, c.od, c.olo, c.owt, c.oE}) CHECK(o % 4 == 0);  // 16-byte copies
      CHECK(c.ov - c.ox >= (c.Lg + 1) * D);  // x from the row before the chunk
      CHECK(c.ou - c.ov >= c.Lg * r + 3);    // odd r: the walk reads up to 3 past r
      CHECK(c.od - c.ou >= c.Lg * r + 3);
      CHECK((c.olo - c.od >= c.Lg && c.owt - c.olo >= c.Lg));
      CHECK(c.oE - c.owt >= 8 * r * D);
      CHECK((c.Lg * r) % 4 == 0);  // a chunk's rows of u and v start 16-byte aligned
      CHECK(c.smem_bytes >= (c.oE + 2 * r * D) * 4);
      CHECK(r * D <= 1024);  // four elements of the chunk's sum per thread
      const std::int64_t N = std::int64_t{1} << 22;
      const std::int64_t nc = (N + c.Lg - 1) / c.Lg;  // x of nc whole chunks is 4 nc Lg D bytes
      const std::int64_t flags = (nc + 1) * 4 + 15;
      CHECK(sp::staged_scan_flag_bytes(1, N, D, r) % 16 == 0);
      CHECK(sp::staged_scan_flag_bytes(1, N, D, r) >= (nc + 1) * 4);
      CHECK(sp::staged_scan_ws_bytes(1, N, D, r) >= sp::staged_scan_flag_bytes(1, N, D, r) + nc * r * D * 12);
      // the rounds kernel (variants 7 to 10): its layout in order, 16-byte aligned, within the workspace for
      // rounds of kMinRoundChunks chunks or longer, with a counter and three flags per round before agg
      for (std::int64_t B : {1, 3})
        for (std::int64_t Nk : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{131149}, N + 1})
          for (std::int64_t Rc : {sp::kMinRoundChunks, std::int64_t{32}, std::int64_t{64}}) {
            const sp::RoundsLayout L = sp::staged_rounds_layout(B, Nk, D, r, Rc);
            const std::int64_t nck = (Nk + c.Lg - 1) / c.Lg;
            CHECK(L.rounds == (nck + Rc - 1) / Rc);
            CHECK(L.agg >= (1 + 3 * B * L.rounds) * 4);
            CHECK((L.agg % 16 == 0 && L.E % 16 == 0 && L.rag % 16 == 0 && L.rin % 16 == 0));
            CHECK(L.E - L.agg == B * nck * r * D * 4);
            CHECK(L.rag - L.E == B * nck * r * D * 8);
            CHECK(L.rin - L.rag == B * L.rounds * r * D * 4);
            CHECK(L.bytes - L.rin == B * L.rounds * r * D * 8);
            CHECK(L.bytes <= sp::staged_scan_ws_bytes(B, Nk, D, r));
          }
      CHECK(sp::staged_scan_ws_bytes(1, N, D, r) <= nc * c.Lg * D + flags);  // at most a quarter of x
      CHECK((nc * r * D * 4) % 16 == 0);  // the f64 prefixes after the f32 sums stay 16-byte aligned
      // the clustered kernel's layout: the cluster's prefix after E; its units (clusters of 4 or 8 chunks,
      // a batch's chunks padded) fit the one-pass kernel's workspace, as its launcher requires
      const sp::StagedScan k = sp::staged_scan(r, D, true);
      if (!k.fits) continue;
      CHECK(k.smem_bytes <= sp::kScanSmem);
      CHECK((k.oG % 4 == 0 && k.oG - k.oE >= 2 * r * D && k.smem_bytes >= (k.oG + 2 * r * D) * 4));
      CHECK((k.Lg <= c.Lg && k.Lg == k.H * k.SR));
      for (std::int64_t B : {1, 3})
        for (std::int64_t Nk : {std::int64_t{1}, std::int64_t{1000}, N + 1})
          for (std::int64_t CS : {4, 8}) {
            const std::int64_t units = B * (((Nk + k.Lg - 1) / k.Lg + CS - 1) / CS);
            const std::int64_t fb = sp::staged_scan_flag_bytes(B, Nk, D, r);
            CHECK((units + 1) * 4 <= fb);
            CHECK(fb + units * r * D * 12 <= sp::staged_scan_ws_bytes(B, Nk, D, r));
          }
    }
  CHECK(scan_fits > 60);
  CHECK(sp::staged_scan(22, 16).fits);  // the size
  CHECK(sp::staged_scan(22, 16, true).fits);
  CHECK(!sp::staged_scan(22, 12).fits);  // D not a power of two: the two-pass kernels
}

TEST_CASE("gpu plans: the semi-CRF lanes' regions do not overlap and hold hi + lo f32 rings") {
  // the CUDA kernels carve these bytes (src/cuda/semicrf.cu); an overlap or a short ring fails only on a GPU
  namespace sc = ad::semicrf;
  for (const std::int64_t esize : {std::int64_t{4}, std::int64_t{8}})
    for (const bool general : {false, true})
      for (const sc::Pass pass : {sc::Pass::logz, sc::Pass::backward, sc::Pass::marginals, sc::Pass::viterbi})
        for (const std::array<std::int64_t, 3>& tkc : {std::array<std::int64_t, 3>{400, 60, 5}, {7, 30, 3}, {4000, 257, 24}}) {
          const std::int64_t T = tkc[0], K = tkc[1], C = tkc[2];
          sc::Dims d;
          d.B = 3, d.T = T, d.K = K, d.C = C, d.general = general, d.esize = static_cast<std::size_t>(esize);
          const sc::gpu::Layout y = sc::gpu::layout(d, pass);
          const bool fast = !general && pass != sc::Pass::viterbi;
          const std::int64_t re = fast ? esize : 8, ke = y.ke;
          const std::int64_t ring = C * (fast && re == 4 ? ke + (ke + 1) / 2 : ke) * re;  // hi + bf16 lo for f32
          const bool full = pass == sc::Pass::backward || pass == sc::Pass::marginals;
          std::vector<std::array<std::int64_t, 2>> r{{y.rows, sc::gpu::kRows * C * 8}, {y.abase, 2 * C * 8}};
          if (!full) r.push_back({y.ck_ring, ring});
          else {
            CHECK(y.ck_stride >= ring);
            r.push_back({y.ck_ring, y.ck_stride * y.slots});
            if (fast) r.push_back({y.ck_meta, y.meta_stride * y.slots}), r.push_back({y.nu, y.I * 8});
            r.push_back({y.ival, y.I * C * re});
            r.push_back({y.bring, ring});
            r.push_back({y.bbase, 2 * C * 8});
          }
          if (pass == sc::Pass::viterbi) r.push_back({y.bk, (T + 1) * C * 4}), r.push_back({y.bc, (T + 1) * C * 4});
          if (pass == sc::Pass::backward)
            r.push_back({y.gD, ke * C * 8}), r.push_back({y.gTr, (general ? ke : 1) * C * C * 8}), r.push_back({y.gP, C * 8});
          std::sort(r.begin(), r.end());
          INFO("esize " << esize << " general " << general << " pass " << static_cast<int>(pass) << " T " << T << " K " << K);
          for (std::size_t i = 0; i + 1 < r.size(); ++i) CHECK(r[i][0] + r[i][1] <= r[i + 1][0]);
          CHECK(r.back()[0] + r.back()[1] <= y.lane_bytes);
          CHECK(y.total == y.lanes * y.lane_bytes);
        }
}
