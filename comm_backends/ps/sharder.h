// Assigns partitions (key, offset) to servers: greedy least-loaded by bytes, first come first served. One Sharder
// lives on the rendezvous root (server 0) and answers every worker, so all workers agree whatever order their
// partitions arrive in. Partitions of one tensor may land on different servers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace commsched::ps {

class Sharder {
 public:
  explicit Sharder(int num_servers);
  // The owner of (key, offset); assigns it to the least-loaded server (lowest rank on ties) on first sight.
  int assign(uint64_t key, uint64_t offset, uint64_t bytes);
  const std::vector<uint64_t>& loads() const { return loads_; }
  // max load / mean load (1.0 when perfectly even).
  double imbalance() const;

 private:
  struct KeyHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& k) const { return k.first * 0x9e3779b97f4a7c15ull ^ k.second; }
  };
  std::vector<uint64_t> loads_;
  std::unordered_map<std::pair<uint64_t, uint64_t>, int, KeyHash> owner_;
};

}  // namespace commsched::ps
