// bench/nn — the training toolkit's own costs, against physical references
// measured in the same run:
//   1. optimizer steps (SGD+momentum, Nesterov, Adam, AdamW) over one f32
//      parameter of N elements: ms per step and the bytes they must move
//      (SGD+momentum: read p, g, b, write p, b = 5 x 4 B per element; Adam:
//      read p, g, m, v, write p, m, v = 7 x 4 B) as GB/s, against memcpy's
//      GB/s (read + write) on buffers of the same size;
//   2. safetensors save (incl. fsync and rename) and load of the same tensor,
//      against writing (+fsync) and reading the same bytes with plain
//      write/read.
//
//   bench_nn [--n N] [--reps R] [--json] [--dir DIR]
#include <ad/ad.hpp>
#include "../cli.hpp"
#include "../timing.hpp"
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using bench_time::median_ms;

struct Row {
  std::string what;
  double ms, gbs, ref_gbs;
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table row as it is measured, also into a pipe
  std::int64_t n = 1 << 22;
  int reps = 21;
  bool json = false;
  std::string dir = "/tmp";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--n") && i + 1 < argc) n = bench_cli::whole(argc, argv, i, 1);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = bench_cli::whole_int(argc, argv, i, 1);
    else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else { std::fprintf(stderr, "usage: %s [--n N] [--reps R] [--json] [--dir DIR]\n", argv[0]); return 2; }
  }
  try {
    ad::Rng rng(1);
    auto bytes = static_cast<double>(n) * 4;
    // memcpy reference: read + write of 4N bytes
    std::vector<float> a(static_cast<std::size_t>(n), 1.0f), b(static_cast<std::size_t>(n));
    double memcpy_ms = median_ms(reps, [&] { std::memcpy(b.data(), a.data(), static_cast<std::size_t>(bytes)); });
    double memcpy_gbs = 2 * bytes / (memcpy_ms * 1e6);

    std::vector<Row> rows;
    auto bench_opt = [&](const std::string& name, int words, auto make) {
      ad::Parameter p(ad::Tensor::randn({n}, rng), "w");
      {
        ad::Graph g;
        ad::backward(ad::sum(ad::mul(g.param(p), g.input(ad::Tensor::randn({n}, rng)))));
      }
      auto opt = make(ad::nn::NamedParameters{{"w", p}});
      double ms = median_ms(reps, [&] { opt->step(); });
      rows.push_back({name, ms, words * bytes / (ms * 1e6), memcpy_gbs});
    };
    bench_opt("SGD momentum 0.9", 5, [](ad::nn::NamedParameters ps) {
      return std::make_unique<ad::nn::SGD>(ps, ad::nn::SGDOptions{1e-3, 0.9, 0, 0, false});
    });
    bench_opt("SGD Nesterov 0.9", 5, [](ad::nn::NamedParameters ps) {
      return std::make_unique<ad::nn::SGD>(ps, ad::nn::SGDOptions{1e-3, 0.9, 0, 0, true});
    });
    bench_opt("Adam", 7, [](ad::nn::NamedParameters ps) { return std::make_unique<ad::nn::Adam>(ps); });
    bench_opt("AdamW", 7, [](ad::nn::NamedParameters ps) { return std::make_unique<ad::nn::AdamW>(ps); });

    // safetensors against plain write+fsync / read of the same bytes
    ad::Tensor t = ad::Tensor::randn({n}, rng);
    std::string path = dir + "/bench_nn.safetensors", raw = dir + "/bench_nn.raw";
    double save_ms = median_ms(reps, [&] { ad::save_safetensors(path, {{"w", t}}); });
    double write_ms = median_ms(reps, [&] {
      int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || ::write(fd, t.raw(), t.nbytes()) != static_cast<ssize_t>(t.nbytes()) || ::fsync(fd) != 0)
        throw ad::Error("bench: raw write failed");
      ::close(fd);
    });
    double load_ms = median_ms(reps, [&] { (void)ad::load_safetensors(path); });
    std::vector<char> buf(t.nbytes());
    double read_ms = median_ms(reps, [&] {
      int fd = ::open(raw.c_str(), O_RDONLY);
      if (fd < 0 || ::read(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size()))
        throw ad::Error("bench: raw read failed");
      ::close(fd);
    });
    ::unlink(path.c_str());
    ::unlink(raw.c_str());
    rows.push_back({"save_safetensors (fsync)", save_ms, bytes / (save_ms * 1e6), bytes / (write_ms * 1e6)});
    rows.push_back({"load_safetensors", load_ms, bytes / (load_ms * 1e6), bytes / (read_ms * 1e6)});

    if (json) {
      std::printf("{\"n\": %lld, \"rows\": [", static_cast<long long>(n));
      for (std::size_t i = 0; i < rows.size(); ++i)
        std::printf("%s{\"what\": \"%s\", \"ms\": %.4f, \"gbs\": %.3f, \"ref_gbs\": %.3f}", i ? ", " : "",
                    rows[i].what.c_str(), rows[i].ms, rows[i].gbs, rows[i].ref_gbs);
      std::printf("]}\n");
    } else {
      std::printf("f32 parameter of %lld elements (%.1f MiB), median of %d\n\n", static_cast<long long>(n),
                  bytes / 1048576.0, reps);
      std::printf("| step | ms | GB/s moved | reference GB/s | ratio |\n|---|---:|---:|---:|---:|\n");
      for (const auto& r : rows)
        std::printf("| %s | %.3f | %.2f | %.2f | %.2f |\n", r.what.c_str(), r.ms, r.gbs, r.ref_gbs, r.gbs / r.ref_gbs);
      std::printf("\nreference: memcpy (read + write) for the optimizers; plain write+fsync / read of the same bytes "
                  "for safetensors\n");
    }
    return 0;
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
