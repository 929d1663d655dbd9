// Communicator: collectives over MPI (CPU tensors), or a world of one.
// Every collective is non-blocking underneath and waited for against the
// communicator's timeout, so a dead or stuck rank turns into an ad::Error.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "ad/dist.hpp"
#include "ad/error.hpp"
#include "dist/impl.hpp"

namespace ad::dist {

bool have_mpi() { return AD_HAVE_MPI != 0; }
bool have_nccl() { return AD_HAVE_NCCL != 0; }


namespace {

std::string what(const Tensor& t) { return fmt::format("{}{}", dtype_name(t.dtype()), t.shape().str()); }

void check_tensor(const Communicator::Impl& c, const char* op, const Tensor& t, bool need_float) {
  if (!t.defined()) throw Error(fmt::format("{}: undefined tensor", op));
  if (c.uses_nccl() && !(t.device() == Device::cuda(c.device)))
    throw Error(fmt::format("{}: {} is not on cuda:{}, the GPU of this rank's NCCL communicator", op, what(t),
                            c.device));
  if (!c.uses_nccl() && t.device().kind != DeviceKind::cpu)
    throw Error(fmt::format("{}: {} is on a GPU; the MPI backend moves CPU tensors (Options::backend = "
                            "Backend::nccl for GPU tensors)", op, what(t)));
  DType d = t.dtype();
  if (d != DType::f32 && d != DType::f64 && (need_float || d != DType::i64))
    throw Error(fmt::format("{}: dtype of {} not supported (f32, f64{})", op, what(t), need_float ? "" : ", i64"));
  // MPI counts elements in an int (NCCL in a size_t)
  if (c.mpi && !c.uses_nccl() && t.numel() > std::numeric_limits<int>::max())
    throw Error(fmt::format("{}: {} has {} elements, more than MPI's count limit of 2^31-1 per call (split it)", op,
                            what(t), t.numel()));
}

// The ad::Error that f throws, or "" (a collective's local argument checks:
// under MPI every rank learns of an invalid call, check_same).
template <class F> std::string local_error(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

void divide(Tensor& t, double by) {
  if (t.dtype() == DType::f32) {
    auto* p = t.data<float>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(p[i] / by);
  } else {
    auto* p = t.data<double>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] /= by;
  }
}

#if AD_HAVE_MPI
std::string mpi_error(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(buf, static_cast<std::size_t>(len));
}
#define AD_MPI_CHECK(call, op)                                                                                  \
  do {                                                                                                          \
    int rc_ = (call);                                                                                           \
    if (rc_ != MPI_SUCCESS)                                                                                     \
      throw ::ad::Error(fmt::format("{}: {} failed ({}:{}): {}", op, #call, __FILE__, __LINE__, mpi_error(rc_))); \
  } while (0)

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    default: return MPI_INT64_T;
  }
}

// One MPI_Test of `req`: true when it has completed. A failed test breaks the
// communicator (Impl::broken) and throws; on a broken communicator a request
// still pending throws at once. Either way `keep`, the buffers the request may
// still write, is kept alive for good (leaked) rather than freed under it.
bool test_request(const Communicator::Impl& c, MPI_Request& req, const char* op, const std::vector<Tensor>& keep) {
  int done = 0;
  const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  if (rc == MPI_SUCCESS && done) return true;
  if (rc == MPI_SUCCESS && c.broken.empty()) return false;
  if (!keep.empty()) (void)new std::vector<Tensor>(keep);  // leaked on purpose
  if (rc != MPI_SUCCESS) {
    std::string e = fmt::format("{}: MPI_Test failed ({}:{}): {}", op, __FILE__, __LINE__, mpi_error(rc));
    if (c.broken.empty()) c.broken = e;
    throw Error(e);
  }
  throw_broken(c, op);
}

// Polls `req` until it completes. After the timeout the communicator is broken
// and ad::Error is thrown (keep: as test_request).
void wait_for(const Communicator::Impl& c, MPI_Request& req, const char* op, const std::string& detail,
              const std::vector<Tensor>& keep = {}) {
  auto t0 = std::chrono::steady_clock::now();
  int spins = 0;
  for (;;) {
    if (test_request(c, req, op, keep)) return;
    if (c.options.timeout.count() > 0 && std::chrono::steady_clock::now() - t0 > c.options.timeout) {
      if (!keep.empty()) (void)new std::vector<Tensor>(keep);  // leaked on purpose
      c.broken = fmt::format("{}: no progress for {} ms on rank {} of {} ({}): a rank died, hangs or stopped "
                             "calling collectives (dist::Options::timeout); end the job with Communicator::abort()",
                             op, c.options.timeout.count(), c.rank, c.size, detail);
      throw Error(c.broken);
    }
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    else std::this_thread::yield();
  }
}

}  // namespace
// Every rank must call the same collective (same root or reduce op: `arg`)
// on a tensor of the same shape and dtype: one small all-reduce of each
// field and its negation with MAX gives every field's largest and smallest
// value over the ranks, and a field whose two differ names the disagreement
// on every rank at once (rather than pairing mismatched calls).
void check_same(const Communicator::Impl& c, const char* op, const Shape& shape, DType d, std::int64_t arg,
                const std::string& mine, const std::string& local_error) {
  constexpr int F = 5 + kMaxRank;  // op, arg, dtype, rank, dims, and whether this rank's call was invalid
  std::int64_t f[F] = {};
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the collective's name
  for (const char* p = op; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  f[0] = static_cast<std::int64_t>(h >> 1);
  f[1] = arg;
  f[2] = static_cast<std::int64_t>(d);
  f[3] = shape.rank();
  for (int i = 0; i < shape.rank(); ++i) f[4 + i] = shape[i];
  f[F - 1] = local_error.empty() ? 0 : 1;
  Tensor vt = Tensor::empty({2 * F}, DType::i64);  // a tensor: kept alive, should the wait fail
  std::int64_t* v = vt.data<std::int64_t>();
  for (int i = 0; i < F; ++i) {
    v[i] = f[i];
    v[F + i] = -f[i];
  }
  MPI_Request req;
  AD_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v, 2 * F, MPI_INT64_T, MPI_MAX, c.comm, &req), op);
  wait_for(c, req, op, mine, {vt});
  auto other = [&](int i) { return v[i] == f[i] ? -v[F + i] : v[i]; };  // a value another rank has
  // a call one rank found invalid by itself fails on every rank, now rather than at the timeout
  if (!local_error.empty()) throw Error(local_error);
  if (v[F - 1] > 0)
    throw Error(fmt::format("{}: another rank's call was invalid (its own error says why); rank {} passed {}", op,
                            c.rank, mine));
  if (v[0] != -v[F])
    throw Error(fmt::format("{}: ranks call different collectives: rank {} calls {} on {} while another rank calls "
                            "another one (every rank must make the same collective calls in the same order)",
                            op, c.rank, op, mine));
  if (v[1] != -v[F + 1]) {
    const bool root = std::string(op) == "broadcast";
    auto name = [&](std::int64_t a) {
      return root ? std::to_string(a) : std::string(static_cast<ReduceOp>(a) == ReduceOp::mean ? "mean" : "sum");
    };
    throw Error(fmt::format("{}: ranks disagree on the {}: rank {} passes {}, another rank {}", op,
                            root ? "root" : "reduce op", c.rank, name(arg), name(other(1))));
  }
  for (int i = 2; i < F - 1; ++i)
    if (v[i] != -v[F + i])
      throw Error(fmt::format("{}: ranks disagree on the tensor: rank {} has {} but another rank's {} is {}", op, c.rank,
                              mine,
                              i == 2 ? "dtype"
                              : i == 3 ? "rank"
                                       : fmt::format("dimension {}", i - 4),
                              i == 2 ? std::string(dtype_name(static_cast<DType>(other(i)))) : std::to_string(other(i))));
}
namespace {

// Process-wide MPI state: initialised once, finalised at exit (MPI allows one
// init per process; this is the one global the library keeps, by necessity).
struct MpiEnv {
  bool mine = false;
  ~MpiEnv() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (mine && !fin) MPI_Finalize();
  }
};
MpiEnv& mpi_env() {
  static MpiEnv env;
  return env;
}
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}
#endif

}  // namespace

