// Hierarchical mode end to end: machines x local workers emulated on one host (each worker a thread with its own
// ClusterEnv: rank, local rank, local size), one parameter server in this process over ZeroMQ on loopback, the Gloo
// local collective among the workers of each emulated machine. The sums must be exact for every dtype the parameter
// server sums and for sizes that do not divide by the machine size (1, 3, 5 elements, odd partitions), through
// single partitions and fused groups; the PS sees each slice from one worker per machine (a lane), so a slice summed
// over every worker instead would never complete.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/backend_registry.h"
#include "comm_backends/comm_backend.h"
#include "comm_backends/hierarchical/hierarchical_backend.h"
#include "comm_backends/gloo/gloo_local_collective.h"
#include "comm_backends/ps/server.h"
#include "scheduler/stages/host_copier.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "tests/integration/harness/local_cluster.h"
#include "tests/unit/device/fake_tensor.h"
#if COMMSCHED_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_devices.h"
#endif

namespace commsched {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

#define REQUIRE_GLOO()                                                                                \
  do {                                                                                                \
    if (!find_backend("gloo")->available) GTEST_SKIP() << "hierarchical mode's CPU local collective is Gloo, " \
                                                          "which this build lacks (install libgloo-dev)";   \
  } while (0)

// Shuts every worker down at once, as separate processes would: the collectives' goodbye waits for every rank.
template <class T>
void close_all(std::vector<T>& workers) {
  std::vector<std::thread> closing;
  for (auto& w : workers)
    closing.emplace_back([&w] {
      if constexpr (requires { w->shutdown(); }) {
        if (w) w->shutdown();
      }
    });
  for (auto& t : closing) t.join();
}

// One parameter server and `machines` x `local` workers, hierarchical (COMMSCHED_HIERARCHICAL=gloo) unless `plain`.
struct Cluster {
  ClusterEnv base;
  std::future<int> server;
  std::vector<std::shared_ptr<CommBackend>> backends;

  using Make = std::function<std::shared_ptr<CommBackend>(const ClusterEnv&)>;
  Cluster(int machines, int local, bool plain = false, Make make = nullptr, const char* local_kind = "gloo") {
    base.num_workers = machines * local;
    base.num_servers = 1;
    base.root_port = testing::free_tcp_port();
    base.local_size = local;
    base.timeout_s = 20;
    ::setenv("COMMSCHED_HIERARCHICAL", plain ? "off" : local_kind, 1);
    ::setenv("COMMSCHED_HIERARCHICAL_PORT", std::to_string(testing::free_tcp_port()).c_str(), 1);
    ClusterEnv server_env = base;
    server_env.role = Role::server;
    server_env.local_size = 1;
    server = std::async(std::launch::async, [server_env] { return run_server(server_env, PsConfig{}); });
    backends.resize(static_cast<size_t>(base.num_workers));
    std::vector<std::thread> joins;
    std::vector<std::string> errors(backends.size());
    for (int r = 0; r < base.num_workers; ++r)
      joins.emplace_back([&, r] {
        ClusterEnv e = base;
        e.rank = r;
        e.local_rank = r % local;
        try {
          backends[static_cast<size_t>(r)] = make ? make(e) : find_backend("ps")->make(e, EngineConfig{});
        } catch (const std::exception& ex) {
          errors[static_cast<size_t>(r)] = ex.what();
        }
      });
    for (auto& j : joins) j.join();
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "worker " << r;
  }
  ~Cluster() {
    close_all(backends);
    if (server.valid()) server.wait_for(30s);
    ::unsetenv("COMMSCHED_HIERARCHICAL");
    ::unsetenv("COMMSCHED_HIERARCHICAL_PORT");
  }
};

// The workers' engines, shut down together.
struct Engines : std::vector<std::unique_ptr<Engine>> {
  Engines() = default;
  Engines(Engines&&) = default;
  ~Engines() { close_all(*this); }
};

Engines engines_over(Cluster& c, uint64_t partition, uint64_t small_tensor_bytes = 0) {
  Engines out;
  for (auto& b : c.backends) {
    EngineConfig cfg;
    cfg.knobs.partition_bytes = partition;
    cfg.knobs.small_tensor_bytes = small_tensor_bytes;
    out.push_back(std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(0), b, cfg));
  }
  return out;
}

