// Parameter-server options (beyond the ClusterEnv contract): rows of the option registry, ps_option_table() in
// ps_config.cc, where each variable's type, default and doc live (the README's options table, `commsched options`).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "comm_backends/cluster_env.h"
#include "comm_backends/control/van.h"
#include "comm_backends/ps/transport.h"
#include "options/option_table.h"
#include "scheduler/reply_order.h"
#include "scheduler/stall.h"

namespace commsched {
namespace collective {
class Rendezvous;
}

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
  // Gradient push_pulls (ps_mode.h): "sync" (every worker's push of a round, summed), "async" (each push answered at
  // once with the running sum since the caller's last pull) or "ssp" (async, at most `staleness` rounds ahead).
  std::string mode = "sync";
  int staleness = 1;
  // A server sends its most urgent ready reply first, each at the latest once this many have left since it was
  // ready (scheduler/reply_order.h); 0: every reply at once, in arrival order.
  int reply_bound = static_cast<int>(ReplyOrder<int>::kDefaultMaxOvertakes);
  // Each server logs the sync rounds some workers pushed and others have not, and fails them after
  // stall.shutdown_s (scheduler/stall.h; COMMSCHED_STALL_*, its own option table).
  StallOptions stall;

  // Applies one option by its variable name without the prefix, lower case ("deterministic", "emulate_rate", ...).
  void set(std::string_view option, std::string_view value, std::string_view var = {});
  static PsConfig from_env();
  // Throws InvalidArgument naming the variable and value.
  void validate(double peer_timeout_s) const;

  // What the server and the worker of `env` build their transport and control plane with (the same rules for
  // both: workers authenticate exactly when the servers of the run do).
  ps::TransportOptions transport_options(const ClusterEnv& env) const;
  // The job's rendezvous store: server 0 serves it at COMMSCHED_ROOT_ADDR:COMMSCHED_ROOT_PORT, and every process
  // connects, waiting for it at most COMMSCHED_PS_RENDEZVOUS_TIMEOUT. Throws std::runtime_error naming the store and
  // this process when the bind or the connection fails, or the store refuses it (another secret).
  std::unique_ptr<collective::Rendezvous> rendezvous(const ClusterEnv& env) const;
  // The job's keys in `rendezvous`'s store (its scope), and the rendezvous timeout counted from when it began.
  control::VanOptions van_options(const ClusterEnv& env, const collective::Rendezvous& rendezvous) const;
  // The mode and staleness as one word every process of a job must share (checked at the rendezvous).
  uint32_t mode_word() const;
  static std::string describe_mode_word(uint32_t word);  // "COMMSCHED_PS_MODE=ssp COMMSCHED_STALENESS=2"
  // The staleness bound of the AsyncTable: k for ssp, nullopt (none) for async. Only for mode async or ssp.
  std::optional<uint64_t> staleness_bound() const;
};

// The registry rows of PsConfig.
const OptionTable<PsConfig>& ps_option_table();

}  // namespace commsched
