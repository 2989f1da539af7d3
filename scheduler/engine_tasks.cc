#include "scheduler/engine_tasks.h"

namespace commsched {

std::pair<uint64_t, uint64_t> TaskRegistry::admit(const std::string& name) {
  std::lock_guard lk(mu_);
  if (in_flight_.count(name))
    throw InvalidArgument("task '" + name + "' submitted while a task with the same name is still in flight");
  in_flight_.insert(name);
  return {next_id_++, rounds_[name]++};
}

void TaskRegistry::release(const std::string& name) {
  std::lock_guard lk(mu_);
  in_flight_.erase(name);
}

void TaskRegistry::restart_rounds() {
  std::lock_guard lk(mu_);
  rounds_.clear();
}

uint64_t TaskRegistry::submitted() const {
  std::lock_guard lk(mu_);
  return next_id_;
}

void WaitGroup::add() {
  std::lock_guard lk(mu_);
  ++outstanding_;
}

void WaitGroup::remove() {
  std::lock_guard lk(mu_);
  if (--outstanding_ == 0) cv_.notify_all();
}

void WaitGroup::done(const Status& failure) {
  std::lock_guard lk(mu_);
  if (!failure.ok() && first_failure_.ok()) first_failure_ = failure;
  if (--outstanding_ == 0) cv_.notify_all();
}

Status WaitGroup::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return outstanding_ == 0; });
  Status s = std::move(first_failure_);
  first_failure_ = Status::Ok();
  return s;
}

bool WaitGroup::wait_for(std::chrono::nanoseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return outstanding_ == 0; });
}

}  // namespace commsched
