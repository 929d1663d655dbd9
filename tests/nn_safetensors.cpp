// safetensors: bit-exact round trips for every dtype, the exact byte layout,
// every kind of malformed file giving its own ad::Error, atomic saves, and
// module / optimizer / checkpoint files.
#include <doctest/doctest.h>

#include "test_util.hpp"
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "fuzz/fuzz_safetensors.hpp"

namespace {

namespace fs = std::filesystem;
using ad::DType;
using ad::Tensor;
namespace nn = ad::nn;

// A fresh directory under the system's temp dir, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("ad_safetensors_{}_{}", static_cast<long>(::getpid()),
                                                   reinterpret_cast<std::uintptr_t>(this));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::size_t entries() const { return static_cast<std::size_t>(std::distance(fs::directory_iterator(path), fs::directory_iterator())); }
};

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<std::uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A file from a header text and `data_bytes` bytes of data; `len` overrides the length prefix.
std::vector<std::uint8_t> make_file(const std::string& header, std::size_t data_bytes, std::uint64_t len = UINT64_MAX) {
  if (len == UINT64_MAX) len = header.size();
  std::string s;
  for (int k = 0; k < 8; ++k) s += static_cast<char>((len >> (8 * k)) & 0xFF);
  s += header;
  for (std::size_t i = 0; i < data_bytes; ++i) s += static_cast<char>(i * 7 + 1);
  std::vector<std::uint8_t> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

std::string error_of(const std::vector<std::uint8_t>& b) {
  try {
    ad::parse_safetensors(b.data(), b.size());
  } catch (const ad::Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_BAD(bytes, needle)                                               \
  do {                                                                          \
    std::string msg_ = error_of(bytes);                                         \
    INFO("message: " << msg_);                                                  \
    CHECK(msg_.find(needle) != std::string::npos);                              \
  } while (0)

// Tensors of every dtype, with awkward bit patterns (NaN payloads, -0, inf,
// subnormals) written as raw bits, plus a scalar and an empty tensor.
ad::NamedTensors every_dtype(ad::Rng& rng) {
  ad::NamedTensors ts;
  auto raw = [&](DType t, const ad::Shape& s) {
    Tensor x = Tensor::empty(s, t);
    auto* b = static_cast<std::uint8_t*>(x.raw());
    Tensor bits = Tensor::randint({static_cast<std::int64_t>(x.nbytes())}, rng, 256);
    for (std::size_t i = 0; i < x.nbytes(); ++i) b[i] = static_cast<std::uint8_t>(bits.data<std::int64_t>()[i]);
    return x;
  };
  ts.emplace_back("f32", raw(DType::f32, {3, 5}));
  ts.emplace_back("f64", raw(DType::f64, {2, 2, 3}));
  ts.emplace_back("f16", raw(DType::f16, {7}));
  ts.emplace_back("bf16", raw(DType::bf16, {3, 3}));
  ts.emplace_back("i64", raw(DType::i64, {4}));
  Tensor special = Tensor::from(std::vector<float>{-0.0f, INFINITY, -INFINITY, NAN, 1e-45f}, {5});
  ts.emplace_back("special", special);
  ts.emplace_back("scalar", Tensor::full({}, 2.5, DType::f64));
  ts.emplace_back("empty", Tensor::empty({0, 3}, DType::bf16));
  ts.emplace_back("name with \"quotes\", \\ and \xc3\xa9\xf0\x9f\x98\x80", raw(DType::f16, {1}));
  return ts;
}

void check_same(const ad::NamedTensors& want, const ad::SafeTensors& got) {
  REQUIRE(got.tensors.size() == want.size());
  for (const auto& nt : want) {
    INFO("tensor " << nt.first);
    const Tensor* t = got.find(nt.first);
    REQUIRE(t != nullptr);
    CHECK(ad::bitwise_equal(*t, nt.second));
  }
}

}  // namespace

TEST_CASE("nn safetensors round trip is bit-exact for every dtype") {
  ad::Rng rng(31);
  ad::NamedTensors ts = every_dtype(rng);
  ad::Metadata meta{{"format", "pt"}, {"note", "line\nbreak \"quoted\" \\ \xe2\x82\xac"}, {"", "empty key"}};
  auto bytes = ad::serialize_safetensors(ts, meta);
  ad::SafeTensors st = ad::parse_safetensors(bytes.data(), bytes.size());
  check_same(ts, st);
  CHECK(st.metadata == meta);

  TempDir dir;
  ad::save_safetensors(dir.file("all.safetensors"), ts, meta);
  CHECK(read_bytes(dir.file("all.safetensors")) == bytes);
  ad::SafeTensors lf = ad::load_safetensors(dir.file("all.safetensors"));
  check_same(ts, lf);
  CHECK(lf.metadata == meta);
  CHECK(dir.entries() == 1);  // no temporary file left behind
}

TEST_CASE("nn safetensors byte layout follows the format") {
  Tensor a = Tensor::from(std::vector<float>{1.0f, -2.0f}, {2});
  Tensor h = Tensor::from(std::vector<float>{0.5f}, {1}).to(DType::f16);
  Tensor d = Tensor::from(std::vector<double>{3.0}, {1, 1});
  // f64 first (largest element), then f32, then f16: every tensor aligned to its element size
  auto b = ad::serialize_safetensors({{"h", h}, {"a", a}, {"d", d}}, {{"k", "v"}});
  std::string want = R"({"__metadata__":{"k":"v"},"d":{"dtype":"F64","shape":[1,1],"data_offsets":[0,8]},)"
                     R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                     R"("h":{"dtype":"F16","shape":[1],"data_offsets":[16,18]}})";
  while ((want.size() + 8) % 8) want += ' ';
  std::uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | b[static_cast<std::size_t>(k)];
  CHECK(n == want.size());
  CHECK(std::string(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n)) == want);
  REQUIRE(b.size() == 8 + n + 18);
  const std::uint8_t* data = b.data() + 8 + n;
  double dv;
  float av[2];
  std::memcpy(&dv, data, 8);
  std::memcpy(av, data + 8, 8);
  CHECK(dv == 3.0);
  CHECK(av[0] == 1.0f);
  CHECK(av[1] == -2.0f);
  CHECK(data[16] == 0x00);  // f16 0.5 = 0x3800, little-endian
  CHECK(data[17] == 0x38);

  // files as other writers make them: other key order, whitespace, escapes, no padding
  std::string other = "{ \"w\" : {\"shape\": [2], \"data_offsets\": [0, 8], \"dtype\": \"F32\"},\n"
                      "  \"__metadata__\": {\"format\": \"pt\", \"\\u00e9\\ud83d\\ude00\": \"\\/\"} }";
  auto f = make_file(other, 8);
  ad::SafeTensors st = ad::parse_safetensors(f.data(), f.size());
  REQUIRE(st.tensors.size() == 1);
  CHECK(st.at("w").shape() == ad::Shape{2});
  CHECK(st.metadata.at("\xc3\xa9\xf0\x9f\x98\x80") == "/");
  CHECK(ad::parse_safetensors(make_file("{}", 0).data(), 8 + 2).tensors.empty());
}

TEST_CASE("nn safetensors malformed files each give their error") {
  const std::string t8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  // length prefix and truncation
  EXPECT_BAD((std::vector<std::uint8_t>{1, 2, 3}), "too short to hold the 8-byte header length");
  EXPECT_BAD(make_file("{" + t8 + "}", 8, 1ull << 40), "exceeds the limit of 100000000 bytes");
  EXPECT_BAD(make_file("{" + t8 + "}", 8, 100'000'001), "exceeds the limit");
  EXPECT_BAD(make_file("{" + t8 + "}", 0, 500), "runs past the end of the data");
  EXPECT_BAD(make_file("{" + t8 + "}", 4), "run past the end of the data section (4 bytes; truncated?)");
  {
    auto good = make_file("{" + t8 + "}", 8);
    for (std::size_t cut = 0; cut < good.size(); ++cut) {
      std::vector<std::uint8_t> part(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
      INFO("cut at " << cut);
      CHECK_THROWS_AS(ad::parse_safetensors(part.data(), part.size()), ad::Error);
    }
    CHECK_NOTHROW(ad::parse_safetensors(good.data(), good.size()));
  }
  // JSON
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32",}})", 0), "header: expected a string key at byte 20");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32"})", 0), "unexpected end of the document");
  EXPECT_BAD(make_file("{} x", 0), "unexpected data after the JSON value");
  EXPECT_BAD(make_file("[]", 0), "header does not start with '{'");
  EXPECT_BAD(make_file("{\"a\xff\":1}", 0), "invalid UTF-8");
  EXPECT_BAD(make_file("{\"\xc0\xaf\":1}", 0), "invalid UTF-8");  // overlong '/'
  EXPECT_BAD(make_file(R"({"\ud800":1})", 0), "unpaired high surrogate");
  EXPECT_BAD(make_file("{\"a\nb\":1}", 0), "unescaped control character");
  EXPECT_BAD(make_file(R"({"__metadata__":{"k":01}})", 0), "expected '}' or ','");
  EXPECT_BAD(make_file("{\"__metadata__\":" + std::string(100, '[') + std::string(100, ']') + "}", 0), "nesting deeper than 64");
  // fields
  EXPECT_BAD(make_file("{" + t8 + "," + t8 + "}", 16), "duplicate key \"a\"");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2), "unsupported dtype \"F8\"");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8), "unsupported dtype \"I32\"");
  EXPECT_BAD(make_file(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", 8), "dtype is a number, not a string");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
             "shape entry -2 is not a non-negative 64-bit integer");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), "shape entry 2.0 is not");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})", 8), "is not a non-negative");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8),
             "more elements than 64 bits can count");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4), "rank 9");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8), "shape is a string, not an array");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8), "lacks \"shape\"");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8), "unknown field \"x\"");
  EXPECT_BAD(make_file(R"({"a":[1]})", 8), "tensor \"a\" is an array, not an object");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets must be [begin, end]");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "end before they begin");
  EXPECT_BAD(make_file(R"({"__metadata__":{"k":1}})", 0), "\"__metadata__\" value for key \"k\" is a number, not a string");
  EXPECT_BAD(make_file(R"({"__metadata__":[]})", 0), "\"__metadata__\" is an array");
  // sizes and offsets against each other and the data
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
             "data_offsets [0, 8] hold 8 bytes, but F32[3] needs 12");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
             "tensors \"a\" [0, 8] and \"b\" [4, 12] overlap");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
             "overlap");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "bytes [0, 4) of the data section belong to no tensor");
  EXPECT_BAD(make_file("{" + t8 + "}", 9), "the data section has 9 bytes but the tensors cover 8");
  EXPECT_BAD(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", 8), "run past the end");
}

