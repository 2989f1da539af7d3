#include "plugins/cli/trace_merge.h"

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/types.h"

namespace commsched {
namespace {

using nlohmann::json;

struct RankTrace {
  std::string file;
  int rank = -1;
  int64_t zero_unix_ns = 0;
  json events;
};

RankTrace load_trace(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw InvalidArgument("trace-merge: cannot read '" + file + "'");
  RankTrace t;
  t.file = file;
  try {
    t.events = json::parse(in);
  } catch (const json::exception& e) {
    throw InvalidArgument("trace-merge: '" + file + "' is not valid JSON: " + e.what());
  }
  if (!t.events.is_array()) throw InvalidArgument("trace-merge: '" + file + "' is not a trace (a JSON array of events)");
  for (const auto& e : t.events) {
    if (e.is_object() && e.value("name", "") == "clock_sync" && e.contains("args")) {
      t.rank = e["args"].value("rank", -1);
      t.zero_unix_ns = e["args"].value("zero_unix_ns", int64_t{0});
    }
  }
  if (t.rank < 0)
    throw InvalidArgument("trace-merge: '" + file + "' has no clock_sync event naming its rank (not a commsched "
                          "rank trace, or written by an older version)");
  return t;
}

// Async span ids are per-rank counters: made unique across ranks so a viewer does not join spans of two ranks.
constexpr int64_t kIdStride = 1'000'000'000'000;  // rank * stride + id stays below 2^53 for ranks < 9000

}  // namespace

size_t merge_traces(const std::vector<std::string>& inputs, const std::string& output, TraceAlign align) {
  if (inputs.empty()) throw InvalidArgument("trace-merge: no input files");
  std::map<int, RankTrace> ranks;
  for (const auto& f : inputs) {
    RankTrace t = load_trace(f);
    if (auto it = ranks.find(t.rank); it != ranks.end())
      throw InvalidArgument("trace-merge: '" + f + "' and '" + it->second.file + "' are both rank " +
                            std::to_string(t.rank) + " (traces of two runs?)");
    const int r = t.rank;
    ranks.emplace(r, std::move(t));
  }
  int64_t min_zero = ranks.begin()->second.zero_unix_ns;
  for (const auto& [r, t] : ranks) min_zero = std::min(min_zero, t.zero_unix_ns);
  json out = json::array();
  for (auto& [r, t] : ranks) {
    const double shift_us = align == TraceAlign::wall ? static_cast<double>(t.zero_unix_ns - min_zero) / 1000.0 : 0.0;
    out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    out.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", r}, {"args", {{"sort_index", r}}}});
    for (auto& e : t.events) {
      if (!e.is_object() || e.value("name", "") == "process_name") continue;
      e["pid"] = r;
      if (e.contains("ts") && e["ts"].is_number()) e["ts"] = e["ts"].get<double>() + shift_us;
      if (e.contains("id") && e["id"].is_number_integer()) e["id"] = r * kIdStride + e["id"].get<int64_t>();
      out.push_back(std::move(e));
    }
  }
  std::ofstream os(output);
  if (!os) throw InvalidArgument("trace-merge: cannot write '" + output + "'");
  os << out.dump() << '\n';
  if (!os) throw std::runtime_error("trace-merge: writing '" + output + "' failed");
  return out.size();
}

void add_trace_merge_subcommand(CLI::App& app) {
  struct Opts {
    std::vector<std::string> inputs;
    std::string output = "trace.merged.json";
    std::string align = "rendezvous";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("trace-merge", "merge the per-rank trace files of one run into one Perfetto trace");
  sub->add_option("inputs", o->inputs, "per-rank trace files (e.g. trace.rank*.json)")->required()->expected(-1);
  sub->add_option("-o,--output", o->output, "merged trace file");
  sub->add_option("--align", o->align, "rendezvous (each rank's zero is its rendezvous; default) or wall "
                                       "(wall clocks, when the hosts' clocks are synchronized)")
      ->check(CLI::IsMember({"rendezvous", "wall"}));
  sub->callback([o] {
    try {
      const size_t n = merge_traces(o->inputs, o->output, o->align == "wall" ? TraceAlign::wall : TraceAlign::rendezvous);
      std::cerr << "commsched trace-merge: " << o->inputs.size() << " rank(s), " << n << " events -> " << o->output
                << std::endl;
    } catch (const std::exception& e) {
      std::cerr << "commsched trace-merge: " << e.what() << std::endl;
      throw CLI::RuntimeError(2);
    }
  });
}

}  // namespace commsched
