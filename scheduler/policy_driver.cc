#include "scheduler/policy_driver.h"

#include <string>

namespace commsched {
namespace {

// A policy that keeps asking for "now" without dispatching is asked this many times per pump, then left to the
// caller's next look (so a pump always ends).
constexpr int kPollsAskingForNow = 2;

}  // namespace

void PolicyDriver::fault(const char* call) const {
  const std::string who = "policy '" + std::string(policy_.name()) + "' ";
  try {
    throw;
  } catch (const std::exception& ex) {
    throw PolicyFault(who + "threw in " + call + ": " + ex.what());
  } catch (...) {
    throw PolicyFault(who + "threw a non-standard exception in " + call);
  }
}

void PolicyDriver::arrived(const TaskArrival& task, Nanos now) {
  try {
    policy_.on_task_arrived(task, now);
  } catch (...) {
    fault("on_task_arrived");
  }
}

void PolicyDriver::batch_done(const Batch& batch, Nanos now) {
  try {
    policy_.on_batch_done(batch, now);
  } catch (...) {
    fault("on_batch_done");
  }
}

void PolicyDriver::backward_done(Nanos now) {
  try {
    policy_.on_backward_done(now);
  } catch (...) {
    fault("on_backward_done");
  }
}

void PolicyDriver::flushed(Nanos now) {
  try {
    policy_.on_flush(now);
  } catch (...) {
    fault("on_flush");
  }
}

void PolicyDriver::set_knobs(const Knobs& knobs) {
  try {
    policy_.set_knobs(knobs);
  } catch (...) {
    fault("set_knobs");
  }
}

std::optional<Nanos> PolicyDriver::pump(Nanos now, DispatchSink& sink) {
  int asked_for_now = 0;
  while (sink.may_poll()) {
    ready_.clear();
    try {
      policy_.poll(now, ready_);
    } catch (...) {
      fault("poll");
    }
    bool freed = false;  // a batch ended at once: its credit is free again, so the policy may dispatch more
    for (Batch& b : ready_) {
      if (b.empty() || sink.dispatch(b, now)) continue;
      batch_done(b, now);
      freed = true;
    }
    if (freed) continue;
    std::optional<Nanos> wake;
    try {
      wake = policy_.next_wakeup();
    } catch (...) {
      fault("next_wakeup");
    }
    if (!wake || *wake > now || ++asked_for_now == kPollsAskingForNow) return wake;
  }
  return std::nullopt;
}

}  // namespace commsched
