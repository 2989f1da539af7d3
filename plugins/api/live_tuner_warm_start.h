// The live tuner's warm start for a training process (the Python plugin, or any caller of Context): what the link is,
// what the model's backward computes, and which knobs the simulator predicts fastest for that, before tuning starts.
//
// Link. Estimated before the backend connects, so that the automatic knobs (scheduler/auto_knobs.h) use it: the
// EMULATED rate when the launcher paces every process's sends (COMMSCHED_EMULATE_RATE, what the local benchmarks
// run), else the speed the fastest network interface that is up reports (/sys/class/net/*/speed, the NIC the
// cluster's traffic crosses on a dedicated node), else 10 Gbit/s, said so in the log. When tuning, the Context then
// measures the link through the connected backend before the first step (link_probe.h, COMMSCHED_LINK_PROBE) and the
// warm start simulates the measured rate and latency; where that is off or impossible it keeps the estimate and the
// simulator's default latency (25 us per PS message, 5 us per ring step), and its log line says which.
//
// Compute. The plugin reports when each gradient became ready in the first backwards (Context::note_backward); the
// gap between consecutive gradients is the backward compute of the layer that produced the later one, and the
// forward is taken as half of it (simulator/warm_start.h measured_profile). The least disturbed backward (the
// shortest) is the one kept. Where the compute per layer is known in advance (a model profile: `commsched run`), the
// profile's is simulated instead; the link, the cluster and the rule for where tuning starts are the same.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "scheduler/config.h"
#include "scheduler/policy.h"
#include "tuner/search_space.h"
#include "workload/profile.h"

namespace commsched {

struct LinkEstimate {
  double rate_bps = 0;       // per process, each direction; 0: unknown (the assumed default applies)
  bool emulated = false;     // the transport paces sends at rate_bps (receivers are not limited)
  std::string source;        // for the log: where the rate came from
  double latency_s = 0;      // the simulator's (PS one way per message, ring per step); 0: its default, assumed
  bool measured = false;     // rate and latency were timed through the backend (link_probe.h)
};
// The estimate above; `net_dir` is where the interfaces are listed (tests point it elsewhere).
LinkEstimate estimate_link(const std::string& net_dir = "/sys/class/net");

// The gradient ready times of one backward, kept until the tuner starts: tensor i of the model's signature became
// ready at ready_s[i] seconds (any clock; negative: not seen in that backward).
class BackwardSamples {
 public:
  // Keeps the sample with the shortest span from the first gradient to the last (the least disturbed one).
  void add(std::vector<double> ready_s);
  const std::optional<std::vector<double>>& best() const { return best_; }

 private:
  std::optional<std::vector<double>> best_;
  double best_span_s_ = 0;
};

struct LiveWarmStartJob {
  std::vector<uint64_t> tensor_bytes;  // the model's gradient sizes, in forward order
  std::vector<double> ready_s;         // one backward's ready times (BackwardSamples::best)
  std::optional<sim::ModelProfile> profile;  // the compute known in advance: simulated in place of the two above
  bool parameter_server = true;        // false: a ring all-reduce
  int workers = 2;
  int servers = 0;
  LinkEstimate link;                   // measured (link_probe.h) or estimated; its latency 0: the simulator's default
  EngineConfig config;                 // the engine's options, with the knobs it runs now
  tuner::SearchSpaceBounds bounds;     // the tuner's (COMMSCHED_TUNER_*): only knobs it can reach are simulated
};

// The least predicted gain for which the warm start starts tuning from its best candidate rather than the current
// knobs. The simulator matched real runs within 10%, and its errors for two configurations of one cell differed by up
// to about 5% (bench/RESULTS.md, the validation tables): a smaller predicted gain is not known to be one. The tuner
// keeps the first configuration it measures unless a later one beats it beyond the noise, so the order matters.
inline constexpr double kWarmStartMinGain = 0.05;

struct LiveWarmStart {
  std::vector<Knobs> trials;           // tried first, in this order (the first is where tuning starts: the current
                                       // knobs when no candidate is predicted kWarmStartMinGain faster)
  std::vector<double> predicted_s;     // the simulated time per step of each
  std::string why;                     // one line for the log: what was simulated, what was chosen, predicted vs now
};

// The link as the warm start's log line says it: the rate, measured or estimated (and from where), and the latency,
// measured or the simulator's default (assumed).
std::string describe_link(const LinkEstimate& link, bool parameter_server);

// Simulates the knobs the tuner can reach for this job (the same Policy code as the engine, simulator/warm_start.h)
// and returns the best three, fastest first. Throws InvalidArgument on a job the simulator refuses.
LiveWarmStart plan_live_warm_start(const LiveWarmStartJob& job);

}  // namespace commsched
