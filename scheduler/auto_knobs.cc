#include "scheduler/auto_knobs.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace commsched {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

// Parameter server (the partition rule in the header).
constexpr uint64_t kPsSmallestPartition = 16 * KiB;
constexpr uint64_t kPsLargestPartition = 4 * MiB;     // the PS backend's chunk: larger messages travel as chunks anyway

// All-reduce.
constexpr double kLatencyShare = 64;  // a partition's ring latency <= 1/64 of its bytes' time
constexpr uint64_t kRingSmallestPartition = Knobs{}.partition_bytes;
constexpr uint64_t kRingSmallestFusion = 2 * kRingSmallestPartition;  // the fusion bound's floor
constexpr uint64_t kRingLargest = 1024 * MiB;  // partitions and fused batches
constexpr uint64_t kOneBatchInFlight = 1;      // a credit below any partition: one batch at a time

bool has_servers(const ClusterShape& s) { return s.servers > 0; }

constexpr uint64_t kPsCreditCap = 16 * MiB;         // above this, only (W + 1) partitions (see the header)

// Two rounds of one partition from every worker plus one (one round is sent before its receipts can be back), as long
// as that stays within the cap; never below one round.
uint64_t ps_credit_for(uint64_t partition, int workers) {
  const uint64_t round = partition * uint64_t(workers + 1);
  return std::max(round, std::min(2 * round, kPsCreditCap));
}

double link_bytes_per_s(const ClusterShape& s) { return (s.link_bps > 0 ? s.link_bps : kAssumedLinkBps) / 8; }

// m: the shape's per-message cost, or the dedicated-core default.
double message_cost(const ClusterShape& s) { return s.message.seconds > 0 ? s.message.seconds : kPsMessageS; }

// The power of two nearest (in ratio) to sqrt(B * m * rate / min(W, S)), within [16 KiB, 4 MiB] (see the header).
uint64_t ps_partition(const ClusterShape& s) {
  const double fan_in = std::min(s.workers, s.servers);
  const double best = std::sqrt(kPsReferenceBytes * message_cost(s) * link_bytes_per_s(s) / fan_in);
  if (!(best >= double(kPsSmallestPartition))) return kPsSmallestPartition;  // also a cost of 0
  if (best >= double(kPsLargestPartition)) return kPsLargestPartition;
  const uint64_t below = std::bit_floor(uint64_t(best));
  return best * best > 2.0 * double(below) * double(below) ? 2 * below : below;  // best / below > sqrt(2)
}

MessageCost ring_cost(const ClusterShape& s) {
  return ring_allreduce_cost(s.workers, s.link_bps > 0 ? s.link_bps : kAssumedLinkBps,
                             s.step_latency_s > 0 ? s.step_latency_s : kAssumedStepLatencyS);
}

uint64_t ring_partition(const ClusterShape& s) {
  const MessageCost c = ring_cost(s);
  const double amortising = kLatencyShare * c.alpha_s / c.beta_s_per_byte;
  const uint64_t wanted =
      amortising >= double(kRingLargest) ? kRingLargest : std::bit_ceil(uint64_t(std::ceil(amortising)));
  return std::clamp(wanted, kRingSmallestPartition, kRingLargest);
}

// One partition, at least two of the smallest: the same bound as the 1/32 rule's two partitions (which one 1/64
// partition equals), so the share of 1/64 changes only how finely large tensors are cut: half as many collectives
// for them, each paying the ring latency once. Smaller fusion bounds are faster in the many-tensor cells that miss
// the bound, but the best bound depends on the model, not only on the cluster's shape (BERT and Transformer 4-32 MiB,
// ResNet-50 32 MiB over 4 MiB partitions, VGG-16 at 100 Gbit/s and 128-256 workers 512 MiB or more), and every
// shape-only bound tried (caps of 8-64 MiB or of link time, shares of 1/8-1/16) put a cell below 0.98x the best
// baseline (bench/RESULTS.md, session 24).
uint64_t ring_fusion_for(uint64_t partition) {
  return partition == 0 ? 0 : std::min(std::max(partition, kRingSmallestFusion), kRingLargest);
}

std::string assumed_link(const ClusterShape& s) {
  return s.link_bps > 0 ? "" : ", link assumed " + std::to_string(int(kAssumedLinkBps / 1e9)) + " Gbit/s";
}

