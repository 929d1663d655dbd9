// Progress line: plain lines when not a terminal, in-place redraws ('\r')
// on one, the text of a line, byte and time formatting. Times are given
// explicitly (update_at), so nothing depends on the wall clock.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "ad/ad.hpp"

namespace {

namespace nn = ad::nn;

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  int c;
  while ((c = std::fgetc(f)) != EOF) s += static_cast<char>(c);
  return s;
}

int count(const std::string& s, char c) {
  int n = 0;
  for (char x : s) n += x == c;
  return n;
}

}  // namespace

TEST_CASE("nn progress line text") {
  CHECK(nn::Progress::format("train", 120, 1000, 2.34567, 85.25, "step", 13107200, 10.4) ==
        "train  step 120/1000 (12%)  loss 2.3457  85.2 step/s  peak 12.5 MiB  ETA 10s");
  CHECK(nn::Progress::format("", 5, 0, 1.0, 0, "step", -1, -1) == "step 5  loss 1.0000");
  CHECK(nn::Progress::format("", 5, 10, 1.0, 2048.4, "token", 100, 3) ==
        "step 5/10 (50%)  loss 1.0000  2048 token/s  peak 100 B  ETA 3.0s");
  CHECK(nn::format_bytes(1023) == "1023 B");
  CHECK(nn::format_bytes(1536) == "1.5 KiB");
  CHECK(nn::format_bytes(3ll << 30) == "3.0 GiB");
  CHECK(nn::format_seconds(0.42) == "0.4s");
  CHECK(nn::format_seconds(59.6) == "1m00s");
  CHECK(nn::format_seconds(185) == "3m05s");
  CHECK(nn::format_seconds(3720) == "1h02m");
}

TEST_CASE("nn progress plain lines when not a terminal") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    nn::ProgressOptions o;
    o.out = f;
    o.tty = 0;
    o.print_every = 3;
    o.items_per_step = 32;
    o.item_name = "sample";
    nn::Progress p(10, o);
    CHECK_FALSE(p.tty());
    for (int s = 1; s <= 10; ++s) p.update_at(0.5 * s, s, 1.0 / s, 1000 * s);
  }
  std::string out = contents(f);
  std::fclose(f);
  INFO(out);
  CHECK(count(out, '\r') == 0);
  CHECK(count(out, '\n') == 4);  // steps 3, 6, 9 and the last
  CHECK(out.find("step 3/10 (30%)  loss 0.3333  64.0 sample/s  peak 2.9 KiB  ETA 3.5s\n") != std::string::npos);
  CHECK(out.find("step 10/10 (100%)  loss 0.1000  64.0 sample/s  peak 9.8 KiB  in 5.0s\n") != std::string::npos);
}

TEST_CASE("nn progress redraws in place on a terminal") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    nn::ProgressOptions o;
    o.out = f;
    o.tty = 1;
    o.redraw_seconds = 1.0;
    o.label = "fit";
    o.start_step = 100;  // a resumed run: throughput counts from here
    nn::Progress p(0, o);
    p.update_at(0.5, 101, 10.0);   // drawn (first)
    p.update_at(1.0, 102, 9.0);    // too soon
    p.update_at(1.6, 104, 123.5);  // drawn
    p.update_at(1.7, 105, 7.0);    // too soon: drawn by finish()
  }
  std::string out = contents(f);
  std::fclose(f);
  INFO(out);
  CHECK(count(out, '\r') == 3);
  CHECK(count(out, '\n') == 1);
  CHECK(out.back() == '\n');
  CHECK(out.find("\rfit  step 101  loss 10.0000  2.0 step/s") == 0);
  CHECK(out.find("\rfit  step 104  loss 123.5000  2.5 step/s") != std::string::npos);
  CHECK(out.find("step 105  loss 7.0000") != std::string::npos);
  CHECK(out.find("step 102") == std::string::npos);
}

TEST_CASE("nn progress misuse") {
  CHECK_THROWS_AS(nn::Progress(-1), ad::Error);
  nn::ProgressOptions o;
  o.out = nullptr;
  CHECK_THROWS_AS(nn::Progress(1, o), ad::Error);
}
