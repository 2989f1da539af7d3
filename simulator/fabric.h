// What carries the simulated workers' batches. The simulator (simulator.cc) owns the event loop and the workers; a
// Fabric is told each batch a worker's policy dispatches and reports, through events it schedules on the loop, when
// the batch's pushes have been received (the engine releases credit then) and when its results are back.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "scheduler/policy.h"

namespace commsched::sim {

// Simulated time, one event after another; ties run in the order they were scheduled, so runs are deterministic.
// The frequent events (a message moving, a compute step ending) are plain records, a handler and two words, so that
// scheduling one allocates nothing; a std::function serves the rest.
class EventLoop {
 public:
  using Handler = void (*)(void* target, uint64_t a, uint64_t b);

  void at(Nanos t, std::function<void()> f) {
    size_t slot;
    if (free_.empty()) {
      slot = fns_.size();
      fns_.push_back(std::move(f));
    } else {
      slot = free_.back();
      free_.pop_back();
      fns_[slot] = std::move(f);
    }
    post(t, &EventLoop::call_slot, this, slot);
  }
  void post(Nanos t, Handler h, void* target, uint64_t a = 0, uint64_t b = 0) {
    post_in_turn(t, next_seq_++, h, target, a, b);
  }
  // A place in the order of ties taken now for an event posted later (post_in_turn): a model that keeps a FIFO of
  // future events to itself, posting one at a time, still runs them in the order it decided them.
  uint64_t take_turn() { return next_seq_++; }
  void post_in_turn(Nanos t, uint64_t turn, Handler h, void* target, uint64_t a = 0, uint64_t b = 0) {
    push({t, turn, h, target, a, b});
  }
  // Runs every event, including those the events schedule, until none is left or an event calls stop().
  void run() {
    while (!heap_.empty() && !stopped_) {
      const Event e = heap_.front();
      pop();
      now_ = e.time;
      e.handler(e.target, e.a, e.b);
    }
  }
  Nanos now() const { return now_; }
  void stop() { stopped_ = true; }

