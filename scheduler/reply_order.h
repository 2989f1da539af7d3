// Which ready reply a parameter server sends next: the rule shared by the real server (comm_backends/ps/server.cc)
// and the simulator's every-worker PS model (simulator/ps_cluster.cc), so the simulator orders a server's replies
// exactly as the product does.
//
// Why: a server answering in arrival order on one send queue puts the receipts that release a worker's credit, and
// the sums of the layers the next forward pass needs first, behind every sum that happened to complete before them.
// With many tensors (ResNet-50, BERT-base) each round's W sums of a late, big layer then hold up the urgent ones.
//
// The rule, among the replies ready now:
// 1. credit first: a reply that releases credit (a `received` receipt, header-only) before any data;
// 2. then the most urgent partition: lowest priority value (the worker's layer index in forward order; lower is
//    needed sooner);
// 3. then arrival order.
// Bounded so nothing starves: a reply is sent, at the latest, once `max_overtakes` replies have left since it became
// ready (the oldest such reply goes first). So a reply waits behind at most `max_overtakes` plus the replies that
// were ready before it.
//
// Pure: no clock and no I/O; a sender pops when its link or transport can take the next message.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <utility>
#include <vector>

namespace commsched {

template <class T>
class ReplyOrder {
 public:
  // The default bound: measured in the simulator's PS grid (bench/RESULTS.md, "server-side priority").
  static constexpr uint64_t kDefaultMaxOvertakes = 256;

  explicit ReplyOrder(uint64_t max_overtakes = kDefaultMaxOvertakes) : max_overtakes_(max_overtakes) {
    if (max_overtakes == 0) throw std::invalid_argument("ReplyOrder: max_overtakes must be at least 1 (got 0)");
  }

  // A reply became ready. `releases_credit`: a receipt (rule 1); `priority`: its partition's (rule 2).
  void push(T reply, bool releases_credit, int32_t priority) {
    const uint64_t seq = first_seq_ + slots_.size();
    slots_.push_back({std::move(reply), sent_, false});
    const int rank = releases_credit ? 0 : 1;
    if (open_.next < open_.end && open_.rank == rank && open_.priority == priority && open_.end == seq) {
      ++open_.end;  // the same rank as the reply before: its run grows
    } else {
      if (open_.next < open_.end) push_run(open_);
      open_ = {rank, priority, seq, seq + 1};
    }
    ++size_;
  }

  // The reply to send next (the queue must not be empty).
  T pop() {
    if (empty()) throw std::logic_error("ReplyOrder::pop on an empty queue");
    while (slots_.front().taken) drop_front();
    uint64_t seq = first_seq_;  // the oldest waiting: it goes if it has waited long enough
    if (sent_ - slots_.front().ready_at < max_overtakes_) seq = most_urgent();
    Slot& slot = slots_[seq - first_seq_];
    slot.taken = true;
    T reply = std::move(slot.reply);
    --size_;
    ++sent_;
    return reply;
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

 private:
  // Replies pushed one after another with the same rank (credit first, then priority): seqs [next, end). A server's
  // W sums of a round become ready together, so a heap of runs orders a few entries where a heap of every reply
  // ordered hundreds (the simulator runs hundreds of servers' queues at once). Within a run the order is arrival, so
  // the most urgent run's first waiting reply is the most urgent reply.
  struct Run {
    int rank;
    int32_t priority;
    uint64_t next, end;
  };
  // std heaps keep the "largest" on top, so "less urgent" compares as smaller.
  struct LessUrgent {
    bool operator()(const Run& a, const Run& b) const {
      if (a.rank != b.rank) return a.rank > b.rank;
      if (a.priority != b.priority) return a.priority > b.priority;
      return a.next > b.next;
    }
  };
  struct Slot {
    T reply;
    uint64_t ready_at;  // replies sent before this one became ready
    bool taken;
  };
  // Both views keep replies already sent until they reach the front (runs and a FIFO cannot drop from the middle).
  void drop_front() {
    slots_.pop_front();
    ++first_seq_;
  }
  bool sent_already(uint64_t seq) const { return seq < first_seq_ || slots_[seq - first_seq_].taken; }
  // Skips the run's replies already sent (the bound sent them early); false if none is left.
  bool skip_sent(Run& r) const {
    while (r.next < r.end && sent_already(r.next)) ++r.next;
    return r.next < r.end;
  }
  void push_run(const Run& r) {
    runs_.push_back(r);
    std::push_heap(runs_.begin(), runs_.end(), LessUrgent{});
  }
  // The heap's most urgent run, with its sent replies skipped (or nullptr if the heap holds none waiting).
  Run* heap_top() {
    while (!runs_.empty()) {
      Run& top = runs_.front();
      const uint64_t was = top.next;
      const bool waiting = skip_sent(top);
      if (waiting && top.next == was) return &top;
      settle_top(waiting);  // its key grew, or it is done
    }
    return nullptr;
  }
  // The top run's key grew: back to its place in the heap while it still has a waiting reply, else out of it.
  void settle_top(bool waiting) {
    std::pop_heap(runs_.begin(), runs_.end(), LessUrgent{});
    if (waiting) std::push_heap(runs_.begin(), runs_.end(), LessUrgent{});
    else runs_.pop_back();
  }
  // The seq of the most urgent waiting reply, taken out of its run (some reply is waiting).
  uint64_t most_urgent() {
    Run* top = heap_top();
    const bool open = skip_sent(open_);
    if (!open || (top && LessUrgent{}(open_, *top))) {
      const uint64_t seq = top->next++;
      settle_top(top->next < top->end);
      return seq;
    }
    return open_.next++;
  }

  uint64_t max_overtakes_;
  uint64_t first_seq_ = 0;  // arrival number of slots_.front()
  uint64_t sent_ = 0;
  size_t size_ = 0;
  std::deque<Slot> slots_;  // by arrival
  std::vector<Run> runs_;   // a heap of runs, the most urgent on top
  Run open_{0, 0, 0, 0};    // the run of the latest pushes, outside the heap while it may still grow
};

}  // namespace commsched
