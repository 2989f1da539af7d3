#include "comm_backends/liveness.h"

#include <algorithm>
#include <sstream>

#include "base/types.h"

namespace commsched {
namespace {
double seconds(Liveness::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
std::chrono::milliseconds to_ms(double s) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(s));
}
}  // namespace

std::chrono::milliseconds heartbeat_interval(double timeout_s, double configured_s) {
  if (configured_s > 0) return to_ms(configured_s);
  return std::clamp(to_ms(timeout_s / kBeatsPerTimeout), std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
}

void check_heartbeat(const std::string& option, double interval_s, double timeout_s) {
  if (interval_s > 0 && interval_s * kBeatsPerTimeout <= timeout_s) return;
  throw InvalidArgument(option + "=" + std::to_string(interval_s) +
                        "s is invalid: must be positive and at most a quarter of COMMSCHED_TIMEOUT (" +
                        std::to_string(timeout_s) + "s)");
}

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
    if (p.closed && now - *p.closed >= bye_grace_) return Loss{id, "connection closed", {}};
  // Silent for over half the limit, longest first (ties in id order: the same report for the same state).
  std::vector<std::pair<Clock::time_point, Id>> quiet;
  for (const auto& [id, p] : peers_)
    if (p.heard != Clock::time_point{} && now - p.heard > silence_limit_ / 2) quiet.emplace_back(p.heard, id);
  std::sort(quiet.begin(), quiet.end());
  if (quiet.empty() || now - quiet.front().first <= silence_limit_) return std::nullopt;
  std::ostringstream os;
  os << "no message for " << seconds(silence_limit_) << " s (hung or unreachable; COMMSCHED_TIMEOUT)";
  Loss loss{quiet.front().second, os.str(), {}};
  for (size_t i = 1; i < quiet.size(); ++i) loss.also_silent.push_back(quiet[i].second);
  return loss;
}

std::string Liveness::Loss::explain(const std::function<std::string(Id)>& name) const {
  if (also_silent.empty()) return why;
  std::string out = why + "; also silent for over half that: ";
  for (size_t i = 0; i < also_silent.size(); ++i) out += (i ? ", " : "") + name(also_silent[i]);
  return out + " (the hung one may be any of these)";
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
