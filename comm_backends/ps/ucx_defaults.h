// The UCX transport's defaults for UCX settings the user left unset (ucx_transport.cc applies them; a UCX_* variable
// always wins). Free of UCX headers, so that they are tested in every build.
#pragma once

namespace commsched::ps {

// Over shared memory only, messages from this size go by rendezvous (a CMA read), smaller ones eagerly through the
// shared FIFO (ucx_transport.cc says why).
constexpr const char* kUcxShmRendezvousFrom = "64K";

// Whether UCX_TLS names shared-memory transports only (one host): "sm,self", "posix,cma". Unset or empty (UCX's
// choice), any network transport, or an exclusion list ("^tcp") is not.
bool ucx_shared_memory_only(const char* tls);

}  // namespace commsched::ps
