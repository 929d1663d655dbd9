// bench_remat: what rematerialisation costs and saves.
//  1. A 64-layer tanh MLP and a stack of 8 transformer blocks, every policy:
//     peak bytes, step time against keep_all (median of interleaved steps),
//     recomputed nodes and flops, planning time of the first (uncached) step.
//  2. A budget sweep on the MLP from the least feasible budget to keep_all's
//     peak (memory against time; CSV with --csv FILE).
//  3. Targets, printed PASS/FAIL: step time at a 2*sqrt(n)-activation budget,
//     growth of sqrt_n's peak with depth, planning time of 1,000-node graphs.
//  4. The budget policy against an exact oracle (oracle.hpp) on small graphs.
//  5. Planning time against graph size: transformer stacks up to tens of
//     thousands of nodes, budgets at 50 % and 25 % of keep_all's peak and one
//     below the least feasible (the whole search, then BudgetError).
//
//   bench_remat [--json] [--csv FILE] [--rounds N] [--quick] [--sections 12345]
#include <ad/ad.hpp>
#include "../cli.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/planner.hpp"
#include "core/graph_impl.hpp"
#include "compare.hpp"
#include "models.hpp"

namespace rb = remat_bench;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  bool json = false, quick = false;
  std::string csv, sections = "12345";
  int rounds = 7;
  std::size_t max_states = 1'000'000;  // per oracle search
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
std::string mib(std::int64_t b) { return fmt::format("{:.2f} MiB", double(b) / double(1 << 20)); }
std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o + "\"";
}

// The planner's problem for backward(loss): gradient nodes are built first.
ad::planner::Problem problem_of(const ad::Var& loss) {
  ad::plan_backward(loss, ad::policy::keep_all());
  ad::GraphImpl& g = *loss.graph();
  return ad::planner::Problem(g, {loss.id()}, g.grad_cache.at(loss.id()).sinks);
}
double sum_flops(const ad::planner::Problem& p, const std::vector<std::int32_t>& ids) {
  double f = 0;
  for (auto id : ids) f += p.flops[static_cast<std::size_t>(id)];
  return f;
}
// the least peak a budget error states, or -1
std::int64_t parse_minimum(const ad::Error& e) {
  const auto* be = dynamic_cast<const ad::BudgetError*>(&e);
  return be ? be->least_peak : -1;
}

// ---- 1. every policy on a model ----
struct Run {
  std::string label;
  ad::Policy pol;
  bool marks = false;  // checkpoint marks in the graph (policy::manual)
};
struct PolicyRow {
  std::string label, error;
  std::int64_t predicted = 0, measured = 0, kept = 0, recomputed = 0;
  double recompute_flops = 0, plan_ms = 0, step_ms = 0, ratio = 0;
  bool grads_equal = false;
};
struct ModelTable {
  std::string model;
  double step_flops = 0;  // one computation of every node of a step (cost model)
  std::int64_t forward_nodes = 0, joint_nodes = 0;
  std::vector<PolicyRow> rows;
};

// One training step's work: build the graph, backward under the policy.
ad::Report step(const rb::Model& m, const Run& r, double* ms) {
  m.zero_grad();
  auto t0 = Clock::now();
  ad::Report rep;
  {
    ad::Graph g;
    rep = ad::backward(m.loss(g, r.marks), r.pol);
  }
  if (ms) *ms = ms_since(t0);
  return rep;
}
std::vector<ad::Tensor> grads(const rb::Model& m) {
  std::vector<ad::Tensor> v;
  for (const auto& p : m.params()) v.push_back(p.grad().clone());
  return v;
}

std::vector<Run> standard_runs(std::int64_t top, bool chain) {
  std::vector<Run> runs = {
      {"keep_all", ad::policy::keep_all()},
      {"sqrt_n", ad::policy::sqrt_n()},
      {"uniform(4)", ad::policy::uniform(4)},
      {"selective(save_matmuls)", ad::policy::selective(ad::save_matmuls)},
      {chain ? "manual (every 8th layer)" : "manual (block outputs)", ad::policy::manual(), true},
      {fmt::format("budget(50% = {})", mib(top / 2)), ad::policy::budget(top / 2)},
      {fmt::format("budget(25% = {})", mib(top / 4)), ad::policy::budget(top / 4)},
      {"optimal_chain(8)", ad::policy::optimal_chain(8)},
  };
  return runs;
}

