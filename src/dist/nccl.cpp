// The NCCL backend of ad::dist::Communicator: CUDA tensors, one GPU per rank.
// Collectives are queued on the device's default stream (where ad's kernels
// run, so they are ordered with the step), followed by an event; waiting
// polls the event and NCCL's asynchronous error against the timeout, and a
// timeout or an asynchronous error aborts the NCCL communicator, marks the
// communicator broken (Impl::broken) and throws ad::Error.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "dist/impl.hpp"

#if AD_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "ad/cuda.hpp"
#include "cuda/launch.hpp"
#endif

namespace ad::dist {

#if AD_HAVE_NCCL
namespace {

#define AD_NCCL_CHECK(call, op)                                                                                 \
  do {                                                                                                          \
    ncclResult_t r_ = (call);                                                                                   \
    if (r_ != ncclSuccess)                                                                                      \
      throw Error(fmt::format("{}: {} failed ({}:{}): {}", op, #call, __FILE__, __LINE__, ncclGetErrorString(r_))); \
  } while (0)
#define AD_CUDART_CHECK(call, op)                                                                               \
  do {                                                                                                          \
    cudaError_t e_ = (call);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                    \
      (void)cudaGetLastError(); /* as check_call: not reported again by the next launch's check */              \
      throw Error(fmt::format("{}: {} failed ({}:{}): {}", op, #call, __FILE__, __LINE__, cudaGetErrorString(e_))); \
    }                                                                                                           \
  } while (0)

ncclComm_t comm_of(const Communicator::Impl& c) { return static_cast<ncclComm_t>(c.nccl); }
ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    default: return ncclInt64;
  }
}
struct OnDevice {
  int prev = 0;
  explicit OnDevice(int d) {
    cudaGetDevice(&prev);
    cudaSetDevice(d);
  }
  ~OnDevice() { cudaSetDevice(prev); }
};
std::string what(const Tensor& t) { return fmt::format("{}{}@cuda:{}", dtype_name(t.dtype()), t.shape().str(), t.device().index); }

// arg: the root or the reduce op (check_same); bad: this rank's own argument
// error, which fails every rank at once under MPI (the others would wait for
// this rank's NCCL call until the timeout)
void same_everywhere(const Communicator::Impl& c, const char* op, std::int64_t arg, const Tensor& t,
                     const std::string& bad) {
#if AD_HAVE_MPI
  if (c.mpi) {
    check_same(c, op, t.shape(), t.dtype(), arg, bad.empty() ? what(t) : std::string("an invalid call"), bad);
    return;
  }
#else
  (void)c, (void)op, (void)arg, (void)t;
#endif
  if (!bad.empty()) throw Error(bad);
}

// Aborts the NCCL communicator (its queued collectives end without
// completing) and marks the communicator broken with `error`, if not yet.
void abort_nccl(const Communicator::Impl& c, const std::string& error) {
  if (c.nccl) {
    ncclCommAbort(comm_of(c));
    const_cast<Communicator::Impl&>(c).nccl = nullptr;
  }
  if (c.broken.empty()) c.broken = error;
}

// The event is still pending on a broken communicator: its collective will not
// complete, so the NCCL communicator is aborted and the broken error thrown.
[[noreturn]] void pending_on_broken(const Communicator::Impl& c, const char* op) {
  abort_nccl(c, c.broken);
  throw_broken(c, op);
}

// Waits for `ev` (recorded after the queued work) against the timeout. On a
// broken communicator it queries once and does not wait.
void wait_event(const Communicator::Impl& c, cudaEvent_t ev, const char* op, const std::string& detail) {
  auto t0 = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) AD_CUDART_CHECK(q, op);
    if (!c.broken.empty() || !c.nccl) pending_on_broken(c, op);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_of(c), &async);
    if (async != ncclSuccess) {
      const std::string e = fmt::format("{}: NCCL reported {} on rank {} of {} ({}); the NCCL communicator was "
                                        "aborted",
                                        op, ncclGetErrorString(async), c.rank, c.size, detail);
      abort_nccl(c, e);
      throw Error(e);
    }
    if (c.options.timeout.count() > 0 && std::chrono::steady_clock::now() - t0 > c.options.timeout) {
      const std::string e = fmt::format("{}: no progress for {} ms on rank {} of {} ({}): a rank died, hangs or "
                                        "stopped calling collectives (dist::Options::timeout); the NCCL communicator "
                                        "was aborted",
                                        op, c.options.timeout.count(), c.rank, c.size, detail);
      abort_nccl(c, e);
      throw Error(e);
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    else std::this_thread::yield();
  }
}
void sync(const Communicator::Impl& c, const char* op, const std::string& detail) {
  cudaEvent_t ev;
  AD_CUDART_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), op);
  AD_CUDART_CHECK(cudaEventRecord(ev, 0), op);
  try {
    wait_event(c, ev, op, detail);
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  cudaEventDestroy(ev);
}
void scale(const Tensor& t, double by) {
  cuda_k::map1(t.dtype(), t.raw(), t.raw(), t.numel(), pw::MulScalar{1.0 / by});
}

}  // namespace

void nccl_init(Communicator::Impl& c) {
  const char* op = "dist::Communicator::from_env(nccl)";
  int n = cuda::device_count();
  if (n == 0) cuda::require(0);  // throws with the reason
  int local = 0;
  if (const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) local = std::atoi(lr);
  else if (const char* l2 = std::getenv("MPI_LOCALRANKID")) local = std::atoi(l2);
  c.device = c.options.device >= 0 ? c.options.device : local % n;
  cuda::require(c.device);
  OnDevice on(c.device);
  ncclUniqueId id;
  if (c.rank == 0) AD_NCCL_CHECK(ncclGetUniqueId(&id), op);
#if AD_HAVE_MPI
  if (c.mpi && MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, c.comm) != MPI_SUCCESS)
    throw Error(fmt::format("{}: broadcasting the NCCL id over MPI failed", op));
