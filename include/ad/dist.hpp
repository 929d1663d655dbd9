#pragma once
// ad::dist — collectives over existing engines (MPI for CPU tensors; NCCL for
// CUDA tensors, Backend::nccl) and data-parallel training on top.
//
// Launch with the MPI launcher; every rank runs the same program:
//   mpirun -np 4 ./train
//   auto comm = ad::dist::Communicator::from_env();   // MPI_Init from the launcher's environment
//   ad::dist::DataParallel dp(comm, model_params);    // broadcasts rank 0's parameters
//   ... ad::Report r = dp.backward(loss, policy);      // gradients averaged over ranks
// A build without MPI (AD_MPI=OFF) or a process started without a launcher
// gets a world of one rank, where every collective is the identity.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ad/graph.hpp"
#include "ad/nn/optim.hpp"
#include "ad/policy.hpp"
#include "ad/schedule.hpp"
#include "ad/tensor.hpp"

namespace ad::dist {

enum class ReduceOp { sum, mean };

// True when this build can use the backend.
bool have_mpi();
bool have_nccl();

// mpi: CPU tensors over MPI. nccl: CUDA tensors over NCCL, one GPU per rank
// (the launcher's local rank modulo the GPUs, or Options::device), with the
// NCCL id broadcast over MPI (a process started without a launcher is a world
// of one). Needs a build with AD_NCCL.
enum class Backend { mpi, nccl };

struct Options {
  // A collective that makes no progress for this long throws ad::Error
  // (a rank died, hangs, or stopped calling collectives). 0: wait forever.
  // The communicator is broken from then on: every later collective on it
  // throws at once, and waiting for work posted before (Work::wait, a Work
  // dropped while unwinding) tests it once rather than waiting another
  // timeout, so the error arrives after one timeout however many collectives
  // were in flight. Buffers a broken transfer may still write are leaked,
  // never freed. What is left is to report it and call Communicator::abort().
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  Backend backend = Backend::mpi;
  int device = -1;  // nccl: this rank's GPU; -1: local rank modulo the visible GPUs
};

class Communicator {
 public:
  // Initialises MPI (once per process, thread level "funneled") from the
  // launcher's environment and returns the world communicator. Without MPI
  // in the build, a world of one. Throws ad::Error if MPI fails to start.
  static Communicator from_env(Options options = {});
  // A world of one rank (no MPI calls), for single-process runs and tests.
  static Communicator local();

  int rank() const;
  int size() const;
  const char* backend() const;  // "mpi", "nccl" or "local"
  const Options& options() const;

  // With the nccl backend every tensor must be on this rank's GPU
  // (Device::cuda(device())); with mpi, on the CPU.
  int device() const;
  // In place over all ranks. Every rank passes a tensor of the same shape and
  // dtype (f32, f64 or i64; mean needs f32/f64; with MPI at most 2^31-1
  // elements). Checked before any data moves, for every collective (barrier
  // included): ranks that differ in shape, dtype, root or reduce op, or that
  // call different collectives, all get an ad::Error naming the difference,
  // and their tensors are left as they were; an argument error one rank finds
  // alone (mean on i64) is thrown there and, under MPI, every other rank
  // learns at once that a call was invalid (with NCCL they reach the
  // timeout). Blocking, with the timeout.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum) const;
  // Root's values into t on every rank (same shape and dtype everywhere).
  void broadcast(Tensor& t, int root = 0) const;
  // in: (size * n) elements on every rank; out: (n) elements = rank's block
  // of the reduction. Shapes checked.
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::sum) const;
  // in: n elements per rank; out: size * n elements, rank r's block at r * n.
  void all_gather(const Tensor& in, Tensor& out) const;
  void barrier() const;

