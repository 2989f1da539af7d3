// A Payload over bytes the test owns, for feeding the server's slot table without a transport.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "comm_backends/ps/transport.h"

namespace commsched::ps::testing {

class VecPayload final : public Payload {
 public:
  explicit VecPayload(std::vector<std::byte> b) : b_(std::move(b)) {}
  std::span<const std::byte> bytes() const override { return b_; }

 private:
  std::vector<std::byte> b_;
};

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace commsched::ps::testing
