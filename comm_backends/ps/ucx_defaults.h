// The UCX transport's defaults for UCX settings the user left unset (ucx_transport.cc applies them; a UCX_* variable
// always wins). Free of UCX headers, so that they are tested in every build.
#pragma once

#include <string>
#include <vector>

namespace commsched::ps {

// Over shared memory only, messages from this size go by rendezvous (a CMA copy), smaller ones eagerly through the
// shared FIFO (ucx_transport.cc says why).
constexpr const char* kUcxShmRendezvousFrom = "64K";

// Whether UCX_TLS names shared-memory transports only (one host): "sm,self", "posix,cma". Unset or empty (UCX's
// choice), any network transport, or an exclusion list ("^tcp") is not.
bool ucx_shared_memory_only(const char* tls);

struct UcxSetting {
  std::string name;  // without UCX_
  std::string value;
};

// The settings a UCX transport gives UCX's config, for UCX_TLS `tls`: over shared memory only, rendezvous from
// kUcxShmRendezvousFrom, and where `sender_writes` (TransportOptions::sender_writes_rendezvous) the put scheme, so that
// this side copies its big messages into the receiver's memory. A setting whose UCX_ variable is set is left out: the
// user's word wins.
std::vector<UcxSetting> ucx_default_settings(const char* tls, bool sender_writes);

}  // namespace commsched::ps