ModelTable policy_table(const rb::Model& m, bool chain, int rounds) {
  ModelTable t;
  t.model = m.name();
  {
    ad::Graph g;
    ad::Var loss = m.loss(g, false);
    auto p = problem_of(loss);
    t.step_flops = sum_flops(p, p.order);
    t.forward_nodes = static_cast<std::int64_t>(p.forward.size());
    t.joint_nodes = static_cast<std::int64_t>(p.order.size());
  }
  const std::int64_t top = step(m, {"keep_all", ad::policy::keep_all()}, nullptr).measured_peak_bytes;
  auto runs = standard_runs(top, chain);
  std::vector<ad::Tensor> ref;
  for (const Run& r : runs) {
    PolicyRow row;
    row.label = r.label;
    try {
      ad::Report rep = step(m, r, nullptr);  // first step: plans (uncached)
      row.plan_ms = rep.plan->schedule.plan_ms;
      row.predicted = rep.predicted_peak_bytes;
      row.measured = rep.measured_peak_bytes;
      row.kept = rep.kept_bytes;
      row.recomputed = rep.recomputed_nodes;
      row.recompute_flops = rep.recompute_flops;
      auto gr = grads(m);
      if (ref.empty()) ref = gr;
      row.grads_equal = true;
      for (std::size_t i = 0; i < gr.size(); ++i) row.grads_equal = row.grads_equal && ad::bitwise_equal(gr[i], ref[i]);
    } catch (const ad::Error& e) {
      row.error = e.what();
    }
    t.rows.push_back(row);
  }
  // interleaved rounds, so load on the machine affects every policy alike
  std::vector<std::vector<double>> times(runs.size());
  for (int k = 0; k < rounds; ++k)
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!t.rows[i].error.empty()) continue;
      double ms;
      step(m, runs[i], &ms);
      times[i].push_back(ms);
    }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    t.rows[i].step_ms = median(times[i]);
    t.rows[i].ratio = t.rows[0].step_ms > 0 ? t.rows[i].step_ms / t.rows[0].step_ms : 0;
  }
  return t;
}

std::string table_md(const ModelTable& t) {
  std::string s = fmt::format("### {}\n\n{} forward nodes, {} joint (forward + backward) nodes, {:.3g} flops per step "
                              "(cost model, each node once)\n\n",
                              t.model, t.forward_nodes, t.joint_nodes, t.step_flops);
  s += "| policy | peak (measured = predicted) | peak vs keep_all | kept after forward | step time vs keep_all | "
       "recomputed nodes | recompute flops (% of step) | planning, 1st step | grads = keep_all |\n";
  s += "|---|---|---|---|---|---|---|---|---|\n";
  const std::int64_t top = t.rows[0].measured;
  for (const auto& r : t.rows) {
    if (!r.error.empty()) {
      s += fmt::format("| {} | — | — | — | — | — | — | — | error: {} |\n", r.label, r.error);
      continue;
    }
    s += fmt::format("| {} | {}{} | {:.2f} | {} | {:.2f}x | {} | {:.3g} ({:.1f}%) | {:.2f} ms | {} |\n", r.label,
                     mib(r.measured), r.measured == r.predicted ? "" : fmt::format(" (predicted {})", mib(r.predicted)),
                     double(r.measured) / double(top), mib(r.kept), r.ratio, r.recomputed, r.recompute_flops,
                     100 * r.recompute_flops / t.step_flops, r.plan_ms, r.grads_equal ? "yes" : "NO");
  }
  s += fmt::format("\nkeep_all step: {:.2f} ms (median of interleaved steps).\n", t.rows[0].step_ms);
  return s;
}
std::string table_json(const ModelTable& t) {
  std::string s = fmt::format("{{\"model\": {}, \"forward_nodes\": {}, \"joint_nodes\": {}, \"step_flops\": {}, \"policies\": [",
                              json_str(t.model), t.forward_nodes, t.joint_nodes, t.step_flops);
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const auto& r = t.rows[i];
    s += fmt::format("{}{{\"policy\": {}, \"error\": {}, \"predicted_peak_bytes\": {}, \"measured_peak_bytes\": {}, "
                     "\"kept_bytes\": {}, \"step_ms\": {:.4f}, \"time_vs_keep_all\": {:.4f}, \"recomputed_nodes\": {}, "
                     "\"recompute_flops\": {}, \"plan_ms_uncached\": {:.4f}, \"grads_equal_keep_all\": {}}}",
                     i ? ", " : "", json_str(r.label), json_str(r.error), r.predicted, r.measured, r.kept, r.step_ms,
                     r.ratio, r.recomputed, r.recompute_flops, r.plan_ms, r.grads_equal);
  }
  return s + "]}";
}

