// Persistence of the best configuration found, keyed by model signature and cluster shape, so that the next run of
// the same model on the same cluster shape starts from it and skips tuning.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "scheduler/policy.h"

namespace commsched::tuner {

// What makes a tuning result reusable: the same gradient sizes (model) on the same cluster shape and backend.
struct TuningKey {
  uint64_t model_signature = 0;
  int workers = 1;
  int servers = 0;
  std::string backend = "loopback";

  // Stable text form used as the JSON key, e.g. "model=0123abcd.../workers=8/servers=2/backend=ps".
  std::string str() const;
};

// FNV-1a over the tensor sizes in bytes, in submission order (a permutation is a different model on purpose: the
// order is the layer order the scheduler prioritises by).
uint64_t model_signature(std::span<const uint64_t> tensor_bytes);

struct StoredBest {
  Knobs knobs;
  double score = 0.0;  // iterations per second when it was measured
  int trials = 0;      // how many trials the tuning run took
};

// A JSON file {"version": 1, "entries": {"<key>": {...}}}. Writes replace the file atomically (temp + rename) and keep
// the other keys.
class BestStore {
 public:
  explicit BestStore(std::string path);
  const std::string& path() const { return path_; }

  // nullopt when the file or the key does not exist. Throws std::runtime_error naming the file when it is unreadable
  // or malformed.
  std::optional<StoredBest> load(const TuningKey& key) const;
  // Throws std::runtime_error naming the file when it cannot be written.
  void save(const TuningKey& key, const StoredBest& best) const;

 private:
  std::string path_;
};

}  // namespace commsched::tuner
