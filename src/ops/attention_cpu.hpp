#pragma once
// CPU kernels of attention over raw pointers (src/ops/attention_cpu.cpp).
// Layouts are row-major: q, o [B, H, Nq, d]; k, v [B, Hkv, Nk, d];
// lse [B, H, Nq]; key lengths [B] (nullptr: no padding).
#include <cstddef>
#include <cstdint>

namespace ad::attn {

struct Dims {
  std::int64_t B = 0, H = 0, Hkv = 0, Nq = 0, Nk = 0, d = 0;
  bool causal = false;
  double scale = 1;
  int threads = 0;  // worker threads; 0: threads_for() (what the op uses). Tests set it.
  std::int64_t group() const { return Hkv ? H / Hkv : 1; }  // query heads per key/value head
};

// Tile sizes (query rows x keys), fixed per d so results never depend on
// anything but the shapes. Chosen so that one tile's products (br x bc x d)
// stay within OpenBLAS's single-thread size and the tile fits in L2.
struct Tiles { std::int64_t br, bc; };
Tiles tiles_for(std::int64_t d);

// (i, j) pairs the causal mask leaves visible over all rows (Nq Nk without
// it); key lengths are data, not counted. The cost model's unit.
double visible_pairs(const Dims& dm);

// Worker threads for a kernel: dm.threads if set, else min(hardware threads,
// independent units), 1 for small problems. A function of the shapes only
// (the workspace, which the planner counts, depends on it).
int threads_for(const Dims& dm, bool backward);

// The forward node's value [O | lse], in elements of the input dtype (elem
// bytes each): O [B,H,Nq,d] first, then lse [B,H,Nq] in the accumulate type
// (f64 for f64 inputs, f32 otherwise). For bf16/f16 inputs each f32 lse takes
// two elements, from an even element offset (4-byte aligned).
inline std::int64_t lse_offset(const Dims& dm, std::size_t elem) {
  const std::int64_t no = dm.B * dm.H * dm.Nq * dm.d;
  return elem == 2 ? (no + 1) / 2 * 2 : no;
}
inline std::int64_t buffer_elems(const Dims& dm, std::size_t elem) {
  return lse_offset(dm, elem) + dm.B * dm.H * dm.Nq * (elem == 2 ? 2 : 1);
}

// Scratch bytes of the kernels (tile buffers per thread). elem = 2 (bf16,
// f16 inputs): also the f32 copies of the inputs and outputs that the half
// entry points below convert through.
std::int64_t forward_workspace_bytes(const Dims& dm, std::size_t elem);
std::int64_t backward_workspace_bytes(const Dims& dm, std::size_t elem);

// o = softmax(scale q k^T + mask) v, lse = log-sum-exp of each masked score
// row (-inf, and o = 0, for a fully masked row). Tiled over keys with an
// online softmax; parallel over (b, h); deterministic.
template <class T>
void forward_cpu(const Dims& dm, const T* q, const T* k, const T* v, const std::int64_t* lens, T* o, T* lse, void* ws);

// dq, dk, dv from dO (and dlse, the gradient of lse, nullptr for none),
// recomputing the probabilities tile by tile from q, k and lse. Parallel
// over (b, kv head); each unit accumulates its query heads in a fixed order,
// so results do not depend on the thread count.
template <class T>
void backward_cpu(const Dims& dm, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                  const T* dlse, const std::int64_t* lens, T* dq, T* dk, T* dv, void* ws);

// bf16 / f16 inputs (bf16 when `bf16`, else f16; raw 16-bit values): the
// inputs are converted to f32 in the workspace, the f32 kernels above run
// (f32 accumulation throughout), and o (dq, dk, dv) are rounded to nearest
// even once at the end. lse and dlse are f32.
void forward_cpu_half(const Dims& dm, bool bf16, const std::uint16_t* q, const std::uint16_t* k,
                      const std::uint16_t* v, const std::int64_t* lens, std::uint16_t* o, float* lse, void* ws);
void backward_cpu_half(const Dims& dm, bool bf16, const std::uint16_t* q, const std::uint16_t* k,
                       const std::uint16_t* v, const std::uint16_t* o, const float* lse, const std::uint16_t* dout,
                       const float* dlse, const std::int64_t* lens, std::uint16_t* dq, std::uint16_t* dk,
                       std::uint16_t* dv, void* ws);

}  // namespace ad::attn
