// The interface lives in the header; its one defined default reads the registry's row for the backend.
#include "comm_backends/comm_backend.h"

#include "comm_backends/backend_registry.h"

namespace commsched {

BackendCapabilities CommBackend::capabilities() const {
  BackendCapabilities c;
  if (const BackendInfo* row = find_backend(name())) c.carries = row->row();  // no row (a test double): carries nothing
  return c;
}

}  // namespace commsched
