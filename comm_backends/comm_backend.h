// The interface every backend implements. scheduler/ knows backends only through this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/task.h"
#include "base/types.h"

namespace commsched {

// A rank that holds the others back, as this rank last heard it (comm_backends/straggler.h): how many iterations it
// is behind the furthest rank, and how long ago the first other rank passed the iteration it is at.
struct Straggler {
  int rank = 0;
  uint64_t iterations = 0;
  double seconds = 0;
};

// Called exactly once per start(), from any thread, when every partition of the batch has been moved (or failed).
using BatchDone = std::function<void(const Status&)>;

class GlobalOrderInbox;  // scheduler/global_order.h

// What a backend can do beyond start/done: one row, asked once.
struct BackendCapabilities {
  // start_with_sent() tells when a batch has left this worker (the receiver holds every byte, e.g. a parameter server
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
  // join() can stand in with zeros for a rank that has run out of data (Horovod's join).
  bool joins = false;
  // The encoded schemes whose reduction this backend understands (a parameter server that decodes, sums and encodes
  // the pull), a bit per compression::Scheme. Casts (fp16/bf16) need no such support: their sum is defined on the wire.
  uint32_t reduces_encoded = 0;
  // The CUDA device whose memory this backend's collectives use (a device-only backend, NCCL): host tensors are
  // staged there (the host-to-device copy stage). 0 for the others.
  int cuda_device = 0;

  bool reduces(compression::Scheme s) const { return (reduces_encoded >> static_cast<unsigned>(s)) & 1u; }
  static uint32_t scheme_bit(compression::Scheme s) { return 1u << static_cast<unsigned>(s); }
};

class CommBackend {
 public:
  virtual ~CommBackend() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Begins moving a batch of partitions (one, or several to fuse) and returns quickly; never blocks on the network.
  // The TaskDesc pointers in the views stay valid until `done` has been called. `done` may be called inline.
  virtual void start(std::vector<PartitionView> batch, BatchDone done) = 0;

  // Starts a batch like start(), and calls `sent` once, before `done` (or never when the batch fails), when the
  // backend's capabilities say reports_sent; the others never call it.
  virtual void start_with_sent(std::vector<PartitionView> batch, BatchDone /*sent*/, BatchDone done) {
    start(std::move(batch), std::move(done));
  }

  // What this backend can do beyond moving bytes (see BackendCapabilities). Read by the engine when it is built and
  // by stages deciding whether a task can run; the answer does not change over the backend's life.
  virtual BackendCapabilities capabilities() const { return {}; }

  // Whether the backend can carry this operation on buffers of this device. By default its row of the backend
  // registry answers (BackendInfo::ops x devices, the row named name()): the one list of what a backend moves. Only
  // a backend without a row (a test double) has a reason to override it.
  virtual bool supports(Op op, Device device) const;

  // Horovod's join, where capabilities say joins: blocks until every rank has joined and returns the rank that joined
  // last. Called with nothing of this rank in flight (Engine::join sees to it).
  virtual int join() { throw std::logic_error(std::string(name()) + " backend cannot join"); }

  // The ranks that lag, most seconds first, as the backend last learned them (the parameter server's lag reports,
  // the all-reduce coordinator's); empty when none does or the backend cannot tell. Thread-safe.
  virtual std::vector<Straggler> stragglers() const { return {}; }

  // Stops the backend: in-flight batches are completed with an error (or finished); after return, no `done`
  // callback runs any more. Idempotent.
  virtual void shutdown() = 0;
};

}  // namespace commsched
