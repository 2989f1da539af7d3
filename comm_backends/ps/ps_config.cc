#include "comm_backends/ps/ps_config.h"

#include <string>

#include "comm_backends/ps/transport.h"

#include "scheduler/config.h"
#include "scheduler/types.h"

namespace commsched {
namespace {
constexpr const char* kOptions[] = {"deterministic", "emulate_rate", "server_threads", "parallel_sum_bytes",
                                    "heartbeat", "rendezvous_timeout", "max_message", "io_threads",
                                    "chunk_bytes", "transport"};

std::string parse_transport(const std::string& var, std::string_view value) {
  if (value == "zmq") return "zmq";
  if (value == "ucx" && ps::ucx_built_in()) return "ucx";
  if (value == "ucx")
    throw InvalidArgument(var + "=ucx is not available: this build has no UCX (install libucx-dev and rebuild); "
                          "allowed: zmq");
  throw InvalidArgument(var + "='" + std::string(value) + "' is invalid: allowed " +
                        (ps::ucx_built_in() ? "zmq, ucx" : "zmq (ucx: not built in)"));
}

std::string var_name(std::string_view option) {
  std::string v = option == "emulate_rate" ? "COMMSCHED_" : "COMMSCHED_PS_";
  for (char c : option) v += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return v;
}
}  // namespace

void PsConfig::set(std::string_view option, std::string_view value) {
  const std::string var = var_name(option);
  if (option == "deterministic") deterministic = parse_bool(var, value);
  else if (option == "emulate_rate") emulate_rate_bps = parse_rate_bps(var, value, /*allow_unlimited=*/true);
  else if (option == "server_threads") server_threads = static_cast<int>(parse_int(var, value, 0, 1024));
  else if (option == "parallel_sum_bytes") parallel_sum_bytes = parse_bytes(var, value);
  else if (option == "heartbeat") heartbeat_s = parse_seconds(var, value);
  else if (option == "rendezvous_timeout") rendezvous_timeout_s = parse_seconds(var, value);
  else if (option == "max_message") max_message_bytes = parse_bytes(var, value);
  else if (option == "io_threads") io_threads = static_cast<int>(parse_int(var, value, 1, 64));
  else if (option == "chunk_bytes") chunk_bytes = parse_bytes(var, value, /*allow_unlimited=*/true);
  else if (option == "transport") transport = parse_transport(var, value);
  else {
    std::string known;
    for (const char* o : kOptions) known += std::string(known.empty() ? "" : ", ") + o;
    throw InvalidArgument("unknown parameter-server option '" + std::string(option) + "' (known: " + known + ")");
  }
}

PsConfig PsConfig::from_env() {
  PsConfig c;
  for (const char* o : kOptions)
    if (auto v = env_value(var_name(o))) c.set(o, *v);
  return c;
}

void PsConfig::validate(double peer_timeout_s) const {
  if (heartbeat_s <= 0 || heartbeat_s * 4 > peer_timeout_s)
    throw InvalidArgument("COMMSCHED_PS_HEARTBEAT=" + std::to_string(heartbeat_s) +
                          "s is invalid: must be positive and at most a quarter of COMMSCHED_TIMEOUT (" +
                          std::to_string(peer_timeout_s) + "s)");
  if (rendezvous_timeout_s <= 0) throw InvalidArgument("COMMSCHED_PS_RENDEZVOUS_TIMEOUT must be positive");
  if (max_message_bytes < 4096)
    throw InvalidArgument("COMMSCHED_PS_MAX_MESSAGE=" + std::to_string(max_message_bytes) + " is invalid: at least 4KiB");
}

}  // namespace commsched
