#include "comm_backends/liveness.h"

#include <algorithm>
#include <sstream>

namespace commsched {

Liveness::Liveness(Clock::duration silence_limit, Clock::duration bye_grace)
    : silence_limit_(silence_limit), bye_grace_(bye_grace) {}

Liveness::Liveness(double silence_limit_s, Clock::duration bye_grace)
    : Liveness(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(silence_limit_s)), bye_grace) {}

void Liveness::watch(Id peer, Clock::time_point heard) { peers_[peer] = Peer{heard, std::nullopt}; }

void Liveness::forget(Id peer) { peers_.erase(peer); }

void Liveness::heard(Id peer, Clock::time_point now) {
  if (auto it = peers_.find(peer); it != peers_.end()) it->second.heard = now;
}

void Liveness::closed(Id peer, Clock::time_point now) {
  auto it = peers_.find(peer);
  if (it != peers_.end() && !it->second.closed) it->second.closed = now;
}

std::optional<Liveness::Loss> Liveness::check(Clock::time_point now) const {
  for (const auto& [id, p] : peers_)
    if (p.closed && now - *p.closed >= bye_grace_) return Loss{id, "connection closed"};
  for (const auto& [id, p] : peers_) {
    if (p.heard == Clock::time_point{} || now - p.heard <= silence_limit_) continue;
    std::ostringstream os;
    os << "no message for " << std::chrono::duration<double>(silence_limit_).count()
       << " s (hung or unreachable; COMMSCHED_TIMEOUT)";
    return Loss{id, os.str()};
  }
  return std::nullopt;
}

std::vector<Liveness::Id> Liveness::expected() const {
  std::vector<Id> out;
  for (const auto& [id, p] : peers_)
    if (!p.closed) out.push_back(id);
  return out;
}

std::chrono::milliseconds Liveness::poll_wait(std::chrono::milliseconds wait, Clock::time_point now) const {
  for (const auto& [id, p] : peers_) {
    if (!p.closed) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*p.closed + bye_grace_ - now);
    wait = std::min(wait, std::max(left, std::chrono::milliseconds(0)) + std::chrono::milliseconds(1));
  }
  return wait;
}

}  // namespace commsched
