// Knobs chosen from the cluster's shape when the user sets none: what the engine starts with, and what the simulator
// reports as the scheduler "with automatic knobs" (the same functions, so the two agree).
//
// Parameter server. Every worker pushes each partition into the same server, so that server's downlink takes all W
// pushes of it one after another: a worker's push is acknowledged (and its credit released) up to W * partition /
// rate after it left. A worker whose credit is smaller than about W partitions therefore stalls with its own uplink
// idle, and only credit/partition servers are busy at a time (in the simulator, 4 MiB partitions and 16 MiB credit
// keep the links of 16 workers 58% busy; bench/RESULTS.md). So:
//   - credit covers one partition from every worker plus the next, twice: 2(W + 1) partitions, while that is at most
//     16 MiB, and never less than (W + 1) partitions. A push is acknowledged (and its credit released) when the
//     server's receipt comes back. The servers send receipts ahead of their sums (scheduler/reply_order.h), but a
//     push still waits at its server's downlink for the pushes ahead of it, up to one from every worker, each holding
//     the link its bytes' time plus the per-message cost, and its receipt then for the message on the server's link
//     and a latency: longer than one round of (W + 1) partitions takes to leave the worker. Under that reply order
//     with the measured per-message cost (5 profiles x 1-25 Gbit/s x 8-32 workers, every worker simulated), 2(W + 1)
//     was at least as fast as (W + 1) in 38 of 45 cells and up to 8.1% faster (10 Gbit/s), (W + 1) at most 0.7%
//     faster; 1.5(W + 1) at most 1.0% faster and up to 5.3% slower (bench/RESULTS.md, session 21). Without a
//     per-message cost (W + 1) was the faster on ResNet-50 (8 workers, 10 Gbit/s: 93.3 against 101.8 ms) but not on
//     BERT-base (398.6 against 380.3). Bytes in flight also
//     queue ahead of an urgent partition in the servers' FIFO queues: at 256 workers 2(W + 1) x 64 KiB = 32 MiB was
//     18% slower than (W + 1) on ResNet-50 at 10 Gbit/s (every worker simulated), and 4(W + 1) was worse at 8
//     workers too; hence the cap, which leaves 256 workers at (W + 1). PS grid (5 profiles x 1-100 Gbit/s x 2-256
//     workers): within 1.10x of the dependency bound in 110 of 120 cells instead of 101, >= 0.98x the best baseline
//     in all 120 (bench/RESULTS.md, issue 12, item 1). The credit is the same all through the backward: shrinking it
//     before the backward's end, so the first-needed gradients meet empty queues, did not move the every-worker
//     grid (bench/RESULTS.md, session 23; scheduler/priority_credit_policy.h);
//   - the partition weighs incast against the per-message cost (m: each message costs each end m beside its bytes /
//     rate R; ClusterShape::message, whose 0 means kPsMessageS, or kPsMessageSharedCoresS where the workers fill
//     their host's cores, below). With S servers a partition's round takes its server's downlink W (p / R + m): the
//     incast latency a tensor needed first pays before its sum can come back. For B gradient bytes a step, a worker's
//     link carries B / p messages each way and a server's W / S times as many, so the busier end pays about
//     max(1, W / S) B m / p in per-message cost. Their sum, max(1, W / S) B m / p + W p / R, is least at
//         p = sqrt(B m R / min(W, S)),
//     taken to the nearest power of two within [16 KiB, 4 MiB] (4 MiB: the PS backend's chunk), with
//     B = kPsReferenceBytes (below; the knobs are chosen before the model's tensors are known). A faster link and
//     fewer servers afford larger partitions; more workers ask for smaller ones. The earlier rule (256 KiB up to 16
//     workers, halved per doubling down to 64 KiB, rate ignored) left the many-tensor models at 1.14-1.21x the bound
//     at 16-64 workers with every worker simulated, where 32-64 KiB reached 1.02-1.06x, but with no per-message cost
//     in the model; on the real PS (ResNet-50 profile, 4 workers, 2 servers, emulated 2 Gbit/s) 64 KiB was 4.5%
//     slower than 256 KiB (1002 against 959 ms/step). The simulator now charges m (simulator/network.h) and both
//     sides choose by this rule: in the PS grid at 8-64 workers it beat the earlier rule in 20 of 80 cells (up to
//     7.8%) and lost 1% in one. On the real PS at that shape with 4 servers (the rule's 128 KiB against 256 KiB)
//     128 KiB was 1.0% slower at the median of 24 rounds on a shared 2-core machine (2.9% slower at load 7-18, 1.6%
//     faster at load 3-11): inside the spread. Were it real, a message would cost 6-18 us end to end there, and at 18
//     us the rule keeps 256 KiB. Open: measure m where the server has cores of its own (bench/RESULTS.md, session
//     18).
//   - no small-tensor fusion (small_tensor_bytes 0), decided by real runs: the PS does carry a fused batch's small
//     partitions as one message each way (push_pull_batch), but fusing tensors of up to 32 KiB did not measurably
//     help the torch plugin on a local PS (examples/pytorch_profile_benchmark.py --profile resnet50, 1 server,
//     compute emulated, the two settings alternated pair by pair, 3 rounds, medians of 15 steps; a shared 2-core
//     machine at load 5-16), fused against unfused: 4 workers unshaped (CPU-bound) 843 against 778 ms/step before
//     the server's summation threads, 850 against 842 after them; 2 workers at an emulated 1 Gbit/s (link-bound)
//     1691 against 1711. Every difference is inside the run-to-run spread (up to +-20% per run). Revisit where
//     per-message costs dominate (many workers, fast links).
//
// All-reduce (no servers: Gloo, NCCL). A ring all-reduce of b bytes over n workers takes
//   alpha + beta * b,   alpha = 2(n-1) * step latency,   beta = 2(n-1)/n / link rate,
// so the latency, which grows with n, must be amortised by the message. The collectives run one at a time (the ring
// pipelines its own chunks, so one collective keeps every link busy), which gives the three knobs:
//   - partition: the smallest power of two that pays at most 1/64 of its bytes' time in latency,
//     kLatencyShare * alpha / beta = 64 * n * step latency * rate (in bytes), within [4 MiB, 1 GiB]; at 256 workers,
//     5 us per step and 10 Gbit/s that is 128 MiB, where the fixed 4 MiB pays 2.55 ms of latency per 6.7 ms of bytes;
//   - credit: one batch in flight. A free credit would start every small tensor as a collective of its own, each
//     paying alpha; with one batch in flight whatever becomes ready meanwhile waits and is fused into the next one,
//     so batches grow with the backlog and stay small (urgent) when the queue is short. The next batch is ordered the
//     moment the running one ends: the pipe stays full;
//   - small-tensor fusion bound: one partition, at least 8 MiB (two of the smallest partitions).
// In the simulator (5 profiles x 1-100 Gbit/s x 8-256 workers, ring, bench/RESULTS.md, session 24) that is the 1/32
// rule's fusion bound, with large tensors cut into half as many pieces: faster in 43 of 120 cells (up to 1.5%), slower
// in 4 (under 1%), never below 0.98x the best baseline. Shares of 1/8 and 1/16, and every smaller fusion bound tried,
// put cells below 0.98x (the best fusion bound depends on the model, not on the shape). The 4 MiB floor is the default:
// below it the per-call costs of the real collectives, which the ring model leaves out, dominate.
#pragma once

