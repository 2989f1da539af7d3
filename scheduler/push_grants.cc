#include "scheduler/push_grants.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace commsched {

PushGrants::PushGrants(uint64_t window_bytes, uint64_t max_overtakes)
    : window_(window_bytes), announced_(max_overtakes) {
  if (window_bytes == 0) throw std::invalid_argument("PushGrants: window_bytes must be at least 1 (got 0)");
}

void PushGrants::announce(const Push& push) {
  if (push.bytes == 0)
    throw std::invalid_argument("PushGrants: push " + std::to_string(push.id) + " announced with 0 bytes");
  announced_.push(push, /*releases_credit=*/false, push.priority);
}

std::optional<PushGrants::Push> PushGrants::next() {
  if (announced_.empty() || in_flight_ >= window_) return std::nullopt;
  Push p = announced_.pop();
  in_flight_ += p.bytes;
  return p;
}

void PushGrants::arrived(uint64_t bytes) {
  if (bytes > in_flight_)
    throw std::logic_error("PushGrants: " + std::to_string(bytes) + " bytes arrived but only " +
                           std::to_string(in_flight_) + " were granted and on their way");
  in_flight_ -= bytes;
}

UnscheduledPushes::UnscheduledPushes(size_t servers, uint64_t budget_bytes, int32_t urgent_below)
    : budget_(budget_bytes), urgent_below_(urgent_below), in_flight_(servers, 0) {
  if (servers == 0) throw std::invalid_argument("UnscheduledPushes: servers must be at least 1 (got 0)");
}

bool UnscheduledPushes::admit(size_t server, int32_t priority, uint64_t bytes) {
  if (server >= in_flight_.size())
    throw std::out_of_range("UnscheduledPushes: server " + std::to_string(server) + " of " +
                            std::to_string(in_flight_.size()));
  uint64_t& on_way = in_flight_[server];
  if (priority >= urgent_below_ && on_way + bytes > budget_) return false;
  on_way += bytes;
  return true;
}

void UnscheduledPushes::arrived(size_t server, uint64_t bytes) {
  uint64_t& on_way = in_flight_.at(server);
  if (bytes > on_way)
    throw std::logic_error("UnscheduledPushes: " + std::to_string(bytes) + " bytes arrived at server " +
                           std::to_string(server) + " but only " + std::to_string(on_way) + " were sent unscheduled");
  on_way -= bytes;
}

namespace {

// Bytes a link of `link_bps` moves over one grant's round trip: the grant out and the push in, each a latency and
// one message's fixed cost.
double round_trip_bytes(double link_bps, double latency_s, double message_s) {
  return link_bps / 8 * (2 * latency_s + 2 * message_s);
}

}  // namespace

uint64_t grant_window_bytes(double link_bps, double latency_s, double message_s) {
  const double bytes = round_trip_bytes(link_bps, latency_s, message_s) * kGrantWindowRoundTrips;
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(bytes)));
}

uint64_t grant_min_bytes(double link_bps, double latency_s, double message_s) {
  return static_cast<uint64_t>(std::llround(round_trip_bytes(link_bps, latency_s, message_s)));
}

}  // namespace commsched