std::string describe_ring(const ClusterShape& s) {
  const MessageCost c = ring_cost(s);
  return "knobs for a " + std::to_string(s.workers) + "-worker all-reduce (ring latency " +
         std::to_string(int64_t(std::llround(c.alpha_s * 1e6))) + " us" + assumed_link(s) + "): ";
}

std::string describe_ps(const ClusterShape& s) {
  return "knobs for " + std::to_string(s.workers) + " workers x " + std::to_string(s.servers) + " servers (" +
         std::to_string(int64_t(std::llround(message_cost(s) * 1e6))) + " us per message" +
         (s.message.why.empty() ? "" : ": " + s.message.why) + assumed_link(s) +
         "): ";
}

// The log line: what was chosen, what was set, and why.
std::string explain(const EngineConfig& config, const ClusterShape& shape, bool fusion_automatic) {
  const bool ring = !has_servers(shape);
  const std::string credit_why = ring ? "the collectives run one at a time; what queues meanwhile is fused"
                                      : "two rounds of one partition from every worker plus one, up to 16 MiB: a "
                                        "push's receipt comes back after the pushes ahead of it at the server (one per "
                                        "worker, each with its per-message cost) and a latency: longer than one round "
                                        "takes to send";
  std::string why = ring ? describe_ring(shape) : describe_ps(shape);
  why += "partition " + format_bytes(config.knobs.partition_bytes) +
         (config.partition_set ? " (set)"
          : ring ? " (automatic: ring latency at most 1/" + std::to_string(int(kLatencyShare)) + " of its bytes' time)"
                 : " (automatic: incast against per-message cost)") +
         ", credit " +
         describe_knob(registered_knob("credit_bytes"), config.knobs) +
         (config.credit_set ? " (set)" : " (automatic: " + credit_why + ")");
  if (fusion_automatic)
    why += ", tensors fused up to " + format_bytes(config.knobs.small_tensor_bytes) +
           " (automatic: one partition, at least " + format_bytes(kRingSmallestFusion) +
           ": each collective pays the ring latency)";
  return why;
}

}  // namespace

PsMessageCost ps_message_cost(int local_workers, unsigned cores, int gpus) {
  if (gpus > 0) return {kPsMessageS, ""};  // the workers compute on their GPUs: a message's CPU does not delay that
  if (cores > 0 && local_workers >= int(cores)) return {kPsMessageSharedCoresS, "the workers fill the host's cores"};
  return {kPsMessageS, ""};
}

MessageCost ring_allreduce_cost(int workers, double link_bps, double step_latency_s) {
  if (workers <= 1) return {0, 0};  // nothing to exchange
  const double n = workers;
  return {2 * (n - 1) * step_latency_s, 2 * (n - 1) / n * 8.0 / link_bps};
}

AutoKnobs auto_knobs(const ClusterShape& shape) {
  if (shape.workers <= 1) return AutoKnobs{};
  if (has_servers(shape)) {
    const uint64_t partition = ps_partition(shape);
    return {Knobs{partition, ps_credit_for(partition, shape.workers), 0}};
  }
  const uint64_t partition = ring_partition(shape);
  return {Knobs{partition, kOneBatchInFlight, ring_fusion_for(partition)}};
}

std::string apply_auto_knobs(EngineConfig& config, const ClusterShape& shape) {
  if (shape.workers <= 1) return {};
  const bool ring = !has_servers(shape);
  const bool fusion_automatic = ring && config.knobs.small_tensor_bytes == 0;
  if (config.partition_set && config.credit_set && !fusion_automatic) return {};
  const AutoKnobs automatic = auto_knobs(shape);
  if (!config.partition_set) config.knobs.partition_bytes = automatic.knobs.partition_bytes;
  const uint64_t partition = config.knobs.partition_bytes;
  if (!config.credit_set)
    config.knobs.credit_bytes = ring ? kOneBatchInFlight : partition == 0 ? 0 : ps_credit_for(partition, shape.workers);
  if (fusion_automatic)
    config.knobs.small_tensor_bytes = partition == 0 ? automatic.knobs.small_tensor_bytes : ring_fusion_for(partition);

  return explain(config, shape, fusion_automatic);
}

}  // namespace commsched
