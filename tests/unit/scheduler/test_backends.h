// Backends for engine tests: they record what the engine dispatches and check invariants under concurrency.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/comm_backend.h"
#include "scheduler/engine.h"
#include "scheduler/global_order.h"
#include "scheduler/task.h"

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
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::push_pull, Op::allreduce, Op::broadcast}, {Device::cpu});
    return c;
  }

  void do_start(std::vector<PartitionView> batch, BatchDone /*sent*/, BatchDone done) override {
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

// The engine configuration most tests need: a partition size and a credit (0: none).
inline EngineConfig config_with(uint64_t partition, uint64_t credit) {
  EngineConfig c;
  c.knobs.partition_bytes = partition;
  c.knobs.credit_bytes = credit;
  return c;
}

// A push_pull task of f32 over `buf`.
inline Task make_task(std::string name, int prio, std::vector<float>& buf, TaskCallback cb = {}) {
  Task t;
  t.name = std::move(name);
  t.priority = prio;
  t.op = Op::push_pull;
  t.dtype = DType::f32;
  t.count = buf.size();
  t.buffer.data = buf.data();
  t.on_done = std::move(cb);
  return t;
}

// A backend whose batches are sent at once (if `sent_notices`) but complete only when the test says so: the stand-in
// for a parameter server whose sums wait on the other workers.
class HeldBackend final : public CommBackend {
 public:
  explicit HeldBackend(bool sent_notices, bool global_order = false)
      : sent_notices_(sent_notices), global_order_(global_order) {}
  std::string_view name() const override { return "held"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::push_pull, Op::allreduce, Op::broadcast}, {Device::cpu});
    c.reports_sent = sent_notices_;
    if (global_order_) c.global_order = &inbox_;
    return c;
  }
  // What the engine hands the global order: its policy and its knobs.
  void posted() {
    std::lock_guard lk(mu_);
    if (auto p = inbox_.take_policy().policy) adopted_ = std::move(p);
    if (auto k = inbox_.take()) {
      credits_.push_back(k->credit_bytes);
      fusion_bounds_.push_back(k->small_tensor_bytes);
    }
  }
  // What reached the backend, in order: "start" per batch, "backward" or "flush" per iteration mark.
  void marked(bool backward) {
    std::lock_guard lk(mu_);
    log_.push_back(backward ? "backward" : "flush");
  }
  std::vector<std::string> log() {
    std::lock_guard lk(mu_);
    return log_;
  }
  // The name of the policy handed over (empty: none).
  std::string adopted() {
    std::lock_guard lk(mu_);
    return adopted_ ? std::string(adopted_->name()) : std::string();
  }
  std::vector<uint64_t> fusion_bounds() {
    std::lock_guard lk(mu_);
    return fusion_bounds_;
  }
  std::vector<uint64_t> credits() {
    std::lock_guard lk(mu_);
    return credits_;
  }
  void do_start(std::vector<PartitionView>, BatchDone sent, BatchDone done) override {
    {
      std::lock_guard lk(mu_);
      held_.push_back(std::move(done));
      log_.push_back("start");
    }
    if (sent) sent(Status::Ok());
  }
  void shutdown() override { complete_all(Status::Error("held backend shut down", Status::Code::cancelled)); }
  size_t started() {
    std::lock_guard lk(mu_);
    return held_.size() + completed_;
  }
  void complete_all(const Status& st = Status::Ok()) {
    std::vector<BatchDone> todo;
    {
      std::lock_guard lk(mu_);
      todo.swap(held_);
      completed_ += todo.size();
    }
    for (auto& d : todo) d(st);
  }

 private:
  bool sent_notices_;
  bool global_order_;
  mutable GlobalOrderInbox inbox_{[this] { posted(); }, [this](bool backward) { marked(backward); }};
  std::unique_ptr<Policy> adopted_;
  std::vector<uint64_t> credits_, fusion_bounds_;
  std::vector<std::string> log_;
  std::mutex mu_;
  std::vector<BatchDone> held_;
  size_t completed_ = 0;
};

// A backend that throws from start() for the task named `victim`.
class ThrowingBackend final : public CommBackend {
 public:
  std::string_view name() const override { return "throwing"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::push_pull, Op::allreduce, Op::broadcast}, {Device::cpu, Device::cuda});
    return c;
  }
  void do_start(std::vector<PartitionView> batch, BatchDone /*sent*/, BatchDone done) override {
    if (batch.front().task->name == "victim") throw std::runtime_error("injected backend failure");
    done(Status::Ok());
  }
  void shutdown() override {}
};

}  // namespace commsched::testing
