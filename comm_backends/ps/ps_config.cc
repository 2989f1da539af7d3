#include "comm_backends/ps/ps_config.h"

#include <string>

#include "comm_backends/ps/transport.h"
#include "base/types.h"
#include "comm_backends/liveness.h"

namespace commsched {
namespace {

ValueType<std::string> transport_value() {
  const std::string allowed = ps::ucx_built_in() ? "one of zmq, ucx" : "zmq (ucx: not built in)";
  // The documented text is the same in every build (the README table is generated); errors say what this one has.
  return {"choice", "one of zmq, ucx (ucx when built with UCX)",
          [allowed](std::string_view var, std::string_view value) -> std::string {
            if (value == "zmq") return "zmq";
            if (value == "ucx" && ps::ucx_built_in()) return "ucx";
            if (value == "ucx")
              throw InvalidArgument(std::string(var) + "=ucx is not available: this build has no UCX (install "
                                    "libucx-dev and rebuild); allowed: zmq");
            throw InvalidArgument(std::string(var) + "='" + std::string(value) + "' is invalid: allowed " + allowed);
          },
          [](const std::string& s) { return s; }};
}

OptionTable<PsConfig> build_ps_table() {
  using C = PsConfig;
  OptionTable<PsConfig> t("ps", "parameter-server");
  t.bind("deterministic", "COMMSCHED_PS_DETERMINISTIC", [](C& c) -> bool& { return c.deterministic; }, bool_value(),
         "sum in rank order: bitwise reproducible (holds all pushes until the last)");
  t.bind("emulate_rate", "COMMSCHED_EMULATE_RATE", [](C& c) -> double& { return c.emulate_rate_bps; },
         rate_value(/*allow_unlimited=*/true), "EMULATED link rate per process (token bucket on sends), e.g. 1gbit");
  t.bind("server_threads", "COMMSCHED_PS_SERVER_THREADS", [](C& c) -> int& { return c.server_threads; },
         int_value(0, 1024), "summation threads per server (0: one per core this process may use)");
  t.bind("parallel_sum_bytes", "COMMSCHED_PS_PARALLEL_SUM_BYTES", [](C& c) -> uint64_t& { return c.parallel_sum_bytes; },
         size_value(), "partitions at least this big are summed by several threads");
  t.bind("heartbeat", "COMMSCHED_PS_HEARTBEAT", [](C& c) -> double& { return c.heartbeat_s; }, duration_value(),
         "heartbeat interval (at most a quarter of COMMSCHED_TIMEOUT)");
  t.bind("rendezvous_timeout", "COMMSCHED_PS_RENDEZVOUS_TIMEOUT", [](C& c) -> double& { return c.rendezvous_timeout_s; },
         duration_value(), "how long to wait for every process to show up");
  t.bind("max_message", "COMMSCHED_PS_MAX_MESSAGE", [](C& c) -> uint64_t& { return c.max_message_bytes; }, size_value(),
         "largest accepted partition (at least 4KiB); bigger messages drop the sender");
  t.bind("io_threads", "COMMSCHED_PS_IO_THREADS", [](C& c) -> int& { return c.io_threads; }, int_value(1, 64),
         "ZeroMQ I/O threads per process");
  t.bind("chunk_bytes", "COMMSCHED_PS_CHUNK_BYTES", [](C& c) -> uint64_t& { return c.chunk_bytes; },
         size_value(ZeroSize::unlimited),
         "partitions bigger than this travel as several messages, so the server sums one chunk while the next arrives");
  t.bind("transport", "COMMSCHED_PS_TRANSPORT", [](C& c) -> std::string& { return c.transport; }, transport_value(),
         "ZeroMQ over TCP, or UCX when built in (shared memory, TCP, InfiniBand/RoCE verbs; UCX_TLS restricts it)");
  t.bind("mode", "COMMSCHED_PS_MODE", [](C& c) -> std::string& { return c.mode; }, choice_value({"sync", "async", "ssp"}),
         "gradients: sync (summed over every worker each round), async (each push answered at once with what every "
         "worker pushed since the caller's last pull) or ssp (async, at most COMMSCHED_STALENESS rounds ahead of the "
         "slowest worker); the same on every process");
  t.bind("staleness", "COMMSCHED_STALENESS", [](C& c) -> int& { return c.staleness; }, int_value(0, 1000000),
         "ssp: how many rounds a worker may run ahead of the slowest (0: as sync)");
  t.bind("reply_bound", "COMMSCHED_PS_REPLY_BOUND", [](C& c) -> int& { return c.reply_bound; }, int_value(0, 1000000),
         "a server sends receipts, then the most urgent partition's sums first, a reply at the latest once this many "
         "have left since it was ready (0: every reply at once, in arrival order)");
  return t;
}

}  // namespace

const OptionTable<PsConfig>& ps_option_table() {
  static const OptionTable<PsConfig> table = build_ps_table();
  return table;
}

void PsConfig::set(std::string_view option, std::string_view value, std::string_view var) {
  ps_option_table().set(*this, option, value, var);
}

PsConfig PsConfig::from_env() {
  PsConfig c;
  ps_option_table().set_from_env(c);
  c.stall = StallOptions::from_env();
  return c;
}

namespace {
const char* const kModes[] = {"sync", "async", "ssp"};
}  // namespace

// Low byte: the mode's index; above it the staleness, which only ssp uses (so only there it must agree).
uint32_t PsConfig::mode_word() const {
  uint32_t m = 0;
  while (m < 2 && mode != kModes[m]) ++m;
  return m == 2 ? m | static_cast<uint32_t>(staleness) << 8 : m;
}

std::string PsConfig::describe_mode_word(uint32_t word) {
  const uint32_t m = word & 0xff;
  if (m > 2) return "an unknown COMMSCHED_PS_MODE (" + std::to_string(word) + ")";
  std::string out = std::string("COMMSCHED_PS_MODE=") + kModes[m];
  if (m == 2) out += " COMMSCHED_STALENESS=" + std::to_string(word >> 8);
  return out;
}

std::optional<uint64_t> PsConfig::staleness_bound() const {
  if (mode == "ssp") return static_cast<uint64_t>(staleness);
  return std::nullopt;
}

void PsConfig::validate(double peer_timeout_s) const {
  check_heartbeat("COMMSCHED_PS_HEARTBEAT", heartbeat_s, peer_timeout_s);
  if (rendezvous_timeout_s <= 0) throw InvalidArgument("COMMSCHED_PS_RENDEZVOUS_TIMEOUT must be positive");
  if (deterministic && mode != "sync")
    throw InvalidArgument("COMMSCHED_PS_DETERMINISTIC=1 needs COMMSCHED_PS_MODE=sync (it is " + mode +
                          "): asynchronous answers depend on arrival order by design");
  if (max_message_bytes < 4096)
    throw InvalidArgument("COMMSCHED_PS_MAX_MESSAGE=" + std::to_string(max_message_bytes) + " is invalid: at least 4KiB");
}

}  // namespace commsched
