// UCX's own ceiling for ps_goodput: `ucx_perftest -t tag_bw` between two processes on this host, over the same
// UCX_TLS as the PS column it stands beside. A push_pull moves each byte twice (the push, then the sum back), so the
// PS column is judged against half of perftest's one-way rate (the "two-transfer ceiling").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace commsched::bench {

// Whether `ucx_perftest` is on the PATH; when it is not, the caller says so and leaves the ceiling out.
bool have_ucx_perftest();

// One-way tag_bw bandwidth in bytes per second (perftest prints MiB/s) for messages of `bytes`, moving about
// `total` bytes after a warm-up, between a perftest server and client started here with UCX_TLS=`tls` on `port`.
// nullopt (and a line on stderr naming the reason) when perftest fails or prints no result.
std::optional<double> ucx_perftest_rate(const std::string& tls, uint64_t bytes, uint64_t total, int port);

// Parses perftest's "Final:" line (iterations, three latencies, bandwidth average and overall in MiB/s, message rates)
// into bytes per second, the overall bandwidth; nullopt when `output` has no such line.
std::optional<double> parse_perftest_final(const std::string& output);

}  // namespace commsched::bench
