#include "plugins/api/live_tuner_warm_start.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "options/parse.h"
#include "scheduler/auto_knobs.h"
#include "simulator/warm_start.h"
#include "tuner/online_tuner.h"

namespace commsched {
namespace {

// A sysfs attribute's first word; empty when unreadable (virtual interfaces have no speed).
std::string read_word(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string word;
  in >> word;
  return in ? word : std::string();
}

std::string ms(double seconds) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << seconds * 1e3 << " ms";
  return s.str();
}

}  // namespace

LinkEstimate estimate_link(const std::string& net_dir) {
  if (const std::optional<std::string> rate = env_value("COMMSCHED_EMULATE_RATE")) {
    const double bps = parse_rate_bps("COMMSCHED_EMULATE_RATE", *rate, /*allow_unlimited=*/true);
    if (bps > 0) return {bps, true, "emulated link COMMSCHED_EMULATE_RATE=" + *rate};
  }
  double best_mbps = 0;
  std::string best_name;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(net_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "lo" || read_word(entry.path() / "operstate") != "up") continue;
    const std::string speed = read_word(entry.path() / "speed");
    char* end = nullptr;
    const double mbps = speed.empty() ? 0 : std::strtod(speed.c_str(), &end);
    if (mbps > best_mbps) best_mbps = mbps, best_name = name;
  }
  if (best_mbps > 0)
    return {best_mbps * 1e6, false, "NIC " + best_name + " at " + std::to_string(int64_t(best_mbps)) + " Mbit/s"};
  return {0, false, "link assumed " + std::to_string(int(kAssumedLinkBps / 1e9)) + " Gbit/s (no NIC speed readable)"};
}

void BackwardSamples::add(std::vector<double> ready_s) {
  double first = 0, last = 0;
  bool any = false;
  for (double t : ready_s) {
    if (t < 0) continue;
    first = any ? std::min(first, t) : t;
    last = any ? std::max(last, t) : t;
    any = true;
  }
  if (!any) return;
  const double span = last - first;
  if (!best_ || span < best_span_s_) {
    best_ = std::move(ready_s);
    best_span_s_ = span;
  }
}

std::string describe_link(const LinkEstimate& link, bool parameter_server) {
  if (link.measured) return link.source;
  const double latency = parameter_server ? sim::WarmStartJob{}.latency_s : kAssumedStepLatencyS;
  std::ostringstream s;
  s << "link estimated (" << link.source << "), latency assumed " << latency * 1e6
    << (parameter_server ? " us per message" : " us per ring step") << " (the simulator's default)";
  return s.str();
}

namespace {

// True when no candidate of `plan` is predicted at least kWarmStartMinGain faster than its current knobs.
bool keeps_current(const sim::WarmStartPlan& plan) {
  return !plan.ranked.empty() && plan.ranked.front().predicted_s > plan.current.predicted_s * (1 - kWarmStartMinGain);
}

}  // namespace

LiveWarmStart plan_live_warm_start(const LiveWarmStartJob& job) {
  const auto started = std::chrono::steady_clock::now();
  const sim::ModelProfile model = job.profile ? *job.profile : sim::measured_profile(job.tensor_bytes, job.ready_s);
  sim::WarmStartJob w;
  w.network = job.parameter_server ? sim::NetworkKind::ps : sim::NetworkKind::allreduce;
  w.workers = job.workers;
  w.servers = job.parameter_server ? job.servers : 0;
  w.link_bps = job.link.rate_bps > 0 ? job.link.rate_bps : kAssumedLinkBps;
  if (job.link.latency_s > 0) w.latency_s = job.link.latency_s;
  else if (!job.parameter_server) w.latency_s = kAssumedStepLatencyS;
  w.emulated_links = job.link.emulated;
  w.bounds = job.bounds;
  w.base = job.config;
  const sim::WarmStartPlan plan = sim::plan_warm_start(model, w, 3);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  LiveWarmStart out;
  const bool keep = keeps_current(plan);
  if (keep) {
    out.trials.push_back(plan.current.knobs);
    out.predicted_s.push_back(plan.current.predicted_s);
  }
  for (const sim::WarmStartCandidate& c : plan.ranked) {
    if (keep && c.knobs == plan.current.knobs) continue;
    out.trials.push_back(c.knobs);
    out.predicted_s.push_back(c.predicted_s);
  }
  std::ostringstream why;
  why << "warm start: simulated " << job.workers << " workers"
      << (job.parameter_server ? " x " + std::to_string(job.servers) + " servers" : std::string(" (ring)")) << ", "
      << describe_link(job.link, job.parameter_server) << ", " << model.tensors.size() << " gradients ("
      << format_bytes(model.total_bytes()) << "), ";
  if (job.profile)
    why << "the profile's compute " << ms(double(model.compute_per_iteration()) * 1e-9) << " (forward + backward)";
  else
    why << "measured backward " << ms(double(model.compute_per_iteration()) / (1 + sim::kForwardShareOfBackward) * 1e-9)
        << " (+ forward taken as half)";
  why << ", in " << ms(took) << ": ";
  if (plan.ranked.empty()) {
    why << "no candidate";
  } else if (keep) {
    why << "keeps the current " << tuner::describe_knobs(plan.current.knobs) << " (predicted " << ms(plan.current.predicted_s)
        << "/step) to start from: the best candidate, " << tuner::describe_knobs(plan.ranked.front().knobs) << ", is predicted "
        << ms(plan.ranked.front().predicted_s) << ", less than " << int(kWarmStartMinGain * 100)
        << "% faster, which the simulator cannot tell from its error; tries it next";
  } else {
    why << "chose " << tuner::describe_knobs(plan.ranked.front().knobs) << ", predicted " << ms(plan.ranked.front().predicted_s)
        << "/step against " << ms(plan.current.predicted_s) << " at the current " << tuner::describe_knobs(plan.current.knobs)
        << "; next " ;
    for (size_t i = 1; i < plan.ranked.size(); ++i)
      why << (i > 1 ? ", " : "") << tuner::describe_knobs(plan.ranked[i].knobs) << " (" << ms(plan.ranked[i].predicted_s) << ")";
  }
  out.why = why.str();
  return out;
}

}  // namespace commsched
