// Data-parallel training (or ZeRO-1 with --zero) of an MLP regressor over
// MPI. Launch with the MPI launcher; every rank runs this program:
//   mpirun -np 2 ./dist_mlp [--zero] [--steps N] [--policy keep_all|sqrt_n]
// Without mpirun it trains as a world of one. At the end each rank's memory
// (parameters, gradients, optimizer state, activation peak) and the bytes it
// passed to collectives per step are printed next to the analytical values.
#include <ad/ad.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "../common/args.hpp"

namespace {

constexpr std::int64_t kIn = 32, kOut = 8, kRows = 4096, kGlobalBatch = 64;

// y = sin(x A) + noise, the same on every rank (seeded)
void make_data(ad::Tensor& X, ad::Tensor& Y) {
  ad::Rng rng(2024);
  X = ad::Tensor::randn({kRows, kIn}, rng);
  ad::Tensor A = ad::Tensor::randn({kIn, kOut}, rng, ad::DType::f32, 0, 0.3);
  Y = ad::Tensor::empty({kRows, kOut});
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t o = 0; o < kOut; ++o) {
      double s = 0;
      for (std::int64_t k = 0; k < kIn; ++k) s += X.data<float>()[i * kIn + k] * A.data<float>()[k * kOut + o];
      Y.data<float>()[i * kOut + o] = static_cast<float>(std::sin(s));
    }
}
ad::Tensor rows(const ad::Tensor& t, const std::vector<std::int64_t>& idx) {
  std::int64_t w = t.dim(1);
  ad::Tensor out = ad::Tensor::empty({static_cast<std::int64_t>(idx.size()), w});
  for (std::size_t i = 0; i < idx.size(); ++i)
    std::memcpy(out.data<float>() + static_cast<std::int64_t>(i) * w, t.data<float>() + idx[i] * w,
                static_cast<std::size_t>(w) * 4);
  return out;
}
std::string mib(std::int64_t b) { return fmt::format("{:.3f} MiB", static_cast<double>(b) / (1 << 20)); }

}  // namespace