#endif
  ncclComm_t comm;
  AD_NCCL_CHECK(ncclCommInitRank(&comm, c.size, id, c.rank), op);
  c.nccl = comm;
}

Communicator::Impl::~Impl() {
  if (nccl) ncclCommDestroy(static_cast<ncclComm_t>(nccl));
}
Communicator::Work::Impl::~Impl() {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void nccl_all_reduce(const Communicator::Impl& c, Communicator::Work::Impl& w, const std::string& bad) {
  same_everywhere(c, "all_reduce", static_cast<std::int64_t>(w.op), w.t, bad);
  OnDevice on(c.device);
  cudaEvent_t ev;
  AD_CUDART_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "all_reduce");
  w.event = ev;  // destroyed with w
  AD_NCCL_CHECK(ncclAllReduce(w.t.raw(), w.t.raw(), static_cast<std::size_t>(w.t.numel()), nccl_type(w.t.dtype()),
                              ncclSum, comm_of(c), 0),
                "all_reduce");
  w.done = false;  // queued: from here w waits before its tensor may go
  if (w.op == ReduceOp::mean && c.size > 1) scale(w.t, c.size);
  AD_CUDART_CHECK(cudaEventRecord(ev, 0), "all_reduce");
  c.bytes += static_cast<std::int64_t>(w.t.nbytes());
}
void nccl_wait(Communicator::Work::Impl& w) {
  // after an abort the queued NCCL kernels exit early and the event completes anyway: the tensor may hold a
  // partial reduction, so work on a broken communicator is never reported done
  if (!w.c->broken.empty() || !w.c->nccl) pending_on_broken(*w.c, "all_reduce");
  wait_event(*w.c, static_cast<cudaEvent_t>(w.event), "all_reduce", what(w.t));
  w.done = true;
}
bool nccl_test(Communicator::Work::Impl& w) {
  if (!w.c->broken.empty() || !w.c->nccl) pending_on_broken(*w.c, "all_reduce");  // as nccl_wait
  cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(w.event));
  if (q == cudaErrorNotReady) return false;
  AD_CUDART_CHECK(q, "all_reduce");
  w.done = true;
  return true;
}
void nccl_broadcast(const Communicator::Impl& c, Tensor& t, int root, const std::string& bad) {
  same_everywhere(c, "broadcast", root, t, bad);
  OnDevice on(c.device);
  AD_NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), static_cast<std::size_t>(t.numel()), nccl_type(t.dtype()), root,
                              comm_of(c), 0),
                "broadcast");
  c.bytes += static_cast<std::int64_t>(t.nbytes());
  sync(c, "broadcast", what(t));
}
void nccl_reduce_scatter(const Communicator::Impl& c, const Tensor& in, Tensor& out, ReduceOp op,
                         const std::string& bad) {
  same_everywhere(c, "reduce_scatter", static_cast<std::int64_t>(op), in, bad);
  OnDevice on(c.device);
  AD_NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), static_cast<std::size_t>(out.numel()), nccl_type(in.dtype()),
                                  ncclSum, comm_of(c), 0),
                "reduce_scatter");
  if (op == ReduceOp::mean && c.size > 1) scale(out, c.size);
  c.bytes += static_cast<std::int64_t>(in.nbytes());
  sync(c, "reduce_scatter", what(in));
}
void nccl_all_gather(const Communicator::Impl& c, const Tensor& in, Tensor& out, const std::string& bad) {
  same_everywhere(c, "all_gather", 0, in, bad);
  OnDevice on(c.device);
  AD_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), static_cast<std::size_t>(in.numel()), nccl_type(in.dtype()),
                              comm_of(c), 0),
                "all_gather");
  c.bytes += static_cast<std::int64_t>(out.nbytes());
  sync(c, "all_gather", what(in));
}
void nccl_barrier(const Communicator::Impl& c) {
  Tensor one = Tensor::zeros({1}).to(Device::cuda(c.device));
  OnDevice on(c.device);
  AD_NCCL_CHECK(ncclAllReduce(one.raw(), one.raw(), 1, ncclFloat32, ncclSum, comm_of(c), 0), "barrier");
  sync(c, "barrier", "no data");
}

#else  // a build without NCCL

void nccl_init(Communicator::Impl&) {
  throw Error("dist::Communicator: this build has no NCCL backend (configure with AD_CUDA=ON and AD_NCCL=ON where "
              "the CUDA toolkit's NCCL is installed)");
}
Communicator::Impl::~Impl() = default;
Communicator::Work::Impl::~Impl() = default;
void nccl_all_reduce(const Communicator::Impl&, Communicator::Work::Impl&, const std::string&) {}
void nccl_wait(Communicator::Work::Impl&) {}
bool nccl_test(Communicator::Work::Impl&) { return true; }
void nccl_broadcast(const Communicator::Impl&, Tensor&, int, const std::string&) {}
void nccl_reduce_scatter(const Communicator::Impl&, const Tensor&, Tensor&, ReduceOp, const std::string&) {}
void nccl_all_gather(const Communicator::Impl&, const Tensor&, Tensor&, const std::string&) {}
void nccl_barrier(const Communicator::Impl&) {}

#endif

}  // namespace ad::dist
