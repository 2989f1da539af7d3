#include "comm_backends/loopback/loopback_backend.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <queue>
#include <thread>
#include <tuple>

#include "comm_backends/reduce.h"

namespace commsched {
namespace {

using Clock = std::chrono::steady_clock;

// One rank's start() call: completes when all its partitions are matched, reduced and delivered.
struct BatchState {
  int rank = 0;
  BatchDone done;
  size_t remaining = 0;
  Status status;
  Clock::time_point arrival;  // when the batch has crossed this rank's link
};

// A partition as contributed by each rank, matched by (key, round, offset).
struct Contribution {
  PartitionView view;
  std::shared_ptr<BatchState> batch;
};
using PartKey = std::tuple<uint64_t, uint64_t, uint64_t>;

struct Entry {
  std::vector<Contribution> by_rank;  // indexed by rank; view.task == nullptr until that rank contributes
  int arrived = 0;
};

}  // namespace

class LoopbackHub : public std::enable_shared_from_this<LoopbackHub> {
 public:
  LoopbackHub(int ranks, LinkModel link) : ranks_(ranks), link_(link), link_free_(ranks, Clock::now()), dead_(ranks, false) {
    worker_ = std::thread([this] { run(); });
  }
  ~LoopbackHub() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    worker_.join();
  }

  int ranks() const { return ranks_; }

  void start(int rank, std::vector<PartitionView> batch, BatchDone done) {
    auto state = std::make_shared<BatchState>();
    state->rank = rank;
    state->done = std::move(done);
    state->remaining = batch.size();
    std::vector<std::shared_ptr<BatchState>> finished_now;
    {
      std::lock_guard lk(mu_);
      if (dead_count_ > 0) {
        finished_now.push_back(state);
        state->status = dead_[rank] ? Status::Error("loopback rank " + std::to_string(rank) + " is shut down", Status::Code::cancelled)
                                    : Status::Error("loopback: peer rank " + std::to_string(first_dead()) + " has shut down",
                                                    Status::Code::peer_lost);
      } else {
        state->arrival = reserve_link(rank, batch);
        for (const PartitionView& v : batch) contribute(rank, v, state, finished_now);
      }
    }
    if (batch.empty()) finished_now.push_back(state);
    complete(finished_now);
  }