  // Non-blocking all_reduce of t (sum, or mean: applied at wait() under MPI,
  // queued after the collective under NCCL). t must stay untouched until
  // wait() returns. A Work destroyed or assigned over before wait() waits for
  // its collective then (errors swallowed; should that wait fail, the
  // tensor's buffer is kept alive, leaked, rather than freed under a
  // transfer; on a broken communicator it does not wait: Options::timeout):
  // call wait() to see its errors.
  class Work {
   public:
    Work();
    Work(Work&&) noexcept;
    Work& operator=(Work&&) noexcept;
    ~Work();
    // Blocks until done (with the communicator's timeout); idempotent.
    void wait();
    // Advances MPI's progress engine; true when complete.
    bool test();
    struct Impl;

   private:
    friend class Communicator;
    void settle() noexcept;
    std::unique_ptr<Impl> impl_;
  };
  Work all_reduce_async(Tensor& t, ReduceOp op = ReduceOp::sum) const;

  // Bytes of the full-size buffers of the collectives this rank has run
  // (all_reduce and broadcast: the tensor; reduce_scatter: its input;
  // all_gather: its output). A bandwidth-optimal algorithm sends
  // (size-1)/size of that per rank, twice for all_reduce.
  std::int64_t bytes_communicated() const;

  // Ends every rank of the job (MPI_Abort) with `code`; for a program whose
  // collective failed, so the launcher does not wait for the others.
  [[noreturn]] void abort(int code = 1) const;

  struct Impl;

 private:
  explicit Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// Data-parallel training. Parameters are broadcast from rank 0 when it is
// made. backward() runs ad::backward on this rank's loss and averages each
// parameter's gradient over the ranks: gradients are packed into buckets of
// about `bucket_bytes` in the order backward produces them, and a bucket's
// all-reduce starts as soon as its last gradient has been accumulated, so
// communication overlaps with the rest of backward (MPI progresses it each
// time another gradient is ready). Any rematerialisation policy works
// unchanged: the schedule is per rank. Every rank passes the same number of
// parameters (else ad::Error on every rank). A parameter given a tensor of
// another shape, dtype or device after this was made (a bucket's sizes are
// fixed then) makes backward() and all_reduce_gradients() throw ad::Error on
// every rank, whether one rank or all changed it: it names the parameter,
// was and is (on the ranks that changed it), and asks for a new
// DataParallel; no gradient is written.
class DataParallel {
 public:
  DataParallel(Communicator comm, std::vector<Parameter> params, std::int64_t bucket_bytes = 4 << 20);
  Report backward(const Var& loss, const Policy& policy = policy::keep_all());
  // Averages the gradients already accumulated (for a custom backward).
  void all_reduce_gradients();
  const Communicator& comm() const { return comm_; }
  const std::vector<Parameter>& params() const { return params_; }
  std::int64_t buckets() const { return static_cast<std::int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<std::size_t> members;  // indices into params_
    std::int64_t elems = 0;
    DType dtype = DType::f32;
  };
  struct Held {  // a parameter as it was when this was made: its bucket slot's size and place
    Shape shape;
    DType dtype = DType::f32;
    Device device;
  };
  void build_buckets(std::int64_t bucket_bytes);
  std::string changed(const char* where, std::size_t i) const;
  Communicator comm_;
  std::vector<Parameter> params_;
  std::vector<Held> held_;
  std::vector<Bucket> buckets_;
};

// ZeRO stage 1: the optimizer state is partitioned across ranks. All
// parameters (one dtype, f32 or f64) are viewed as one flat vector of N
// elements, padded to world x S with S = ceil(N / world); rank r owns
// elements [r S, (r + 1) S). Each parameter's part of that range is a flat
// segment, and `make_optimizer` builds an optimizer over this rank's segments,
// each named after its parameter (so any ad::nn optimizer works: Adam, AdamW,
// SGD with momentum; a rank whose range is all padding gets none). A step is:
//   backward(loss, policy)  gradients, then reduce_scatter(mean) of the flat
//                           gradient: each rank gets its range's average,
//                           and which parameters any rank's loss reached;
//   step()                  the optimizer updates the segments of the
//                           parameters some rank reached (as an unsharded
//                           optimizer skips one without a fresh gradient),
//                           then all_gather puts the full parameters on
//                           every rank.
// Per-rank optimizer-state bytes (state_bytes()) are the unsharded total /
// world plus at most one element per slot of padding and a step count per
// segment. state() returns the full state in the unsharded optimizer's format
// ("step", "<name>.step", "<name>.<slot>" per parameter stepped at least once;
// gathered from all ranks), and load_state() takes that format and keeps this
// rank's part, so a run saved with one world size resumes on another.
// Parameters hold no lower-precision copies in this engine (they are f32 or
// f64), so there are no separate master weights. Every rank passes the same
// number of parameters (else ad::Error on every rank). A parameter given a
// tensor of another shape, dtype or device after this was made (the flat
// layout is fixed then) makes backward()/reduce_gradients() and step() throw
// ad::Error on every rank, whether one rank or all changed it, naming it and
// asking for a new Zero1; load_state() throws it on the ranks that changed it.
// Every rank knows the outcome before anything of this Zero1 changes: no
// parameter is written, no rank's optimizer shard is stepped (its moments and
// step counts stay), no segment gradient is taken. (backward() has run
// ad::backward first: what it accumulated into this rank's parameters'
// gradients stays, as after a plain ad::backward; zero_grad() clears it.)
// step() costs one all-gather of a flag per rank for this, before the step.
class Zero1 {
 public:
  using MakeOptimizer = std::function<std::unique_ptr<nn::Optimizer>(nn::NamedParameters shard)>;
  // Broadcasts rank 0's parameters, then takes this rank's shard.
  Zero1(Communicator comm, nn::NamedParameters params, MakeOptimizer make_optimizer);
  Report backward(const Var& loss, const Policy& policy = policy::keep_all());
  // Averages the gradients already accumulated into this rank's shard.
  void reduce_gradients();
  void step();
  void zero_grad() const;

