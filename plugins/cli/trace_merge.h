// `commsched trace-merge`: joins the per-rank trace files of one run (COMMSCHED_TIMELINE / start_timeline write one
// per rank) into a single Chrome/Perfetto trace with one track (process) per rank.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace commsched {

enum class TraceAlign { rendezvous, wall };

// Merges `inputs` into `output`. Each input must be a trace written by commsched's Timeline (its clock_sync event
// names the rank); two files of the same rank, a file that is not JSON, or one without a rank throw InvalidArgument
// naming the file. rendezvous: every rank's ts 0 is its engine start, right after the backend's rendezvous, so the
// timestamps are kept; wall: shifted by the ranks' wall-clock zero (for hosts with synchronized clocks).
// Returns the number of events written.
size_t merge_traces(const std::vector<std::string>& inputs, const std::string& output, TraceAlign align);

void add_trace_merge_subcommand(CLI::App& app);

}  // namespace commsched
