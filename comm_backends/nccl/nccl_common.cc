#include "comm_backends/nccl/nccl_common.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm_backends/cluster_env.h"

namespace commsched::nccl {

ncclComm_t nccl_communicator(int rank, int size, control::Store& store, const std::string& id_key, double timeout_s,
                             const std::string& who) {
  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), who + ": ncclGetUniqueId");
    store.set(id_key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    const auto wait = std::chrono::milliseconds(static_cast<int64_t>(join_timeout_s(timeout_s) * 1000));
    const std::string bytes = store.get(id_key, wait);
    if (bytes.size() != sizeof id) throw std::runtime_error(who + ": malformed ncclUniqueId in the rendezvous store");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), who + ": ncclCommInitRank");
  return comm;
}

}  // namespace commsched::nccl
