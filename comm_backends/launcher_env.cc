#include "comm_backends/launcher_env.h"

#include <cctype>
#include <optional>

#include "options/parse.h"
#include "base/types.h"

namespace commsched {
namespace {

constexpr int64_t kMaxIndex = 1'000'000'000;

[[noreturn]] void bad_list(const std::string& var, const std::string& text, const std::string& why) {
  throw InvalidArgument(var + "='" + text + "' is invalid: " + why);
}

// One bracket of a host list, "[10-12,20]": its ranges and the width of their numbers (zero padding kept).
struct Range {
  int64_t lo = 0, hi = 0;
  size_t width = 0;
};
// A host name pattern: literal text and brackets in turn ("gpu-a" then "[01-02]").
struct Piece {
  std::string literal;        // used when ranges is empty
  std::vector<Range> ranges;  // a bracket
};
using Pattern = std::vector<Piece>;

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "a,b,,c" -> a, b, (empty), c: empty items stay, for the callers to reject.
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out(1);
  for (char c : text) {
    if (c == ',') out.emplace_back();
    else out.back().push_back(c);
  }
  return out;
}

std::vector<Range> parse_bracket(const std::string& var, const std::string& text, const std::string& inside) {
  std::vector<Range> out;
  for (const std::string& part : split_commas(inside)) {
    const size_t dash = part.find('-');
    const std::string lo = part.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi))
      bad_list(var, text, "'[" + inside + "]' holds '" + part + "', not a number or a range such as 10-12");
    Range r{std::stoll(lo), std::stoll(hi), lo.size()};
    if (r.lo > r.hi) bad_list(var, text, "the range '" + part + "' runs backwards");
    out.push_back(r);
  }
  return out;
}

// Splits at the commas outside brackets and parses each host pattern.
std::vector<Pattern> parse_hostlist(const std::string& var, const std::string& text) {
  if (text.empty()) bad_list(var, text, "an empty host list");
  std::vector<Pattern> out(1);
  std::string literal;
  auto end_literal = [&] {
    if (!literal.empty()) out.back().push_back({literal, {}});
    literal.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '[') {
      const size_t close = text.find_first_of("[]", i + 1);
      if (close == std::string::npos || text[close] != ']') bad_list(var, text, "a '[' at " + std::to_string(i) + " is not closed");
      end_literal();
      out.back().push_back({"", parse_bracket(var, text, text.substr(i + 1, close - i - 1))});
      i = close;
    } else if (c == ']') {
      bad_list(var, text, "a ']' at " + std::to_string(i) + " has no '['");
    } else if (c == ',') {
      end_literal();
      if (out.back().empty()) bad_list(var, text, "an empty host name before the comma at " + std::to_string(i));
      out.emplace_back();
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      bad_list(var, text, "a space at " + std::to_string(i));
    } else {
      literal += c;
    }
  }
  end_literal();
  if (out.back().empty()) bad_list(var, text, "an empty host name at the end");
  return out;
}

std::string padded(int64_t n, size_t width) {
  std::string s = std::to_string(n);
  return s.size() < width ? std::string(width - s.size(), '0') + s : s;
}

// Appends every host of `p` from piece `k` on, each prefixed by `prefix`.
void expand(const Pattern& p, size_t k, const std::string& prefix, std::vector<std::string>& out, size_t max_hosts,
            const std::string& var, const std::string& text) {
  if (k == p.size()) {
    if (out.size() == max_hosts) bad_list(var, text, "more than " + std::to_string(max_hosts) + " hosts");
    out.push_back(prefix);
    return;
  }
  if (p[k].ranges.empty()) return expand(p, k + 1, prefix + p[k].literal, out, max_hosts, var, text);
  for (const Range& r : p[k].ranges)
    for (int64_t n = r.lo; n <= r.hi; ++n) expand(p, k + 1, prefix + padded(n, r.width), out, max_hosts, var, text);
}

std::optional<LauncherSetting> setting_of(const char* var, std::string how = {}) {
  if (auto v = env_value(var)) return LauncherSetting{*v, var, std::move(how)};
  return std::nullopt;
}

// Puts `s` into `fields[name]` when set.
void put(LauncherView& v, const std::string& name, std::optional<LauncherSetting> s) {
  if (s) v.fields[name] = std::move(*s);
}

