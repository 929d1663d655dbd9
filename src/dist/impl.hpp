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
  // NCCL (GPU tensors): the communicator (an ncclComm_t), this rank's GPU
  void* nccl = nullptr;
  int device = -1;
  ~Impl();
};

struct Communicator::Work::Impl {
  const Communicator::Impl* c = nullptr;
  Tensor t;
  ReduceOp op = ReduceOp::sum;
  bool done = true;
#if AD_HAVE_MPI
  MPI_Request req = MPI_REQUEST_NULL;
#endif
  void* event = nullptr;  // NCCL: a cudaEvent_t recorded after the collective
  void finish();          // MPI: applies the mean
  ~Impl();
};

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
// through the MPI check (check_same) when MPI runs the job, else thrown here
void nccl_all_reduce(const Communicator::Impl& c, Communicator::Work::Impl& w, const std::string& bad);
void nccl_wait(Communicator::Work::Impl& w);
bool nccl_test(Communicator::Work::Impl& w);
void nccl_broadcast(const Communicator::Impl& c, Tensor& t, int root, const std::string& bad);
void nccl_reduce_scatter(const Communicator::Impl& c, const Tensor& in, Tensor& out, ReduceOp op, const std::string& bad);
void nccl_all_gather(const Communicator::Impl& c, const Tensor& in, Tensor& out, const std::string& bad);
void nccl_barrier(const Communicator::Impl& c);

}  // namespace ad::dist
