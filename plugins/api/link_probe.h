// The link measured at startup (COMMSCHED_LINK_PROBE=auto): a short timed exchange through the engine and the real
// backend, before the first step, of the reduction training runs (push_pull on the parameter server, all-reduce on
// the collectives). The tuner's warm start (live_tuner_warm_start.h) simulates candidate knobs with its numbers in
// place of the estimate. Every rank runs the same exchanges; rank 0's numbers are broadcast, so every rank plans
// with the same link.
//
//   1. Latency: one untimed and 7 timed reduces of one float; the median's time T1. A PS push_pull of one message is
//      a push and a pull: the simulator's PS latency (one way per message) is T1 / 2. A ring all-reduce of one float
//      takes 2(W - 1) steps: the simulator's ring latency (per step) is T1 / (2(W - 1)), the collective's
//      negotiation included (every collective pays it).
//   2. Pilot: one untimed and 3 timed reduces of one partition per server (256 KiB when the partition is unlimited
//      or large); rank 0 sizes the bandwidth tensor from their median (at least 4 pilots, about 30 ms more than the
//      pilot, at most 16 MiB, a whole number of partitions per server so that the servers' shards stay balanced)
//      and broadcasts the size.
//   3. Bandwidth: one untimed and 3 timed reduces of that size; rate = 8 x the difference of the bytes the busiest
//      link carries / the difference of the two medians (what both sizes pay, latency and the pipeline's fill,
//      cancels). The busiest link carries max(1, W / S) bytes per byte of the tensor on a parameter server (each
//      server receives every worker's push of its share and sends each the sum: what COMMSCHED_EMULATE_RATE's
//      pacing and a real NIC both limit) and 2(W - 1) / W on a ring (what each rank sends).
//   4. Rank 0 broadcasts its rate and latency (0: it could not time the exchange, and every rank says so).
// The untimed rounds absorb first-use costs (a PS assigns a key's shards to servers on first sight).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "plugins/api/live_tuner_warm_start.h"
#include "scheduler/engine.h"

namespace commsched {

struct ProbeShape {
  bool parameter_server = true;  // false: a ring all-reduce (Gloo, NCCL)
  int workers = 2;
  int servers = 1;               // parameter server only
  uint64_t partition_bytes = 0;  // the engine's partition size (0: tensors are not split)
};

// The exchanges a probe makes; the engine's below, a fake in tests.
struct ProbeExchange {
  // Reduces a tensor of `bytes` bytes on every rank and returns the wall seconds it took; throws std::runtime_error
  // when it fails or does not complete in time.
  std::function<double(uint64_t bytes)> reduce;
  // Overwrites `words` on every rank with rank 0's; throws as reduce does.
  std::function<void(std::span<int64_t> words)> share;
  bool leader = false;  // rank 0
};

struct LinkMeasurement {
  double rate_bps = 0;      // per process, each direction
  double latency_s = 0;     // the simulator's: PS one way per message, ring per step
  std::string how;          // for the log: the numbers and how they were taken
};

// The bytes the busiest link carries per byte of a reduced tensor of `tensor_bytes` bytes, and the simulator's
// latency from the time of a one-float reduce (see above).
double busiest_link_bytes_per_byte(const ProbeShape& shape, uint64_t tensor_bytes);
double latency_from_small_reduce(const ProbeShape& shape, double seconds);

// Runs steps 1-4 above. Throws std::runtime_error saying why when the link could not be timed (the exchange failed,
// or the bandwidth rounds were no slower than the latency rounds), on every rank alike where rank 0 decided it.
LinkMeasurement measure_link(const ProbeShape& shape, const ProbeExchange& exchange);

// The exchanges through `engine` (the most urgent tasks, uncompressed, flushed at once like the tuner's agreement);
// each waits at most `limit`.
ProbeExchange engine_exchange(Engine& engine, Op reduce_op, std::chrono::nanoseconds limit = std::chrono::seconds(10));

// The estimate with the measurement in its place (its `emulated` flag kept: that is how the transport paces).
LinkEstimate measured_link(const LinkEstimate& estimate, const LinkMeasurement& m);

}  // namespace commsched