// Rank, size and local rank/size of the processes a launcher started: this role's.
void put_shape(LauncherView& v, bool server, const char* rank, const char* size, const char* local_rank,
               const char* local_size) {
  put(v, "rank", setting_of(rank));
  put(v, server ? "num_servers" : "num_workers", setting_of(size));
  put(v, "local_rank", setting_of(local_rank));
  if (local_size) put(v, "local_size", setting_of(local_size));
}

std::optional<LauncherView> torchrun_view(bool server) {
  LauncherView v;
  v.launcher = "torchrun/Ray";
  put_shape(v, server, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  put(v, "root_addr", setting_of("MASTER_ADDR"));
  if (auto m = env_value("MASTER_PORT")) {
    // torchrun's agent store (or rank 0 of torch.distributed's env:// init) holds MASTER_PORT; ours is the next one.
    const int64_t port = parse_int("MASTER_PORT", *m, 1, 65534) + 1;
    v.fields["root_port"] = {std::to_string(port), "MASTER_PORT", "MASTER_PORT + 1"};
  }
  // Each restart of torchrun's agent is a new membership: its rendezvous keys must not meet the last one's.
  put(v, "generation", setting_of("TORCHELASTIC_RESTART_COUNT"));
  if (v.fields.empty()) return std::nullopt;
  if (env_value("TORCHELASTIC_RUN_ID")) v.parent = "torchrun's agent (TORCHELASTIC_RUN_ID)";
  else if (env_value("RAY_RAYLET_PID")) v.parent = "the Ray node (RAY_RAYLET_PID: a Ray worker)";
  if (!v.parent.empty()) v.notes.push_back("started by " + v.parent);
  return v;
}

// This node's entry of SLURM_TASKS_PER_NODE (SLURM_NODEID picks it) when SLURM_NTASKS_PER_NODE is not set.
std::optional<LauncherSetting> slurm_local_size() {
  if (auto s = setting_of("SLURM_NTASKS_PER_NODE")) return s;
  for (const char* var : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    auto text = env_value(var);
    if (!text) continue;
    const std::vector<int> per_node = expand_slurm_tasks_per_node(var, *text);
    const auto node = env_value("SLURM_NODEID");
    const int64_t i = node ? parse_int("SLURM_NODEID", *node, 0, kMaxIndex) : 0;
    if (i >= static_cast<int64_t>(per_node.size()))
      throw InvalidArgument(std::string("SLURM_NODEID=") + std::to_string(i) + " is beyond " + var + "='" + *text +
                            "' (" + std::to_string(per_node.size()) + " nodes)");
    return LauncherSetting{std::to_string(per_node[i]), var, "entry SLURM_NODEID of " + std::string(var)};
  }
  return std::nullopt;
}

std::optional<LauncherView> slurm_view(bool server) {
  if (!env_value("SLURM_PROCID")) return std::nullopt;
  LauncherView v;
  v.launcher = "Slurm";
  put_shape(v, server, "SLURM_PROCID", env_value("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS", "SLURM_LOCALID",
            nullptr);
  put(v, "local_size", slurm_local_size());
  for (const char* var : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (auto list = env_value(var)) {
      v.fields["root_addr"] = {first_slurm_host(var, *list), var, std::string("first host of ") + var};
      break;
    }
  if (auto job = env_value("SLURM_JOB_ID"))
    v.fields["root_port"] = {std::to_string(port_for_job("SLURM_JOB_ID", *job)), "SLURM_JOB_ID",
                             "10000 + 4 * (SLURM_JOB_ID mod 5000)"};
  return v;
}

std::optional<LauncherView> openmpi_view(bool server) {
  if (!env_value("OMPI_COMM_WORLD_RANK")) return std::nullopt;
  LauncherView v;
  v.launcher = "Open MPI";
  put_shape(v, server, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (auto job = env_value("OMPI_MCA_ess_base_jobid"))
    v.fields["root_port"] = {std::to_string(port_for_job("OMPI_MCA_ess_base_jobid", *job)), "OMPI_MCA_ess_base_jobid",
                             "10000 + 4 * (OMPI_MCA_ess_base_jobid mod 5000)"};
  const auto size = env_value("OMPI_COMM_WORLD_SIZE");
  const auto local = env_value("OMPI_COMM_WORLD_LOCAL_SIZE");
  // mpirun names no rendezvous host. Every rank on this host: loopback reaches rank 0; across hosts only the user
  // knows which address of rank 0's host the others reach.
  if (size && local && parse_int("OMPI_COMM_WORLD_SIZE", *size, 1, kMaxIndex) ==
                           parse_int("OMPI_COMM_WORLD_LOCAL_SIZE", *local, 1, kMaxIndex))
    v.fields["root_addr"] = {"127.0.0.1", "OMPI_COMM_WORLD_LOCAL_SIZE", "loopback: every rank is on this host"};
  else
    v.missing_root = "mpirun started ranks on several hosts (OMPI_COMM_WORLD_LOCAL_SIZE=" + local.value_or("?") +
                     " of OMPI_COMM_WORLD_SIZE=" + size.value_or("?") +
                     ") and names no rendezvous host: set COMMSCHED_ROOT_ADDR to an address of rank 0's host "
                     "(mpirun -x COMMSCHED_ROOT_ADDR=HOST), and COMMSCHED_ROOT_PORT to a port free there";
  return v;
}

std::optional<LauncherView> dmlc_view(bool server) {
  LauncherView v;
  v.launcher = "DMLC (BytePS)";
  put(v, "num_workers", setting_of("DMLC_NUM_WORKER"));
  put(v, "num_servers", setting_of("DMLC_NUM_SERVER"));
  put(v, "rank", setting_of(server ? "DMLC_SERVER_ID" : "DMLC_WORKER_ID"));
  put(v, "root_addr", setting_of("DMLC_PS_ROOT_URI"));
  put(v, "root_port", setting_of("DMLC_PS_ROOT_PORT"));
  put(v, "bind", setting_of("DMLC_INTERFACE"));
  if (v.fields.empty()) return std::nullopt;
  return v;
}

}  // namespace

std::vector<LauncherView> launcher_views(bool server) {
  std::vector<LauncherView> out;
  for (auto* view : {torchrun_view, slurm_view, openmpi_view, dmlc_view})
    if (auto v = view(server)) out.push_back(std::move(*v));
  return out;
}

std::vector<std::string> expand_slurm_hostlist(const std::string& var, const std::string& text, size_t max_hosts) {
  std::vector<std::string> out;
  for (const Pattern& p : parse_hostlist(var, text)) expand(p, 0, "", out, max_hosts, var, text);
  return out;
}

std::string first_slurm_host(const std::string& var, const std::string& text) {
  const std::vector<Pattern> patterns = parse_hostlist(var, text);
  std::string host;
  for (const Piece& piece : patterns.front())
    host += piece.ranges.empty() ? piece.literal : padded(piece.ranges.front().lo, piece.ranges.front().width);
  return host;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& var, const std::string& text) {
  if (text.empty()) bad_list(var, text, "empty");
  std::vector<int> out;
  for (const std::string& item : split_commas(text)) {
    const size_t open = item.find("(x");
    const std::string count = item.substr(0, open);
    std::string times = "1";
    if (open != std::string::npos) {
      if (item.back() != ')') bad_list(var, text, "'" + item + "' lacks its closing ')'");
      times = item.substr(open + 2, item.size() - open - 3);
    }
    if (!all_digits(count) || !all_digits(times) || std::stoll(count) == 0 || std::stoll(times) == 0)
      bad_list(var, text, "'" + item + "' is not N or N(xM) with positive N and M");
    if (out.size() + std::stoll(times) > (1u << 16)) bad_list(var, text, "more than 65536 nodes");
    out.insert(out.end(), std::stoll(times), static_cast<int>(std::stoll(count)));
  }
  return out;
}

int port_for_job(const std::string& var, const std::string& job_id) {
  return static_cast<int>(10000 + 4 * (parse_int(var, job_id, 0, int64_t{1} << 62) % 5000));
}

std::string scheduler_role_notice() {
  if (env_value("COMMSCHED_ROLE")) return {};
  const auto role = env_value("DMLC_ROLE");
  if (!role || *role != "scheduler") return {};
  return "commsched: DMLC_ROLE=scheduler: commsched needs no scheduler process (workers and servers meet at "
         "DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT without one); this process exits with nothing to do";
}

}  // namespace commsched
