// The interface every backend implements. scheduler/ knows backends only through this header.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/task.h"
#include "base/types.h"
#include "comm_backends/membership.h"

namespace commsched {

// Called exactly once per start(), from any thread, when every partition of the batch has been moved (or failed).
using BatchDone = std::function<void(const Status&)>;

class GlobalOrderInbox;  // scheduler/global_order.h
class WaitHelper;        // scheduler/wait_helper.h

// Which operations a backend carries on which buffers: a bit per (operation, device) pair. Data, so that supports()
// is answered from a backend's capability row and no backend writes it.
class OpDeviceSet {
 public:
  OpDeviceSet() = default;
  // Every pair of the two lists (a backend registry row: BackendInfo::ops x devices).
  OpDeviceSet(std::span<const Op> ops, std::span<const Device> devices) { add_all(ops, devices); }
  OpDeviceSet(std::initializer_list<Op> ops, std::initializer_list<Device> devices) {
    add_all(std::span<const Op>(ops.begin(), ops.size()), std::span<const Device>(devices.begin(), devices.size()));
  }
  OpDeviceSet& add(Op op, Device device) {
    bits_ |= bit(op, device);
    return *this;
  }
  bool has(Op op, Device device) const { return (bits_ & bit(op, device)) != 0; }

 private:
  void add_all(std::span<const Op> ops, std::span<const Device> devices) {
    for (Op op : ops)
      for (Device d : devices) add(op, d);
  }
  static uint32_t bit(Op op, Device device) {
    return 1u << (static_cast<unsigned>(op) * 2 + static_cast<unsigned>(device));  // two devices per operation
  }
  uint32_t bits_ = 0;
};

// What a backend can do beyond start/sent/done: one row, asked once.
struct BackendCapabilities {
  // What it moves. CommBackend::capabilities() fills it from the backend's row of the backend registry (the one list
  // of what a backend moves); only a backend without a row (a test double) or one whose row depends on how it was
  // built (hierarchical: the local collective's memory) sets it itself.
  OpDeviceSet carries;
  // start() calls `sent` when a batch has left this worker (the receiver holds every byte, e.g. a parameter server
  // acknowledged the push). The engine releases the batch's credit then: what a batch still waits for after that (the
  // other workers' pushes, for a PS sum) must not hold this worker's credit, or workers whose credits are full of
  // different partitions would wait on each other forever.
  bool reports_sent = false;
  // Non-null: the order of collectives is decided on rank 0 over what every rank has ready (scheduler/global_order.h),
  // by the Policy handed over here (valid while the backend lives). A collective needs every rank to issue the same
  // partitions, so per-rank policies whose credits fill with different partitions deadlock it. The engine then hands
  // its own Policy here, forwards its partitions as they arrive, and posts its whole knob set here at start and at
  // every knob change (the same iteration on every rank, when the knobs come from the auto-tuner); rank 0 runs that
  // policy and gives it every knob through Policy::set_knobs.
  GlobalOrderInbox* global_order = nullptr;
  // Non-null: Horovod's join, a rank that has run out of data stood in for with zeros (comm_backends/membership.h).
  // Valid while the backend lives.
  RankJoin* joins = nullptr;
  // Non-null: who lags, as the backend last learned it (comm_backends/membership.h). Valid while the backend lives.
  const StragglerReport* stragglers = nullptr;
  // Non-null: a caller about to wait for this backend's completions may do its pending work on its own thread
  // instead (scheduler/wait_helper.h; CompletionWaiter::wait takes it). Valid while the backend lives.
  WaitHelper* wait_helper = nullptr;
  // The encoded schemes whose reduction this backend understands (a parameter server that decodes, sums and encodes
  // the pull), a bit per compression::Scheme. Casts (fp16/bf16) need no such support: their sum is defined on the wire.
  uint32_t reduces_encoded = 0;
  // The CUDA device whose memory this backend's collectives use (a device-only backend, NCCL): host tensors are
  // staged there (the host-to-device copy stage). 0 for the others.
  int cuda_device = 0;

  bool reduces(compression::Scheme s) const { return (reduces_encoded >> static_cast<unsigned>(s)) & 1u; }
  static uint32_t scheme_bit(compression::Scheme s) { return 1u << static_cast<unsigned>(s); }
};

// What a backend implements: its identity, do_start() and shutdown(); capabilities() only where it can do more than
// its registry row says. Everything else a backend may offer (join, stragglers, the global order) is reached through
// the capability row, so a backend that offers none of it writes none of it.
class CommBackend {
 public:
  virtual ~CommBackend() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Begins moving a batch of partitions (one, or several to fuse) and returns quickly; never blocks on the network.
  // The TaskDesc pointers in the views stay valid until `done` has been called. `done` may be called inline.
  void start(std::vector<PartitionView> batch, BatchDone done) { do_start(std::move(batch), nullptr, std::move(done)); }
  // Starts a batch like start(), and calls `sent` once, before `done` (or never when the batch fails), where the
  // capabilities say reports_sent; the others never call it.
  void start(std::vector<PartitionView> batch, BatchDone sent, BatchDone done) {
    do_start(std::move(batch), std::move(sent), std::move(done));
  }

  // What this backend can do beyond moving bytes (see BackendCapabilities). Read by the engine when it is built and
  // by stages deciding whether a task can run; the answer does not change over the backend's life. By default: what
  // the backend's registry row (the row named name()) says it carries, and nothing more.
  virtual BackendCapabilities capabilities() const;

  // Whether the backend can carry this operation on buffers of this device (its capability row's `carries`).
  bool supports(Op op, Device device) const { return capabilities().carries.has(op, device); }

  // Stops the backend: in-flight batches are completed with an error (or finished); after return, no `done`
  // callback runs any more. Idempotent.
  virtual void shutdown() = 0;

 private:
  // The one way bytes move: start() in both its forms. `sent` may be empty (not asked for).
  virtual void do_start(std::vector<PartitionView> batch, BatchDone sent, BatchDone done) = 0;
};

}  // namespace commsched
