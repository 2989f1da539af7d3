// What every ps_goodput mode measures with: push_pull goodput over a window of partitions or in rounds, the cluster
// environment of a loopback server or worker, and the sizes, medians and names its tables print.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/ps/ps_backend.h"

namespace commsched::bench {

using Clock = std::chrono::steady_clock;

// 64 KiB .. 64 MiB: the partition sizes measured unless --only names others.
std::vector<uint64_t> default_sizes();
inline uint64_t total_bytes(uint64_t part, uint64_t mib) { return std::max<uint64_t>(mib << 20, 8 * part); }
inline uint64_t window_of(uint64_t part) { return std::max<uint64_t>(4, (32ull << 20) / part); }  // >= 32 MiB in flight
double seconds_since(Clock::time_point t);

// Partition bytes push_pulled per second through `b`, a window of partitions in flight; 0 when one failed.
double ps_goodput(PsBackend& b, uint64_t part, uint64_t mib);
// Rounds of `parts` partitions of `part` bytes, each round submitted at once and waited for (a training step's small
// tensors): as one batch (`fused`) or as one batch per partition. Partitions push_pulled per second, in bytes.
double ps_round_goodput(PsBackend& b, uint64_t part, uint64_t parts, bool fused, uint64_t mib);

ClusterEnv env_for(Role role, const std::string& addr, int port, int workers = 1, int rank = 0);

// Whether `t` is one of the comma-separated `transports` (--transports zmq,shm,tcp).
bool wanted(const std::string& transports, const std::string& t);
double median(std::vector<double> v);
std::string size_name(uint64_t b);

}  // namespace commsched::bench
