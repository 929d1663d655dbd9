// The training toolkit end to end: an MLP regressor (modules), AdamW with a
// warmup + cosine schedule, gradient clipping, a progress line, and a
// checkpoint every 50 steps (and at the last) that a later run resumes from
// bit for bit.
// The part between the snippet markers is the loop shown in
// docs/training.md (scripts/check-snippets.sh, run by ctest, compares them).
//
//   ./toolkit [--steps N] [--checkpoint PATH] [--resume]
#include <ad/ad.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "../common/args.hpp"

namespace {
// y = sin(3 x0) * x1 for x [N, 2] -> [N, 1]
ad::Tensor target(const ad::Tensor& x) {
  std::int64_t n = x.dim(0);
  ad::Tensor y = ad::Tensor::empty({n, 1});
  const float* xv = x.data<float>();
  float* yv = y.data<float>();
  for (std::int64_t i = 0; i < n; ++i) yv[i] = std::sin(3.0f * xv[2 * i]) * xv[2 * i + 1];
  return y;
}
}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 200;
  std::string ckpt = "toolkit.safetensors";
  bool resume = false;
  try {
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = args::flag_whole(argv[i], argv[i + 1], 1), ++i;
      else if (!std::strcmp(argv[i], "--checkpoint") && i + 1 < argc) ckpt = argv[++i];
      else if (!std::strcmp(argv[i], "--resume")) resume = true;
      else { std::fprintf(stderr, "usage: %s [--steps N] [--checkpoint PATH] [--resume]\n", argv[0]); return 2; }
    }
  } catch (const ad::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    // [snippet loop]
    ad::Rng rng(1);
    ad::nn::MLPOptions mo;
    mo.activation = ad::nn::Activation::gelu;
    ad::nn::MLP model({2, 64, 64, 1}, rng, mo);  // parameters "layers.0.weight", ...
    ad::nn::AdamW opt(model.named_parameters());
    opt.set_schedule(ad::nn::LrSchedule::warmup_cosine(1e-2, std::min<std::int64_t>(20, steps), steps));

    ad::Rng data(2);  // the batches' random stream
    std::int64_t step = 0;
    if (resume) {  // parameters, optimizer state, and where the data stream was
      ad::Metadata m = ad::nn::load_checkpoint(ckpt, model, opt);
      const std::string was = m.count("steps") ? m.at("steps") : "?";
      if (was != std::to_string(steps))  // the learning-rate schedule's length
        throw ad::Error(fmt::format("{} is from a run of --steps {}: resume with that value", ckpt, was));
      step = std::stoll(m.at("step"));
      data.reserve(std::stoull(m.at("data_offset")));
    }
    ad::nn::ProgressOptions po;
    po.label = "fit";
    po.start_step = step;
    ad::nn::Progress progress(steps, po);
    double loss_value = 0;
    while (step < steps) {
      ad::Tensor x = ad::Tensor::uniform({64, 2}, data, ad::DType::f32, -1, 1);
      ad::Graph g;
      ad::Var loss = ad::mse(model(g.input(x)), g.input(target(x)));
      ad::Report r = ad::backward(loss);
      ad::nn::clip_grad_norm(opt.params(), 1.0);
      opt.step();
      opt.zero_grad();
      loss_value = loss.value().item();
      progress.update(++step, loss_value, r);
      if (step % 50 == 0 || step == steps)  // and at the end, so a finished run resumes to "nothing to do"
        ad::nn::save_checkpoint(ckpt, model, opt,
                                {{"step", std::to_string(step)}, {"steps", std::to_string(steps)},
                                 {"data_offset", std::to_string(data.offset())}});
    }
    // [end snippet]
    if (po.start_step >= steps) {
      fmt::print("nothing to do: {} is at step {} of {}\n", ckpt, po.start_step, steps);
      return 0;
    }
    progress.finish();
    ad::SafeTensors st = ad::load_safetensors(ckpt);
    fmt::print("final loss {:.5f}; {} holds {} tensors at step {}\n", loss_value, ckpt, st.tensors.size(),
               st.metadata.count("step") ? st.metadata.at("step") : "?");
    return 0;
  } catch (const ad::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {  // a checkpoint without this program's metadata (step, data_offset)
    fmt::print(stderr, "error: {} is not a checkpoint of this program ({})\n", ckpt, e.what());
    return 1;
  }
}
