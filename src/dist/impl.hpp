#pragma once
// Internal: the communicator's state, shared by the MPI code (comm.cpp) and
// the NCCL code (nccl.cpp).
#include <cstdint>
#include <string>

#include "ad/dist.hpp"

#if AD_HAVE_MPI
#include <mpi.h>
#endif

namespace ad::dist {

struct Communicator::Impl {
  int rank = 0, size = 1;
  Options options;
  bool mpi = false;
  mutable std::int64_t bytes = 0;
#if AD_HAVE_MPI
  MPI_Comm comm = MPI_COMM_NULL;
#endif
  // NCCL (GPU tensors): the communicator (an ncclComm_t; null once aborted), this rank's GPU
  void* nccl = nullptr;
  int device = -1;
  // The first error of a collective that timed out (or whose transfer failed)
  // on this communicator, "" while none has. Once set the communicator is
  // broken: a later collective throws at once, and a wait for work posted
  // before does not wait again (it tests once; a transfer still pending is
  // then left to run into memory that is kept, never freed).
  mutable std::string broken;
  bool uses_nccl() const { return options.backend == Backend::nccl; }
  ~Impl();
};

struct Communicator::Work::Impl {
  const Communicator::Impl* c = nullptr;
  Tensor t;
  ReduceOp op = ReduceOp::sum;
  bool done = true;   // false from when the collective is posted until it is waited for
  bool nccl = false;  // posted by NCCL (the mean is applied on the GPU), else by MPI
#if AD_HAVE_MPI
  MPI_Request req = MPI_REQUEST_NULL;
#endif
  void* event = nullptr;  // NCCL: a cudaEvent_t recorded after the collective
  void finish();          // MPI: applies the mean
  ~Impl();
};

// Throws the ad::Error of a collective `op` called, or waited for, on a broken
// communicator (Impl::broken).
[[noreturn]] void throw_broken(const Communicator::Impl& c, const char* op);
// Every rank passes the same number `n` of parameters to `who` (DataParallel,
// Zero1), else ad::Error on every rank. One all-reduce.
void check_same_count(const Communicator& c, const char* who, std::size_t n, const std::string& local_error = {});

// A parameter of `who` (DataParallel, Zero1) given a tensor of another shape,
// dtype or device after `who` was made: "" while `now` (its tensor) still
// matches (shape, dtype, device), else the ad::Error message, naming the
// parameter (`label`), both and what to do.
std::string changed_parameter(const char* where, const char* who, const std::string& label, const Shape& shape,
                              DType dtype, Device device, const Tensor& now);
// The message on the ranks where that parameter did not change, when some
// other rank's did.
std::string changed_elsewhere(const char* where, const char* who, const std::string& label, const Shape& shape,
                              DType dtype);

#if AD_HAVE_MPI
// Every rank passes `n` elements of dtype `d`, else ad::Error on every rank (MPI).
// local_error: this rank's own argument error ("" if none): thrown here, and
// every other rank throws that some rank's call was invalid.
void check_same(const Communicator::Impl& c, const char* op, const Shape& shape, DType d, std::int64_t arg,
                const std::string& mine, const std::string& local_error = {});
#endif

// ---- NCCL backend (nccl.cpp; in a build without NCCL, nccl_init throws and
// the rest is never reached) ----
void nccl_init(Communicator::Impl& c);  // picks the GPU, creates the communicator (id over MPI)
// bad: this rank's own argument error ("" if none), shared with every rank
// through the MPI check (check_same) when MPI runs the job, else thrown here.
// nccl_all_reduce marks w not done once the collective is queued.
void nccl_all_reduce(const Communicator::Impl& c, Communicator::Work::Impl& w, const std::string& bad);
void nccl_wait(Communicator::Work::Impl& w);
bool nccl_test(Communicator::Work::Impl& w);
void nccl_broadcast(const Communicator::Impl& c, Tensor& t, int root, const std::string& bad);
void nccl_reduce_scatter(const Communicator::Impl& c, const Tensor& in, Tensor& out, ReduceOp op, const std::string& bad);
void nccl_all_gather(const Communicator::Impl& c, const Tensor& in, Tensor& out, const std::string& bad);
void nccl_barrier(const Communicator::Impl& c);

}  // namespace ad::dist
