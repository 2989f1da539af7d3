// Whether this build has the UCX transport: a fact of the build alone, apart from transport.cc (which makes
// transports), so that config validation (ps_config.cc) can say what is available without linking any transport.
#include "comm_backends/ps/transport.h"

namespace commsched::ps {

bool ucx_built_in() {
#ifdef COMMSCHED_HAVE_UCX
  return true;
#else
  return false;
#endif
}

}  // namespace commsched::ps
