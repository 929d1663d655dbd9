// Inspection: the executor's Chrome trace (well-formed JSON whose spans,
// recomputations and live-bytes counter agree with the Report) and to_dot
// (each computed node once, with its fate under the plan, and its edges).
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"

namespace {

// A strict JSON well-formedness check (RFC 8259 grammar, no extensions).
class JsonCheck {
 public:
  explicit JsonCheck(const std::string& s) : s_(s) {}
  bool ok() {
    ws();
    if (!value()) return false;
    ws();
    return i_ == s_.size();
  }

 private:
  bool value() {
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return string();
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return number();
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(i_, std::char_traits<char>::length(lit), lit) == 0) {
        i_ += std::char_traits<char>::length(lit);
        return true;
      }
    return false;
  }
  bool object() {
    ++i_;
    ws();
    if (peek('}')) return ++i_, true;
    for (;;) {
      ws();
      if (!string()) return false;
      ws();
      if (!peek(':')) return false;
      ++i_;
      ws();
      if (!value()) return false;
      ws();
      if (peek('}')) return ++i_, true;
      if (!peek(',')) return false;
      ++i_;
    }
  }
  bool array() {
    ++i_;
    ws();
    if (peek(']')) return ++i_, true;
    for (;;) {
      ws();
      if (!value()) return false;
      ws();
      if (peek(']')) return ++i_, true;
      if (!peek(',')) return false;
      ++i_;
    }
  }
  bool string() {
    if (!peek('"')) return false;
    for (++i_; i_ < s_.size(); ++i_) {
      auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') return ++i_, true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (++i_ >= s_.size()) return false;
        char e = s_[i_];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k)
            if (++i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return false;
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    std::size_t b = i_;
    if (peek('-')) ++i_;
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return false;
    if (s_[i_] == '0') ++i_;
    else while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (peek('.')) {
      ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return false;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (peek('e') || peek('E')) {
      ++i_;
      if (peek('+') || peek('-')) ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return false;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    return i_ > b;
  }
  bool peek(char c) const { return i_ < s_.size() && s_[i_] == c; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  const std::string& s_;
  std::size_t i_ = 0;
};

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

struct Chain {
  std::vector<ad::Parameter> w;
  explicit Chain(ad::Rng& rng) {
    for (int i = 0; i < 8; ++i)
      w.push_back(ad::Parameter::randn({16, 16}, rng, 0.3, ad::DType::f32, i == 0 ? "w \"first\"\\0" : ""));
  }
  ad::Var loss(ad::Graph& g, const ad::Tensor& x) const {
    ad::Var h = g.input(x, "x");
    for (const auto& p : w) h = ad::tanh(ad::matmul(h, p));
    return ad::sum(h);
  }
};

}  // namespace

TEST_CASE("json check rejects what is not JSON") {
  for (const char* bad : {"", "{", "{\"a\":}", "[1,]", "{\"a\" 1}", "\"\x01\"", "01", "[1.]", "{\"a\":1}x", "nul"}) {
    std::string s = bad;
    CAPTURE(s);
    CHECK_FALSE(JsonCheck(s).ok());
  }
  for (const char* good : {"{}", "[]", "{\"a\":[1,-2.5e3,true,null,\"\\u00e9\\\"\"]}", " 0 "}) {
    std::string s = good;
    CAPTURE(s);
    CHECK(JsonCheck(s).ok());
  }
}

TEST_CASE("trace: spans, recomputations and the live-bytes counter agree with the Report") {
  ad::Rng rng(3);
  Chain net(rng);
  ad::Tensor x = ad::Tensor::randn({32, 16}, rng);
  ad::Graph g;
  ad::Var loss = net.loss(g, x);
  ad::Trace trace;
  g.record(&trace);
  ad::Report r = ad::backward(loss, ad::policy::sqrt_n());
  g.record(nullptr);
  REQUIRE(r.recomputed_nodes > 0);

  std::int64_t spans = 0, recomputes = 0, accumulates = 0, max_live = 0, allocs = 0, frees = 0;
  double last_ts = -1;
  bool ordered = true;
  for (const auto& e : trace.events()) {
    using K = ad::TraceEvent::Kind;
    spans += e.kind == K::compute || e.kind == K::recompute;
    recomputes += e.kind == K::recompute;
    accumulates += e.kind == K::accumulate;
    allocs += e.kind == K::alloc ? e.bytes : 0;
    frees += e.kind == K::free ? e.bytes : 0;
    if (e.kind == K::live) max_live = std::max(max_live, e.bytes);
    CHECK(e.run == 0);
    if (e.ts_us < last_ts) ordered = false;
    last_ts = std::max(last_ts, e.ts_us);
  }
  CHECK(ordered);
  CHECK(spans == r.computed_nodes);
  CHECK(recomputes == r.recomputed_nodes);
  CHECK(accumulates == static_cast<std::int64_t>(net.w.size()));
  CHECK(max_live == r.measured_peak_bytes);  // the counter is sampled at every allocation and free
  CHECK(allocs >= frees);
  CHECK(allocs - frees == g.live_bytes() - r.baseline_bytes);  // what is still allocated: the kept values

  std::string js = trace.json();
  CHECK(JsonCheck(js).ok());
  CHECK(count(js, "\"ph\":\"X\"") == static_cast<std::size_t>(spans + accumulates));
  CHECK(count(js, "\"cat\":\"recompute\"") == static_cast<std::size_t>(recomputes));
  CHECK(count(js, "\"ph\":\"C\"") > 0);
  CHECK(js.find("w \\\"first\\\"\\\\0") != std::string::npos);  // parameter names escaped

  // a second step on the same graph is a second run (its own track)
  g.record(&trace);
  ad::backward(loss, ad::policy::sqrt_n());
  g.record(nullptr);
  CHECK(trace.events().back().run == 1);
  CHECK(JsonCheck(trace.json()).ok());
  for (auto& p : net.w) p.zero_grad();

  // save writes the same text; an unwritable path is an ad::Error
  std::string path = "trace_test.trace.json";
  trace.save(path);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  CHECK(ss.str() == trace.json());
  std::remove(path.c_str());
  CHECK_THROWS_AS(trace.save("no/such/dir/t.json"), ad::Error);

  // nothing recorded once detached
  std::size_t before = trace.events().size();
  ad::backward(loss, ad::policy::keep_all());
  CHECK(trace.events().size() == before);
}

TEST_CASE("trace: budget guard evictions are recorded") {
  ad::Rng rng(4);
  Chain net(rng);
  ad::Tensor x = ad::Tensor::randn({32, 16}, rng);
  ad::Graph g;
  ad::Var loss = net.loss(g, x);
  ad::Plan p = ad::plan_backward(loss);
  p.schedule.budget_bytes = p.schedule.predicted_peak_bytes * 2 / 3;
  ad::Trace trace;
  g.record(&trace);
  ad::RunStats st = ad::execute(g.impl(), p.schedule);
  REQUIRE(st.evictions > 0);
  std::int64_t ev = 0, max_live = 0;
  for (const auto& e : trace.events()) {
    ev += e.kind == ad::TraceEvent::Kind::evict;
    if (e.kind == ad::TraceEvent::Kind::live) max_live = std::max(max_live, e.bytes);
  }
  CHECK(ev == st.evictions);
  CHECK(max_live == st.measured_peak_bytes);
  CHECK(max_live <= p.schedule.budget_bytes);
}

TEST_CASE("to_dot: every computed node once, with its fate and its edges") {
  ad::Rng rng(5);
  Chain net(rng);
  ad::Tensor x = ad::Tensor::randn({32, 16}, rng);
  ad::Graph g;
  ad::Var loss = net.loss(g, x);
  ad::Plan p = ad::plan_backward(loss, ad::policy::sqrt_n());
  REQUIRE(p.schedule.recomputed_nodes > 0);
  std::string dot = ad::to_dot(g, p);
  CHECK(dot.rfind("digraph ad {", 0) == 0);
  CHECK(dot.substr(dot.size() - 2) == "}\n");

  std::vector<int> computes(g.impl().nodes.size(), 0);
  for (const auto& st : p.schedule.steps)
    if (st.kind == ad::Step::Kind::compute) ++computes[static_cast<std::size_t>(st.node)];
  std::size_t edges = 0, recomputed = 0;
  for (std::size_t i = 0; i < computes.size(); ++i) {
    if (!computes[i]) continue;
    edges += g.impl().nodes[i].inputs.size();
    CHECK(count(dot, fmt::format("\n  n{} [label=\"#{} ", i, i)) == 1);
    if (computes[i] > 1) {
      ++recomputed;
      CHECK(count(dot, fmt::format("#{} {}\\n", i, ad::op_name(g.impl().nodes[i].op))) == 1);
    }
  }
  CHECK(count(dot, " -> ") == edges);
  CHECK(count(dot, "recomputed x") == recomputed);
  CHECK(count(dot, "fillcolor=gold") == net.w.size());  // the parameters
  CHECK(dot.find("'w \\\"first\\\"\\\\0'") != std::string::npos);
  CHECK(dot.find("input 'x'") != std::string::npos);

  // keep_all recomputes nothing
  ad::Plan k = ad::plan_backward(loss, ad::policy::keep_all());
  CHECK(count(ad::to_dot(k), "recomputed") == 0);
  // a plan of another graph, an empty plan
  ad::Graph other;
  CHECK_THROWS_WITH_AS(ad::to_dot(other, p), doctest::Contains("another graph"), ad::Error);
  CHECK_THROWS_AS(ad::to_dot(ad::Plan{}), ad::Error);
  // the whole graph, no plan
  std::string all = ad::to_dot(g);
  CHECK(count(all, "[label=") == g.impl().nodes.size());
}

TEST_CASE("trace: the live-bytes counter reaches the measured peak under activation compression") {
  // a (de)compress step holds both copies for a moment; the counter was sampled only after the old one
  // was released (its maximum 260 B against the measured 324 B)
  for (ad::DType c : {ad::DType::f16, ad::DType::bf16}) {
    ad::Rng rng(0);
    ad::Parameter w = ad::Parameter::randn({8, 8}, rng);
    ad::Graph g;
    ad::Var loss = ad::sum(ad::tanh(ad::matmul(g.input(ad::Tensor::randn({4, 8}, rng)), w)));
    ad::Trace trace;
    g.record(&trace);
    ad::Report r = ad::backward(loss, ad::policy::keep_all().compressed(c));
    g.record(nullptr);
    std::int64_t max_live = 0;
    for (const auto& e : trace.events())
      if (e.kind == ad::TraceEvent::Kind::live) max_live = std::max(max_live, e.bytes);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    CHECK(max_live == r.measured_peak_bytes);
  }
}
