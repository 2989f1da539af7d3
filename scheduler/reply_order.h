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
#include <functional>
#include <stdexcept>
#include <tuple>
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
    urgent_.push_back({releases_credit ? 0 : 1, priority, seq});
    std::push_heap(urgent_.begin(), urgent_.end(), std::greater<>());
    ++size_;
  }

  // The reply to send next (the queue must not be empty).
  T pop() {
    if (empty()) throw std::logic_error("ReplyOrder::pop on an empty queue");
    while (slots_.front().taken) drop_front();
    uint64_t seq = first_seq_;  // the oldest waiting: it goes if it has waited long enough
    if (sent_ - slots_.front().ready_at < max_overtakes_) {
      while (sent_already(std::get<2>(urgent_.front()))) pop_urgent();
      seq = std::get<2>(urgent_.front());
    }
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
  using Rank = std::tuple<int, int32_t, uint64_t>;  // credit first, priority, arrival
  struct Slot {
    T reply;
    uint64_t ready_at;  // replies sent before this one became ready
    bool taken;
  };
  // Both views keep replies already sent until they reach the front (a heap and a FIFO cannot drop from the middle).
  void drop_front() {
    slots_.pop_front();
    ++first_seq_;
  }
  bool sent_already(uint64_t seq) const { return seq < first_seq_ || slots_[seq - first_seq_].taken; }
  void pop_urgent() {
    std::pop_heap(urgent_.begin(), urgent_.end(), std::greater<>());
    urgent_.pop_back();
  }

  uint64_t max_overtakes_;
  uint64_t first_seq_ = 0;  // arrival number of slots_.front()
  uint64_t sent_ = 0;
  size_t size_ = 0;
  std::deque<Slot> slots_;    // by arrival
  std::vector<Rank> urgent_;  // a min-heap by rank
};

}  // namespace commsched