 private:
  struct Event {  // trivially copyable: the heap moves these; a std::function stays put in fns_
    Nanos time;
    uint64_t seq;
    Handler handler;
    void* target;
    uint64_t a, b;
    bool before(const Event& o) const { return time != o.time ? time < o.time : seq < o.seq; }
  };
  // A 4-ary min-heap on (time, seq): half the levels of a binary heap, and a node's children share a cache line or
  // two, which is what the loop spends its time on with hundreds of workers. (time, seq) orders every event totally,
  // so the order they run in is the same as with any other exact priority queue.
  static constexpr size_t kArity = 4;
  void push(const Event& e) {
    size_t i = heap_.size();
    heap_.push_back(e);
    while (i > 0) {
      const size_t parent = (i - 1) / kArity;
      if (!e.before(heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }
  void pop() {
    const Event last = heap_.back();
    heap_.pop_back();
    const size_t n = heap_.size();
    if (n == 0) return;
    size_t i = 0;
    for (;;) {
      const size_t first = kArity * i + 1;
      if (first >= n) break;
      size_t least = first;
      for (size_t c = first + 1; c < std::min(first + kArity, n); ++c)
        if (heap_[c].before(heap_[least])) least = c;
      if (!heap_[least].before(last)) break;
      heap_[i] = heap_[least];
      i = least;
    }
    heap_[i] = last;
  }
  static void call_slot(void* loop, uint64_t slot, uint64_t) {
    EventLoop& self = *static_cast<EventLoop*>(loop);
    std::function<void()> fn = std::move(self.fns_[slot]);
    self.free_.push_back(slot);
    fn();
  }
  std::vector<Event> heap_;
  std::vector<std::function<void()>> fns_;
  std::vector<size_t> free_;
  uint64_t next_seq_ = 0;
  Nanos now_ = 0;
  bool stopped_ = false;
};

// Future events of one source that fall due in order, (at, turn) never decreasing (a server's arrivals through its
// FIFO downlink, its receipts, a worker's sums): one event on the loop at a time serves them all, so the loop's heap
// holds one per source instead of one per event in flight (hundreds of thousands at 256 workers, out of every cache).
// Each still runs at its own (at, turn): the same order as posting every one. T has `Nanos at` and `uint64_t turn`.
template <class T>
class InOrder {
 public:
  using Fire = void (*)(void* owner, const T& item);
  // Queues `item` if it falls due after the last one queued, to be handed to fire(owner, item) then; false if it
  // falls due earlier (the caller posts it on the loop itself). `warm`, if given, is handed each item when it becomes
  // the next to fall due, so that the owner can prefetch what fire will touch.
  bool add(EventLoop& loop, const T& item, void* owner, Fire fire, Fire warm = nullptr) {
    if (!items_.empty() && !(item.at > items_.back().at || (item.at == items_.back().at && item.turn > items_.back().turn)))
      return false;
    loop_ = &loop;
    owner_ = owner;
    fire_ = fire;
    warm_ = warm;
    items_.push_back(item);
    if (items_.size() == 1) post_head();
    return true;
  }

 private:
  void post_head() {
    if (warm_) warm_(owner_, items_.front());
    loop_->post_in_turn(items_.front().at, items_.front().turn, [](void* q, uint64_t, uint64_t) {
      auto& self = *static_cast<InOrder*>(q);
      const T item = self.items_.front();
      self.items_.pop_front();
      if (!self.items_.empty()) self.post_head();
      self.fire_(self.owner_, item);
    }, this);
  }
  std::deque<T> items_;
  EventLoop* loop_ = nullptr;
  void* owner_ = nullptr;
  Fire fire_ = nullptr;
  Fire warm_ = nullptr;
};

// Where a fabric reports a batch's progress (the simulator's workers).
class BatchSink {
 public:
  virtual ~BatchSink() = default;
  // Every push of worker `worker`'s batch `id` has been received: the engine releases its credit (on_batch_sent).
  virtual void batch_sent(int worker, size_t id, Nanos now) = 0;
  // Its results are back.
  virtual void batch_done(int worker, size_t id, Nanos now) = 0;
  // A hint: batch_sent or batch_done of this batch will come before long; the sink may prefetch what they touch.
  virtual void upcoming(int /*worker*/, size_t /*id*/) {}
};

// How busy each kind of link was over a run: the mean busy fraction over the links of that kind, and the least and
// most busy one (a server whose downlink sits idle while another's is saturated shows as min << max).
struct LinkBusy {
  double mean = 0, min = 0, max = 0;
};
struct LinkUse {
  bool have = false;  // false: the fabric does not model links one by one
  LinkBusy worker_up, server_in, server_out, worker_down;
};

class Fabric {
 public:
  virtual ~Fabric() = default;
  // How many workers are simulated one by one (the others, if any, are symmetric copies the fabric accounts for).
  virtual int simulated_workers() const = 0;
  // Forgets everything (a new run) and reports to `sink` through `loop` from now on.
  virtual void start(EventLoop& loop, BatchSink& sink) = 0;
  // Worker `worker` dispatches its batch `id` at `now`; returns when its first byte starts moving (for the timeline).
  // The fabric calls sink.batch_sent and then sink.batch_done for it, each exactly once, from events on the loop.
  virtual Nanos dispatch(int worker, size_t id, const Batch& batch, Nanos now) = 0;
  // Busy fractions of the links over [0, until] (the simulated run); empty where not modelled.
  virtual LinkUse link_use(Nanos /*until*/) const { return {}; }
  // At least how long one simulated worker's uplink takes to push `bytes` more gradient bytes in `parts` partitions,
  // whatever the schedule and however they are batched; 0 where the fabric promises nothing. It lets a run be
  // abandoned early (SimOptions::abandon_above_s), so it must never exceed the truth.
  virtual Nanos min_push_ns(uint64_t /*bytes*/, uint64_t /*parts*/) const { return 0; }
};

}  // namespace commsched::sim