  nn::Optimizer& optimizer() { return *opt_; }  // the shard's (learning rate, schedule)
  std::int64_t state_bytes() const;             // this rank's optimizer state
  std::int64_t unsharded_state_bytes() const;   // what one unsharded optimizer would hold
  std::int64_t largest_parameter_bytes() const;
  std::int64_t shard_elements() const { return shard_; }

  nn::NamedTensors state() const;  // collective: every rank must call it
  // Throws ad::Error naming the tensor (on every rank alike: each checks the
  // whole state) for a missing "step", an unknown name, a slot without its
  // "<name>.step", or a shape or dtype that differs from the parameter's.
  void load_state(const nn::NamedTensors& state);

 private:
  // params_[param]'s flat elements [lo, hi), at offset `at` of this rank's range
  struct Segment {
    std::size_t param;
    std::int64_t lo, hi, at;
    Parameter p;
  };
  // all_gather of every rank's `flag` (its first changed parameter + 1, 0 if
  // none): the largest over the ranks
  std::int64_t changed_anywhere(std::int64_t flag) const;
  // all_gather of the segments into the parameters on every rank
  void gather_parameters();
  std::string changed(const char* where, std::size_t i) const;  // "" or the error (see changed_parameter)
  Communicator comm_;
  nn::NamedParameters params_;
  std::vector<Shape> shapes_;  // per parameter, when this was made (its part of the flat vector)
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
  std::int64_t total_ = 0, shard_ = 0, begin_ = 0;  // N, S, r S
  std::vector<Segment> segs_;
  mutable std::vector<char> reached_;  // per parameter: some rank's loss reached it since zero_grad
  std::vector<std::int64_t> steps_;  // per parameter: its updates so far (the same on every rank)
  std::unique_ptr<nn::Optimizer> opt_;
};

// Which examples of a dataset of n this rank sees in an epoch: a permutation
// of 0..n-1 drawn from (seed, epoch) — the same on every rank — split into
// `world` strided shards; the last (n mod world) examples of the permutation
// are dropped so every rank takes the same number of steps.
std::vector<std::int64_t> shard_indices(std::int64_t n, int rank, int world, std::uint64_t seed, std::int64_t epoch,
                                        bool shuffle = true);

}  // namespace ad::dist
