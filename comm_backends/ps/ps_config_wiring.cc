// What a validated PsConfig hands the transport and the Van. Apart from ps_config.cc (parsing and validation), so
// that the parsers link without the keys, the Van and the transports (the config fuzzer, tests/fuzz, builds them alone).
#include "comm_backends/cluster_auth.h"
#include "comm_backends/control/socket.h"
#include "comm_backends/ps/ps_config.h"

namespace commsched {

ps::TransportOptions PsConfig::transport_options(const ClusterEnv& env) const {
  ps::TransportOptions opts;
  opts.emulate_rate_bps = emulate_rate_bps;
  opts.max_message_bytes = max_message_bytes + 4096;  // a header and some slack over the largest data range
  opts.io_threads = io_threads;
  opts.auth_secret = ClusterAuth::from_env().secret_for(control::bind_host(env));
  return opts;
}

control::VanOptions PsConfig::van_options(const ClusterEnv& env) const {
  control::VanOptions o = control::VanOptions::from(env);
  o.heartbeat_s = heartbeat_s;
  o.rendezvous_timeout_s = rendezvous_timeout_s;
  o.max_message_bytes = max_message_bytes;
  o.settings = mode_word();
  o.describe_settings = &PsConfig::describe_mode_word;
  return o;
}

}  // namespace commsched
