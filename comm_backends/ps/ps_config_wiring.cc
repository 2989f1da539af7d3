// What a validated PsConfig hands the transport and the Van. Apart from ps_config.cc (parsing and validation), so
// that the parsers link without the keys, the Van and the transports (the config fuzzer, tests/fuzz, builds them alone).
#include <stdexcept>

#include "base/types.h"
#include "comm_backends/cluster_auth.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"
#include "comm_backends/ps/ps_config.h"

namespace commsched {

ps::TransportOptions PsConfig::transport_options(const ClusterEnv& env) const {
  ps::TransportOptions opts;
  opts.emulate_rate_bps = emulate_rate_bps;
  opts.max_message_bytes = max_message_bytes + 4096;  // a header and some slack over the largest data range
  opts.io_threads = io_threads;
  opts.auth_secret = ClusterAuth::from_env().secret_for(control::bind_host(env));
  opts.sender_writes_rendezvous = env.role == Role::worker;
  return opts;
}

std::unique_ptr<collective::Rendezvous> PsConfig::rendezvous(const ClusterEnv& env) const {
  const bool root = env.role == Role::server && env.rank == 0;
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(rendezvous_timeout_s * 1000));
  try {
    return std::make_unique<collective::Rendezvous>(env, "ps/", root, wait);
  } catch (const InvalidArgument&) {
    throw;  // a configuration error (no secret beyond loopback) says what to set
  } catch (const std::exception& e) {
    throw std::runtime_error("parameter-server rendezvous at " + env.root_addr + ":" + std::to_string(env.root_port) +
                             " failed for " + (env.role == Role::server ? "server " : "worker ") +
                             std::to_string(env.rank) + (root ? "" : " (server 0 serves the store)") + ": " + e.what());
  }
}

control::VanOptions PsConfig::van_options(const ClusterEnv& env, const collective::Rendezvous& rendezvous) const {
  control::VanOptions o = control::VanOptions::from(env);
  o.store_scope = rendezvous.scope();
  o.rendezvous_began = rendezvous.began();
  o.heartbeat_s = heartbeat_s;
  o.rendezvous_timeout_s = rendezvous_timeout_s;
  o.max_message_bytes = max_message_bytes;
  o.settings = mode_word();
  o.describe_settings = &PsConfig::describe_mode_word;
  return o;
}

}  // namespace commsched
