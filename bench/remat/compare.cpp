#include "compare.hpp"

#include <ad/ad.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "checkpoint/planner.hpp"
#include "core/graph_impl.hpp"
#include "models.hpp"
#include "oracle.hpp"

namespace remat_bench {

namespace {
std::vector<SmallGraph> graphs(bool quick) {
  std::vector<SmallGraph> gs;
  const int seeds = quick ? 3 : 6;
  for (int ops : {4, 5, 6})
    for (int s = 1; s <= seeds; ++s) gs.push_back(random_dag(ops, static_cast<std::uint64_t>(100 * ops + s)));
  for (int s = 1; s <= 3; ++s) gs.push_back(random_dag(7, static_cast<std::uint64_t>(700 + s)));
  gs.push_back(vgg_like({16, 16, 8, 8, 4}, 1));
  gs.push_back(vgg_like({8, 16, 16, 8, 8, 4}, 2));
  if (!quick) gs.push_back(vgg_like({32, 16, 16, 8, 4}, 3));
  gs.push_back(resnet_like(2, 8, 4));
  if (!quick) gs.push_back(resnet_like(2, 16, 5));
  gs.push_back(unet_like(2, 16, 6));
  if (!quick) gs.push_back(unet_like(2, 32, 7));
  return gs;
}

// Drops every computed value of the graph (leaves keep theirs), so a schedule
// can run from the start again.
void clear_values(ad::GraphImpl& g) {
  for (auto& nd : g.nodes)
    if (ad::op_def(nd.op).cpu) nd.value = ad::Tensor{};
}

// Runs the oracle's schedule for real: "" if the measured peak equals the
// simulated one and the gradients equal keep_all's to the bit.
std::string run_check(SmallGraph& sg, const ad::Schedule& s, std::int64_t simulated, const std::vector<ad::Tensor>& ref) {
  ad::GraphImpl& g = *sg.loss.graph();
  clear_values(g);
  for (const auto& p : sg.params) p.zero_grad();
  ad::RunStats rs = ad::execute(g, s);
  std::string note;
  if (rs.measured_peak_bytes != simulated)
    note += fmt::format("oracle schedule measured {} B, simulated {} B; ", rs.measured_peak_bytes, simulated);
  for (std::size_t i = 0; i < sg.params.size(); ++i)
    if (!sg.params[i].has_grad() || !ad::bitwise_equal(sg.params[i].grad(), ref[i])) {
      note += "oracle schedule's gradients differ from keep_all; ";
      break;
    }
  clear_values(g);
  return note;
}

// AD_ORACLE_DUMP=<graph name>: the graph's values (op, bytes, flops, inputs)
// once, then per budget the oracle's and the policy's schedules as C<node>
// (compute) and F<node> (free) steps, to see where the policy loses.
void dump_schedules(const ad::planner::Problem& p, const ad::GraphImpl& g, std::int64_t budget, const ad::Schedule& oracle,
                    const ad::Schedule& policy, bool first) {
  if (first)
    for (auto v : p.order) {
      std::fprintf(stderr, "  #%d %s bytes=%lld flops=%.0f <-", v, ad::op_def(g.node(v).op).name,
                   static_cast<long long>(p.bytes[static_cast<std::size_t>(v)]), p.flops[static_cast<std::size_t>(v)]);
      for (auto in : g.node(v).inputs) std::fprintf(stderr, " %d", in);
      std::fprintf(stderr, "%s\n", p.is_sink(v) ? " (sink)" : "");
    }
  for (const auto* s : {&oracle, &policy}) {
    std::fprintf(stderr, "  %s (budget %lld):%s", s == &oracle ? "oracle" : "policy", static_cast<long long>(budget),
                 s->steps.empty() ? " infeasible" : "");
    for (const auto& st : s->steps)
      if (st.kind == ad::Step::Kind::compute || st.kind == ad::Step::Kind::free)
        std::fprintf(stderr, " %s%d", st.kind == ad::Step::Kind::compute ? "C" : "F", st.node);
    std::fprintf(stderr, "\n");
  }
}

ad::planner::Problem problem_of(const ad::Var& loss) {
  ad::plan_backward(loss, ad::policy::keep_all());
  ad::GraphImpl& g = *loss.graph();
  return ad::planner::Problem(g, {loss.id()}, g.grad_cache.at(loss.id()).sinks);
}
}  // namespace

std::vector<OracleCase> oracle_compare(int budgets, bool quick, std::size_t max_states,
                                       std::vector<OracleGraphNote>* skipped) {
  std::vector<OracleCase> out;
  const char* only = std::getenv("AD_ORACLE_ONLY");  // one graph, by name
  for (SmallGraph& sg : graphs(quick)) {
    if (only && sg.name != only) continue;
    auto p = problem_of(sg.loss);
    // keep_all's gradients, the reference for the oracle's schedules
    ad::backward(sg.loss, ad::policy::keep_all());
    std::vector<ad::Tensor> ref;
    for (const auto& prm : sg.params) ref.push_back(prm.grad().clone());
    clear_values(*sg.loss.graph());
    // Every plan below is made with the gradients zeroed, as in a training
    // step, so the policy and the oracle (whose problem was built before any
    // gradient existed) both write parameter gradients in place.
    auto zero = [&] { for (const auto& prm : sg.params) prm.zero_grad(); };
    zero();
    ad::Policy keep = ad::policy::keep_all();
    keep.reuse_buffers = false;
    std::int64_t top = ad::plan_backward(sg.loss, keep).schedule.predicted_peak_bytes;
    try {
      Oracle o(p);
      auto t0 = std::chrono::steady_clock::now();
      OracleResult mp = o.min_peak(max_states, top);
      const bool exact = mp.status == OracleResult::Status::optimal;
      if (!exact && mp.schedule.steps.empty()) {
        skipped->push_back({sg.family, sg.name, fmt::format("least peak not found within {} states ({} values)",
                                                                   max_states, o.values())});
        continue;
      }
      std::fprintf(stderr, "  oracle: %s (%d values): least peak %s%lld B (keep_all %lld B), %zu states, %.0f ms\n",
                   sg.name.c_str(), o.values(), exact ? "" : "<= ", static_cast<long long>(mp.peak), static_cast<long long>(top), mp.states,
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (std::getenv("AD_ORACLE_CHECK")) {
        OracleResult mb = o.min_peak_bottleneck(max_states);
        std::fprintf(stderr, "    least peak by bottleneck search: %lld B (%zu states)\n", static_cast<long long>(mb.peak), mb.states);
        if (mb.status == OracleResult::Status::optimal && mb.peak != mp.peak)
          skipped->push_back({sg.family, sg.name, "least peak: bisection and bottleneck search disagree"});
      }
      std::vector<std::int64_t> bs;
      if (exact) bs.push_back(mp.peak - 1);  // both must be infeasible here
      for (int i = 0; i < budgets; ++i) {
        std::int64_t b = mp.peak + (top - mp.peak) * i / std::max(1, budgets - 1);
        if (bs.empty() || b != bs.back()) bs.push_back(b);
      }
      for (auto b : bs) {
        OracleCase c;
        c.family = sg.family;
        c.graph = sg.name;
        c.values = o.values();
        c.budget = b;
        c.min_peak = mp.peak;
        c.min_peak_exact = exact;
        c.top = top;
        c.base = o.base_flops();
        auto t1 = std::chrono::steady_clock::now();
        OracleResult r = o.min_cost(b, max_states);
        if (std::getenv("AD_ORACLE_CHECK")) {  // the two canonical forms must agree
          OracleResult r2 = o.min_cost(b, max_states, false);
          std::fprintf(stderr, "    budget %lld: lazy %s %.0f (%zu states), eager %s %.0f (%zu states)\n",
                       static_cast<long long>(b), r.status == OracleResult::Status::optimal ? "opt" : "not", r.recompute_flops,
                       r.states, r2.status == OracleResult::Status::optimal ? "opt" : "not", r2.recompute_flops, r2.states);
          if (r.status != r2.status || (r.status == OracleResult::Status::optimal && r.recompute_flops != r2.recompute_flops))
            c.note += "lazy and eager oracle forms disagree; ";
        }
        c.oracle_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
        c.states = r.states;
        c.oracle = r.status == OracleResult::Status::optimal      ? OracleCase::Status::optimal
                   : r.status == OracleResult::Status::infeasible ? OracleCase::Status::infeasible
                                                                  : OracleCase::Status::gave_up;
        if (c.oracle == OracleCase::Status::optimal) {
          c.oracle_rc = r.recompute_flops;
          c.oracle_peak = r.peak;
          if (r.peak > b) c.note += fmt::format("oracle schedule simulates to {} B > budget; ", r.peak);
          if (std::abs(r.schedule.recompute_flops - r.recompute_flops) > 0.5)
            c.note += "oracle cost and its schedule's recompute flops differ; ";
          c.note += run_check(sg, r.schedule, r.peak, ref);
        }
        ad::Schedule policy_schedule;  // empty: infeasible
        c.first = b == bs.front();
        if (c.first) ad::planner::clear_exact_sweeps();  // the graph's first plan sweeps from scratch
        auto t2 = std::chrono::steady_clock::now();
        try {
          zero();
          ad::Policy pol = ad::policy::budget(b);
          pol.reuse_buffers = false;  // the oracle does not model buffer reuse: compare like with like
          ad::Plan pl = ad::plan_backward(sg.loss, pol);
          c.policy_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t2).count();
          c.policy_proven = pl.schedule.proven_cheapest;
          c.policy_feasible = true;
          c.policy_rc = pl.schedule.recompute_flops;
          c.policy_peak = pl.schedule.predicted_peak_bytes;
          if (c.policy_peak > b) c.note += "policy peak above budget; ";
          policy_schedule = pl.schedule;
        } catch (const ad::Error& e) {
          c.policy_feasible = false;
          c.policy_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t2).count();
        }
        if (const char* dump = std::getenv("AD_ORACLE_DUMP");
            dump && sg.name == dump && c.oracle == OracleCase::Status::optimal)
          dump_schedules(p, *sg.loss.graph(), b, r.schedule, policy_schedule, bs.front() == b);
        if (c.oracle == OracleCase::Status::optimal && c.policy_feasible && c.policy_rc < c.oracle_rc - 0.5)
          c.note += "policy cheaper than the oracle (oracle bug); ";
        if (c.oracle == OracleCase::Status::infeasible && c.policy_feasible)
          c.note += "policy feasible where the oracle is not (oracle bug); ";
        out.push_back(c);
      }
    } catch (const ad::Error& e) {
      skipped->push_back({sg.family, sg.name, e.what()});
    }
  }
  return out;
}

}  // namespace remat_bench
