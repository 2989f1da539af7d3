// The conformance suite: one parameterised test over backend × ranks × dtype × size × operation (as gloo's tests are
// parameterised). Every case goes through an Engine as a user's job does (4 KiB partitions, 256 KiB for MiB
// tensors, a credit of four partitions, the default scheduler) and checks every element of the result exactly
// (conformance_case.cc says why exact comparison is right for floats too).
//
// Where the grid is cut, and why:
//   loopback (ranks as threads of this process): the full grid, every rank count 1-4, every dtype, every size, every
//     operation. It costs seconds.
//   ps, gloo (ranks as processes on loopback, through LocalCluster): the full dtype × size × operation grid at 2 ranks
//     (72 cases), and 1, 3 and 4 ranks on a spread of dtypes, sizes and operations (13 cases). Each case starts a
//     cluster (0.05-0.5 s here); all rank counts would triple that for little more coverage: what differs with the
//     rank count is the backends' rendezvous and reduction order, which the spread exercises at every count.
//   nccl: the ps/gloo cut, one GPU per rank; skipped with the reason where the build has no CUDA or the machine too
//     few GPUs.
// Operations a backend does not offer (CommBackend::supports) are not instantiated; the rank process checks that the
// backend agrees with this table. The CommBackend interface offers push_pull, allreduce (both sums) and broadcast;
// there is no average or allgather to test.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "comm_backends/loopback/loopback_backend.h"
#include "tests/integration/conformance/conformance_case.h"
#include "tests/integration/harness/local_cluster.h"
#if COMMSCHED_HAVE_CUDA
#include "cuda/cuda_devices.h"
#endif