// ---- 2. budget sweep ----
struct SweepPoint {
  std::int64_t budget = 0, predicted = 0, measured = 0, recomputed = 0;
  double recompute_flops = 0, step_ms = 0, keep_all_ms = 0;
  std::string error;
};
struct Sweep {
  std::int64_t minimum = -1, top = 0;
  std::vector<SweepPoint> points;
};

// steps of `a` and keep_all interleaved; returns {median a, median keep_all}
std::pair<double, double> timed_pair(const rb::Model& m, const Run& a, int rounds) {
  Run base{"keep_all", ad::policy::keep_all()};
  std::vector<double> ta, tb;
  for (int k = 0; k < rounds; ++k) {
    double x, y;
    step(m, base, &y);
    step(m, a, &x);
    ta.push_back(x);
    tb.push_back(y);
  }
  return {median(ta), median(tb)};
}

Sweep budget_sweep(const rb::Mlp& m, int points, int rounds) {
  Sweep sw;
  sw.top = step(m, {"keep_all", ad::policy::keep_all()}, nullptr).measured_peak_bytes;
  {
    ad::Graph g;
    ad::Var loss = m.loss(g, false);
    try {
      ad::plan_backward(loss, ad::policy::budget(0));
    } catch (const ad::Error& e) {
      sw.minimum = parse_minimum(e);
    }
  }
  if (sw.minimum < 0) return sw;
  for (int i = 0; i < points; ++i) {
    SweepPoint pt;
    pt.budget = sw.minimum + (sw.top - sw.minimum) * i / (points - 1);
    Run r{"budget", ad::policy::budget(pt.budget)};
    try {
      ad::Report rep = step(m, r, nullptr);
      pt.predicted = rep.predicted_peak_bytes;
      pt.measured = rep.measured_peak_bytes;
      pt.recomputed = rep.recomputed_nodes;
      pt.recompute_flops = rep.recompute_flops;
      std::tie(pt.step_ms, pt.keep_all_ms) = timed_pair(m, r, rounds);
    } catch (const ad::Error& e) {
      pt.error = e.what();
    }
    sw.points.push_back(pt);
  }
  return sw;
}

// ---- 3. targets ----
struct Target {
  std::string name, detail;
  bool pass = false;
};

// uncached planning time of `pol` on a fresh graph of m (median of `reps`)
double plan_time(const rb::Model& m, const std::function<ad::Policy()>& make, int reps, std::int64_t* fwd,
                 std::int64_t* joint) {
  ad::Graph g;
  ad::Var loss = m.loss(g, false);
  auto p = problem_of(loss);  // builds the gradient nodes once
  *fwd = static_cast<std::int64_t>(p.forward.size());
  *joint = static_cast<std::int64_t>(p.order.size());
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(ad::plan_backward(loss, make()).schedule.plan_ms);
  return median(t);
}
std::int64_t keep_all_peak_planned(const rb::Model& m) {
  ad::Graph g;
  return ad::plan_backward(m.loss(g, false), ad::policy::keep_all()).schedule.predicted_peak_bytes;
}

