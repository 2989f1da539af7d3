// Knobs chosen from the cluster's shape when the user sets none: what the engine starts with on a parameter server,
// and what the simulator reports as the scheduler "with automatic knobs" (the same function, so the two agree).
//
// Why they depend on the shape. On a parameter server every worker pushes each partition into the same server, so
// that server's downlink takes all W pushes of it one after another: a worker's push is acknowledged (and its credit
// released) up to W * partition / rate after it left. A worker whose credit is smaller than about W partitions
// therefore stalls with its own uplink idle, and only credit/partition servers are busy at a time (in the simulator,
// 4 MiB partitions and 16 MiB credit keep the links of 16 workers 58% busy; bench/RESULTS.md). So:
//   - credit covers one partition from every worker plus the next: (W + 1) partitions;
//   - partitions are small, 256 KiB up to 16 workers and halving per doubling beyond (64 KiB from 64 workers on),
//     so that the incast latency W * partition / rate, which every tensor pays at least once, stays small and a
//     model's bytes spread evenly over many servers. In the simulator's grid (5 profiles x 1-100 Gbit/s, every
//     worker simulated up to 16 workers) 256 KiB was never worse than 1 MiB or 4 MiB at 2-16 workers and up to 1.16x
//     better; at 64 workers 64 KiB reached the dependency bound within 10% in 20 of 20 cells, 128 KiB in 18, and
//     with a 256 KiB floor ResNet-50 at 256 workers was 2.0x the bound (1.3x at 64 KiB). The simulator does not
//     charge per-message CPU, which the floor guards against (bench/RESULTS.md, issue 12).
// All-reduce backends (no servers) keep the fixed defaults: their cost is the collective's, not an incast.
#pragma once

#include "scheduler/config.h"

namespace commsched {

struct ClusterShape {
  int workers = 1;
  int servers = 0;  // 0: no parameter server (all-reduce or loopback)
};

// The automatic knobs for a cluster of this shape.
Knobs auto_knobs(const ClusterShape& shape);

// Replaces the knobs the configuration did not set explicitly (EngineConfig::partition_set / credit_set) with the
// automatic ones; an explicit partition keeps its size and gets the automatic credit for it. Returns a one-line
// explanation for the log, or an empty string when nothing was automatic.
std::string apply_auto_knobs(EngineConfig& config, const ClusterShape& shape);

}  // namespace commsched
