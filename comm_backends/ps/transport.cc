// Transport selection: the one place that maps COMMSCHED_PS_TRANSPORT's value to an implementation.
#include <stdexcept>

#include "comm_backends/ps/transport.h"

namespace commsched::ps {

#ifndef COMMSCHED_HAVE_UCX
std::unique_ptr<Transport> make_ucx_transport(const TransportOptions&) {
  throw std::runtime_error("COMMSCHED_PS_TRANSPORT=ucx: this build has no UCX (install libucx-dev and rebuild)");
}
#endif

OutPayload gathered(std::vector<std::span<const std::byte>> pieces, std::function<void()> release) {
  OutPayload p;
  for (const auto& s : pieces) p.size += s.size();
  p.pieces = std::move(pieces);
  p.release = std::move(release);
  return p;
}

std::unique_ptr<Transport> make_transport(const std::string& kind, const TransportOptions& opts) {
  if (kind == "zmq") return make_zmq_transport(opts);
  if (kind == "ucx") return make_ucx_transport(opts);
  throw std::runtime_error("unknown PS transport '" + kind + "' (allowed: zmq, ucx)");
}

}  // namespace commsched::ps
