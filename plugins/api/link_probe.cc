#include "plugins/api/link_probe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "options/parse.h"
#include "scheduler/completion_waiter.h"

namespace commsched {
namespace {

constexpr int kLatencyRounds = 7;
constexpr int kBandwidthRounds = 3;  // of the pilot and of the bandwidth tensor each
constexpr double kRoundTargetS = 0.03;          // a bandwidth round's time: long enough to time, short at startup
constexpr uint64_t kMaxLargeBytes = 16ull << 20;
constexpr uint64_t kPilotFallbackBytes = 256ull << 10;
constexpr uint64_t kMinPilots = 4;
constexpr uint64_t kFloat = sizeof(float);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of `rounds` timed reduces after one untimed (first-use costs).
double timed_median(const ProbeExchange& x, uint64_t bytes, int rounds) {
  x.reduce(bytes);
  std::vector<double> t;
  for (int i = 0; i < rounds; ++i) t.push_back(x.reduce(bytes));
  return median(std::move(t));
}

// Servers a tensor of `bytes` is spread over: its partitions (0: one) over the servers.
int servers_used(const ProbeShape& s, uint64_t bytes) {
  if (!s.parameter_server) return 1;
  const uint64_t parts = s.partition_bytes == 0 ? 1 : (bytes + s.partition_bytes - 1) / s.partition_bytes;
  return static_cast<int>(std::clamp<uint64_t>(parts, 1, static_cast<uint64_t>(std::max(1, s.servers))));
}

// PS: one partition per server, so the shards stay balanced (a PS assigns each to the least-loaded server). A ring
// has no shards.
uint64_t pilot_bytes(const ProbeShape& s) {
  const uint64_t per_round = s.partition_bytes * static_cast<uint64_t>(std::max(1, s.servers));
  if (!s.parameter_server || s.partition_bytes == 0 || per_round > kMaxLargeBytes / 4) return kPilotFallbackBytes;
  return std::max<uint64_t>(per_round, kFloat);
}

// The bandwidth tensor: at least 4 pilots (the pipeline's fill, which both pay, is then a small part of their
// difference) and about kRoundTargetS more than the pilot at the pilot's rate, at most 16 MiB; a whole number of pilots
// (partitions per server).
uint64_t large_bytes(uint64_t pilot, double pilot_s, double small_s) {
  const double bytes_per_s = double(pilot) / std::max(pilot_s - small_s, 1e-6);
  const double want = std::min(double(pilot) + bytes_per_s * kRoundTargetS, double(kMaxLargeBytes));
  const uint64_t n = std::max<uint64_t>(kMinPilots, static_cast<uint64_t>(want / double(pilot)));
  return std::min(n, kMaxLargeBytes / pilot) * pilot;
}

// Three significant digits below 100, the whole number from 100 up (12345.6 reads "12346"), never an exponent:
// 999.8 reads "1000", not "1e+03" (a link measured at 1 Gbit/s less a hair printed "1e+03 Mbit/s", which readers and
// the tests' parsers of the line do not take for a number).
std::string short_number(double v) {
  std::ostringstream o;
  if (std::abs(v) >= 100) {
    o << std::llround(v);
  } else {
    o.precision(3);
    o << v;
  }
  return o.str();
}

std::string rate_text(double bps) {
  if (bps >= 1e9) return short_number(bps / 1e9) + " Gbit/s";
  return short_number(bps / 1e6) + " Mbit/s";
}

std::string seconds_text(double s) { return s >= 1e-3 ? short_number(s * 1e3) + " ms" : short_number(s * 1e6) + " us"; }

}  // namespace

double busiest_link_bytes_per_byte(const ProbeShape& s, uint64_t tensor_bytes) {
  const double w = std::max(1, s.workers);
  if (!s.parameter_server) return 2.0 * (w - 1) / w;
  return std::max(1.0, w / servers_used(s, tensor_bytes));
}

double latency_from_small_reduce(const ProbeShape& s, double seconds) {
  if (s.parameter_server) return seconds / 2;
  return seconds / (2.0 * std::max(1, s.workers - 1));
}

namespace {

// The slope between the two sizes, in bit/s of the busiest link: what both pay (latency, the pipeline's fill,
// per-call costs) cancels. 0 when the larger was not slower.
double slope_rate(const ProbeShape& shape, uint64_t pilot, double pilot_s, uint64_t large, double large_s) {
  const double busiest_bytes = busiest_link_bytes_per_byte(shape, large) * double(large) -
                               busiest_link_bytes_per_byte(shape, pilot) * double(pilot);
  return large_s > pilot_s && busiest_bytes > 0 ? 8.0 * busiest_bytes / (large_s - pilot_s) : 0.0;
}

// A bandwidth tensor size rank 0 sent: larger than `above`, at most 16 MiB, whole floats; else the share is malformed.
uint64_t checked_size(int64_t bytes, uint64_t above, const char* which) {
  if (bytes <= int64_t(above) || uint64_t(bytes) > kMaxLargeBytes || bytes % int64_t(kFloat) != 0)
    throw std::runtime_error("rank 0 sent a " + std::string(which) + " of " + std::to_string(bytes) +
                             " bytes (malformed)");
  return static_cast<uint64_t>(bytes);
}

}  // namespace

LinkMeasurement measure_link(const ProbeShape& shape, const ProbeExchange& x) {
  const double small_s = timed_median(x, kFloat, kLatencyRounds);
  const uint64_t pilot = pilot_bytes(shape);
  const double pilot_s = timed_median(x, pilot, kBandwidthRounds);
  int64_t size[1] = {x.leader ? static_cast<int64_t>(large_bytes(pilot, pilot_s, small_s)) : 0};
  x.share(size);
  uint64_t large = checked_size(size[0], pilot, "bandwidth probe");
  double large_s = 0;
  const double latency = latency_from_small_reduce(shape, small_s);
  const uint64_t largest = kMaxLargeBytes / pilot * pilot;  // a whole number of pilots
  int64_t agreed[3] = {};  // rank 0's rate, latency, and the size of a second try (0: none)
  for (int attempt = 0;; ++attempt) {
    large_s = timed_median(x, large, kBandwidthRounds);
    const double rate = slope_rate(shape, pilot, pilot_s, large, large_s);
    // A fast link (loopback, shared memory) moves the sized tensor in a millisecond or two, where one disturbed
    // round hides the difference: rank 0 then asks once more with the largest tensor.
    const bool again = rate <= 0 && attempt == 0 && large < largest;
    agreed[0] = x.leader ? std::llround(rate) : 0;
    agreed[1] = x.leader ? std::llround(latency * 1e9) : 0;
    agreed[2] = x.leader && again ? static_cast<int64_t>(largest) : 0;
    x.share(agreed);
    if (agreed[2] == 0) break;
    large = checked_size(agreed[2], large, "second bandwidth probe");
  }
  if (agreed[0] <= 0 || agreed[1] < 0)
    throw std::runtime_error("rank 0 could not time the link (reduces of " + format_bytes(large) +
                             " took no longer than those of " + format_bytes(pilot) + ")");

  LinkMeasurement m;
  m.rate_bps = double(agreed[0]);
  m.latency_s = double(agreed[1]) * 1e-9;
  const std::string op = shape.parameter_server ? "push_pull" : "all-reduce";
  std::ostringstream how;
  how << rate_text(m.rate_bps) << " (rank 0's " << op << "s of " << format_bytes(pilot) << " and "
      << format_bytes(large) << ", medians of " << kBandwidthRounds << ": " << seconds_text(pilot_s) << " and "
      << seconds_text(large_s) << ", " << short_number(busiest_link_bytes_per_byte(shape, large))
      << " bytes on the busiest link per byte"
      << (shape.parameter_server ? " over " + std::to_string(servers_used(shape, large)) + " servers" : std::string())
      << "), latency " << seconds_text(m.latency_s)
      << (shape.parameter_server ? " per message (half the median of " : " per ring step (1/(2(W-1)) of the median of ")
      << kLatencyRounds << " " << op << "s of 4 bytes, " << seconds_text(small_s) << ")";
  m.how = how.str();
  return m;
}

ProbeExchange engine_exchange(Engine& engine, Op reduce_op, std::chrono::nanoseconds limit) {
  ProbeExchange x;
  x.leader = engine.backend().rank() == 0;
  // One task, waited for; its memory belongs to the task as much as to the call (a wait that gives up leaves the task
  // in flight, writing into it later).
  auto run = [&engine, limit](const std::string& name, Op op, DType dtype, uint64_t count, auto fill) {
    struct Round {
      std::vector<std::byte> data;
      CompletionWaiter waiter;
    };
    const auto r = std::make_shared<Round>();
    r->data.resize(count * dtype_size(dtype));
    fill(r->data.data());
    Task t;
    t.name = name;  // the same on every rank; the engine numbers its rounds alike everywhere
    t.priority = std::numeric_limits<int32_t>::min();
    t.op = op;
    t.dtype = dtype;
    t.count = count;
    t.buffer.data = r->data.data();
    t.compression = compression::Spec{};  // the link's own bytes, whatever the default compression
    r->waiter.expect(1);
    t.on_done = [r](const Status& s) { r->waiter.settle(s); };
    const auto started = std::chrono::steady_clock::now();
    engine.submit(std::move(t));
    engine.flush();
    const Status status = r->waiter.wait(limit);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!status.ok())
      throw std::runtime_error("'" + name + "' through the " + std::string(engine.backend().name()) +
                               " backend: " + status.message);
    return std::make_pair(seconds, r);
  };
  x.reduce = [run, reduce_op](uint64_t bytes) {
    const uint64_t count = std::max<uint64_t>(1, bytes / kFloat);
    return run("commsched.link_probe." + std::to_string(count * kFloat), reduce_op, DType::f32, count,
               [count](std::byte* p) { std::fill_n(reinterpret_cast<float*>(p), count, 1.0f); })
        .first;
  };
  x.share = [run, leader = x.leader](std::span<int64_t> words) {
    const auto [seconds, r] = run("commsched.link_probe.share", Op::broadcast, DType::i64, words.size(),
                                  [&](std::byte* p) { if (leader) std::copy(words.begin(), words.end(), reinterpret_cast<int64_t*>(p)); });
    (void)seconds;
    std::copy_n(reinterpret_cast<const int64_t*>(r->data.data()), words.size(), words.begin());
  };
  return x;
}

LinkEstimate measured_link(const LinkEstimate& estimate, const LinkMeasurement& m) {
  LinkEstimate out = estimate;
  out.rate_bps = m.rate_bps;
  out.latency_s = m.latency_s;
  out.measured = true;
  out.source = "link measured at startup: " + m.how;
  return out;
}

}  // namespace commsched