namespace commsched::testing {

// How GoogleTest (and so CTest) shows a case.
void PrintTo(const ConformanceCase& c, std::ostream* os) { *os << case_name(c); }

namespace {

using namespace std::chrono_literals;

constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};
// Element counts: empty, one element, odd and below one partition, just over one f32 partition (1024 elements), an
// odd prime spanning several partitions of every dtype, and a few MiB (3 MiB of f32, 6 of f64, 1.5 of 16-bit types).
constexpr uint64_t kCounts[] = {0, 1, 7, 1025, 4099, 786433};
constexpr uint64_t kMultiPartitionOdd = 4099;
constexpr uint64_t kFewMiB = 786433;

// The operations each backend carries (on its device), as CommBackend::supports says.
std::vector<Op> operations_of(BackendKind b) {
  switch (b) {
    case BackendKind::loopback: return {Op::push_pull, Op::allreduce, Op::broadcast};
    case BackendKind::ps: return {Op::push_pull, Op::broadcast};
    case BackendKind::gloo:
    case BackendKind::nccl: return {Op::allreduce, Op::broadcast};
  }
  return {};
}

std::vector<ConformanceCase> full_grid(BackendKind b) {
  std::vector<ConformanceCase> cases;
  for (int ranks = 1; ranks <= 4; ++ranks)
    for (DType t : kDTypes)
      for (uint64_t n : kCounts)
        for (Op op : operations_of(b)) cases.push_back({b, ranks, t, n, op});
  return cases;
}

// The multi-process cut (see the top of this file): the full dtype × size × operation grid at 2 ranks, and the
// other rank counts on a spread of dtypes, sizes and operations.
std::vector<ConformanceCase> process_grid(BackendKind b) {
  const std::vector<Op> ops = operations_of(b);
  std::vector<ConformanceCase> cases;
  for (DType t : kDTypes)
    for (uint64_t n : kCounts)
      for (Op op : ops) cases.push_back({b, 2, t, n, op});
  const Op sum = ops.front(), bcast = ops.back();
  const ConformanceCase edges[] = {
      {b, 1, DType::f32, 0, sum},          {b, 1, DType::f64, kFewMiB, sum},   {b, 1, DType::i32, 7, bcast},
      {b, 3, DType::bf16, kFewMiB, sum},   {b, 3, DType::i32, 1025, bcast},    {b, 3, DType::f16, 7, sum},
      {b, 3, DType::i64, kMultiPartitionOdd, sum},                             {b, 3, DType::f32, kFewMiB, bcast},
      {b, 4, DType::i64, kMultiPartitionOdd, sum}, {b, 4, DType::f16, 1, bcast}, {b, 4, DType::f32, kFewMiB, sum},
      {b, 4, DType::bf16, 1025, sum},      {b, 4, DType::f64, kMultiPartitionOdd, bcast},
  };
  cases.insert(cases.end(), std::begin(edges), std::end(edges));
  return cases;
}

bool built_in(BackendKind b) {
  switch (b) {
    case BackendKind::loopback:
    case BackendKind::ps: return true;
    case BackendKind::gloo: return COMMSCHED_CONFORMANCE_GLOO;
    case BackendKind::nccl: return COMMSCHED_CONFORMANCE_NCCL;
  }
  return false;
}

int gpus() {
#if COMMSCHED_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

// Ranks as threads: one Engine per rank over a loopback group.
void run_in_process(const ConformanceCase& c) {
  auto group = make_loopback_group(c.ranks);
  std::vector<std::unique_ptr<Engine>> engines;
  for (auto& backend : group) engines.push_back(make_conformance_engine(backend, c));
  std::vector<std::string> errors(static_cast<size_t>(c.ranks));
  std::vector<std::thread> ranks;
  for (int r = 0; r < c.ranks; ++r)
    ranks.emplace_back([&, r] {
      auto memory = host_memory(c.count * dtype_size(c.dtype));
      errors[static_cast<size_t>(r)] = run_case_on_rank(*engines[static_cast<size_t>(r)], c, r, *memory);
    });
  for (auto& t : ranks) t.join();
  for (auto& e : engines) e->shutdown();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

std::string all_logs(LocalCluster& cluster) {
  std::string out;
  for (const Proc& p : cluster.procs()) out += "---- " + p.name + "\n" + cluster.read_log(p.name);
  return out;
}

// Ranks as processes: the rank binary on every worker (and one parameter server for ps), on loopback.
void run_as_processes(const ConformanceCase& c) {
  const int servers = c.backend == BackendKind::ps ? 1 : 0;
  LocalCluster cluster(CONFORMANCE_RANK_BIN, c.ranks, servers,
                       {"--backend", std::string(backend_kind_name(c.backend)), "--ranks", std::to_string(c.ranks),
                        "--dtype", std::string(dtype_name(c.dtype)), "--count", std::to_string(c.count), "--op",
                        std::string(op_name(c.op))},
                       {{"COMMSCHED_PS_TRANSPORT", "zmq"}, {"COMMSCHED_TIMEOUT", "10"}});
  cluster.start();
  ASSERT_TRUE(cluster.wait_all(120s)) << "the case did not finish within 120 s\n" << all_logs(cluster);
  for (const Proc& p : cluster.procs()) {
    EXPECT_EQ(p.exit_code, 0) << p.name << " failed\n" << all_logs(cluster);
    // Each worker says it checked its result: a rank that exits 0 without running the case fails here.
    if (p.name.rfind("worker ", 0) == 0) {
      EXPECT_NE(cluster.read_log(p.name).find(case_name(c) + " rank " + p.name.substr(7) + ": ok"), std::string::npos)
          << p.name << " did not report a checked result\n" << all_logs(cluster);
    }
  }
}

class Conformance : public ::testing::TestWithParam<ConformanceCase> {};

TEST_P(Conformance, ExactResultThroughTheEngine) {
  const ConformanceCase& c = GetParam();
  if (!built_in(c.backend))
    GTEST_SKIP() << backend_kind_name(c.backend) << ": this build has no " << backend_kind_name(c.backend)
                 << " backend (" << (c.backend == BackendKind::nccl ? "no CUDA toolkit/NCCL" : "no libgloo-dev")
                 << " found at configure time)";
  if (c.backend == BackendKind::nccl && gpus() < c.ranks)
    GTEST_SKIP() << "nccl: needs " << c.ranks << " GPU(s), this machine has " << gpus()
                 << " (no GPU here: NCCL reduces device memory only)";
  if (c.backend == BackendKind::loopback)
    run_in_process(c);
  else
    run_as_processes(c);
}

std::string param_name(const ::testing::TestParamInfo<ConformanceCase>& info) { return case_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Loopback, Conformance, ::testing::ValuesIn(full_grid(BackendKind::loopback)), param_name);
INSTANTIATE_TEST_SUITE_P(Ps, Conformance, ::testing::ValuesIn(process_grid(BackendKind::ps)), param_name);
INSTANTIATE_TEST_SUITE_P(Gloo, Conformance, ::testing::ValuesIn(process_grid(BackendKind::gloo)), param_name);
INSTANTIATE_TEST_SUITE_P(Nccl, Conformance, ::testing::ValuesIn(process_grid(BackendKind::nccl)), param_name);

}  // namespace
}  // namespace commsched::testing
