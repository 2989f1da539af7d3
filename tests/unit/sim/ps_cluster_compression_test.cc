// Compression on the every-worker parameter-server model: compressed bytes on every link, the workers' encode and
// decode stages, and the servers' decode of each push and encode of the sum for top-k and signSGD.
#include <gtest/gtest.h>

#include "simulator/grid.h"
#include "simulator/ps_cluster.h"
#include "simulator/sim_policy.h"
#include "simulator/simulator.h"
#include "tests/unit/sim/sim_test_util.h"

namespace commsched::sim {
namespace {

using compression::Scheme;
using testing::kMs;
using E = std::tuple<char, int, size_t, Nanos>;

struct Recorder final : BatchSink {
  std::vector<E> events;
  void batch_sent(int w, size_t id, Nanos now) override { events.emplace_back('s', w, id, now); }
  void batch_done(int w, size_t id, Nanos now) override { events.emplace_back('d', w, id, now); }
};

Batch one_part(int32_t key, uint64_t bytes) { return {PartRef{0, 0, key, 0, 0, bytes}}; }

// Two workers push one partition each at 0 into one server (1 byte per ns everywhere, no latency, real NICs).
std::vector<E> two_pushes(const CompressionModel& c, uint64_t bytes) {
  PsClusterFabric fabric({2, 1, 8e9, 8e9, 0, 0, true, true}, c);
  EventLoop loop;
  Recorder sink;
  fabric.start(loop, sink);
  fabric.dispatch(0, 0, one_part(7, bytes), 0);
  fabric.dispatch(1, 0, one_part(7, bytes), 0);
  loop.run();
  return sink.events;
}

TEST(PsClusterCompression, Fp16HalvesEveryTransfer) {
  // Uncompressed: pushes arrive at 1000 and 2000 (FIFO into the server), sums at 3000 and 4000.
  EXPECT_EQ(two_pushes({}, 1000), (std::vector<E>{E{'s', 0, 0, 1000}, E{'s', 1, 0, 2000}, E{'d', 0, 0, 3000},
                                                  E{'d', 1, 0, 4000}}));
  EXPECT_EQ(two_pushes({{Scheme::fp16}, 0, 0}, 1000),
            (std::vector<E>{E{'s', 0, 0, 500}, E{'s', 1, 0, 1000}, E{'d', 0, 0, 1500}, E{'d', 1, 0, 2000}}));
}

TEST(PsClusterCompression, TopkPaysEncodeOnTheWorkerAndDecodeAndEncodeOnTheServer) {
  const uint64_t mib4 = 4 << 20;
  const CompressionModel c{{Scheme::topk, 0.01}, 1e-3, 0.5e-3};  // 1 ms per MiB to encode, 0.5 ms to decode
  const auto wire = static_cast<Nanos>(compression::encoded_bytes(c.spec, DType::f32, mib4 / 4));  // ns at 1 B/ns
  const Nanos enc = 4 * kMs, dec = 2 * kMs;
  // Both encode in [0, 4 ms); pushes arrive at 4 ms + wire and + 2 wire; the server decodes them one after the other
  // (the second waits for the first), encodes the sum, sends it to worker 0 and then worker 1; each decodes it.
  const Nanos sum_ready = enc + wire + 2 * dec + enc;
  EXPECT_EQ(two_pushes(c, mib4), (std::vector<E>{E{'s', 0, 0, enc + wire}, E{'s', 1, 0, enc + 2 * wire},
                                                 E{'d', 0, 0, sum_ready + wire + dec},
                                                 E{'d', 1, 0, sum_ready + 2 * wire + dec}}));
  // fp16 sums on the wire: the server spends nothing, the workers their encode and decode.
  const CompressionModel half{{Scheme::fp16}, 1e-3, 0.5e-3};
  EXPECT_EQ(two_pushes(half, mib4),
            (std::vector<E>{E{'s', 0, 0, enc + mib4 / 2}, E{'s', 1, 0, enc + mib4}, E{'d', 0, 0, enc + 3 * mib4 / 2 + dec},
                            E{'d', 1, 0, enc + 2 * mib4 + dec}}));
}

// Fair-shared links (flow_net.h) carry the compressed bytes too, and the pushes leave once encoded.
TEST(PsClusterCompression, FairSharedLinksCarryTheCompressedBytesAfterTheEncode) {
  auto run = [](const CompressionModel& c) {
    PsParams p{2, 1, 8e9, 8e9, 0, 0, true, true};
    p.fair_share = true;
    PsClusterFabric fabric(p, c);
    EventLoop loop;
    Recorder sink;
    fabric.start(loop, sink);
    fabric.dispatch(0, 0, one_part(7, 1000), 0);
    fabric.dispatch(1, 0, one_part(7, 1000), 0);
    loop.run();
    return sink.events;
  };
  const std::vector<E> none = run({}), half = run({{Scheme::fp16}, 0, 0}), slow = run({{Scheme::fp16}, 1e-3, 0});
  const Nanos encode = encode_ns({{Scheme::fp16}, 1e-3, 0}, 1000);
  ASSERT_EQ(none.size(), 4u);
  ASSERT_EQ(half.size(), 4u);
  ASSERT_EQ(slow.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(double(std::get<3>(half[i])), std::get<3>(none[i]) / 2.0, 2) << i;
    EXPECT_NEAR(double(std::get<3>(slow[i])), double(std::get<3>(half[i]) + encode), 2) << i;
  }
}

// A compressed top-k or signSGD partition goes whole (the PS backend does not chunk it); fp16 is chunked as usual.
TEST(PsClusterCompression, RecodedPushesAreNotChunked) {
  PsClusterFabric chunked({1, 2, 8e9, 8e9, 0, 1000, true, true}, {{Scheme::signsgd}, 0, 0});
  EventLoop loop;
  Recorder sink;
  chunked.start(loop, sink);
  chunked.dispatch(0, 0, one_part(1, 64'000), 0);  // 2000 bytes of signs + scale: one message to one server
  loop.run();
  const LinkUse u = chunked.link_use(10'000);
  EXPECT_GT(u.server_in.max, 0.0);
  EXPECT_EQ(u.server_in.min, 0.0) << "the second server received nothing";
}

SimResult each(const ModelProfile& m, const PsParams& p, const CompressionModel& c) {
  EngineConfig cfg;
  cfg.policy = PolicyKind::wfbp;
  PsNetwork net(p);
  return simulate_each_worker(m, p, [&] { return make_sim_policy(cfg, net, false); }, SimOptions{}, c);
}

// A link-bound cell: 3 ms of compute, 4 MB over 8 Gbit/s links (three 4 ms transfers on the critical path).
TEST(SimulateEachWorkerCompression, Fp16HalvesTheWireTimeOfALinkBoundStep) {
  const auto m = testing::one_tensor(4'000'000, kMs, 2 * kMs);
  const PsParams p{2, 1, 8e9, 8e9, 0, 0, true, true};
  const SimResult none = each(m, p, {});
  const SimResult half = each(m, p, {{Scheme::fp16}, 0, 0});
  EXPECT_NEAR(none.iteration_s, 15e-3, 1e-6);
  EXPECT_NEAR(half.iteration_s - 3e-3, (none.iteration_s - 3e-3) / 2, 1e-6);
  EXPECT_NEAR(half.comm_bound_s, none.comm_bound_s / 2, 1e-9) << "the bounds count compressed bytes too";
}

TEST(SimulateEachWorkerCompression, TopkStepIncludesEveryStageOnTheCriticalPath) {
  const auto m = testing::one_tensor(4 << 20, kMs, 2 * kMs);
  const PsParams p{2, 1, 8e9, 8e9, 0, 0, true, true};
  const SimResult free_stages = each(m, p, {{Scheme::topk, 0.01}, 0, 0});
  const SimResult costly = each(m, p, {{Scheme::topk, 0.01}, 1e-3, 0.5e-3});
  // Per step: the worker's encode (4 ms), the server's decode of the last push (2 ms) and encode of the sum (4 ms),
  // the worker's decode (2 ms); the first push's decode may overlap the second's transfer.
  const double added = costly.iteration_s - free_stages.iteration_s;
  EXPECT_GE(added, 12e-3 - 1e-6);
  EXPECT_LE(added, 14e-3 + 1e-6);
}

// With one worker per server nothing is asymmetric: the symmetric PS model with the same compression agrees.
TEST(SimulateEachWorkerCompression, OneWorkerAgreesWithTheSymmetricModel) {
  const auto m = testing::vgg_like();
  const PsParams p{1, 1, 2e9, 2e9, 30e-6, 1 << 20, true, true};
  for (const CompressionModel& c : {CompressionModel{{Scheme::fp16}, 0, 0}, CompressionModel{{Scheme::topk, 0.01}, 0, 0},
                                    CompressionModel{{Scheme::signsgd}, 0, 0}}) {
    EngineConfig cfg;
    cfg.policy = PolicyKind::bytescheduler;
    cfg.knobs = {1 << 20, 3 << 20};
    SimOptions o;
    o.partition_bytes = 1 << 20;
    auto net = with_compression(std::make_unique<PsNetwork>(p), c, 1);
    auto policy = make_sim_policy(cfg, *net);
    const SimResult one = simulate(m, *net, *policy, o);
    const SimResult all = simulate_each_worker(m, p, [&] { return make_sim_policy(cfg, *net); }, o, c);
    EXPECT_EQ(all.iteration_start_s, one.iteration_start_s) << compression::to_string(c.spec);
  }
}

// The grid (what `commsched bench --ps-workers each --compression S` runs) hands the scheme to the per-worker model.
TEST(SimulateEachWorkerCompression, GridCellsUseTheScheme) {
  GridSpec spec;
  spec.models = {testing::one_tensor(4'000'000, kMs, 2 * kMs)};
  spec.servers = 1;
  spec.latency_s = 0;
  spec.ps_chunk_bytes = 0;
  spec.ps_message_s = 0;  // the times below are bytes / rate only
  spec.ps_each_worker_max = 1 << 30;
  const CellResult none = run_cell(spec, spec.models[0], 8e9, 2, PolicyKind::wfbp);
  spec.compression = {{Scheme::fp16}, 0, 0};
  const CellResult half = run_cell(spec, spec.models[0], 8e9, 2, PolicyKind::wfbp);
  EXPECT_NEAR(none.iteration_s, 15e-3, 1e-6);
  EXPECT_NEAR(half.iteration_s, 9e-3, 1e-6);
}

}  // namespace
}  // namespace commsched::sim