#include <cstdint>
#include <string>

#include "scheduler/config.h"

namespace commsched {

// The parameter server's per-message cost and the reason the rule chose it (the log's words, empty for the
// dedicated-core default), together so that the log cannot describe a cost the rule did not choose.
struct PsMessageCost {
  double seconds = 0;
  std::string why;
};

struct ClusterShape {
  int workers = 1;
  int servers = 0;  // 0: no parameter server (all-reduce or loopback)
  // The link: rate per worker (bits/s; both rules) and latency per ring step (all-reduce). 0: unknown, the assumed
  // values below.
  double link_bps = 0;
  double step_latency_s = 0;
  // Parameter server: the fixed cost of one message at one end (the PS partition rule's m). Seconds 0 (the default):
  // kPsMessageS; the plugin passes ps_message_cost() for its host.
  PsMessageCost message;
};

inline constexpr double kAssumedLinkBps = 10e9;       // when ClusterShape::link_bps is 0
inline constexpr double kAssumedStepLatencyS = 5e-6;  // when ClusterShape::step_latency_s is 0

// The real parameter server's fixed cost of one message at one end (sending or receiving it: framing, system calls,
// the server's bookkeeping), beside its bytes / rate. Measured with build/bench/ps/ps_goodput on loopback, 1 KiB
// push_pulls with a window in flight, where the bytes cost under 1 us (bench/RESULTS.md, session 18): ZeroMQ, the
// default transport, 11.7 us per push_pull with 1 worker and 7.5 us per push_pull at the server with 4 workers; a
// push_pull is two messages at each end, so 4-6 us a message (UCX over TCP: 7-10 us). Taken on a shared 2-core
// machine, so an upper end for a server with cores of its own. The PS partition rule weighs it against incast, and the
// simulator charges it on every real link a message crosses (simulator/network.h, PsParams::message_s), so the two
// agree.
inline constexpr double kPsMessageS = 5e-6;

// m where the workers have no core to spare: as many worker processes on the host as it has cores, each computing on
// the CPU, so every message's CPU (the engine's tasks and wake-ups, the transport's polling, the oneTBB workers'
// spinning) is taken from the training compute and its wake-ups wait for a core. Measured on the main job (SmallCNN on
// the CPU, 2 workers and a server on 2 cores, UCX shared memory at an emulated 1 Gbit/s, bench/RESULTS.md, session 23):
// the server's emulated link stayed saturated through the big layer at 256 KiB and a 16 MiB credit changed nothing,
// while each worker used 0.42-0.55 ms more CPU per extra partition. In step time (quiet, session 22) 256 KiB cost
// 41.9 ms a step more than 4 MiB for 60 more partitions although its pipeline fills 31.5 ms sooner: 1.2 ms a partition.
inline constexpr double kPsMessageSharedCoresS = 1.2e-3;

// m for a host running `local_workers` worker processes on `cores` cores (the plugin passes base/cpu_usage.h's
// usable_cores(): the affinity, so a cpuset or a Slurm binding counts; 0: unknown, the default kept).
// A process that sees a GPU (`gpus` > 0) trains on it, so its host keeps the default whatever its cores: a
// per-rank binding of a GPU job (Slurm's --cpus-per-task, mpirun --bind-to) would otherwise look like full cores.
// Returns the cost with the reason the knobs' log gives for it.
PsMessageCost ps_message_cost(int local_workers, unsigned cores, int gpus = 0);

// B in the PS partition rule: the gradient bytes a step is taken to carry per incast it exposes. In the simulator
// (every worker simulated, 5 us per message, partitions 32 KiB-512 KiB side by side) the fastest partition at 16
// workers was 128 KiB at 10 Gbit/s for ResNet-50 and BERT-base (Transformer-base: 64 KiB, 1% ahead of 128 KiB) and
// 256-512 KiB at 25 Gbit/s, and at 64 workers and 10 Gbit/s 64 KiB (ResNet-50, BERT-base): what 64 MiB gives
// (bench/RESULTS.md, session 18).
inline constexpr double kPsReferenceBytes = 64.0 * 1024 * 1024;

// One message's cost on a network: alpha + beta * bytes (MG-WFBP's planner and the simulator use the same form).
struct MessageCost {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
};

// A ring all-reduce over `workers` workers: 2(n-1) steps of `step_latency_s`, 2(n-1)/n of the bytes over the link.
// The simulator's ring model (simulator/network.h) charges exactly this.
MessageCost ring_allreduce_cost(int workers, double link_bps, double step_latency_s);

// What the automatic choice sets: the knob set (small_tensor_bytes 0: the policy's, or the collective's, default).
struct AutoKnobs {
  Knobs knobs;
};

// The automatic knobs for a cluster of this shape: the parameter server's rule when it has servers, the all-reduce
// rule otherwise; the fixed defaults with one worker.
AutoKnobs auto_knobs(const ClusterShape& shape);

// Replaces the knobs the configuration did not set explicitly (EngineConfig::partition_set / credit_set, a
// small-tensor bound of 0) with the automatic ones; an explicit partition keeps its size and gets the automatic credit
// for it. Returns a one-line explanation for the log, or an empty string when nothing was automatic.
std::string apply_auto_knobs(EngineConfig& config, const ClusterShape& shape);

}  // namespace commsched
