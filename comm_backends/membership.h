// What a backend may know of the other ranks beyond moving bytes: optional services, reached through the backend's
// capability row (BackendCapabilities::joins, ::stragglers), so that a backend offering neither writes neither. The
// engine and the Python plugin ask for them there.
#pragma once

#include <cstdint>
#include <vector>

namespace commsched {

// A rank that holds the others back, as this rank last heard it (comm_backends/straggler.h): how many iterations it
// is behind the furthest rank, and how long ago the first other rank passed the iteration it is at.
struct Straggler {
  int rank = 0;
  uint64_t iterations = 0;
  double seconds = 0;
};

// Horovod's join: this rank has run out of data; the others' partitions are run with zeros standing in for it.
class RankJoin {
 public:
  // Blocks until every rank has joined and returns the rank that joined last. Called with nothing of this rank in
  // flight (Engine::join sees to it). Throws std::runtime_error when the group breaks or shuts down meanwhile.
  virtual int join() = 0;

 protected:
  ~RankJoin() = default;  // owned by the backend, never deleted through this interface
};

// Who lags, as the backend last learned it (the parameter server's lag reports, the all-reduce coordinator's).
class StragglerReport {
 public:
  // The ranks that lag, most seconds first; empty when none does. Thread-safe.
  virtual std::vector<Straggler> stragglers() const = 0;

 protected:
  ~StragglerReport() = default;  // owned by the backend, never deleted through this interface
};

}  // namespace commsched
