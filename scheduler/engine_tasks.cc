#include "scheduler/engine_tasks.h"

namespace commsched {

std::unique_ptr<TaskState> TaskPool::take() {
  {
    std::lock_guard lk(mu_);
    if (!free_.empty()) {
      std::unique_ptr<TaskState> t = std::move(free_.back());
      free_.pop_back();
      return t;
    }
  }
  return std::make_unique<TaskState>();
}

void TaskPool::recycle(std::unique_ptr<TaskState> t) {
  std::vector<PartRef> parts = std::move(t->parts);  // capacities kept: the next task's copies allocate nothing
  std::string name = std::move(t->desc.name);
  parts.clear();
  name.clear();
  *t = TaskState{};
  t->parts = std::move(parts);
  t->desc.name = std::move(name);
  std::lock_guard lk(mu_);
  if (free_.size() < kKeep) free_.push_back(std::move(t));
}

std::pair<uint64_t, uint64_t> TaskRegistry::admit(const std::string& name) {
  std::lock_guard lk(mu_);
  Name& n = names_[name];
  if (n.in_flight)
    throw InvalidArgument("task '" + name + "' submitted while a task with the same name is still in flight");
  n.in_flight = true;
  return {next_id_++, n.round++};
}

void TaskRegistry::release(const std::string& name) {
  std::lock_guard lk(mu_);
  auto it = names_.find(name);
  if (it != names_.end()) it->second.in_flight = false;
}

void TaskRegistry::restart_rounds() {
  std::lock_guard lk(mu_);
  for (auto& [name, n] : names_) n.round = 0;
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