// Submits every rank's tensors, waits, checks exact sums over all ranks.
void run_round(Engines& engines, std::vector<std::vector<FakeDeviceTensor>>& t, int iter,
               Op op = Op::push_pull) {
  const int ranks = static_cast<int>(engines.size());
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < t[r].size(); ++i) {
      t[r][i].fill(r, i, iter);
      Task task = t[r][i].task(op, Device::cpu);
      task.priority = static_cast<int32_t>(i);
      engines[r]->submit(std::move(task));
    }
  for (auto& e : engines) e->backward_done();
  for (int r = 0; r < ranks; ++r) {
    ASSERT_TRUE(engines[r]->wait_all_for(60s)) << "rank " << r << " hung";
    const Status s = engines[r]->wait_all();
    ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.message;
    for (size_t i = 0; i < t[r].size(); ++i)
      ASSERT_EQ(t[r][i].first_wrong(ranks, i, iter), -1)
          << "rank " << r << " tensor " << t[r][i].name << " (" << t[r][i].count << " " << dtype_name(t[r][i].dtype)
          << ") iteration " << iter;
  }
}

std::vector<std::vector<FakeDeviceTensor>> tensors(int ranks, DType dtype) {
  const uint64_t counts[] = {0, 1, 3, 5, 1001, 30011};
  std::vector<std::vector<FakeDeviceTensor>> t(static_cast<size_t>(ranks));
  for (auto& mine : t)
    for (size_t i = 0; i < std::size(counts); ++i) mine.emplace_back("layer" + std::to_string(i), dtype, counts[i]);
  return t;
}

class HierarchicalSums : public ::testing::TestWithParam<DType> {};

TEST_P(HierarchicalSums, TwoMachinesOfTwoWorkersSumExactlyForUnevenSizes) {
  REQUIRE_GLOO();
  Cluster c(2, 2);
  for (auto& b : c.backends) {
    ASSERT_TRUE(b);
    EXPECT_EQ(b->name(), "hierarchical");
  }
  auto engines = engines_over(c, 4100);  // partitions of odd element counts for every dtype
  auto t = tensors(4, GetParam());
  for (int it = 0; it < 2; ++it) run_round(engines, t, it);
}

INSTANTIATE_TEST_SUITE_P(EveryDtype, HierarchicalSums,
                         ::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Hierarchical, FusedSmallTensorsAndThreeWorkersPerMachine) {
  REQUIRE_GLOO();
  Cluster c(2, 3);
  auto engines = engines_over(c, 0, 64 << 10);  // bytescheduler fuses the small tensors into groups
  auto t = tensors(6, DType::f32);
  for (int it = 0; it < 3; ++it) run_round(engines, t, it);
  const auto* h = dynamic_cast<const HierarchicalBackend*>(c.backends[0].get());
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->machines(), 2);
  const collective::NegotiatorStats s = h->negotiation_stats();
  EXPECT_LT(s.groups, s.submitted) << "no partitions were fused";
}

// A local collective on "device" memory (NCCL's case) stages each slice through pinned host buffers: here Gloo on
// host memory that says it is device 1, and the host stand-in copier, so the staging path runs without a GPU.
class DeviceMemoryLocal final : public LocalCollective {
 public:
  explicit DeviceMemoryLocal(std::unique_ptr<LocalCollective> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "device-memory"; }
  int local_rank() const override { return inner_->local_rank(); }
  int local_size() const override { return inner_->local_size(); }
  Device memory() const override { return Device::cuda; }
  int device_index() const override { return 1; }
  void reduce_scatter(std::byte* d, DType t, std::span<const uint64_t> s) override { inner_->reduce_scatter(d, t, s); }
  void all_gather(std::byte* d, DType t, std::span<const uint64_t> s) override { inner_->all_gather(d, t, s); }

 private:
  std::unique_ptr<LocalCollective> inner_;
};