Communicator Communicator::local() {
  auto impl = std::make_shared<Impl>();
  return Communicator(impl);
}

Communicator Communicator::from_env(Options options) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
#if AD_HAVE_MPI
  if (!launched_by_mpi()) {
    if (options.backend == Backend::nccl) nccl_init(*impl);
    return Communicator(impl);
  }
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    AD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "dist::Communicator::from_env");
    mpi_env().mine = true;
  }
  AD_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm), "dist::Communicator::from_env");
  AD_MPI_CHECK(MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN), "dist::Communicator::from_env");
  MPI_Comm_rank(impl->comm, &impl->rank);
  MPI_Comm_size(impl->comm, &impl->size);
  impl->mpi = true;
#endif
  if (options.backend == Backend::nccl) nccl_init(*impl);
  return Communicator(impl);
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
int Communicator::device() const { return impl_->device; }
const char* Communicator::backend() const { return impl_->uses_nccl() ? "nccl" : impl_->mpi ? "mpi" : "local"; }
const Options& Communicator::options() const { return impl_->options; }
std::int64_t Communicator::bytes_communicated() const { return impl_->bytes; }

void Communicator::abort(int code) const {
#if AD_HAVE_MPI
  if (impl_->mpi) MPI_Abort(impl_->comm, code);
#endif
  std::_Exit(code);
}

