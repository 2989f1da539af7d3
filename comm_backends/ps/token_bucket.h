// Token bucket for the EMULATED link rate (COMMSCHED_EMULATE_RATE): not a real link, a pacing of our own sends.
// A message may start whenever the bucket is not in debt and then charges its full size, so the average rate is exact
// while one message at a time may burst (like a real link, which is busy for size/rate after a message starts).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace commsched::ps {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;
  // rate_bps in bits per second; burst_bytes: credit the bucket may save while idle.
  TokenBucket(double rate_bps, double burst_bytes) : rate_Bps_(rate_bps / 8.0), burst_(burst_bytes) {}

  bool enabled() const { return rate_Bps_ > 0; }
  // Seconds until a message may start (0 when it may start now).
  double wait_s(Clock::time_point now) {
    refill(now);
    return tokens_ >= 0 ? 0.0 : -tokens_ / rate_Bps_;
  }
  void charge(uint64_t bytes, Clock::time_point now) {
    refill(now);
    tokens_ -= static_cast<double>(bytes);
  }

 private:
  void refill(Clock::time_point now) {
    if (!started_) {
      started_ = true;
      last_ = now;
    }
    const double dt = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    tokens_ = std::min(burst_, tokens_ + dt * rate_Bps_);
  }

  double rate_Bps_;
  double burst_;
  double tokens_ = 0;
  bool started_ = false;
  Clock::time_point last_{};
};

}  // namespace commsched::ps