TEST(Hierarchical, ADeviceLocalCollectiveStagesOnlyItsSliceThroughTheHost) {
  REQUIRE_GLOO();
  std::vector<std::shared_ptr<HostCopier>> copiers(4);
  for (auto& c : copiers) c = std::make_shared<HostCopier>();
  HierarchicalOptions o;
  o.local = "nccl";
  o.port = testing::free_tcp_port();
  const LocalCollectiveFactory local = [](const ClusterEnv& env, int rank, int size, control::Store& store,
                                          const std::string& prefix) -> std::unique_ptr<LocalCollective> {
    return std::make_unique<DeviceMemoryLocal>(
        std::make_unique<GlooLocalCollective>(connect_gloo_mesh(env, rank, size, store, prefix), rank, size));
  };
  Cluster c(2, 2, false, [&](const ClusterEnv& e) {
    return std::make_shared<HierarchicalBackend>(e, PsConfig{}, o, collective::CollectiveOptions{}, local,
                                                 copiers[static_cast<size_t>(e.rank)]);
  });
  for (auto& b : c.backends) {
    ASSERT_TRUE(b);
    EXPECT_TRUE(b->supports(Op::push_pull, Device::cuda));
    EXPECT_FALSE(b->supports(Op::push_pull, Device::cpu)) << "host tensors must take the host-to-device stage";
    EXPECT_EQ(b->capabilities().cuda_device, 1);
  }
  auto engines = engines_over(c, 4100);
  std::vector<std::vector<FakeDeviceTensor>> t(4);
  for (auto& mine : t) mine.emplace_back("w", DType::f32, 20011);
  for (int it = 0; it < 2; ++it) {
    for (int r = 0; r < 4; ++r) {
      t[r][0].fill(r, 0, it);
      Task task = t[r][0].task(Op::push_pull);
      task.buffer.device_index = 1;
      engines[r]->submit(std::move(task));
    }
    for (auto& e : engines) e->backward_done();
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(engines[r]->wait_all_for(60s));
      const Status s = engines[r]->wait_all();
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(t[r][0].first_wrong(4, 0, it), -1) << "rank " << r << " iteration " << it;
    }
  }
  // Each group's slice went out and back (groups: the coordinator fuses partitions, at most one per partition).
  const uint64_t parts = partition_count(20011, DType::f32, 4100);
  for (auto& cp : copiers) {
    EXPECT_GE(cp->copies(), 2u * 2) << "a slice skipped the staging";
    EXPECT_LE(cp->copies(), 2u * 2 * parts);
    EXPECT_EQ(cp->copies() % 2, 0u) << "a slice went out without coming back";
  }
}

TEST(Hierarchical, BroadcastReachesEveryWorker) {
  REQUIRE_GLOO();
  Cluster c(2, 2);
  auto engines = engines_over(c, 8192);
  std::vector<FakeDeviceTensor> t;
  for (int r = 0; r < 4; ++r) {
    t.emplace_back("params", DType::f32, 5003);
    t[r].fill(r, 0, 0);
    Task task = t[r].task(Op::broadcast, Device::cpu);
    task.root = 3;
    engines[r]->submit(std::move(task));
    engines[r]->flush();
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(engines[r]->wait_all_for(60s));
    ASSERT_TRUE(engines[r]->wait_all().ok());
    for (uint64_t e = 0; e < 5003; ++e)
      ASSERT_EQ(load(DType::f32, t[r].bytes.data() + 4 * e), value_of(3, 0, e, 0)) << "rank " << r << " element " << e;
  }
}

TEST(Hierarchical, OneWorkerPerMachineIsThePlainParameterServer) {
  Cluster c(3, 1);
  for (auto& b : c.backends) {
    ASSERT_TRUE(b);
    EXPECT_EQ(b->name(), "ps");
  }
  auto engines = engines_over(c, 4096);
  auto t = tensors(3, DType::f32);
  run_round(engines, t, 0);
}