int main(int argc, char** argv) {
  bool zero = false;
  std::int64_t steps = 300;
  std::string policy_name = "keep_all";
  try {
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--zero")) zero = true;
      else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = args::flag_whole(argv[i], argv[i + 1], 1), ++i;
      else if (!std::strcmp(argv[i], "--policy") && i + 1 < argc) policy_name = argv[++i];
      else {
        std::fprintf(stderr, "usage: %s [--zero] [--steps N] [--policy keep_all|sqrt_n]\n", argv[0]);
        return 2;
      }
    }
  } catch (const ad::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  ad::dist::Options opt;
  opt.timeout = std::chrono::seconds(30);
  auto comm = ad::dist::Communicator::from_env(opt);
  try {
    const int rank = comm.rank(), world = comm.size();
    if (kGlobalBatch % world != 0) throw ad::Error(fmt::format("the global batch {} must divide by {} ranks", kGlobalBatch, world));
    ad::Tensor X, Y;
    make_data(X, Y);
    ad::Rng rng(7 + static_cast<std::uint64_t>(rank));  // different per rank: rank 0's weights are broadcast
    ad::nn::MLP model({kIn, 256, 256, kOut}, rng, {});
    if (policy_name != "sqrt_n" && policy_name != "keep_all")
      throw ad::Error(fmt::format("--policy must be keep_all or sqrt_n, got \"{}\"", policy_name));
    ad::Policy policy = policy_name == "sqrt_n" ? ad::policy::sqrt_n() : ad::policy::keep_all();
    ad::nn::AdamOptions adam;
    adam.lr = 3e-3;

    // [snippet dp]
    std::unique_ptr<ad::dist::DataParallel> dp;
    std::unique_ptr<ad::nn::AdamW> opt_dp;
    std::unique_ptr<ad::dist::Zero1> opt_zero;
    if (zero) {
      opt_zero = std::make_unique<ad::dist::Zero1>(comm, model.named_parameters(), [&](ad::nn::NamedParameters shard) {
        return std::make_unique<ad::nn::AdamW>(std::move(shard), adam);
      });
    } else {
      dp = std::make_unique<ad::dist::DataParallel>(comm, model.parameters());  // broadcasts rank 0's weights
      opt_dp = std::make_unique<ad::nn::AdamW>(model.named_parameters(), adam);
    }
    // [end snippet]

    const std::int64_t per_rank = kGlobalBatch / world, steps_per_epoch = kRows / kGlobalBatch;
    ad::nn::Progress progress(rank == 0 ? steps : 0);
    ad::Report last;
    double loss_avg = 0, first_loss = 0;
    std::int64_t bytes_before = 0, bytes_per_step = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      std::int64_t epoch = s / steps_per_epoch, k = s % steps_per_epoch;
      auto shard = ad::dist::shard_indices(kRows, rank, world, 11, epoch);
      std::vector<std::int64_t> idx(shard.begin() + k * per_rank, shard.begin() + (k + 1) * per_rank);
      bytes_before = comm.bytes_communicated();
      // [snippet step]
      ad::Graph g;
      ad::Var loss = ad::mse(model(g.input(rows(X, idx))), g.input(rows(Y, idx)));
      if (zero) {
        last = opt_zero->backward(loss, policy);  // gradients reduce-scattered to their shard's owner
        opt_zero->step();                         // update this rank's shard, all-gather the parameters
        opt_zero->zero_grad();
      } else {
        last = dp->backward(loss, policy);        // gradients averaged over ranks while backward runs
        opt_dp->step();
        opt_dp->zero_grad();
      }
      // [end snippet]
      bytes_per_step = comm.bytes_communicated() - bytes_before;
      ad::Tensor l = ad::Tensor::full({1}, loss.value().item(), ad::DType::f64);
      comm.all_reduce(l, ad::dist::ReduceOp::mean);
      loss_avg = l.item();
      if (s == 0) first_loss = loss_avg;
      if (rank == 0) progress.update(s + 1, loss_avg, last);
    }
    progress.finish();

    // ---- per-rank memory and communication, gathered to rank 0 ----
    std::int64_t params = 0, largest = 0;
    for (const auto& p : model.parameters()) {
      params += static_cast<std::int64_t>(p.value().nbytes());
      largest = std::max<std::int64_t>(largest, static_cast<std::int64_t>(p.value().nbytes()));
    }
    std::int64_t state = zero ? opt_zero->state_bytes() : 0;
    if (!zero)
      for (const auto& nt : opt_dp->state()) state += static_cast<std::int64_t>(nt.second.nbytes());
    std::int64_t n_elems = params / 4;
    // analytical bytes handed to collectives per step: DP all-reduces every
    // gradient once; ZeRO-1 reduce-scatters the flat gradient and all-gathers
    // the flat parameters, both padded to world * ceil(N / world) elements
    std::int64_t padded = (n_elems + world - 1) / world * world * 4;
    std::int64_t analytical = zero ? 2 * padded : params;
    ad::Tensor mine = ad::Tensor::from(std::span<const double>(std::vector<double>{
                                           static_cast<double>(params), static_cast<double>(params),
                                           static_cast<double>(state), static_cast<double>(last.measured_peak_bytes),
                                           static_cast<double>(bytes_per_step)}),
                                       {5});
    ad::Tensor all = ad::Tensor::empty({5 * world}, ad::DType::f64);
    comm.all_gather(mine.to(ad::DType::f64), all);
    if (rank == 0) {
      fmt::print("\n{} on {} rank(s), policy {}, loss {:.5f} -> {:.5f}\n\n",
                 zero ? "ZeRO-1 AdamW" : "data-parallel AdamW", world, policy_name, first_loss, loss_avg);
      fmt::print("| rank | parameters | gradients | optimizer state | activations (step peak) | collectives per step "
                 "(analytical) |\n|---|---|---|---|---|---|\n");
      for (int r = 0; r < world; ++r) {
        const double* v = all.data<double>() + 5 * r;
        fmt::print("| {} | {} | {} | {} | {} | {} ({}) |\n", r, mib(static_cast<std::int64_t>(v[0])),
                   mib(static_cast<std::int64_t>(v[1])), mib(static_cast<std::int64_t>(v[2])),
                   mib(static_cast<std::int64_t>(v[3])), mib(static_cast<std::int64_t>(v[4])), mib(analytical));
      }
      fmt::print("\noptimizer state bound for ZeRO-1: total / world + largest parameter = {}\n",
                 mib(2 * params / world + 2 * largest));
    }
    // it learns: the loss at least halves (exit status for CI)
    if (loss_avg < 0.5 * first_loss) return 0;
    if (rank == 0) fmt::print(stderr, "the loss did not halve ({:.4f} -> {:.4f}): exit status 1\n", first_loss, loss_avg);
    return 1;
  } catch (const ad::Error& e) {
    fmt::print(stderr, "rank {}: {}\n", comm.rank(), e.what());
    comm.abort(1);
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "rank {}: out of host memory\n", comm.rank());
    comm.abort(1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "rank {}: {}\n", comm.rank(), e.what());
    comm.abort(1);
  }
}
