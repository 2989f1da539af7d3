#include "comm_backends/ps/sharder.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace commsched::ps {

Sharder::Sharder(int num_servers) : loads_(static_cast<size_t>(num_servers), 0) {
  if (num_servers < 1) throw std::invalid_argument("Sharder needs at least one server, got " + std::to_string(num_servers));
}

int Sharder::assign(uint64_t key, uint64_t offset, uint64_t bytes) {
  auto [it, fresh] = owner_.try_emplace({key, offset}, 0);
  if (fresh) {
    it->second = static_cast<int>(std::min_element(loads_.begin(), loads_.end()) - loads_.begin());
    loads_[static_cast<size_t>(it->second)] += bytes;
  }
  return it->second;
}

double Sharder::imbalance() const {
  const double total = std::accumulate(loads_.begin(), loads_.end(), 0.0);
  if (total == 0) return 1.0;
  return static_cast<double>(*std::max_element(loads_.begin(), loads_.end())) / (total / loads_.size());
}

}  // namespace commsched::ps