void throw_broken(const Communicator::Impl& c, const char* op) {
  throw Error(fmt::format("{}: not run on rank {} of {}: an earlier collective on this communicator timed out or "
                          "failed, so it is broken (the first error: {})",
                          op, c.rank, c.size, c.broken));
}

// Every rank wraps the same number of parameters: over the ranks, size *
// sum(n^2) == sum(n)^2 only when every n is the same (Cauchy-Schwarz). A rank
// whose own arguments are invalid (local_error) counts -1, so the others
// fail too instead of waiting for its next collective; it throws its error.
void check_same_count(const Communicator& c, const char* who, std::size_t n, const std::string& local_error) {
  const std::int64_t k = local_error.empty() ? static_cast<std::int64_t>(n) : -1;
  Tensor t = Tensor::empty({2}, DType::i64);
  t.data<std::int64_t>()[0] = k;
  t.data<std::int64_t>()[1] = k * k;
  const bool gpu = std::string(c.backend()) == "nccl";  // NCCL moves tensors on its GPU only
  Tensor d = gpu ? t.to(Device::cuda(c.device())) : t;
  c.all_reduce(d);
  if (gpu) t = d.to(Device::cpu());
  if (!local_error.empty()) throw Error(local_error);
  const std::int64_t s = t.data<std::int64_t>()[0], s2 = t.data<std::int64_t>()[1];
  if (c.size() * s2 != s * s)
    throw Error(fmt::format("{}: ranks pass different numbers of parameters, or another rank's arguments are "
                            "invalid (its own error says why): rank {} passes {} (every rank must pass the same "
                            "parameters)",
                            who, c.rank(), n));
}

