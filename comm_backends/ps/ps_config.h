// Parameter-server options (beyond the ClusterEnv contract). Parsed and validated here with the shared value parsers.
//
//   COMMSCHED_PS_DETERMINISTIC      0|1   sum in rank order: bitwise reproducible (holds all pushes until the last)
//   COMMSCHED_EMULATE_RATE          rate  EMULATED link rate per process (token bucket on sends), e.g. 1gbit; 0: off
//   COMMSCHED_PS_SERVER_THREADS     int   summation threads per server (0: all cores)
//   COMMSCHED_PS_PARALLEL_SUM_BYTES size  partitions at least this big are summed by several threads (default 1MiB)
//   COMMSCHED_PS_HEARTBEAT          time  heartbeat interval (default 250ms; must be well below COMMSCHED_TIMEOUT)
//   COMMSCHED_PS_RENDEZVOUS_TIMEOUT time  how long to wait for every process to show up (default 120s)
//   COMMSCHED_PS_MAX_MESSAGE        size  largest accepted partition (default 2GiB); bigger messages drop the sender
//   COMMSCHED_PS_IO_THREADS         int   ZeroMQ I/O threads per process (default 1)
//   COMMSCHED_PS_CHUNK_BYTES        size  partitions bigger than this travel as several messages (default 4MiB; 0: never)
//                                         so the server sums one chunk while the next arrives and buffers stay small
//   COMMSCHED_PS_TRANSPORT          zmq|ucx ZeroMQ over TCP (default), or UCX (when built in: shared memory, TCP,
//                                         InfiniBand/RoCE verbs; UCX_TLS restricts UCX's choice)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace commsched {

struct PsConfig {
  bool deterministic = false;
  double emulate_rate_bps = 0;
  int server_threads = 0;
  uint64_t parallel_sum_bytes = 1ull << 20;
  double heartbeat_s = 0.25;
  double rendezvous_timeout_s = 120;
  uint64_t max_message_bytes = 2ull << 30;
  int io_threads = 1;
  uint64_t chunk_bytes = 4ull << 20;
  std::string transport = "zmq";

  // Applies one option by its variable name without the prefix, lower case ("deterministic", "emulate_rate", ...).
  void set(std::string_view option, std::string_view value);
  static PsConfig from_env();
  // Throws InvalidArgument naming the variable and value.
  void validate(double peer_timeout_s) const;
};

}  // namespace commsched
