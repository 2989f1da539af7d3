// Writers for the bench grid: CSV and JSON for tools, Markdown for people, timelines JSON for simulator/plot.py.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "simulator/grid.h"

namespace commsched::sim {

void write_csv(std::ostream& out, const std::vector<CellResult>& cells);
void write_json(std::ostream& out, const std::vector<CellResult>& cells);
// One table per model: iteration ms and speedup per policy, the lower bound, and the targets check
// (bytescheduler >= 0.98x the best baseline's speed, <= 1.10x the lower bound; reported against both bounds).
void write_markdown(std::ostream& out, const std::vector<CellResult>& cells, const std::string& title);
// {"model":..., "bandwidth_bps":..., "workers":..., "policies":[{"policy", "knobs", "spans":[...]}]}; times in ms
// from the shown iteration's start.
void write_timelines(std::ostream& out, const std::string& model, double bandwidth_bps, int workers,
                     const std::vector<PolicyTimeline>& timelines);

struct TargetCheck {
  bool have = false;          // the cell has bytescheduler and at least one baseline
  double vs_best_baseline;    // best baseline time / bytescheduler time (speed ratio; target >= 0.98)
  double vs_lower_bound;      // bytescheduler time / max(compute, comm) (target <= 1.10)
  double vs_dependency_bound; // bytescheduler time / the dependency-aware bound
  std::string best_baseline;
};
// Checks the cell (model, bandwidth, workers) that cells[first..last) describe.
TargetCheck check_targets(const std::vector<CellResult>& cell);

}  // namespace commsched::sim
