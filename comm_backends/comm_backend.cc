// The interface lives in the header; its one defined default reads the registry's row for the backend.
#include "comm_backends/comm_backend.h"

#include "comm_backends/backend_registry.h"

namespace commsched {

bool CommBackend::supports(Op op, Device device) const {
  const BackendInfo* row = find_backend(name());
  return row && row->carries(op, device);
}

}  // namespace commsched