std::vector<Target> targets(const rb::Mlp& mlp64, const ModelTable* mlp_table, int rounds, bool quick) {
  std::vector<Target> out;
  {  // step time at a budget of 2 sqrt(n) layer activations
    const std::int64_t b = 2 * 8 * mlp64.activation_bytes();
    Run r{"budget", ad::policy::budget(b)};
    Target t{"budget = 2*sqrt(64) layer activations on the 64-layer MLP: step time <= 1.35x keep_all", "", false};
    try {
      ad::Report rep = step(mlp64, r, nullptr);
      auto [a, k] = timed_pair(mlp64, r, std::max(rounds, 9));
      t.pass = a / k <= 1.35;
      t.detail = fmt::format("budget {} ({} activations of {} KiB): measured peak {}, {} recomputed nodes, "
                             "{:.3g} recompute flops; step {:.2f} ms vs keep_all {:.2f} ms = {:.3f}x",
                             mib(b), 16, mlp64.activation_bytes() / 1024, mib(rep.measured_peak_bytes),
                             rep.recomputed_nodes, rep.recompute_flops, a, k, a / k);
    } catch (const ad::Error& e) {
      t.detail = fmt::format("budget {} infeasible: {}", mib(b), e.what());
    }
    out.push_back(t);
  }
  {  // sqrt_n peak growth 64 -> 256 layers
    std::int64_t p64 = 0;
    if (mlp_table)
      for (const auto& r : mlp_table->rows)
        if (r.label == "sqrt_n") p64 = r.measured;
    if (!p64) p64 = step(mlp64, {"sqrt_n", ad::policy::sqrt_n()}, nullptr).measured_peak_bytes;
    rb::Mlp mlp256(256, 256, 64, 5);
    ad::Report rep = step(mlp256, {"sqrt_n", ad::policy::sqrt_n()}, nullptr);
    double ratio = double(rep.measured_peak_bytes) / double(p64);
    out.push_back({"sqrt_n peak grows <= 2.2x when depth grows 4x (64 -> 256 layers)",
                   fmt::format("sqrt_n measured peak: 64 layers {}, 256 layers {} = {:.3f}x (keep_all: {} -> {})",
                               mib(p64), mib(rep.measured_peak_bytes), ratio, mib(keep_all_peak_planned(mlp64)),
                               mib(keep_all_peak_planned(mlp256))),
                   ratio <= 2.2});
  }
  const int reps = quick ? 1 : 5;
  {  // planning 1,000 forward nodes under budget
    rb::Mlp chain(334, 64, 16, 3);            // 334 x (matmul, add, tanh) - 1 + mse = 1,002 forward nodes
    rb::Transformer tf(34, 1, 16, 32, 2, 4);  // 34 x 30 + 2 = 1,022 forward nodes
    for (const rb::Model* m : {static_cast<const rb::Model*>(&chain), static_cast<const rb::Model*>(&tf)}) {
      std::int64_t top = keep_all_peak_planned(*m), fwd = 0, joint = 0;
      for (int pct : {50, 25}) {
        double ms = plan_time(*m, [&] { return ad::policy::budget(top * pct / 100); }, reps, &fwd, &joint);
        out.push_back({fmt::format("planning under budget({}% of keep_all) < 100 ms: {}", pct, m->name()),
                       fmt::format("{} forward / {} joint nodes: {:.2f} ms (median of {} uncached plans)", fwd, joint, ms,
                                   reps),
                       ms < 100});
      }
    }
    for (int slots : {8, 32}) {
      std::int64_t fwd = 0, joint = 0;
      double ms = plan_time(chain, [&] { return ad::policy::optimal_chain(slots); }, reps, &fwd, &joint);
      out.push_back({fmt::format("planning under optimal_chain({}) < 10 ms: {}", slots, chain.name()),
                     fmt::format("{}-node chain ({} joint nodes): {:.2f} ms (median of {} uncached plans)", fwd, joint, ms,
                                 reps),
                     ms < 10});
    }
  }
  return out;
}

}  // namespace

