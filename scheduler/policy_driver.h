// PolicyDriver: the one loop that drives a Policy (arrivals -> dispatch under its credit -> on_batch_done -> flush),
// written once for every caller: the engine (real time), rank 0's global order over every rank's readiness, and the
// simulator (simulated time). Pure and single-threaded like the Policy it drives: no threads, no clocks (the caller
// passes the time), no I/O; what a dispatched batch becomes (a backend start, an order on the wire, a simulated
// transfer) is the caller's, through a DispatchSink.
//
// Every exception a policy throws leaves as a PolicyFault naming the policy and the call, so every caller reports a
// broken policy the same way; a sink's own exceptions pass through untouched.
#pragma once

#include <optional>
#include <stdexcept>
#include <vector>

#include "scheduler/policy.h"

namespace commsched {

// A policy threw: its state is unknown. The message names the policy and the call.
struct PolicyFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where the batches a policy dispatches go.
class DispatchSink {
 public:
  virtual ~DispatchSink() = default;
  // Takes a non-empty batch the policy dispatched, moving from it only when it returns true. False: the batch ended
  // at once (there was nothing to move), so the driver tells the policy it is done and asks it again, since that
  // freed credit. True: the caller tells batch_done() later.
  virtual bool dispatch(Batch& batch, Nanos now) = 0;
  // Whether the policy may be asked now; false holds back what it would dispatch (it keeps it, and may fuse more).
  virtual bool may_poll() const { return true; }
};

class PolicyDriver {
 public:
  explicit PolicyDriver(Policy& policy) : policy_(policy) {}

  Policy& policy() const { return policy_; }

  // Events, told to the policy at the caller's time.
  void arrived(const TaskArrival& task, Nanos now);
  // The batch no longer holds credit (sent, or done). Call once per batch the sink took.
  void batch_done(const Batch& batch, Nanos now);
  void backward_done(Nanos now);
  void flushed(Nanos now);
  void set_knobs(const Knobs& knobs);

  // Asks the policy what to dispatch now and hands every non-empty batch to the sink, in the policy's order. Asks
  // again after a batch that ended at once, and once more while the policy wants a wake-up no later than now.
  // Returns when to pump again without an event: nullopt for never; a time not after `now` means the policy keeps
  // asking for "now" without dispatching (the caller looks again a moment later rather than spin).
  std::optional<Nanos> pump(Nanos now, DispatchSink& sink);

 private:
  [[noreturn]] void fault(const char* call) const;

  Policy& policy_;
  std::vector<Batch> ready_;
};

}  // namespace commsched
