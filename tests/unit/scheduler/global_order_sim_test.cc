// The global order decides all-reduce as the simulator does: the simulator (simulator/) drives rank 0's GlobalOrder, in
// place of the policy it wraps, through whole training iterations on a ring all-reduce, and every iteration starts
// at the very nanosecond it starts when the simulator drives the policy directly.
#include <gtest/gtest.h>

#include <map>

#include "simulator/sim_policy.h"
#include "simulator/simulator.h"
#include "scheduler/global_order.h"
#include "scheduler/config.h"
#include "scheduler/policy_factory.h"

namespace commsched {
namespace {

// A Policy whose decisions are a one-rank GlobalOrder's: each partition is reported ready, the order the global order
// produces is what gets dispatched, completions go back as group completions, and the end of backward and flushes
// as iteration marks (as an engine sends them).
class GlobalOrderAsPolicy final : public Policy {
 public:
  explicit GlobalOrderAsPolicy(std::unique_ptr<Policy> policy)
      : splits_(policy->splits_tasks()), name_(policy->name()), c_(1) {
    c_.adopt(std::move(policy), /*marks=*/true);
  }

  std::string_view name() const override { return name_; }
  bool splits_tasks() const override { return splits_; }
  void on_task_arrived(const TaskArrival& task, Nanos /*now*/) override {
    std::vector<ReadyReport> reps;
    for (const PartRef& p : task.parts) {
      ReadyReport r;
      r.desc = PartitionDesc{task.task_id, p.offset, p.bytes, task.bytes, DType::f32, Op::allreduce, 0};
      r.name = "t" + std::to_string(task.task_id);
      r.priority = task.priority;
      reps.push_back(r);
      parts_[{task.task_id, p.offset}] = p;
    }
    c_.on_ready(0, reps, out_);
    reported_ += reps.size();
  }
  void on_backward_done(Nanos /*now*/) override { c_.on_mark(0, {true, reported_}); }
  void on_flush(Nanos /*now*/) override { c_.on_mark(0, {false, reported_}); }
  void on_batch_done(const Batch& /*batch*/, Nanos now) override { c_.on_group_done(now); }
  void poll(Nanos now, std::vector<Batch>& out) override {
    c_.flush(now, out_);
    EXPECT_TRUE(out_.errors.empty());
    for (const auto& d : out_.order.defines) slot_of_[d.cache_id] = {d.desc.key, d.desc.offset};
    for (const auto& g : out_.order.groups) {
      Batch b;
      for (const auto& e : g) b.push_back(parts_.at(slot_of_.at(e.cache_id)));
      out.push_back(std::move(b));
    }
    out_ = GlobalOrderOutput{};
  }
  std::optional<Nanos> next_wakeup() const override { return c_.next_wakeup(); }
  size_t queued_partitions() const override { return c_.pending(); }
  uint64_t bytes_in_flight() const override { return c_.bytes_in_flight(); }

 private:
  bool splits_;
  std::string name_;
  GlobalOrder c_;
  GlobalOrderOutput out_;
  uint64_t reported_ = 0;
  std::map<std::pair<uint64_t, uint64_t>, PartRef> parts_;
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> slot_of_;
};

sim::ModelProfile model() {
  // Layers of mixed sizes: tiny biases (fused), mid-sized convolutions, and big tensors that are split.
  std::vector<sim::TensorProfile> t;
  const Nanos ms = 1'000'000;
  for (int layer = 0; layer < 12; ++layer) {
    const uint64_t weights = layer % 4 == 3 ? 6'000'000 : 150'000 * (layer + 1);
    t.push_back({"l" + std::to_string(layer) + ".w", layer, DType::f32, weights, ms, 2 * ms});
    t.push_back({"l" + std::to_string(layer) + ".b", layer, DType::f32, 512, 0, 0});
  }
  return sim::make_profile("mixed", std::move(t));
}

class CoordinatorMatchesSimulator : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(CoordinatorMatchesSimulator, EveryIterationStartsWhenThePolicysDoes) {
  EngineConfig cfg;
  cfg.policy = GetParam();
  cfg.knobs.credit_bytes = 8 << 20;
  cfg.knobs.small_tensor_bytes = 64 << 10;
  cfg.fusion_bytes = 16 << 20;
  sim::RingAllreduceNetwork net({16, 10e9, 5e-6});
  sim::SimOptions opts;
  opts.partition_bytes = 2 << 20;
  const auto m = model();
  auto direct = sim::make_sim_policy(cfg, net);
  const sim::SimResult want = sim::simulate(m, net, *direct, opts);
  GlobalOrderAsPolicy through(sim::make_sim_policy(cfg, net));
  const sim::SimResult got = sim::simulate(m, net, through, opts);
  EXPECT_EQ(got.iteration_start_s, want.iteration_start_s);
  EXPECT_EQ(got.batches, want.batches);
  EXPECT_GT(want.batches, static_cast<uint64_t>(opts.iterations)) << "too few messages to compare";
}

INSTANTIATE_TEST_SUITE_P(Policies, CoordinatorMatchesSimulator,
                         ::testing::ValuesIn(all_policies()),  // every registered policy
                         [](const auto& info) { return std::string(policy_name(info.param)); });

}  // namespace
}  // namespace commsched
