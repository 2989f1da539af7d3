#include "scheduler/mg_wfbp_policy.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace commsched {

MergedGradientPolicy::MergedGradientPolicy(double alpha_s, double beta_s_per_byte)
    : alpha_ns_(alpha_s * 1e9), beta_ns_per_byte_(beta_s_per_byte * 1e9) {
  if (!(alpha_s >= 0) || !std::isfinite(alpha_s))
    throw InvalidArgument("MergedGradientPolicy: alpha must be a finite number of seconds >= 0, got " +
                          std::to_string(alpha_s));
  if (!(beta_s_per_byte >= 0) || !std::isfinite(beta_s_per_byte))
    throw InvalidArgument("MergedGradientPolicy: beta must be a finite number of seconds per byte >= 0, got " +
                          std::to_string(beta_s_per_byte));
}

void MergedGradientPolicy::on_task_arrived(const TaskArrival& task, Nanos now) {
  if (!learned_) {
    observe(task, now);
    for (const PartRef& p : task.parts) ready_.push_back(Batch{p});  // WFBP until the plan exists
    return;
  }
  auto it = group_of_.find(task.priority);
  if (it == group_of_.end()) {  // a tensor the plan never saw: do not hold it back
    for (const PartRef& p : task.parts) ready_.push_back(Batch{p});
    return;
  }
  Group& g = groups_[it->second];
  g.parts.insert(g.parts.end(), task.parts.begin(), task.parts.end());
  if (++g.arrived_tasks >= g.expected_tasks) release(g);
}

void MergedGradientPolicy::observe(const TaskArrival& task, Nanos now) {
  if (!iteration_start_) iteration_start_ = now;
  Observed& o = observed_[task.priority];
  o.ready = std::max(o.ready, now - *iteration_start_);
  o.bytes += task.bytes;
  ++o.tasks;
}

void MergedGradientPolicy::release(Group& g) {
  if (!g.parts.empty()) ready_.push_back(std::move(g.parts));
  g.parts.clear();
  g.arrived_tasks = 0;
}

void MergedGradientPolicy::on_batch_done(const Batch& batch, Nanos /*now*/) {
  for (const PartRef& p : batch) in_flight_ -= p.bytes;
}

void MergedGradientPolicy::on_backward_done(Nanos /*now*/) {
  if (!learned_ && !observed_.empty()) {
    plan();
    learned_ = true;
    return;
  }
  // Every gradient of the iteration exists now; a group still incomplete means the model's tensors changed.
  // Send what it has rather than hold it forever.
  for (Group& g : groups_) release(g);
}

void MergedGradientPolicy::on_flush(Nanos /*now*/) {
  if (!learned_) {
    observed_.clear();
    iteration_start_.reset();
    return;
  }
  for (Group& g : groups_) release(g);
}

void MergedGradientPolicy::plan() {
  struct Item {
    int32_t priority;
    Observed o;
  };
  std::vector<Item> items;
  for (const auto& [prio, o] : observed_) items.push_back({prio, o});
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.o.ready != b.o.ready ? a.o.ready < b.o.ready : a.priority > b.priority;
  });

  double link_free = 0;  // when the previous (closed) group's message completes
  Group current;
  double current_ready = 0;
  uint64_t current_bytes = 0;
  auto close = [&] {
    link_free = finish(std::max(current_ready, link_free), current_bytes);
    groups_.push_back(std::move(current));
    current = Group{};
  };
  for (const Item& it : items) {
    const double ready = static_cast<double>(it.o.ready);
    if (!current.priorities.empty()) {
      const double group_alone = finish(std::max(current_ready, link_free), current_bytes);
      const double separately = finish(std::max(ready, group_alone), it.o.bytes);
      const double merged = finish(std::max(ready, link_free), current_bytes + it.o.bytes);
      if (!(merged < separately)) close();
    }
    if (current.priorities.empty()) current_bytes = 0;
    current.priorities.push_back(it.priority);
    current.expected_tasks += it.o.tasks;
    current_ready = ready;
    current_bytes += it.o.bytes;
  }
  if (!current.priorities.empty()) close();
  for (size_t g = 0; g < groups_.size(); ++g)
    for (int32_t prio : groups_[g].priorities) group_of_[prio] = g;
}

void MergedGradientPolicy::poll(Nanos /*now*/, std::vector<Batch>& out) {
  for (Batch& b : ready_) {
    for (const PartRef& p : b) in_flight_ += p.bytes;
    out.push_back(std::move(b));
  }
  ready_.clear();
}

size_t MergedGradientPolicy::queued_partitions() const {
  size_t n = 0;
  for (const Batch& b : ready_) n += b.size();
  for (const Group& g : groups_) n += g.parts.size();
  return n;
}

std::vector<std::vector<int32_t>> MergedGradientPolicy::merge_groups() const {
  std::vector<std::vector<int32_t>> out;
  for (const Group& g : groups_) out.push_back(g.priorities);
  return out;
}

}  // namespace commsched
