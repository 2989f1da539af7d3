// Transport selection: the one place that maps COMMSCHED_PS_TRANSPORT's value to an implementation.
#include <stdexcept>

#include "comm_backends/ps/transport.h"

namespace commsched::ps {

bool ucx_built_in() {
#ifdef COMMSCHED_HAVE_UCX
  return true;
#else
  return false;
#endif
}

#ifndef COMMSCHED_HAVE_UCX
std::unique_ptr<Transport> make_ucx_transport(const TransportOptions&) {
  throw std::runtime_error("COMMSCHED_PS_TRANSPORT=ucx: this build has no UCX (install libucx-dev and rebuild)");
}
#endif

std::unique_ptr<Transport> make_transport(const std::string& kind, const TransportOptions& opts) {
  if (kind == "zmq") return make_zmq_transport(opts);
  if (kind == "ucx") {
    // Fail closed: the UCX transport has no peer authentication yet, so a run that has a secret must not silently
    // accept peers without it.
    if (!opts.auth_secret.empty())
      throw std::runtime_error(
          "COMMSCHED_PS_TRANSPORT=ucx: the UCX transport does not authenticate peers yet, and this run has a shared "
          "secret (COMMSCHED_SECRET, COMMSCHED_KEY_FILE, or the one `commsched launch` makes per run); use "
          "COMMSCHED_PS_TRANSPORT=zmq, or COMMSCHED_AUTH=off on a trusted host");
    return make_ucx_transport(opts);
  }
  throw std::runtime_error("unknown PS transport '" + kind + "' (allowed: zmq, ucx)");
}

}  // namespace commsched::ps
