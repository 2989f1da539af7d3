// Backends for engine tests: they record what the engine dispatches and check invariants under concurrency.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/comm_backend.h"

namespace commsched::testing {

struct Dispatched {
  std::string task;
  uint32_t index;
  uint64_t bytes;
};

// Completes every batch on its own thread after `delay`, in FIFO order. Records the dispatch order and the maximum
// number of bytes in flight (asserting the credit is the caller's job, with the observed maximum).
class RecordingBackend : public CommBackend {
 public:
  explicit RecordingBackend(std::chrono::microseconds delay = std::chrono::microseconds(0), bool auto_complete = true)
      : delay_(delay), auto_complete_(auto_complete) {
    worker_ = std::thread([this] { run(); });
  }
  ~RecordingBackend() override { shutdown(); }

  std::string_view name() const override { return "recording"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool supports(Op, Device d) const override { return d == Device::cpu; }

  void start(std::vector<PartitionView> batch, BatchDone done) override {
    uint64_t bytes = 0;
    std::lock_guard lk(mu_);
    for (const auto& v : batch) {
      bytes += v.bytes;
      order_.push_back({v.task->name, v.index, v.bytes});
      if (v.offset % dtype_size(v.task->dtype) != 0 || v.bytes % dtype_size(v.task->dtype) != 0) misaligned_ = true;
    }
    in_flight_ += bytes;
    max_in_flight_ = std::max(max_in_flight_, in_flight_);
    max_single_ = std::max(max_single_, bytes);
    ++batches_started_;
    queue_.push_back(Item{bytes, std::move(done)});
    cv_.notify_all();
  }

  void shutdown() override {
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
      stop_ = true;
      cv_.notify_all();
    }
    worker_.join();
    // Fail whatever is still queued, as a real backend would.
    for (auto& item : queue_) item.done(Status::Error("recording backend shut down", Status::Code::cancelled));
    queue_.clear();
  }

  // Lets `n` queued batches complete when auto_complete is off.
  void release(int n) {
    std::lock_guard lk(mu_);
    releases_ += n;
    cv_.notify_all();
  }

  std::vector<Dispatched> order() const {
    std::lock_guard lk(mu_);
    return order_;
  }
  uint64_t max_in_flight() const {
    std::lock_guard lk(mu_);
    return max_in_flight_;
  }
  uint64_t max_single_batch() const {
    std::lock_guard lk(mu_);
    return max_single_;
  }
  bool misaligned() const {
    std::lock_guard lk(mu_);
    return misaligned_;
  }
  size_t started() const {
    std::lock_guard lk(mu_);
    return batches_started_;
  }

 private:
  struct Item {
    uint64_t bytes;
    BatchDone done;
  };

  void run() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && (auto_complete_ || releases_ > 0)); });
      if (stop_) return;
      Item item = std::move(queue_.front());
      queue_.pop_front();
      if (!auto_complete_) --releases_;
      lk.unlock();
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      lk.lock();
      in_flight_ -= item.bytes;
      lk.unlock();
      item.done(Status::Ok());
      lk.lock();
    }
  }

  std::chrono::microseconds delay_;
  bool auto_complete_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::vector<Dispatched> order_;
  uint64_t in_flight_ = 0, max_in_flight_ = 0, max_single_ = 0;
  size_t batches_started_ = 0;
  int releases_ = 0;
  bool misaligned_ = false;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace commsched::testing
