// ps_goodput's modes that compare transports in one process (see ps_goodput.cc for the command lines). Each prints
// its table on stdout and returns the exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace commsched::bench {

// zmq, UCX shared memory and UCX TCP (those in `transports`) beside raw TCP echo, memcpy and perftest's ceiling;
// `extra_tls` (not empty) adds a UCX column over that UCX_TLS.
int compare_transports(const std::vector<uint64_t>& sizes, const std::string& transports, uint64_t mib, int reps,
                       const std::string& extra_tls);
// `parts` small partitions per round as one fused batch against a batch each, every transport.
int compare_fused(uint64_t parts, uint64_t mib, int reps);
// `workers` workers and one server per transport in `transports`; the workers' goodputs summed.
int compare_workers(const std::vector<uint64_t>& sizes, const std::string& transports, int workers, uint64_t mib,
                    int reps);

}  // namespace commsched::bench
