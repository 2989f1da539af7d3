// A server's ready replies (receipts, sums, batch answers), handed to the transport most urgent first by the rule the
// simulator shares (scheduler/reply_order.h): receipts, then the lowest partition priority, none overtaken more than
// a bound. The order can only matter while replies wait, so the queue keeps little inside the transport (handed over,
// not yet released by it): less than `window_bytes` of payload, or up to kMinInFlight payloads whatever their size,
// and holds the rest here; while replies wait for room, a transport's release of a payload wakes the server's I/O
// thread to hand over the next.
// (With one big sum at a time, UCX shared memory moved 4-16 MiB partitions at a median 0.76-0.86 of arrival order's
// goodput in ps_goodput's workers mode, loaded; with a second one in flight, which keeps the transport busy while the
// first completes, 1.14-1.18.)
//
// max_overtakes 0: every reply goes to the transport at once, in the order it became ready (the server before the
// rule; COMMSCHED_PS_REPLY_BOUND=0).
//
// Threading: every call comes from the server's I/O thread; only the payloads' release runs elsewhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "comm_backends/control/van.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/transport.h"
#include "scheduler/reply_order.h"

namespace commsched::ps {

// Whether a release of room must wake the thread that waits for it, so that the thread sleeps only when a release
// will wake it and a release wakes only a thread that waits (a wake-up per release otherwise: a system call and a pass
// of the server's loop for nothing). The waiting thread says so before it looks for room again, the releaser frees
// the room before it looks at the flag; both are sequentially consistent, so either the releaser sees the flag or the
// second look sees the room.
class RoomWaiter {
 public:
  // The waiting thread, out of room: true when room came meanwhile (look again), false when a release will wake it.
  template <class HasRoom>
  bool room_came(HasRoom has_room) {
    waiting_.store(true);
    if (!has_room()) return false;
    waiting_.store(false);
    return true;
  }
  // The waiting thread needs no room any more.
  void stop_waiting() { waiting_.store(false); }
  // A releaser, after it freed room: whether to wake the waiting thread (true once per wait).
  bool released() { return waiting_.exchange(false); }

 private:
  std::atomic<bool> waiting_{false};
};

class ReplyQueue {
 public:
  // Payload bytes the transport may hold at once: at 10 Gbit/s about 3.4 ms of sending, enough to keep the link busy
  // across the wake-up of the I/O thread on a loaded machine (with 1 MiB, ZeroMQ moved 256 KiB partitions at a median
  // 0.68 of arrival order's goodput in ps_goodput's workers mode at load 15-25; with 4 MiB, 0.92), and little enough
  // that an urgent sum waits behind a chunk or two (COMMSCHED_PS_CHUNK_BYTES), not behind a round's W sums.
  static constexpr uint64_t kWindowBytes = 4 << 20;
  static constexpr uint32_t kMinInFlight = 2;

  // `wake`: makes the I/O thread's wait return (Transport::wake), called from the thread that releases a payload
  // while replies wait here for room.
  ReplyQueue(control::Van& van, uint64_t max_overtakes, std::function<void()> wake,
             uint64_t window_bytes = kWindowBytes);
  ~ReplyQueue();
  ReplyQueue(const ReplyQueue&) = delete;
  ReplyQueue& operator=(const ReplyQueue&) = delete;

  // A reply to `peer`: a receipt (`received`, header only) releases credit and goes to the transport at once, ahead
  // of data whatever the window holds.
  void add(PeerId peer, const Header& h, OutPayload payload = {});
  // Hands replies to the transport while it holds less than the window.
  void flush();

 private:
  struct Reply {
    PeerId peer;
    Header h;
    OutPayload payload;
  };
  // Shared with the releases that may run after this queue is gone (while the transport closes).
  struct Shared {
    std::atomic<uint64_t> in_flight{0};       // payload bytes
    std::atomic<uint32_t> payloads{0};        // payloads
    RoomWaiter room;  // replies wait here for room in the transport: only then does a release wake the I/O thread
    std::mutex mu;  // guards wake against the destructor clearing it
    std::function<void()> wake;
  };
  void hand_over(Reply r);
  bool transport_has_room() const;

  control::Van& van_;
  uint64_t window_;
  std::unique_ptr<ReplyOrder<Reply>> ready_;  // null: arrival order, at once
  std::shared_ptr<Shared> shared_;
};

}  // namespace commsched::ps