TEST(Hierarchical, LanesSplitElementsAsEvenlyAsWholeElementsAllow) {
  EXPECT_EQ(lane_slices(10, 4), (std::vector<uint64_t>{3, 3, 2, 2}));
  EXPECT_EQ(lane_slices(1, 3), (std::vector<uint64_t>{1, 0, 0}));
  EXPECT_EQ(lane_slices(0, 2), (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(lane_slices(8, 2), (std::vector<uint64_t>{4, 4}));
  EXPECT_THROW(lane_slices(8, 0), std::invalid_argument);
}

TEST(Hierarchical, AClusterWithoutAUsableHierarchyIsRefusedNamingWhy) {
  ClusterEnv e;
  e.num_workers = 4;
  e.num_servers = 1;
  e.local_size = 2;
  e.rank = 1;
  e.local_rank = 0;  // rank 1 of machines of 2 must be local rank 1
  HierarchicalOptions o;
  o.local = "gloo";
  try {
    HierarchicalBackend b(e, PsConfig{}, o, collective::CollectiveOptions{}, nullptr);
    FAIL() << "a worker whose local rank does not follow its rank was accepted";
  } catch (const InvalidArgument& ex) {
    for (const char* part : {"worker 1", "COMMSCHED_LOCAL_RANK=0", "consecutive"})
      EXPECT_TRUE(contains(ex.what(), part)) << "missing '" << part << "' in: " << ex.what();
  }
  e.num_workers = 5;
  e.rank = 1;
  e.local_rank = 1;
  try {
    HierarchicalBackend b(e, PsConfig{}, o, collective::CollectiveOptions{}, nullptr);
    FAIL() << "machines of different sizes were accepted";
  } catch (const InvalidArgument& ex) {
    EXPECT_TRUE(contains(ex.what(), "COMMSCHED_NUM_WORKERS=5 is not a multiple of COMMSCHED_LOCAL_SIZE=2")) << ex.what();
  }
}

TEST(Hierarchical, TheOptionIsValidatedByTheRegistry) {
  ::setenv("COMMSCHED_HIERARCHICAL", "yes please", 1);
  try {
    HierarchicalOptions::from_env();
    ADD_FAILURE() << "a bad COMMSCHED_HIERARCHICAL was accepted";
  } catch (const InvalidArgument& ex) {
    EXPECT_TRUE(contains(ex.what(), "COMMSCHED_HIERARCHICAL")) << ex.what();
    EXPECT_TRUE(contains(ex.what(), "gloo")) << ex.what();
  }
  ::unsetenv("COMMSCHED_HIERARCHICAL");
  EXPECT_FALSE(HierarchicalOptions::from_env().enabled());
}

#if COMMSCHED_HAVE_CUDA
// The NCCL local collective on GPUs: 2 emulated machines x 2 workers, local rank r on GPU r (each machine's
// communicator spans GPUs 0 and 1), CUDA tensors in place, each slice staged through pinned host memory for the PS.
TEST(HierarchicalNccl, TwoMachinesOfTwoGpusSumExactly) {
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs 2 CUDA devices (one per local rank), found " << cuda_device_count()
                 << "; run scripts/gpu_checks.sh on a machine with two GPUs";
  Cluster c(2, 2, false, nullptr, "nccl");
  for (auto& b : c.backends) {
    ASSERT_TRUE(b);
    ASSERT_TRUE(b->supports(Op::push_pull, Device::cuda));
  }
  auto engines = engines_over(c, 1 << 16);
  const uint64_t counts[] = {1, 3, 1001, 300007};
  std::vector<std::vector<FakeDeviceTensor>> host(4);
  std::vector<std::vector<void*>> dev(4);
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < std::size(counts); ++i) {
      host[r].emplace_back("g" + std::to_string(i), DType::f32, counts[i]);
      host[r][i].fill(r, i, 0);
      cudaSetDevice(r % 2);
      void* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, host[r][i].bytes.size()), cudaSuccess);
      cudaMemcpy(d, host[r][i].bytes.data(), host[r][i].bytes.size(), cudaMemcpyHostToDevice);
      dev[r].push_back(d);
      Task t = host[r][i].task(Op::push_pull);
      t.buffer = Buffer{d, Device::cuda, r % 2, nullptr};
      engines[r]->submit(std::move(t));
    }
  for (auto& e : engines) e->backward_done();
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(engines[r]->wait_all_for(120s));
    const Status s = engines[r]->wait_all();
    ASSERT_TRUE(s.ok()) << s.message;
    for (size_t i = 0; i < std::size(counts); ++i) {
      cudaMemcpy(host[r][i].bytes.data(), dev[r][i], host[r][i].bytes.size(), cudaMemcpyDeviceToHost);
      cudaFree(dev[r][i]);
      EXPECT_EQ(host[r][i].first_wrong(4, i, 0), -1) << "rank " << r << " tensor " << i;
    }
  }
}
#endif

}  // namespace
}  // namespace commsched