  // Rank `rank` leaves: its own pending batches are cancelled, and every partition still waiting to be reduced
  // (they all need this rank) fails with an error naming it. After return, no callback of this rank runs.
  void shutdown(int rank) {
    std::vector<std::shared_ptr<BatchState>> finished;
    {
      std::lock_guard lk(mu_);
      if (dead_[rank]) return;
      dead_[rank] = true;
      ++dead_count_;
      for (auto& [key, e] : pending_) {
        for (auto& c : e.by_rank) {
          if (!c.batch) continue;
          if (c.batch->status.ok()) c.batch->status = leave_status(rank, *c.batch, c.view);
          if (--c.batch->remaining == 0) finished.push_back(c.batch);
        }
      }
      pending_.clear();
    }
    complete(finished);
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [&] { return !delivering_; });
  }

 private:
  struct Scheduled {
    Clock::time_point at;
    PartKey key;
    bool operator>(const Scheduled& o) const { return at > o.at; }
  };

  Clock::time_point reserve_link(int rank, const std::vector<PartitionView>& batch) {
    uint64_t bytes = 0;
    for (const auto& v : batch) bytes += v.bytes;
    const Clock::time_point now = Clock::now();
    Clock::time_point start = std::max(now, link_free_[rank]);
    const double seconds = link_.bandwidth_bps > 0 ? static_cast<double>(bytes) * 8.0 / link_.bandwidth_bps : 0.0;
    link_free_[rank] = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return link_free_[rank] + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(link_.latency_s));
  }

  void contribute(int rank, const PartitionView& v, const std::shared_ptr<BatchState>& state,
                  std::vector<std::shared_ptr<BatchState>>& finished) {
    const PartKey key{v.task->key, v.task->round, v.offset};
    Entry& e = pending_[key];
    if (e.by_rank.empty()) e.by_rank.resize(ranks_);
    if (e.by_rank[rank].batch) {
      if (state->status.ok())
        state->status = Status::Error("task '" + v.task->name + "': rank " + std::to_string(rank) +
                                          " started the same partition twice", Status::Code::invalid);
      if (--state->remaining == 0) finished.push_back(state);
      return;
    }
    e.by_rank[rank] = Contribution{v, state};
    ++e.arrived;
    if (e.arrived < ranks_) return;
    Clock::time_point ready = Clock::now();
    for (auto& c : e.by_rank) ready = std::max(ready, c.batch->arrival);
    queue_.push(Scheduled{ready, key});
    cv_.notify_all();
  }

  int first_dead() const {
    for (int r = 0; r < ranks_; ++r)
      if (dead_[r]) return r;
    return -1;
  }

  static Status leave_status(int leaving, const BatchState& s, const PartitionView& v) {
    if (s.rank == leaving)
      return Status::Error("loopback rank " + std::to_string(leaving) + " shut down", Status::Code::cancelled);
    return Status::Error("peer rank " + std::to_string(leaving) + " shut down before a partition of '" + v.task->name +
                             "' was reduced",
                         Status::Code::peer_lost);
  }

  // Checks that every rank gave the same shape; returns the first mismatch as an error naming key and sizes.
  Status check_shapes(const Entry& e) const {
    const PartitionView& a = e.by_rank[0].view;
    for (int r = 1; r < ranks_; ++r) {
      const PartitionView& b = e.by_rank[r].view;
      if (a.bytes != b.bytes || a.task->dtype != b.task->dtype || a.task->op != b.task->op || a.task->count != b.task->count)
        return Status::Error("task '" + a.task->name + "': mismatched tensors across ranks: rank 0 has " +
                                 std::to_string(a.task->count) + " x " + std::string(dtype_name(a.task->dtype)) + " (" +
                                 std::string(op_name(a.task->op)) + "), rank " + std::to_string(r) + " has " +
                                 std::to_string(b.task->count) + " x " + std::string(dtype_name(b.task->dtype)) + " (" +
                                 std::string(op_name(b.task->op)) + ")",
                             Status::Code::invalid);
    }
    return Status::Ok();
  }

  void reduce(const Entry& e) {
    const PartitionView& first = e.by_rank[0].view;
    const TaskDesc& t = *first.task;
    if (t.op == Op::broadcast) {
      const int root = std::clamp(t.root, 0, ranks_ - 1);
      for (int r = 0; r < ranks_; ++r)
        if (r != root) std::memcpy(e.by_rank[r].view.data(), e.by_rank[root].view.data(), first.bytes);
      return;
    }
    // Sum in rank order into rank 0's buffer (deterministic), then copy the sum to the others.
    for (int r = 1; r < ranks_; ++r) sum_into(t.dtype, first.data(), e.by_rank[r].view.data(), first.elements());
    for (int r = 1; r < ranks_; ++r) std::memcpy(e.by_rank[r].view.data(), first.data(), first.bytes);
  }

  void run() {
    std::unique_lock lk(mu_);
    while (true) {
      if (stop_) return;
      if (queue_.empty()) {
        cv_.wait(lk);
        continue;
      }
      const Scheduled next = queue_.top();
      if (Clock::now() < next.at) {
        cv_.wait_until(lk, next.at);
        continue;
      }
      queue_.pop();
      auto it = pending_.find(next.key);
      if (it == pending_.end()) continue;  // failed by a shutdown
      Entry e = std::move(it->second);
      pending_.erase(it);
      const Status shape = check_shapes(e);
      if (shape.ok()) reduce(e);
      std::vector<std::shared_ptr<BatchState>> finished;
      for (auto& c : e.by_rank) {
        if (!shape.ok() && c.batch->status.ok()) c.batch->status = shape;
        if (--c.batch->remaining == 0) finished.push_back(c.batch);
      }
      delivering_ = true;
      lk.unlock();
      complete(finished);
      lk.lock();
      delivering_ = false;
      idle_cv_.notify_all();
    }
  }

  static void complete(std::vector<std::shared_ptr<BatchState>>& finished) {
    for (auto& s : finished)
      if (s->done) {
        BatchDone done = std::move(s->done);
        s->done = nullptr;
        done(s->status);
      }
    finished.clear();
  }

  const int ranks_;
  const LinkModel link_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::vector<Clock::time_point> link_free_;
  std::vector<bool> dead_;
  std::map<PartKey, Entry> pending_;
  std::priority_queue<Scheduled, std::vector<Scheduled>, std::greater<>> queue_;
  int dead_count_ = 0;
  bool stop_ = false;
  bool delivering_ = false;
  std::thread worker_;
};

namespace {

class LoopbackBackend final : public CommBackend {
 public:
  LoopbackBackend(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  std::string_view name() const override { return "loopback"; }
  int rank() const override { return rank_; }
  int size() const override { return hub_->ranks(); }
  void shutdown() override { hub_->shutdown(rank_); }

 private:
  void do_start(std::vector<PartitionView> batch, BatchDone /*sent*/, BatchDone done) override {
    hub_->start(rank_, std::move(batch), std::move(done));
  }

  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<CommBackend>> make_loopback_group(int ranks, LinkModel link) {
  if (ranks < 1) throw InvalidArgument("loopback: number of ranks must be >= 1, got " + std::to_string(ranks));
  if (link.bandwidth_bps < 0 || link.latency_s < 0)
    throw InvalidArgument("loopback: bandwidth and latency must be non-negative");
  auto hub = std::make_shared<LoopbackHub>(ranks, link);
  std::vector<std::shared_ptr<CommBackend>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_shared<LoopbackBackend>(hub, r));
  return out;
}

}  // namespace commsched
