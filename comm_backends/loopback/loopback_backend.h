// Loopback backend: ranks are threads of one process. It really reduces the ranks' buffers (sum for push_pull and
// allreduce, copy from the root for broadcast) and completes each batch after a modelled link time, really waited:
//
//   every rank has its own link of `bandwidth_bps` (full duplex, so a push_pull's push and pull overlap);
//   a batch occupies its rank's link for bytes·8/bandwidth after the link's previous batch, then needs `latency_s`;
//   a partition completes on every rank once all ranks' batches carrying it have crossed their links.
//
// So one rank models a worker's NIC to an infinitely fast parameter server, and several ranks model a cluster whose
// slowest NIC sets the pace. This lets tests check real data and exercises the engine without a network.
#pragma once

#include <memory>

#include "comm_backends/comm_backend.h"

namespace commsched {

struct LinkModel {
  double bandwidth_bps = 0;  // 0: infinitely fast
  double latency_s = 0;
};

class LoopbackHub;

// Creates `ranks` connected loopback backends sharing one link model. The backends keep the hub alive.
std::vector<std::shared_ptr<CommBackend>> make_loopback_group(int ranks, LinkModel link = {});

}  // namespace commsched