TEST_CASE("nn safetensors load_safetensors reports the path") {
  TempDir dir;
  auto check = [](const std::string& path, const std::string& needle) {
    std::string msg;
    try {
      ad::load_safetensors(path);
    } catch (const ad::Error& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find(needle) != std::string::npos);
  };
  check(dir.file("missing.safetensors"), "cannot open");
  check(dir.path.string(), "not a regular file");
  // a FIFO: opening it must not wait for a writer
  REQUIRE(::mkfifo(dir.file("pipe").c_str(), 0600) == 0);
  check(dir.file("pipe"), "not a regular file");
  auto good = ad::serialize_safetensors({{"x", Tensor::ones({100})}});
  write_bytes(dir.file("cut.safetensors"), std::vector<std::uint8_t>(good.begin(), good.end() - 1));
  check(dir.file("cut.safetensors"), "truncated");
  write_bytes(dir.file("short.safetensors"), {1, 0, 0});
  check(dir.file("short.safetensors"), "too short");
}

TEST_CASE("nn safetensors save is atomic") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  ad::save_safetensors(path, {{"old", Tensor::ones({4})}});
  const auto old_bytes = read_bytes(path);

  // invalid tensors: rejected before the disk is touched
  CHECK_THROWS_AS(ad::save_safetensors(path, {{"a", Tensor::ones({1})}, {"a", Tensor::ones({1})}}), ad::Error);
  CHECK_THROWS_AS(ad::save_safetensors(path, {{"__metadata__", Tensor::ones({1})}}), ad::Error);
  CHECK_THROWS_AS(ad::save_safetensors(path, {{"", Tensor::ones({1})}}), ad::Error);
  CHECK_THROWS_AS(ad::save_safetensors(path, {{"bad\xff", Tensor::ones({1})}}), ad::Error);
  CHECK(read_bytes(path) == old_bytes);

  // a write that fails half way (file size limit: EFBIG after 4 KiB)
  {
    struct rlimit saved {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = saved;
    lim.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
    std::string msg;
    try {
      ad::save_safetensors(path, {{"new", Tensor::zeros({100000})}});
    } catch (const ad::Error& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    INFO(msg);
    CHECK(msg.find("save_safetensors: write failed: " + path) != std::string::npos);
  }
  CHECK(read_bytes(path) == old_bytes);
  CHECK(dir.entries() == 1);  // the temporary file was removed

  // a directory that does not exist
  std::string msg;
  try {
    ad::save_safetensors(dir.file("no/such/dir.safetensors"), {{"x", Tensor::ones({1})}});
  } catch (const ad::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("cannot create a temporary file next to") != std::string::npos);

  // a successful save replaces the file
  ad::save_safetensors(path, {{"new", Tensor::zeros({2})}});
  CHECK(ad::load_safetensors(path).find("new") != nullptr);
  CHECK(dir.entries() == 1);
}

TEST_CASE("nn safetensors save through a symbolic link replaces its target and keeps permissions") {
  TempDir dir;
  const std::string target = dir.file("step_5.safetensors"), link = dir.file("latest.safetensors");
  ad::save_safetensors(target, {{"old", Tensor::ones({2})}});
  REQUIRE(::chmod(target.c_str(), 0600) == 0);
  fs::create_symlink("step_5.safetensors", link);  // relative, as `ln -s` makes it
  ad::save_safetensors(link, {{"new", Tensor::zeros({3})}});
  CHECK(fs::is_symlink(link));  // the link stays a link ...
  CHECK(ad::load_safetensors(target).find("new") != nullptr);  // ... and its target has the new contents
  struct stat st {};
  REQUIRE(::stat(target.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(dir.entries() == 2);  // no temporary file left
  // a new file gets the usual mode (0666 less the umask); a dangling link's target is created
  const std::string fresh = dir.file("made.safetensors");
  fs::create_symlink("made.safetensors", dir.file("to_made.safetensors"));
  ad::save_safetensors(dir.file("to_made.safetensors"), {{"x", Tensor::ones({1})}});
  CHECK(fs::is_regular_file(fresh));
  CHECK(fs::is_symlink(dir.file("to_made.safetensors")));
  // a loop of links: an ad::Error, nothing written
  fs::create_symlink("b.safetensors", dir.file("a.safetensors"));
  fs::create_symlink("a.safetensors", dir.file("b.safetensors"));
  CHECK_THROWS_WITH_AS(ad::save_safetensors(dir.file("a.safetensors"), {{"x", Tensor::ones({1})}}),
                       doctest::Contains("symbolic links"), ad::Error);
  CHECK(dir.entries() == 6);
}

TEST_CASE("nn safetensors module, optimizer and checkpoint files") {
  TempDir dir;
  ad::Rng r1(41), r2(42);
  nn::MLPOptions o;
  o.dropout = 0.1;
  nn::MLP a({3, 5, 2}, r1, o), b({3, 5, 2}, r2, o);
  nn::save_module(dir.file("a.safetensors"), a, {{"epoch", "3"}});
  CHECK_FALSE(ad::bitwise_equal(a.layers[0].weight.value(), b.layers[0].weight.value()));
  ad::Metadata m = nn::load_module(dir.file("a.safetensors"), b);
  CHECK(m.at("epoch") == "3");
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(ad::bitwise_equal(a.layers[i].weight.value(), b.layers[i].weight.value()));
    CHECK(ad::bitwise_equal(a.layers[i].bias.value(), b.layers[i].bias.value()));
  }
  CHECK(ad::bitwise_equal(a.dropout.rng_state, b.dropout.rng_state));

  // mismatches: named, and nothing changes
  auto has = [](auto&& f, const std::string& needle) { return ad::test::throws_with(f, needle); };
  ad::Rng r3(43);
  nn::MLP wider({3, 6, 2}, r3, o);
  Tensor before = wider.layers[1].bias.value().clone();
  CHECK(has([&] { nn::load_module(dir.file("a.safetensors"), wider); },
            "\"layers.0.weight\" is f32[5,3] in the source but f32[6,3] in the module"));
  CHECK(ad::bitwise_equal(before, wider.layers[1].bias.value()));
  nn::MLPOptions o64 = o;
  o64.linear.dtype = DType::f64;
  nn::MLP f64net({3, 5, 2}, r3, o64);
  CHECK(has([&] { nn::load_module(dir.file("a.safetensors"), f64net); }, "is f32[5,3] in the source but f64[5,3]"));
  nn::MLP nodrop({3, 5, 2}, r3);
  CHECK(has([&] { nn::load_module(dir.file("a.safetensors"), nodrop); }, "unexpected tensor \"dropout.rng_state\""));
  CHECK_NOTHROW(nn::load_module(dir.file("a.safetensors"), nodrop, false));
  CHECK(ad::bitwise_equal(a.layers[1].weight.value(), nodrop.layers[1].weight.value()));
  nn::MLP deeper({3, 5, 2, 2}, r3, o);
  CHECK(has([&] { nn::load_module_state(deeper, nn::module_state(a)); }, "\"layers.2.weight\" (f32[2,2]) is missing"));

  // optimizer and checkpoint
  nn::AdamW opt(a.named_parameters());
  ad::Graph g;
  ad::backward(ad::sum(a(g.input(Tensor::ones({4, 3})))));
  opt.step();
  nn::save_optimizer(dir.file("opt.safetensors"), opt, {{"k", "v"}});
  nn::AdamW opt2(b.named_parameters());
  CHECK(nn::load_optimizer(dir.file("opt.safetensors"), opt2).at("k") == "v");
  CHECK(opt2.step_count() == 1);
  nn::save_checkpoint(dir.file("ckpt.safetensors"), a, opt, {{"step", "1"}});
  ad::SafeTensors raw = ad::load_safetensors(dir.file("ckpt.safetensors"));
  CHECK(raw.find("model.layers.0.weight") != nullptr);
  CHECK(raw.find("optim.layers.0.weight.exp_avg") != nullptr);
  CHECK(raw.find("optim.step") != nullptr);
  nn::AdamW opt3(wider.named_parameters());
  Tensor keep = wider.layers[0].weight.value().clone();
  CHECK(has([&] { nn::load_checkpoint(dir.file("ckpt.safetensors"), wider, opt3); }, "in the source but"));
  CHECK(ad::bitwise_equal(keep, wider.layers[0].weight.value()));
  CHECK(opt3.step_count() == 0);
  CHECK(nn::load_checkpoint(dir.file("ckpt.safetensors"), b, opt2).at("step") == "1");

  // the files record the optimizer's kind and hyperparameters; another kind is refused, unchanged
  ad::Metadata om = nn::load_optimizer(dir.file("opt.safetensors"), opt2);
  CHECK(om.at("ad.optimizer") == "AdamW");
  CHECK(om.at("ad.optimizer.hyperparameters") == "beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0.01");
  nn::Adam adam(b.named_parameters());  // same slots as AdamW: loaded silently before
  CHECK(has([&] { nn::load_optimizer(dir.file("opt.safetensors"), adam); },
            "load_optimizer: " + dir.file("opt.safetensors") + " holds AdamW state; this optimizer is Adam"));
  CHECK(adam.step_count() == 0);
  Tensor bw = b.layers[0].weight.value().clone();
  CHECK(has([&] { nn::load_checkpoint(dir.file("ckpt.safetensors"), a, adam); },
            "holds AdamW state; this optimizer is Adam"));
  CHECK(adam.step_count() == 0);
  CHECK(ad::bitwise_equal(bw, b.layers[0].weight.value()));
  nn::SGDOptions so;
  so.momentum = 0.9;
  so.nesterov = true;
  nn::SGD sgd(a.named_parameters(), so);
  CHECK(sgd.hyperparameters() == "momentum=0.9 dampening=0 weight_decay=0 nesterov=true");
  CHECK(has([&] { nn::save_optimizer(dir.file("x.safetensors"), sgd, {{"ad.optimizer", "mine"}}); },
            "save_optimizer: metadata key \"ad.optimizer\" is reserved"));
  CHECK(has([&] { nn::save_checkpoint(dir.file("x.safetensors"), a, sgd, {{"ad.optimizer.hyperparameters", ""}}); },
            "save_checkpoint: metadata key \"ad.optimizer.hyperparameters\" is reserved"));
  // a state file without the entries (written by hand, or before they were recorded) still loads
  ad::save_safetensors(dir.file("bare.safetensors"), opt.state());
  nn::Adam adam2(b.named_parameters());
  CHECK_NOTHROW(nn::load_optimizer(dir.file("bare.safetensors"), adam2));
  CHECK(adam2.step_count() == 1);
}

namespace {
// An embedding whose weight the output head reads too: one parameter, two names.
struct TiedLM : nn::Module {
  nn::Embedding emb;
  nn::Linear proj;
  TiedLM(ad::Rng& rng) : emb(30, 6, rng), proj(6, 6, rng) {}
  void visit(nn::Visitor& v) const override {
    v.module("emb", emb);
    v.module("proj", proj);
    v.parameter("head.weight", emb.weight);
  }
};
}  // namespace

TEST_CASE("nn safetensors a tied parameter is written once and loads from either name") {
  TempDir dir;
  ad::Rng r1(51), r2(52);
  TiedLM a(r1), b(r2);
  REQUIRE(a.named_parameters().size() == 4);  // emb.weight, proj.weight, proj.bias, head.weight
  nn::save_module(dir.file("m.safetensors"), a);
  ad::SafeTensors raw = ad::load_safetensors(dir.file("m.safetensors"));
  CHECK(raw.tensors.size() == 3);  // written twice before: the file held the embedding two times
  CHECK(raw.find("emb.weight") != nullptr);
  CHECK(raw.find("head.weight") == nullptr);
  nn::load_module(dir.file("m.safetensors"), b);
  CHECK(ad::bitwise_equal(a.emb.weight.value(), b.emb.weight.value()));
  CHECK(ad::bitwise_equal(a.proj.weight.value(), b.proj.weight.value()));

  // a file with both names (another writer) loads when they agree, and is refused, unchanged, when not
  auto has = [](auto&& f, const std::string& needle) { return ad::test::throws_with(f, needle); };
  ad::Rng r3(53);
  TiedLM c(r3);
  ad::NamedTensors both = nn::module_state(a);
  REQUIRE(both.size() == 4);
  CHECK_NOTHROW(nn::load_module_state(c, both));
  CHECK(ad::bitwise_equal(a.emb.weight.value(), c.emb.weight.value()));
  TiedLM d(r3);
  Tensor d_before = d.emb.weight.value().clone();
  ad::NamedTensors differ;
  for (auto& nt : both) differ.emplace_back(nt.first, nt.first == "head.weight" ? nt.second.clone() : nt.second);
  differ.back().second.data<float>()[0] += 1.0f;  // head.weight is last
  CHECK(has([&] { nn::load_module_state(d, differ); },
            "\"emb.weight\" and \"head.weight\" are one tied tensor of the module but hold different values"));
  CHECK(ad::bitwise_equal(d_before, d.emb.weight.value()));
  // only the second name present: loads; neither: names both
  ad::NamedTensors second_only;
  for (auto& nt : both) if (nt.first != "emb.weight") second_only.push_back(nt);
  CHECK_NOTHROW(nn::load_module_state(d, second_only));
  CHECK(ad::bitwise_equal(a.emb.weight.value(), d.emb.weight.value()));
  ad::NamedTensors neither;
  for (auto& nt : both) if (nt.first != "emb.weight" && nt.first != "head.weight") neither.push_back(nt);
  CHECK(has([&] { nn::load_module_state(d, neither); }, "tied \"emb.weight\", \"head.weight\": all (f32[30,6]) is missing"));
  CHECK_NOTHROW(nn::load_module_state(d, neither, false));

  // a checkpoint: the module part once too, and it resumes
  nn::AdamW opt(a.named_parameters());
  ad::Graph g;
  ad::backward(ad::sum(a.proj(a.emb(g.input(ad::test::index({1, 2, 3}, {3}))))));
  opt.step();
  nn::save_checkpoint(dir.file("c.safetensors"), a, opt);
  ad::SafeTensors ck = ad::load_safetensors(dir.file("c.safetensors"));
  CHECK(ck.find("model.head.weight") == nullptr);
  nn::AdamW opt2(b.named_parameters());
  nn::load_checkpoint(dir.file("c.safetensors"), b, opt2);
  CHECK(ad::bitwise_equal(a.emb.weight.value(), b.emb.weight.value()));
  CHECK(opt2.step_count() == 1);
}

TEST_CASE("nn safetensors fuzz corpus replay") {
  // Every file of the fuzzer's seed corpus through the fuzz entry point (which
  // also re-serialises what it accepted and checks the round trip);
  // valid_* files must load, bad_* files must be rejected with ad::Error.
  int n = 0;
  for (const auto& e : fs::directory_iterator(AD_FUZZ_CORPUS_DIR)) {
    auto bytes = read_bytes(e.path().string());
    std::string name = e.path().filename().string();
    INFO("corpus file " << name);
    CHECK(ad_fuzz_safetensors(bytes.data(), bytes.size()) == 0);
    std::string msg = error_of(bytes);
    if (name.starts_with("valid_")) CHECK(msg == "(no error)");
    else if (name.starts_with("bad_")) CHECK(msg != "(no error)");
    ++n;
  }
  CHECK(n >= 20);
}

TEST_CASE("nn safetensors saves to a file name near the 255-byte limit (the temporary name stays within it)") {
  TempDir dir;
  const std::string name = std::string(230, 'c') + ".safetensors";  // 242 bytes: valid
  ad::save_safetensors(dir.file(name), {{"w", Tensor::ones({3})}});
  ad::save_safetensors(dir.file(name), {{"w", Tensor::zeros({3})}});  // replaced, through a shortened temporary
  CHECK(ad::load_safetensors(dir.file(name)).find("w")->to_vector() == std::vector<double>(3, 0.0));
  CHECK(dir.entries() == 1);
}
