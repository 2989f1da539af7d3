// A fused batch whose partitions have different dtypes: f32, f64, f16, i32 and i64 tensors small enough to be fused,
// submitted together so the fusion policy puts them into one batch, must each be summed in its own dtype. Values are
// chosen so that any other dtype gets them wrong: f64 parts below f32's precision, integers above 2^24 (not exact in
// f32), and every sum is checked exactly. Through the Engine, on every CPU backend with ranks as threads of this
// process: loopback, the parameter server (one in-process server) and Gloo (its coordinator runs the fusion policy).
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "comm_backends/cluster_env.h"
#include "comm_backends/backend_registry.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/comm_backend.h"
#include "base/half.h"
#include "comm_backends/loopback/loopback_backend.h"
#include "comm_backends/ps/server.h"
#include "scheduler/config.h"
#include "scheduler/engine.h"
#include "scheduler/fusion_policy.h"
#include "tests/integration/harness/local_cluster.h"

namespace commsched {
namespace {

using namespace std::chrono_literals;

constexpr int kRanks = 2;  // two addends: a float sum is then the same in any order

// Forwards to a backend and remembers whether any batch it was given mixed dtypes (so the test knows it fused them).
class Recording final : public CommBackend {
 public:
  explicit Recording(std::shared_ptr<CommBackend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void do_start(std::vector<PartitionView> batch, BatchDone sent, BatchDone done) override {
    note(batch);
    inner_->start(std::move(batch), std::move(sent), std::move(done));
  }
  BackendCapabilities capabilities() const override { return inner_->capabilities(); }
  void shutdown() override { inner_->shutdown(); }
  bool saw_mixed_batch() const {
    std::lock_guard lock(mu_);
    return mixed_;
  }

 private:
  void note(const std::vector<PartitionView>& batch) {
    std::set<DType> dtypes;
    for (const PartitionView& v : batch) dtypes.insert(v.task->dtype);
    std::lock_guard lock(mu_);
    mixed_ = mixed_ || dtypes.size() > 1;
  }
  std::shared_ptr<CommBackend> inner_;
  mutable std::mutex mu_;
  bool mixed_ = false;
};

// Rank r's value of element e of tensor t, as a double; exact in the tensor's dtype, and so is the sum of two ranks.
double value(DType t, int r, uint64_t e) {
  switch (t) {
    case DType::f32: return 1.0 + r * 0.25 + double(e) * 0.125;               // exact in f16 too, not the point here
    case DType::f64: return 1.0 + (r + 1) * 1e-12 + double(e);                 // below f32's precision
    case DType::f16: return 0.5 + r + double(e) * 0.25;                       // small: exact in f16
    case DType::i32: return double((1 << 24) + 1 + 3 * r + int64_t(e));       // not exact in f32
    case DType::i64: return double((int64_t(1) << 40) + 7 * r + int64_t(e));  // not exact in f32 or i32
    default: return 0;
  }
}

void store(DType t, std::byte* p, double v) {
  switch (t) {
    case DType::f32: { float x = float(v); std::memcpy(p, &x, 4); break; }
    case DType::f64: std::memcpy(p, &v, 8); break;
    case DType::f16: { uint16_t x = f32_to_f16(float(v)); std::memcpy(p, &x, 2); break; }
    case DType::i32: { int32_t x = int32_t(v); std::memcpy(p, &x, 4); break; }
    case DType::i64: { int64_t x = int64_t(v); std::memcpy(p, &x, 8); break; }
    default: break;
  }
}

// The exact sum over the ranks, computed in the dtype itself, compared bit for bit.
bool equal_sum(DType t, const std::byte* p, uint64_t e) {
  switch (t) {
    case DType::f32: { float want = 0, got; for (int r = 0; r < kRanks; ++r) want += float(value(t, r, e)); std::memcpy(&got, p, 4); return got == want; }
    case DType::f64: { double want = 0, got; for (int r = 0; r < kRanks; ++r) want += value(t, r, e); std::memcpy(&got, p, 8); return got == want; }
    case DType::f16: { float want = 0; for (int r = 0; r < kRanks; ++r) want += float(value(t, r, e)); uint16_t got; std::memcpy(&got, p, 2); return f16_to_f32(got) == want; }
    case DType::i32: { int32_t want = 0, got; for (int r = 0; r < kRanks; ++r) want += int32_t(value(t, r, e)); std::memcpy(&got, p, 4); return got == want; }
    case DType::i64: { int64_t want = 0, got; for (int r = 0; r < kRanks; ++r) want += int64_t(value(t, r, e)); std::memcpy(&got, p, 8); return got == want; }
    default: return false;
  }
}

struct Tensor {
  std::string name;
  DType dtype;
  uint64_t count;
  std::vector<std::byte> bytes;
};

std::vector<Tensor> mixed_tensors(int rank) {
  // Two f32 tensors side by side at each end, so a backend that fuses only equal dtypes still fuses something: the
  // fusion policy takes the first tensors at once and the rest a cycle later, which splits one pair at most.
  const std::pair<DType, uint64_t> shapes[] = {{DType::f32, 5}, {DType::f32, 4}, {DType::f64, 3}, {DType::i32, 7},
                                               {DType::f16, 9}, {DType::i64, 2}, {DType::f64, 1}, {DType::f32, 6},
                                               {DType::f32, 8}};
  std::vector<Tensor> out;
  for (size_t i = 0; i < std::size(shapes); ++i) {
    auto [t, n] = shapes[i];
    Tensor x{"g" + std::to_string(i) + "." + std::string(dtype_name(t)), t, n, std::vector<std::byte>(n * dtype_size(t))};
    for (uint64_t e = 0; e < n; ++e) store(t, x.bytes.data() + e * dtype_size(t), value(t, rank, e));
    out.push_back(std::move(x));
  }
  return out;
}

// The fusion policy with a long cycle: every tensor submitted before the first tick goes out in one fused batch.
EngineConfig fusing_config() {
  EngineConfig c;
  c.policy = PolicyKind::fusion;
  c.fusion_bytes = 1 << 20;
  // The first tick takes the first tensor alone; the rest must arrive within one cycle to be fused. 50 ms was too
  // short under ThreadSanitizer on a loaded machine (7 groups of 7 tensors: nothing fused).
  c.fusion_cycle_s = 0.25;
  return c;
}

// Runs one round on every rank (each from its own thread, as processes would) and checks every element.
void run_and_check(const std::vector<std::shared_ptr<CommBackend>>& backends, Op op) {
  const EngineConfig cfg = fusing_config();
  std::vector<std::string> errors(backends.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < backends.size(); ++r)
    ranks.emplace_back([&, r] {
      Engine engine(std::make_unique<FusionPolicy>(cfg.fusion_bytes, Nanos(cfg.fusion_cycle_s * 1e9)), backends[r],
                    cfg);
      std::vector<Tensor> t = mixed_tensors(int(r));
      for (size_t i = 0; i < t.size(); ++i) {
        Task task;
        task.name = t[i].name;
        task.op = op;
        task.dtype = t[i].dtype;
        task.count = t[i].count;
        task.buffer = Buffer{t[i].bytes.data(), Device::cpu, 0};
        task.priority = int32_t(i);
        engine.submit(std::move(task));
      }
      engine.backward_done();
      if (!engine.wait_all_for(60s)) {
        errors[r] = "hung";
        return;
      }
      if (const Status s = engine.wait_all(); !s.ok()) errors[r] = s.message;
      for (const Tensor& x : t)
        for (uint64_t e = 0; e < x.count && errors[r].empty(); ++e)
          if (!equal_sum(x.dtype, x.bytes.data() + e * dtype_size(x.dtype), e))
            errors[r] = "tensor " + x.name + " element " + std::to_string(e) + " is not the exact sum";
    });
  for (auto& t : ranks) t.join();
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

std::vector<std::shared_ptr<CommBackend>> recorded(std::vector<std::shared_ptr<CommBackend>> inner) {
  std::vector<std::shared_ptr<CommBackend>> out;
  for (auto& b : inner) out.push_back(std::make_shared<Recording>(std::move(b)));
  return out;
}

bool any_mixed(const std::vector<std::shared_ptr<CommBackend>>& backends) {
  for (const auto& b : backends)
    if (static_cast<const Recording&>(*b).saw_mixed_batch()) return true;
  return false;
}

// Makes kRanks backends of `name` concurrently (their rendezvous waits for each other).
std::vector<std::shared_ptr<CommBackend>> connect(std::string_view name, const ClusterEnv& base) {
  std::vector<std::shared_ptr<CommBackend>> out(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> joins;
  for (int r = 0; r < kRanks; ++r)
    joins.emplace_back([&, r] {
      ClusterEnv e = base;
      e.rank = r;
      try {
        out[size_t(r)] = find_backend(name)->make(e, fusing_config());
      } catch (const std::exception& ex) {
        errors[size_t(r)] = ex.what();
      }
    });
  for (auto& j : joins) j.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[size_t(r)], "") << name << " rank " << r;
  return out;
}

void shutdown_all(const std::vector<std::shared_ptr<CommBackend>>& backends) {
  std::vector<std::thread> closing;
  for (const auto& b : backends)
    if (b) closing.emplace_back([b] { b->shutdown(); });
  for (auto& t : closing) t.join();
}

ClusterEnv cluster_env(int servers) {
  ClusterEnv e;
  e.num_workers = kRanks;
  e.num_servers = servers;
  e.root_port = testing::free_tcp_port();
  e.timeout_s = 20;
  return e;
}

TEST(MixedDtypeFusion, LoopbackSumsEachPartitionInItsOwnDtype) {
  for (Op op : {Op::push_pull, Op::allreduce}) {
    auto backends = recorded(make_loopback_group(kRanks));
    run_and_check(backends, op);
    EXPECT_TRUE(any_mixed(backends)) << "the policy never fused different dtypes: the test proves nothing";
    shutdown_all(backends);
  }
}

TEST(MixedDtypeFusion, ParameterServerSumsEachPartitionInItsOwnDtype) {
  ClusterEnv base = cluster_env(1);
  ClusterEnv server_env = base;
  server_env.role = Role::server;
  auto server = std::async(std::launch::async, [server_env] { return run_server(server_env, PsConfig{}); });
  auto backends = connect("ps", base);
  for (const auto& b : backends) ASSERT_TRUE(b);
  backends = recorded(backends);
  run_and_check(backends, Op::push_pull);
  EXPECT_TRUE(any_mixed(backends)) << "the policy never fused different dtypes: the test proves nothing";
  shutdown_all(backends);
  EXPECT_EQ(server.wait_for(30s), std::future_status::ready) << "the server did not exit";
}

// On a collective the engines forward their tasks and rank 0 runs the engine's own policy over every rank's ready
// partitions, ordering the groups each rank runs, one collective (and one dtype) per group.
TEST(MixedDtypeFusion, GlooSumsEachPartitionInItsOwnDtype) {
  if (!find_backend("gloo")->available) GTEST_SKIP() << "this build has no Gloo (install libgloo-dev)";
  auto backends = connect("gloo", cluster_env(0));
  for (const auto& b : backends) ASSERT_TRUE(b);
  run_and_check(backends, Op::allreduce);
  const auto* gloo = dynamic_cast<const collective::CollectiveBackend*>(backends[0].get());
  ASSERT_NE(gloo, nullptr);
  const collective::NegotiatorStats s = gloo->negotiation_stats();
  EXPECT_LT(s.groups, s.submitted) << "nothing was fused: the test proves nothing";
  shutdown_all(backends);
}

}  // namespace
}  // namespace commsched
