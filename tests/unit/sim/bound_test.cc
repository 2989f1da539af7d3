// The lower bound the grid judges the scheduler by (simulator.h: lower_bound_s, dependency_bound_s) counts the fixed
// costs every schedule pays at their fewest (the PS's per-message cost, the ring's alpha per collective): on the real
// profiles with many tensors, at every link rate, no policy at any knobs of its grid may come in below it.
#include <gtest/gtest.h>

#include <string>

#include "simulator/grid.h"
#include "workload/profile.h"

namespace commsched::sim {
namespace {

GridSpec spec_for(const std::string& model, NetworkKind network, int workers) {
  GridSpec s;
  s.models = {load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/" + model + ".json")};
  s.network = network;
  s.workers = {workers};
  s.ps_each_worker_max = workers;  // every PS worker simulated, as the grid judges it
  s.sim.iterations = 8;
  s.sim.warmup = 2;
  use_default_knob_grid(s);
  // The smallest partitions send the most messages, the largest the fewest; the bound must hold at both ends.
  s.grid("partition_bytes") = {32 << 10, 4 << 20};
  s.grid("credit_bytes") = {4};
  s.grid("small_tensor_bytes") = {0, 1 << 20};
  return s;
}

void expect_no_row_below_the_bound(const GridSpec& spec) {
  for (const CellResult& r : run_grid(spec)) {
    SCOPED_TRACE(r.model + ", " + r.policy + " " + r.knobs + ", " + std::to_string(r.bandwidth_bps / 1e9) +
                 " Gbit/s, " + std::to_string(r.workers) + " workers");
    EXPECT_GE(r.dependency_bound_s, r.lower_bound_s);
    EXPECT_GE(r.iteration_s, r.dependency_bound_s * (1 - 1e-9));
  }
}

TEST(LowerBound, ParameterServerPerMessageCostNoScheduleBeatsIt) {
  for (const char* model : {"resnet50", "bert-base"}) {
    GridSpec spec = spec_for(model, NetworkKind::ps, 8);
    ASSERT_GT(spec.ps_message_s, 0);
    expect_no_row_below_the_bound(spec);
  }
}

TEST(LowerBound, RingAlphaPerIterationNoScheduleBeatsIt) {
  for (int workers : {8, 256}) expect_no_row_below_the_bound(spec_for("resnet50", NetworkKind::allreduce, workers));
}

// At 100 Gbit/s ResNet-50's 161 tensors cost a server about as long in per-message time as a tenth of its bytes: the
// bound that counts them is above the bytes-only one by that much.
TEST(LowerBound, CountsEveryTensorsMessage) {
  const GridSpec spec = spec_for("resnet50", NetworkKind::ps, 8);
  const ModelProfile& m = spec.models[0];
  const PsParams p = ps_params(spec, 100e9, 8);
  const PsNetwork net(p);
  uint64_t messages = 0, tensors = 0;
  for (const TensorProfile& t : m.tensors) {
    messages += net.min_messages(t.bytes());
    tensors += t.bytes() > 0;
  }
  EXPECT_GE(messages, tensors);  // every tensor with bytes is a message at least
  EXPECT_GE(tensors, 160u);
  const double bytes_only = m.total_bytes() * 8.0 / 100e9;
  EXPECT_NEAR(comm_bound_s(m, m.layers.size(), net), bytes_only + double(messages) * (p.message_s - 1e-9), 1e-12);
}

}  // namespace
}  // namespace commsched::sim