void Communicator::Work::Impl::finish() {
  done = true;
  if (op == ReduceOp::mean && c->size > 1) divide(t, c->size);
}
Communicator::Work::Work() = default;
Communicator::Work::Work(Work&&) noexcept = default;
// A Work dropped before wait() (gone out of scope, replaced, unwound past by
// an exception) waits for its collective first: the other ranks joined it,
// and MPI or NCCL would go on writing into its tensor after the tensor's
// memory was freed (a segfault, seen). Should that wait fail, the request
// and the tensor it holds are kept (leaked), never freed under a transfer.
void Communicator::Work::settle() noexcept {
  if (!impl_ || impl_->done) return;
  try {
    wait();
  } catch (...) {
    (void)impl_.release();
  }
}
Communicator::Work& Communicator::Work::operator=(Work&& o) noexcept {
  if (this != &o) {
    settle();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Communicator::Work::~Work() { settle(); }

// The backend that posted the Work finishes it (NCCL applied the mean on the
// GPU already; a communicator whose NCCL handle was aborted since is broken).
// On a broken communicator a wait tests once and throws if still pending.
void Communicator::Work::wait() {
  if (!impl_ || impl_->done) return;
  if (impl_->nccl) return nccl_wait(*impl_);
#if AD_HAVE_MPI
  wait_for(*impl_->c, impl_->req, "all_reduce", what(impl_->t));
#endif
  impl_->finish();
}
bool Communicator::Work::test() {
  if (!impl_ || impl_->done) return true;
  if (impl_->nccl) return nccl_test(*impl_);
#if AD_HAVE_MPI
  if (!test_request(*impl_->c, impl_->req, "all_reduce", {})) return false;
#endif
  impl_->finish();
  return true;
}

Communicator::Work Communicator::all_reduce_async(Tensor& t, ReduceOp op) const {
  if (!impl_->broken.empty()) throw_broken(*impl_, "all_reduce");
  t.mark_modified();  // written through raw(): graphs with it as a leaf recompute
  const std::string bad = local_error([&] { check_tensor(*impl_, "all_reduce", t, op == ReduceOp::mean); });
  if (!bad.empty() && !impl_->mpi) throw Error(bad);
  // done stays true until the collective is posted: a call that fails its
  // checks leaves t as it was (no mean applied when the Work is dropped)
  Work w;
  w.impl_ = std::make_unique<Work::Impl>();
  w.impl_->c = impl_.get();
  w.impl_->t = t;
  w.impl_->op = op;
  if (impl_->uses_nccl()) {
    w.impl_->nccl = true;
    nccl_all_reduce(*impl_, *w.impl_, bad);
    return w;
  }
#if AD_HAVE_MPI
  if (impl_->mpi) {
    check_same(*impl_, "all_reduce", t.shape(), t.dtype(), static_cast<std::int64_t>(op), what(t), bad);
    AD_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), static_cast<int>(t.numel()), mpi_type(t.dtype()), MPI_SUM,
                                impl_->comm, &w.impl_->req),
                 "all_reduce");
    w.impl_->done = false;
    impl_->bytes += static_cast<std::int64_t>(t.nbytes());
    return w;
  }
#endif
  w.impl_->finish();
  return w;
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) const { all_reduce_async(t, op).wait(); }

