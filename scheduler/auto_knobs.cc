#include "scheduler/auto_knobs.h"

#include <algorithm>
#include <bit>

namespace commsched {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;
constexpr uint64_t kPartition = 256 * KiB;          // up to 16 workers
constexpr uint64_t kSmallestPartition = 64 * KiB;  // below this, per-message costs of the real PS start to show

uint64_t credit_for(uint64_t partition, int workers) { return partition * uint64_t(workers + 1); }

}  // namespace

Knobs auto_knobs(const ClusterShape& shape) {
  if (shape.servers <= 0 || shape.workers <= 1) return Knobs{};
  // 256 KiB up to 16 workers, then halved for every doubling of W, down to 64 KiB.
  const uint64_t w = std::bit_floor(uint64_t(shape.workers));
  const uint64_t partition = std::max(kSmallestPartition, w <= 16 ? kPartition : kPartition * 16 / w);
  return Knobs{partition, credit_for(partition, shape.workers)};
}

std::string apply_auto_knobs(EngineConfig& config, const ClusterShape& shape) {
  if (shape.servers <= 0 || shape.workers <= 1 || (config.partition_set && config.credit_set)) return {};
  const Knobs automatic = auto_knobs(shape);
  if (!config.partition_set) config.knobs.partition_bytes = automatic.partition_bytes;
  if (!config.credit_set)
    config.knobs.credit_bytes = config.knobs.partition_bytes == 0 ? 0 : credit_for(config.knobs.partition_bytes,
                                                                                   shape.workers);
  return "knobs for " + std::to_string(shape.workers) + " workers x " + std::to_string(shape.servers) +
         " servers: partition " + format_bytes(config.knobs.partition_bytes) +
         (config.partition_set ? " (set)" : " (automatic)") + ", credit " +
         (config.knobs.credit_bytes ? format_bytes(config.knobs.credit_bytes) : std::string("unlimited")) +
         (config.credit_set ? " (set)" : " (automatic: one partition from every worker plus one)");
}

}  // namespace commsched
