#include "comm_backends/control/goodbye_barrier.h"

namespace commsched::control {

void GoodbyeBarrier::await(Id member) { gone_.try_emplace(member, false); }

bool GoodbyeBarrier::said_bye(Id member) {
  auto it = gone_.find(member);
  if (it == gone_.end() || it->second) return false;
  it->second = true;
  return true;
}

bool GoodbyeBarrier::left(Id member) const {
  auto it = gone_.find(member);
  return it != gone_.end() && it->second;
}

bool GoodbyeBarrier::ended(Id member) {
  if (left(member)) return true;
  if (!leaving_) return false;
  if (auto it = gone_.find(member); it != gone_.end()) it->second = true;
  return true;
}

bool GoodbyeBarrier::all_left() const {
  for (const auto& [id, gone] : gone_)
    if (!gone) return false;
  return true;
}

std::vector<GoodbyeBarrier::Id> GoodbyeBarrier::missing() const {
  std::vector<Id> out;
  for (const auto& [id, gone] : gone_)
    if (!gone) out.push_back(id);
  return out;
}

void GoodbyeBarrier::wait_until(Clock::time_point deadline) {
  if (!deadline_ || deadline < *deadline_) deadline_ = deadline;
}

bool GoodbyeBarrier::passed(Clock::time_point now) const {
  return all_left() || (deadline_ && now >= *deadline_);
}

}  // namespace commsched::control
