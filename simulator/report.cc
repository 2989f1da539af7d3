#include "simulator/report.h"

#include <iomanip>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "simulator/row_label.h"

namespace commsched::sim {
namespace {

std::string gbit(double bps) {
  std::ostringstream s;
  s << bps / 1e9 << " Gbit/s";
  return s.str();
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string csv_quote(const std::string& s) { return "\"" + s + "\""; }

// Cells grouped by (model, bandwidth, workers), in grid order.
std::vector<std::vector<CellResult>> group_cells(const std::vector<CellResult>& cells) {
  std::vector<std::vector<CellResult>> groups;
  for (const CellResult& c : cells) {
    if (groups.empty() || groups.back().front().model != c.model ||
        groups.back().front().bandwidth_bps != c.bandwidth_bps || groups.back().front().workers != c.workers)
      groups.emplace_back();
    groups.back().push_back(c);
  }
  return groups;
}

std::string percent(const LinkBusy& b) {
  return fixed(b.mean * 100, 0) + "% (" + fixed(b.min * 100, 0) + "-" + fixed(b.max * 100, 0) + ")";
}

// Where the time goes: how busy each kind of link was, per policy and cell (every PS worker simulated only). A link
// kind far below the others, or a wide min-max spread among the servers, is where a schedule loses to the bound.
void write_link_use(std::ostream& out, const std::vector<CellResult>& cells) {
  bool header = false;
  for (const CellResult& c : cells) {
    if (!c.links.have) continue;
    if (!header) {
      out << "\nLinks busy over the run, mean (least-most busy link): where a schedule loses to the bound\n\n"
             "| model | bandwidth | workers | policy | worker uplinks | server downlinks | server uplinks |"
             " worker downlinks |\n|---|---|---|---|---|---|---|---|\n";
      header = true;
    }
    out << "| " << c.model << " | " << gbit(c.bandwidth_bps) << " | " << c.workers << " | " << c.policy << " | "
        << percent(c.links.worker_up) << " | " << percent(c.links.server_in) << " | " << percent(c.links.server_out)
        << " | " << percent(c.links.worker_down) << " |\n";
  }
}

// The registry row of a result row: its policy, or the policy an automatic-knobs row ("<policy>-auto") belongs to.
const PolicyInfo* policy_of(const CellResult& c) {
  const RowLabel row = parse_row(c.policy);
  return row.knobs == KnobSource::tuned ? nullptr : find_policy(row.policy);
}

bool is_baseline(const CellResult& c) {
  const PolicyInfo* p = policy_of(c);
  return p != nullptr && p->baseline;
}

bool is_auto_row(const CellResult& c) {
  const PolicyInfo* p = policy_of(c);
  return p != nullptr && c.policy == auto_row_label(PolicyKind(p->name));
}

}  // namespace

TargetCheck check_targets(const std::vector<CellResult>& cell) {
  TargetCheck t;
  // The scheduler (the registry's non-baseline policy) is judged at its automatic knobs where that row was run (what
  // a user gets), else at its best; against the best of the baselines.
  const CellResult* bs = nullptr;
  const CellResult* best = nullptr;
  for (const CellResult& c : cell) {
    if (is_baseline(c)) {
      if (!best || c.iteration_s < best->iteration_s) best = &c;
    } else if (policy_of(c) && (is_auto_row(c) || !bs || !is_auto_row(*bs))) {
      bs = &c;
    }
  }
  if (!bs || !best) return t;
  t.have = true;
  t.vs_best_baseline = best->iteration_s / bs->iteration_s;
  t.vs_lower_bound = bs->iteration_s / bs->lower_bound_s;
  t.vs_dependency_bound = bs->iteration_s / bs->dependency_bound_s;
  t.best_baseline = best->policy;
  return t;
}

void write_csv(std::ostream& out, const std::vector<CellResult>& cells) {
  out << "model,bandwidth_gbps,workers,policy,knobs,iteration_ms,speedup_vs_wfbp,compute_ms,comm_bound_ms,"
         "lower_bound_ms,dependency_bound_ms,batches_per_iteration\n";
  for (const CellResult& c : cells)
    out << c.model << ',' << c.bandwidth_bps / 1e9 << ',' << c.workers << ',' << c.policy << ',' << csv_quote(c.knobs)
        << ',' << fixed(c.iteration_s * 1e3, 3) << ',' << fixed(c.speedup_vs_wfbp, 4) << ','
        << fixed(c.compute_s * 1e3, 3) << ',' << fixed(c.comm_bound_s * 1e3, 3) << ','
        << fixed(c.lower_bound_s * 1e3, 3) << ',' << fixed(c.dependency_bound_s * 1e3, 3) << ','
        << c.batches_per_iteration << '\n';
}

void write_json(std::ostream& out, const std::vector<CellResult>& cells) {
  nlohmann::json j = nlohmann::json::array();
  for (const CellResult& c : cells)
    j.push_back({{"model", c.model}, {"bandwidth_bps", c.bandwidth_bps}, {"workers", c.workers},
                 {"policy", c.policy}, {"knobs", c.knobs}, {"iteration_s", c.iteration_s},
                 {"speedup_vs_wfbp", c.speedup_vs_wfbp}, {"compute_s", c.compute_s},
                 {"comm_bound_s", c.comm_bound_s}, {"lower_bound_s", c.lower_bound_s}, {"dependency_bound_s", c.dependency_bound_s},
                 {"batches_per_iteration", c.batches_per_iteration}});
  out << j.dump(1) << '\n';
}

void write_markdown(std::ostream& out, const std::vector<CellResult>& cells, const std::string& title) {
  out << "## " << title << "\n\n";
  std::string model;
  for (const auto& cell : group_cells(cells)) {
    if (cell.front().model != model) {
      model = cell.front().model;
      out << "\n### " << model << " (compute " << fixed(cell.front().compute_s * 1e3, 1) << " ms/iteration)\n\n";
      out << "| bandwidth | workers |";
      for (const CellResult& c : cell) out << ' ' << c.policy << " ms (speedup) |";
      out << " bound ms: simple / dependency | scheduler (automatic knobs where run) speed / best baseline |"
             " scheduler time / bounds |"
             " targets (simple; dependency) |\n|---|---|";
      for (size_t i = 0; i < cell.size() + 4; ++i) out << "---|";
      out << '\n';
    }
    out << "| " << gbit(cell.front().bandwidth_bps) << " | " << cell.front().workers << " |";
    for (const CellResult& c : cell)
      out << ' ' << fixed(c.iteration_s * 1e3, 1) << " (" << fixed(c.speedup_vs_wfbp, 2) << "x) |";
    out << ' ' << fixed(cell.front().lower_bound_s * 1e3, 1) << " / " << fixed(cell.front().dependency_bound_s * 1e3, 1)
        << " |";
    const TargetCheck t = check_targets(cell);
    if (t.have) {
      const bool vs_base = t.vs_best_baseline >= 0.98;
      const auto verdict = [&](double vs_bound) { return vs_base && vs_bound <= 1.10 ? "met" : "**missed**"; };
      out << ' ' << fixed(t.vs_best_baseline, 3) << "x (" << t.best_baseline << ") | " << fixed(t.vs_lower_bound, 3)
          << " / " << fixed(t.vs_dependency_bound, 3) << " | " << verdict(t.vs_lower_bound) << "; "
          << verdict(t.vs_dependency_bound) << " |\n";
    } else {
      out << " - | - | - |\n";
    }
  }
  out << "\nscheduler knobs (automatic, and the best of the grid or tuner) per cell:\n\n";
  for (const CellResult& c : cells)
    if (policy_of(c) && !is_baseline(c))
      out << "- " << c.model << ", " << gbit(c.bandwidth_bps) << ", " << c.workers << " workers: " << c.knobs << '\n';
  write_link_use(out, cells);
}

void write_timelines(std::ostream& out, const std::string& model, double bandwidth_bps, int workers,
                     const std::vector<PolicyTimeline>& timelines) {
  static const char* lanes[] = {"forward", "backward", "comm"};
  nlohmann::json j = {{"model", model}, {"bandwidth_bps", bandwidth_bps}, {"workers", workers}};
  nlohmann::json policies = nlohmann::json::array();
  for (const PolicyTimeline& t : timelines) {
    nlohmann::json spans = nlohmann::json::array();
    const Nanos origin = static_cast<Nanos>(t.iteration_start_s * 1e9 + 0.5);
    for (const Span& s : t.spans)
      spans.push_back({{"lane", lanes[int(s.lane)]}, {"start_ms", (s.start - origin) * 1e-6},
                       {"end_ms", (s.end - origin) * 1e-6}, {"first", s.first_priority}, {"last", s.last_priority},
                       {"bytes", s.bytes}, {"parts", s.parts}});
    policies.push_back({{"policy", t.policy}, {"knobs", t.knobs}, {"spans", spans}});
  }
  j["policies"] = policies;
  out << j.dump() << '\n';
}

}  // namespace commsched::sim