void Communicator::broadcast(Tensor& t, int root) const {
  if (!impl_->broken.empty()) throw_broken(*impl_, "broadcast");
  t.mark_modified();  // written through raw(): graphs with it as a leaf recompute
  const std::string bad = local_error([&] {
    check_tensor(*impl_, "broadcast", t, false);
    if (root < 0 || root >= size()) throw Error(fmt::format("broadcast: root {} is not a rank of {}", root, size()));
  });
  if (!bad.empty() && !impl_->mpi) throw Error(bad);
  if (impl_->uses_nccl()) return nccl_broadcast(*impl_, t, root, bad);
#if AD_HAVE_MPI
  if (!impl_->mpi) return;
  check_same(*impl_, "broadcast", t.shape(), t.dtype(), root, what(t), bad);
  MPI_Request req;
  AD_MPI_CHECK(MPI_Ibcast(t.raw(), static_cast<int>(t.numel()), mpi_type(t.dtype()), root, impl_->comm, &req),
               "broadcast");
  impl_->bytes += static_cast<std::int64_t>(t.nbytes());
  wait_for(*impl_, req, "broadcast", what(t), {t});
#endif
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) const {
  if (!impl_->broken.empty()) throw_broken(*impl_, "reduce_scatter");
  out.mark_modified();  // written through raw(): graphs with it as a leaf recompute
  const std::string bad = local_error([&] {
    check_tensor(*impl_, "reduce_scatter", in, op == ReduceOp::mean);
    check_tensor(*impl_, "reduce_scatter", out, op == ReduceOp::mean);
    if (in.dtype() != out.dtype() || in.numel() != out.numel() * size())
      throw Error(fmt::format("reduce_scatter: in {} must hold world size ({}) x out {} elements of one dtype", what(in),
                              size(), what(out)));
  });
  if (!bad.empty() && !impl_->mpi) throw Error(bad);
  if (impl_->uses_nccl()) return nccl_reduce_scatter(*impl_, in, out, op, bad);
#if AD_HAVE_MPI
  if (impl_->mpi) {
    check_same(*impl_, "reduce_scatter", in.shape(), in.dtype(), static_cast<std::int64_t>(op), what(in), bad);
    MPI_Request req;
    AD_MPI_CHECK(MPI_Ireduce_scatter_block(in.raw(), out.raw(), static_cast<int>(out.numel()), mpi_type(in.dtype()),
                                           MPI_SUM, impl_->comm, &req),
                 "reduce_scatter");
    impl_->bytes += static_cast<std::int64_t>(in.nbytes());
    wait_for(*impl_, req, "reduce_scatter", what(in), {in, out});
    if (op == ReduceOp::mean) divide(out, size());
    return;
  }
#endif
  if (out.raw() != in.raw()) std::memcpy(out.raw(), in.raw(), in.nbytes());
}

void Communicator::all_gather(const Tensor& in, Tensor& out) const {
  if (!impl_->broken.empty()) throw_broken(*impl_, "all_gather");
  out.mark_modified();  // written through raw(): graphs with it as a leaf recompute
  const std::string bad = local_error([&] {
    check_tensor(*impl_, "all_gather", in, false);
    check_tensor(*impl_, "all_gather", out, false);
    if (in.dtype() != out.dtype() || out.numel() != in.numel() * size())
      throw Error(fmt::format("all_gather: out {} must hold world size ({}) x in {} elements of one dtype", what(out),
                              size(), what(in)));
  });
  if (!bad.empty() && !impl_->mpi) throw Error(bad);
  if (impl_->uses_nccl()) return nccl_all_gather(*impl_, in, out, bad);
#if AD_HAVE_MPI
  if (impl_->mpi) {
    check_same(*impl_, "all_gather", in.shape(), in.dtype(), 0, what(in), bad);
    MPI_Request req;
    AD_MPI_CHECK(MPI_Iallgather(in.raw(), static_cast<int>(in.numel()), mpi_type(in.dtype()), out.raw(),
                                static_cast<int>(in.numel()), mpi_type(in.dtype()), impl_->comm, &req),
                 "all_gather");
    impl_->bytes += static_cast<std::int64_t>(out.nbytes());
    wait_for(*impl_, req, "all_gather", what(in), {in, out});
    return;
  }
#endif
  if (out.raw() != in.raw()) std::memcpy(out.raw(), in.raw(), in.nbytes());
}

void Communicator::barrier() const {
  if (!impl_->broken.empty()) throw_broken(*impl_, "barrier");
#if AD_HAVE_MPI
  // checked as the other collectives are: a rank in barrier() while another is
  // in all_reduce() is an ad::Error on both (unchecked, MPI failed with
  // MPI_ERR_TRUNCATE, fatal under Open MPI's default error handler)
  if (impl_->mpi) check_same(*impl_, "barrier", Shape{}, DType::f32, 0, "no data");
#endif
  if (impl_->uses_nccl()) return nccl_barrier(*impl_);
#if AD_HAVE_MPI
  if (!impl_->mpi) return;
  MPI_Request req;
  AD_MPI_CHECK(MPI_Ibarrier(impl_->comm, &req), "barrier");
  wait_for(*impl_, req, "barrier", "no data");
#endif
}

}  // namespace ad::dist