namespace {

// ---- 4. summary of the oracle comparison ----
struct FamilySummary {
  std::string family;
  int graphs = 0, budgets = 0, oracle_feasible = 0, gave_up = 0;
  int policy_infeasible_where_oracle_feasible = 0, zero_vs_positive = 0, anomalies = 0;
  int rc_cases = 0, optimal_hits = 0;
  double log_rc = 0, log_total = 0, worst_rc = 1;
  double geo_rc() const { return rc_cases ? std::exp(log_rc / rc_cases) : 1.0; }
  double geo_total() const { return oracle_feasible ? std::exp(log_total / oracle_feasible) : 1.0; }
};
std::vector<FamilySummary> summarise(const std::vector<rb::OracleCase>& cs) {
  std::vector<FamilySummary> fs{{"all"}};
  for (const auto& c : cs)
    if (std::none_of(fs.begin(), fs.end(), [&](const FamilySummary& x) { return x.family == c.family; }))
      fs.push_back({c.family});
  auto get = [&](const std::string& f) -> FamilySummary& {
    return *std::find_if(fs.begin(), fs.end(), [&](const FamilySummary& x) { return x.family == f; });
  };
  std::string last;
  for (const auto& c : cs) {
    for (auto* s : {&get(c.family), &get("all")}) {
      if (c.graph != last) ++s->graphs;
      ++s->budgets;
      if (!c.note.empty()) ++s->anomalies;
      if (c.oracle == rb::OracleCase::Status::gave_up) { ++s->gave_up; continue; }
      if (c.oracle != rb::OracleCase::Status::optimal) continue;
      ++s->oracle_feasible;
      if (!c.policy_feasible) { ++s->policy_infeasible_where_oracle_feasible; continue; }
      // total-cost ratio: every value once plus recomputation (Checkmate's overhead ratio)
      s->log_total += std::log((c.base + c.policy_rc) / (c.base + c.oracle_rc));
      if (c.oracle_rc > 0) {
        double r = c.policy_rc / c.oracle_rc;
        ++s->rc_cases;
        s->log_rc += std::log(r);
        s->worst_rc = std::max(s->worst_rc, r);
        if (r <= 1.0 + 1e-12) ++s->optimal_hits;
      } else if (c.policy_rc > 0) {
        ++s->zero_vs_positive;
      } else {
        ++s->optimal_hits;
      }
    }
    last = c.graph;
  }
  std::rotate(fs.begin(), fs.begin() + 1, fs.end());  // "all" last
  return fs;
}

void usage(const char* a0) {
  std::fprintf(stderr, "usage: %s [--json] [--csv FILE] [--rounds N] [--quick] [--sections 12345] [--max-states N]\n", a0);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table row as it is measured, also into a pipe
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) o.json = true;
    else if (!std::strcmp(argv[i], "--quick")) o.quick = true;
    else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) o.csv = argv[++i];
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) o.rounds = bench_cli::whole_int(argc, argv, i, 1);
    else if (!std::strcmp(argv[i], "--sections") && i + 1 < argc) o.sections = argv[++i];
    else if (!std::strcmp(argv[i], "--max-states") && i + 1 < argc) o.max_states = static_cast<std::uint64_t>(bench_cli::whole(argc, argv, i, 1));
    else { usage(argv[0]); return 2; }
  }
  if (o.quick) o.rounds = std::min(o.rounds, 3);
  auto want = [&](char c) { return o.sections.find(c) != std::string::npos; };
  try {
    std::string md, js = "{";
    md += fmt::format("# bench_remat (ad {})\n\n", ad::kVersionString);
    js += fmt::format("\"version\": {}", json_str(ad::kVersionString));
    rb::Mlp mlp64(64, 256, 64, 1);
    ModelTable mlp_table;
    bool have_mlp_table = false;

    if (want('1')) {
      std::fprintf(stderr, "section 1: policies\n");
      mlp_table = policy_table(mlp64, true, o.rounds);
      have_mlp_table = true;
      rb::Transformer tf(8, 4, 64, 128, 4, 2);
      ModelTable tf_table = policy_table(tf, false, o.rounds);
      md += "## 1. Every policy\n\n" + table_md(mlp_table) + "\n" + table_md(tf_table) + "\n";
      js += ", \"policies\": [" + table_json(mlp_table) + ", " + table_json(tf_table) + "]";
    }

    if (want('2')) {
      std::fprintf(stderr, "section 2: budget sweep\n");
      Sweep sw = budget_sweep(mlp64, o.quick ? 6 : 16, o.quick ? 3 : 5);
      md += fmt::format("## 2. Budget sweep, {}\n\nleast feasible budget {} B ({}), keep_all peak {} B ({})\n\n",
                        mlp64.name(), sw.minimum, mib(sw.minimum), sw.top, mib(sw.top));
      md += "| budget | % of keep_all | measured peak | step time vs keep_all | recomputed nodes | recompute flops |\n";
      md += "|---|---|---|---|---|---|\n";
      std::string csv = "budget_bytes,budget_frac_keep_all,predicted_peak_bytes,measured_peak_bytes,step_ms,"
                        "keep_all_step_ms,time_vs_keep_all,recomputed_nodes,recompute_flops\n";
      js += fmt::format(", \"sweep\": {{\"model\": {}, \"min_budget\": {}, \"keep_all_peak\": {}, \"points\": [",
                        json_str(mlp64.name()), sw.minimum, sw.top);
      for (std::size_t i = 0; i < sw.points.size(); ++i) {
        const auto& p = sw.points[i];
        double frac = double(p.budget) / double(sw.top);
        if (!p.error.empty()) {
          md += fmt::format("| {} | {:.1f}% | infeasible: {} | | | |\n", mib(p.budget), 100 * frac, p.error);
          csv += fmt::format("{},{:.4f},,,,,,,\n", p.budget, frac);
        } else {
          md += fmt::format("| {} | {:.1f}% | {} | {:.2f}x | {} | {:.3g} |\n", mib(p.budget), 100 * frac, mib(p.measured),
                            p.step_ms / p.keep_all_ms, p.recomputed, p.recompute_flops);
          csv += fmt::format("{},{:.4f},{},{},{:.4f},{:.4f},{:.4f},{},{}\n", p.budget, frac, p.predicted, p.measured,
                             p.step_ms, p.keep_all_ms, p.step_ms / p.keep_all_ms, p.recomputed, p.recompute_flops);
        }
        js += fmt::format("{}{{\"budget\": {}, \"error\": {}, \"predicted_peak_bytes\": {}, \"measured_peak_bytes\": {}, "
                          "\"step_ms\": {:.4f}, \"keep_all_step_ms\": {:.4f}, \"recomputed_nodes\": {}, \"recompute_flops\": {}}}",
                          i ? ", " : "", p.budget, json_str(p.error), p.predicted, p.measured, p.step_ms, p.keep_all_ms,
                          p.recomputed, p.recompute_flops);
      }
      js += "]}";
      md += "\n";
      if (!o.csv.empty()) {
        std::ofstream f(o.csv);
        f << csv;
        if (!f) throw ad::Error(fmt::format("cannot write {}", o.csv));
        md += fmt::format("(CSV written to {})\n\n", o.csv);
      }
    }

    if (want('3')) {
      std::fprintf(stderr, "section 3: targets\n");
      auto ts = targets(mlp64, have_mlp_table ? &mlp_table : nullptr, o.rounds, o.quick);
      md += "## 3. Targets\n\n";
      js += ", \"targets\": [";
      for (std::size_t i = 0; i < ts.size(); ++i) {
        md += fmt::format("- **{}** {} — {}\n", ts[i].pass ? "PASS" : "FAIL", ts[i].name, ts[i].detail);
        js += fmt::format("{}{{\"target\": {}, \"pass\": {}, \"detail\": {}}}", i ? ", " : "", json_str(ts[i].name),
                          ts[i].pass, json_str(ts[i].detail));
      }
      js += "]";
      md += "\n";
    }

    if (want('4')) {
      std::fprintf(stderr, "section 4: oracle\n");
      std::vector<rb::OracleGraphNote> skipped;
      auto t0 = Clock::now();
      auto cases = rb::oracle_compare(o.quick ? 5 : 8, o.quick, o.max_states, &skipped);
      double secs = ms_since(t0) / 1000;
      auto fs = summarise(cases);
      md += "## 4. budget policy vs exact oracle (recompute flops at equal budget)\n\n";
      md += "| family | graphs | budgets | oracle feasible | oracle gave up | policy infeasible where oracle feasible | "
            "geomean policy/oracle recompute (oracle > 0) | worst | oracle 0, policy > 0 | policy optimal | "
            "geomean total-cost ratio | anomalies |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
      js += ", \"oracle\": {\"families\": [";
      for (std::size_t i = 0; i < fs.size(); ++i) {
        const auto& f = fs[i];
        md += fmt::format("| {} | {} | {} | {} | {} | {} | {:.4f} ({} budgets) | {:.3f} | {} | {} | {:.4f} | {} |\n",
                          f.family, f.graphs, f.budgets, f.oracle_feasible, f.gave_up,
                          f.policy_infeasible_where_oracle_feasible, f.geo_rc(), f.rc_cases, f.worst_rc,
                          f.zero_vs_positive, f.optimal_hits, f.geo_total(), f.anomalies);
        js += fmt::format("{}{{\"family\": {}, \"graphs\": {}, \"budgets\": {}, \"oracle_feasible\": {}, \"gave_up\": {}, "
                          "\"policy_infeasible_where_oracle_feasible\": {}, \"geomean_recompute_ratio\": {:.6f}, "
                          "\"recompute_ratio_cases\": {}, \"worst_recompute_ratio\": {:.6f}, \"oracle_zero_policy_positive\": {}, "
                          "\"policy_optimal\": {}, \"geomean_total_cost_ratio\": {:.6f}, \"anomalies\": {}}}",
                          i ? ", " : "", json_str(f.family), f.graphs, f.budgets, f.oracle_feasible, f.gave_up,
                          f.policy_infeasible_where_oracle_feasible, f.geo_rc(), f.rc_cases, f.worst_rc,
                          f.zero_vs_positive, f.optimal_hits, f.geo_total(), f.anomalies);
      }
      js += "], \"cases\": [";
      md += "\nPer budget (bytes; from one below the oracle's least peak up to keep_all's peak; ratio = "
            "policy/oracle recompute flops; \"<=\": least peak not proven, a probe below it hit the state cap):\n\n| graph | values | least peak | keep_all peak | budget | oracle recompute | "
            "policy recompute | ratio | oracle states | note |\n|---|---|---|---|---|---|---|---|---|---|\n";
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        std::string orc = c.oracle == rb::OracleCase::Status::optimal      ? fmt::format("{:.0f}", c.oracle_rc)
                          : c.oracle == rb::OracleCase::Status::infeasible ? "infeasible"
                                                                           : "gave up";
        std::string prc = c.policy_feasible ? fmt::format("{:.0f}", c.policy_rc) : "infeasible";
        std::string ratio = c.oracle == rb::OracleCase::Status::optimal && c.policy_feasible
                                ? (c.oracle_rc > 0 ? fmt::format("{:.3f}", c.policy_rc / c.oracle_rc)
                                                   : (c.policy_rc > 0 ? "inf" : "1"))
                                : "—";
        md += fmt::format("| {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} |\n", c.graph, c.values,
                          c.min_peak_exact ? "" : "<= ", c.min_peak, c.top,
                          c.budget, orc, prc, ratio, c.states, c.note);
        js += fmt::format("{}{{\"graph\": {}, \"values\": {}, \"min_peak\": {}, \"keep_all_peak\": {}, \"budget\": {}, "
                          "\"oracle\": {}, \"oracle_recompute\": {}, \"policy_feasible\": {}, \"policy_recompute\": {}, "
                          "\"states\": {}, \"oracle_ms\": {:.2f}, \"note\": {}}}",
                          i ? ", " : "", json_str(c.graph), c.values, c.min_peak, c.top, c.budget, json_str(orc),
                          c.oracle_rc, c.policy_feasible, c.policy_rc, c.states, c.oracle_ms, json_str(c.note));
      }
      js += "], \"skipped\": [";
      for (std::size_t i = 0; i < skipped.size(); ++i)
        js += fmt::format("{}{{\"graph\": {}, \"why\": {}}}", i ? ", " : "", json_str(skipped[i].graph),
                          json_str(skipped[i].note));
      js += "]}";
      for (const auto& s : skipped) md += fmt::format("\nleft out: {} — {}\n", s.graph, s.note);
      const auto& all = fs.back();
      md += fmt::format("\n- **{}** geometric mean policy/oracle recompute flops <= 1.05: {:.4f} over {} budgets "
                        "where the oracle recomputes; {} more budgets where the oracle needs no recomputation and "
                        "the policy does\n",
                        all.geo_rc() <= 1.05 ? "PASS" : "FAIL", all.geo_rc(), all.rc_cases, all.zero_vs_positive);
      md += fmt::format("- **{}** the policy is feasible wherever the oracle is: {} budgets where it is not\n",
                        all.policy_infeasible_where_oracle_feasible == 0 ? "PASS" : "FAIL",
                        all.policy_infeasible_where_oracle_feasible);
      {  // the policy's planning time: a graph's first plan (from scratch) and the rest (the sweep resumed)
        std::vector<double> first, later;
        int proven = 0, planned = 0, proven_wrong = 0;
        for (const auto& c : cases) {
          (c.first ? first : later).push_back(c.policy_ms);
          if (!c.policy_feasible) continue;
          ++planned;
          proven += c.policy_proven;
          if (c.policy_proven && c.oracle == rb::OracleCase::Status::optimal && c.policy_rc > c.oracle_rc + 0.5) ++proven_wrong;
        }
        auto pct = [](std::vector<double> v, double q) {
          if (v.empty()) return 0.0;
          std::sort(v.begin(), v.end());
          return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
        };
        md += fmt::format("- the policy's plan is proven cheapest (Schedule::proven_cheapest) on {} of {} planned budgets; "
                          "claimed but above the oracle: {}\n", proven, planned, proven_wrong);
        md += fmt::format("- the policy's planning time: a graph's first plan (one byte under the least peak, a whole "
                          "sweep) median {:.1f} ms, max {:.1f} ms; the other budgets (the sweep resumed) median {:.2f} ms, "
                          "max {:.1f} ms\n", pct(first, 0.5), pct(first, 1.0), pct(later, 0.5), pct(later, 1.0));
      }
      md += fmt::format("\n(oracle section: {:.1f} s)\n", secs);
    }

    if (want('5')) {
      std::fprintf(stderr, "section 5: planning time against graph size\n");
      md += "## 5. Planning time against graph size\n\n";
      md += "Transformer blocks (batch 2, 16 tokens, dim 32, 4 heads) and tanh MLPs of width 32 (batch 16) with a "
            "skip connection every 4 layers; the first (uncached) plan of one step.\n\n";
      md += "| model | nodes | keep_all peak | budget | planned peak | plan ms |\n|---|---|---|---|---|---|\n";
      js += ", \"plan_scaling\": [";
      bool first_row = true;
      std::vector<std::unique_ptr<rb::Model>> models;
      for (int blocks : o.quick ? std::vector<int>{8, 32} : std::vector<int>{8, 32, 128, 512})
        models.push_back(std::make_unique<rb::Transformer>(blocks, 2, 16, 32, 4, 3));
      for (int layers : o.quick ? std::vector<int>{100, 600} : std::vector<int>{100, 600, 2400})
        models.push_back(std::make_unique<rb::Mlp>(layers, 32, 16, 5, 8, 4));
      for (const auto& mp : models) {
        const rb::Model& tf = *mp;
        std::int64_t top = 0, nodes = 0;
        {
          ad::Graph g;
          top = ad::backward(tf.loss(g, false)).measured_peak_bytes;
          nodes = g.num_nodes();
          tf.zero_grad();
        }
        for (double frac : {0.5, 0.25, 0.001}) {
          const auto budget = static_cast<std::int64_t>(static_cast<double>(top) * frac);
          ad::Graph g;
          ad::Var loss = tf.loss(g, false);
          auto t0 = Clock::now();
          std::string planned;
          try {
            ad::Plan p = ad::plan_backward(loss, ad::policy::budget(budget));
            planned = mib(p.schedule.predicted_peak_bytes);
          } catch (const ad::BudgetError& e) {
            planned = fmt::format("BudgetError (least {})", mib(e.least_peak));
          }
          double ms = ms_since(t0);
          std::fprintf(stderr, "  %s, %lld nodes, budget %.1f%%: %s in %.1f ms\n", tf.name().c_str(),
                       static_cast<long long>(nodes), 100 * frac, planned.c_str(), ms);
          md += fmt::format("| {} | {} | {} | {} ({:.1f}%) | {} | {:.1f} |\n", tf.name(), nodes, mib(top), mib(budget),
                            100 * frac, planned, ms);
          js += fmt::format("{}{{\"model\": {}, \"nodes\": {}, \"keep_all_peak\": {}, \"budget\": {}, \"plan_ms\": {:.3f}, "
                            "\"planned\": {}}}", first_row ? "" : ", ", json_str(tf.name()), nodes, top, budget, ms,
                            json_str(planned));
          first_row = false;
        }
      }
      js += "]";
      md += "\n";
    }
    js += "}";
    std::fputs((o.json ? js + "\n" : md).c_str(), stdout);
    return 0;
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
