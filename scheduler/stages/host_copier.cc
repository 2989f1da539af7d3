#include "scheduler/stages/host_copier.h"

#include <cstring>
#include <new>
#include <stdexcept>

namespace commsched {
namespace {

class FutureCompletion final : public CopyCompletion {
 public:
  explicit FutureCompletion(std::future<void> f) : f_(std::move(f)) {}
  void wait() override { f_.get(); }  // rethrows the copy's exception

 private:
  std::future<void> f_;
};

constexpr std::align_val_t kPageAlign{4096};

}  // namespace

HostCopier::Lane::Lane() : thread_([this] { run(); }) {}

HostCopier::Lane::~Lane() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // runs what is queued first: a copy is never abandoned half-way
}

std::future<void> HostCopier::Lane::push(std::function<void()> job) {
  std::packaged_task<void()> task(std::move(job));
  std::future<void> f = task.get_future();
  {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(task));
  }
  cv_.notify_one();
  return f;
}

void HostCopier::Lane::run() {
  std::unique_lock lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    std::packaged_task<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    job();  // an exception lands in the job's future
    lk.lock();
  }
}

HostCopier::HostCopier() = default;
HostCopier::~HostCopier() = default;

std::byte* HostCopier::alloc_host(size_t bytes) {
  allocations_.fetch_add(1);
  return static_cast<std::byte*>(::operator new(bytes, kPageAlign));
}

void HostCopier::free_host(std::byte* p) noexcept {
  frees_.fetch_add(1);
  ::operator delete(p, kPageAlign);
}

std::byte* HostCopier::alloc_device(size_t bytes, int) {
  device_allocations_.fetch_add(1);
  return static_cast<std::byte*>(::operator new(bytes, kPageAlign));
}

void HostCopier::free_device(std::byte* p, int) noexcept {
  device_frees_.fetch_add(1);
  ::operator delete(p, kPageAlign);
}

void HostCopier::fail_copy(uint64_t after, std::string message) {
  std::lock_guard lk(fail_mu_);
  fail_at_ = static_cast<int64_t>(copies_.load() + after);
  fail_message_ = std::move(message);
}

std::unique_ptr<CopyCompletion> HostCopier::enqueue(Lane& lane, std::function<void()> copy) {
  const int64_t n = static_cast<int64_t>(copies_.fetch_add(1));
  std::string fail;
  {
    std::lock_guard lk(fail_mu_);
    if (n == fail_at_) fail = fail_message_;
  }
  if (!fail.empty()) copy = [fail] { throw std::runtime_error(fail); };
  return std::make_unique<FutureCompletion>(lane.push(std::move(copy)));
}

std::unique_ptr<CopyCompletion> HostCopier::to_host(std::byte* host, const std::byte* device, size_t bytes, int,
                                                    void* ready) {
  const auto* event = static_cast<const HostReadyEvent*>(ready);
  HostReadyEvent wait_for = event ? *event : HostReadyEvent{};
  return enqueue(d2h_, [=] {
    if (wait_for.valid()) wait_for.wait();  // the lane stalls until the producer is done, as a stream would
    std::memcpy(host, device, bytes);
  });
}

std::unique_ptr<CopyCompletion> HostCopier::to_device(std::byte* device, const std::byte* host, size_t bytes, int) {
  return enqueue(h2d_, [=] { std::memcpy(device, host, bytes); });
}

}  // namespace commsched
