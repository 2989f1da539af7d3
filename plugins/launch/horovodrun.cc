#include "plugins/launch/horovodrun.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string_view>

#include "base/types.h"
#include "comm_backends/cluster_auth.h"
#include "comm_backends/control/socket.h"
#include "plugins/launch/launcher.h"
#include "plugins/launch/process_group.h"
#include "plugins/launch/run_keys.h"

extern char** environ;

namespace commsched {
namespace {

struct RunOptions {
  int np = 0;
  std::string hosts, hostfile, ssh_port, ssh_identity, bind;
  std::vector<std::string> ssh_command = {"ssh"};
  double start_timeout_s = 120;
  int min_np = 0, max_np = 0, servers = 0;
  bool verbose = false;
  std::map<std::string, std::string> env;  // horovodrun's settings as commsched's variables, for every process
  std::vector<std::string> command;
};

void say(const std::string& line) { std::fprintf(stderr, "[commsched horovodrun] %s\n", line.c_str()); }

int to_int(const std::string& flag, const std::string& v, int min) {
  try {
    size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used == v.size() && n >= min) return n;
  } catch (const std::exception&) {
  }
  throw InvalidArgument("horovodrun: " + flag + " takes a whole number of at least " + std::to_string(min) + ", got '" +
                        v + "'");
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The options that take a value, by every name horovodrun gives them (and two of commsched's own).
struct ValuedFlag {
  std::vector<std::string_view> names;
  void (*set)(RunOptions& o, const std::string& flag, const std::string& v);
};

const std::vector<ValuedFlag>& valued_flags() {
  static const std::vector<ValuedFlag> flags = {
      {{"-np", "--num-proc"},
       [](RunOptions& o, const std::string& f, const std::string& v) { o.np = to_int(f, v, 1); }},
      {{"-H", "--hosts"}, [](RunOptions& o, const std::string&, const std::string& v) { o.hosts = v; }},
      {{"-hostfile", "--hostfile"}, [](RunOptions& o, const std::string&, const std::string& v) { o.hostfile = v; }},
      {{"-p", "--ssh-port"},
       [](RunOptions& o, const std::string& f, const std::string& v) { o.ssh_port = std::to_string(to_int(f, v, 1)); }},
      {{"-i", "--ssh-identity-file"},
       [](RunOptions& o, const std::string&, const std::string& v) { o.ssh_identity = v; }},
      {{"--network-interface", "--network-interfaces"},  // horovodrun takes a list; one address binds here
       [](RunOptions& o, const std::string&, const std::string& v) { o.bind = v.substr(0, v.find(',')); }},
      {{"--start-timeout"},
       [](RunOptions& o, const std::string& f, const std::string& v) { o.start_timeout_s = to_int(f, v, 1); }},
      {{"--min-np", "--min-num-proc"},
       [](RunOptions& o, const std::string& f, const std::string& v) { o.min_np = to_int(f, v, 1); }},
      {{"--max-np", "--max-num-proc"},
       [](RunOptions& o, const std::string& f, const std::string& v) { o.max_np = to_int(f, v, 1); }},
      {{"--servers-per-host"},
       [](RunOptions& o, const std::string& f, const std::string& v) { o.servers = to_int(f, v, 0); }},
      {{"--ssh-command"},
       [](RunOptions& o, const std::string&, const std::string& v) { o.ssh_command = split_words(v); }},
      {{"--timeline-filename"},
       [](RunOptions& o, const std::string&, const std::string& v) { o.env["COMMSCHED_TIMELINE"] = v; }},
      {{"--autotune-log-file"},
       [](RunOptions& o, const std::string&, const std::string& v) { o.env["COMMSCHED_TUNER_CSV"] = v; }},
  };
  return flags;
}

const ValuedFlag* valued_flag(const std::string& flag) {
  for (const ValuedFlag& f : valued_flags())
    if (std::find(f.names.begin(), f.names.end(), flag) != f.names.end()) return &f;
  return nullptr;
}

// horovodrun's own flags that commsched cannot honour, each with what to do instead.
std::optional<std::string> refused(const std::string& flag) {
  if (flag == "--mpi" || flag == "--mpi-args")
    return "commsched starts its own processes (Gloo or its parameter server); under Open MPI run `mpirun -np N "
           "python train.py` directly, which commsched.torch.init() reads";
  if (flag == "--host-discovery-script")
    return "hosts are fixed at start; elastic runs survive lost workers and hosts (--min-np) and restart workers with "
           "`commsched launch --restarts`";
  if (flag == "--jsrun" || flag == "--js-args") return "jsrun is not supported; use one `commsched launch` per host";
  return std::nullopt;
}

RunOptions parse_args(const std::vector<std::string>& args) {
  RunOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (flag == "--") {
      ++i;
      break;
    }
    if (flag.empty() || flag[0] != '-') break;  // the command starts here
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[i + 1];
    }
    if (auto why = refused(flag)) throw InvalidArgument("horovodrun: " + flag + " is not supported: " + *why);
    if (flag == "--gloo") continue;  // the default
    if (flag == "--verbose" || flag == "-v") {
      o.verbose = true;
      continue;
    }
    if (flag == "--autotune") {  // the scheduler's online tuner: partition size, credit, fusion bound
      o.env["COMMSCHED_TUNE"] = "1";
      continue;
    }
    const ValuedFlag* f = valued_flag(flag);
    if (!f)
      throw InvalidArgument("horovodrun: unknown option " + flag + " (supported: -np, -H/--hosts, --hostfile, -p, -i, "
                            "--network-interface, --start-timeout, --min-np, --max-np, --gloo, --verbose, "
                            "--autotune, --autotune-log-file, --timeline-filename, --servers-per-host, "
                            "--ssh-command; commsched's knobs are COMMSCHED_* variables: `commsched options`)");
    const bool inline_value = args[i] != flag;
    if (!inline_value && i + 1 >= args.size()) throw InvalidArgument("horovodrun: " + flag + " needs a value");
    f->set(o, flag, value);
    if (!inline_value) ++i;
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.command.empty()) throw InvalidArgument("horovodrun: no command given (horovodrun -np 4 python train.py)");
  if (o.np == 0) throw InvalidArgument("horovodrun: -np (the number of workers) is required");
  if (!o.hosts.empty() && !o.hostfile.empty()) throw InvalidArgument("horovodrun: give -H or --hostfile, not both");
  if (o.ssh_command.empty()) throw InvalidArgument("horovodrun: --ssh-command is empty");
  return o;
}

bool is_loopback_name(const std::string& host) { return host == "localhost" || is_loopback_host(host); }

bool is_this_host(const std::string& host) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return is_loopback_name(host) || host == name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("horovodrun: cannot read the hostfile " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The shared secret every host's launcher proves: the caller's COMMSCHED_SECRET, else none where the caller chose a
// key file (forwarded) or turned authentication off, else a fresh one.
std::string run_secret() {
  if (const char* s = std::getenv("COMMSCHED_SECRET"); s && *s) return s;
  const auto generated = run_auth_env();
  const auto it = generated.find("COMMSCHED_SECRET");
  return it == generated.end() ? std::string() : it->second;
}

// The port the launchers meet on at the first host: probed where that host is this one, else drawn from the range
// the control plane hands out (20000-31999, below the ephemeral ports), which a busy remote host may have taken.
int root_port(const std::string& host0) {
  if (is_this_host(host0)) return control::free_port("0.0.0.0");
  std::mt19937 rng(std::random_device{}());
  return 20000 + static_cast<int>(rng() % 12000);
}

std::vector<std::string> launch_argv(const RunOptions& o, int nnodes, int node, const std::string& root, int workers) {
  std::vector<std::string> a = {std::filesystem::read_symlink("/proc/self/exe").string(), "launch"};
  for (const std::string& s : {std::string("--nnodes"), std::to_string(nnodes), std::string("--node-rank"),
                               std::to_string(node), std::string("--root"), root, std::string("-w"),
                               std::to_string(workers), std::string("-s"), std::to_string(o.servers),
                               std::string("--join-timeout"), std::to_string(static_cast<int>(o.start_timeout_s))})
    a.push_back(s);
  if (!o.bind.empty()) a.insert(a.end(), {"--bind", o.bind});
  if (o.min_np > 0) a.insert(a.end(), {"--min-workers", std::to_string(o.min_np)});
  if (o.max_np > 0) a.insert(a.end(), {"--max-workers", std::to_string(o.max_np)});
  a.push_back("--");
  a.insert(a.end(), o.command.begin(), o.command.end());
  return a;
}

// remote_env: what a host reached over ssh gets (forwarded_env and the secret), the same for every such host.
ProcessSpec host_spec(const RunOptions& o, const HostSlots& h, int node, std::vector<std::string> launch,
                      const std::string& secret, const std::map<std::string, std::string>& remote_env) {
  ProcessSpec spec{"host " + std::to_string(node) + " (" + h.host + ")", {}, {}, "", /*dies_with_parent=*/true, ""};
  if (is_this_host(h.host)) {
    spec.argv = std::move(launch);
    if (!secret.empty()) spec.env["COMMSCHED_SECRET"] = secret;
    return spec;
  }
  spec.argv = o.ssh_command;
  spec.argv.insert(spec.argv.end(), {"-o", "BatchMode=yes"});
  if (!o.ssh_port.empty()) spec.argv.insert(spec.argv.end(), {"-p", o.ssh_port});
  if (!o.ssh_identity.empty()) spec.argv.insert(spec.argv.end(), {"-i", o.ssh_identity});
  spec.argv.push_back(h.host);
  spec.argv.push_back(kRemoteShell);
  // Before launch's "--" (the worker command follows it): the remote launcher stops when ssh's stdin closes.
  launch.insert(std::find(launch.begin() + 2, launch.end(), std::string("--")), "--stdin-lifeline");
  spec.input = remote_script(std::filesystem::current_path().string(), remote_env, launch);
  spec.keep_input_open = true;
  return spec;
}

// What goes to ssh's stdin (the environment among it) must fit ProcessSpec::input's bound; the error names the
// largest variables, the usual cause (module systems export long ones).
void check_inputs(const std::vector<ProcessSpec>& specs, const std::map<std::string, std::string>& remote_env) {
  for (const ProcessSpec& spec : specs) {
    if (spec.input.size() <= kMaxProcessInput) continue;
    std::vector<std::pair<size_t, std::string>> sizes;
    for (const auto& [k, v] : remote_env) sizes.emplace_back(v.size(), k);
    std::sort(sizes.rbegin(), sizes.rend());
    std::string largest;
    for (size_t i = 0; i < std::min<size_t>(3, sizes.size()); ++i)
      largest += (i ? ", " : "") + sizes[i].second + " (" + std::to_string(sizes[i].first) + " bytes)";
    throw InvalidArgument("horovodrun: the environment sent to " + spec.name + " is " +
                          std::to_string(spec.input.size()) + " bytes, above " + std::to_string(kMaxProcessInput) +
                          "; the largest variables: " + largest + " (unset what the job does not need)");
  }
}

// Waits for every host's launcher; the first to fail stops the others (their node link would too, within its
// timeout), except in an elastic run, where node 0's launcher (member 0) survives a lost host and its own end decides.
// Ctrl-C and SIGTERM go to the local processes (ssh clients included); a remote launcher stops when its stdin, ssh's,
// closes (closed here first). Returns the first failure's code, 130 after a signal, else 0.
int supervise(ProcessGroup& group, const sigset_t& mask, bool elastic) {
  for (;;) {
    timespec tick{0, 100'000'000};
    const int sig = sigtimedwait(&mask, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      say(std::string(sig == SIGINT ? "interrupted" : "terminated") + "; stopping every host");
      group.close_inputs();
      group.terminate(sig, std::chrono::seconds(10));
      return 130;
    }
    for (size_t i : group.reap()) {
      const ProcessState& m = group.members()[i];
      if (*m.code == 0) continue;
      if (elastic && i != 0) {
        say(m.name + " exited with status " + std::to_string(*m.code) + "; elastic: the run goes on without it");
        continue;
      }
      say(m.name + " exited with status " + std::to_string(*m.code) + "; stopping the others");
      group.close_inputs();
      group.terminate(SIGTERM, std::chrono::seconds(10));
      return *m.code;
    }
    if (group.alive() == 0) return 0;
  }
}

int run_hosts(const RunOptions& o, const std::vector<HostSlots>& placed) {
  for (const HostSlots& h : placed)
    if (is_loopback_name(h.host))
      throw InvalidArgument("horovodrun: with several hosts name each by an address the others reach, not '" +
                            h.host + "'");
  const std::string root = placed[0].host + ":" + std::to_string(root_port(placed[0].host));
  const std::string secret = run_secret();
  sigset_t mask, old;
  sigemptyset(&mask);
  for (int s : {SIGINT, SIGTERM, SIGCHLD}) sigaddset(&mask, s);
  sigprocmask(SIG_BLOCK, &mask, &old);
  const int n = static_cast<int>(placed.size());
  std::map<std::string, std::string> remote_env = forwarded_env(environ);
  if (!secret.empty()) remote_env["COMMSCHED_SECRET"] = secret;
  std::vector<ProcessSpec> specs;  // all made before any starts: one that cannot be started fails the run untouched
  for (int node = 0; node < n; ++node)
    specs.push_back(host_spec(o, placed[static_cast<size_t>(node)], node,
                              launch_argv(o, n, node, root, placed[static_cast<size_t>(node)].slots), secret,
                              remote_env));
  check_inputs(specs, remote_env);
  ProcessGroup group(old, "commsched horovodrun");
  for (const ProcessSpec& spec : specs) {
    if (o.verbose) {
      std::string line;
      for (const auto& a : spec.argv) line += (line.empty() ? "" : " ") + shell_quote(a);
      say(spec.name + ": " + line);
    }
    group.spawn(spec);
  }
  say(std::to_string(o.np) + " worker(s) on " + std::to_string(n) + " host(s), meeting at " + root);
  const int rc = supervise(group, mask, o.min_np > 0);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

int horovodrun(const RunOptions& o) {
  // Set here, before any process starts, so that this host's launcher and the forwarded environment carry them.
  for (const auto& [k, v] : o.env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<HostSlots> hosts = !o.hostfile.empty() ? parse_hostfile(read_file(o.hostfile), o.hostfile)
                                 : !o.hosts.empty()  ? parse_hosts(o.hosts)
                                                     : std::vector<HostSlots>{{"localhost", o.np}};
  const std::vector<HostSlots> placed = place_workers(o.np, hosts);
  if (placed.size() > 1) return run_hosts(o, placed);
  if (!is_this_host(placed[0].host)) return run_hosts(o, placed);  // one remote host: over ssh too
  LaunchOptions l;
  l.workers = o.np;
  l.servers = o.servers;
  l.command = o.command;
  l.bind = o.bind;
  l.min_workers = o.min_np;
  l.max_workers = o.max_np;
  return launch_local_cluster(l);
}

}  // namespace

std::vector<HostSlots> parse_hosts(const std::string& text) {
  std::vector<HostSlots> out;
  std::stringstream in(text);
  for (std::string entry; std::getline(in, entry, ',');) {
    const auto colon = entry.rfind(':');
    HostSlots h{entry.substr(0, colon), 1};
    if (colon != std::string::npos) h.slots = to_int("-H entry '" + entry + "'", entry.substr(colon + 1), 1);
    if (h.host.empty()) throw InvalidArgument("horovodrun: -H entry '" + entry + "' names no host");
    out.push_back(h);
  }
  if (out.empty()) throw InvalidArgument("horovodrun: -H names no host");
  return out;
}

std::vector<HostSlots> parse_hostfile(const std::string& contents, const std::string& path) {
  static const std::regex line_re(R"(^\s*(\S+)(?:\s+slots\s*=\s*(\d+))?\s*$)");
  std::vector<HostSlots> out;
  std::stringstream in(contents);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    line = line.substr(0, line.find('#'));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::smatch m;
    if (!std::regex_match(line, m, line_re))
      throw InvalidArgument("horovodrun: " + path + " line " + std::to_string(number) + ": expected 'HOST slots=N', "
                            "got '" + line + "'");
    out.push_back({m[1], m[2].matched ? to_int(path + " line " + std::to_string(number), m[2], 1) : 1});
  }
  if (out.empty()) throw InvalidArgument("horovodrun: the hostfile " + path + " names no host");
  return out;
}

std::vector<HostSlots> place_workers(int np, const std::vector<HostSlots>& hosts) {
  std::vector<HostSlots> placed;
  int left = np, slots = 0;
  for (const HostSlots& h : hosts) {
    slots += h.slots;
    if (left == 0) continue;
    placed.push_back({h.host, std::min(left, h.slots)});
    left -= placed.back().slots;
  }
  if (left > 0)
    throw InvalidArgument("horovodrun: -np " + std::to_string(np) + " is more than the hosts' " +
                          std::to_string(slots) + " slot(s)");
  return placed;
}

std::string shell_quote(const std::string& s) {
  // Not std::regex: libstdc++ matches a repeat by recursion, one frame per character, and a value of 100 KB (a
  // module system's exported variable) overflowed the stack.
  static constexpr std::string_view kPlain =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,@%+-";
  if (!s.empty() && s.find_first_not_of(kPlain) == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {

// The script's newline, in a name no forwarded variable can take (forwarded_env leaves it out): a user's own `nl`
// exported before a value that needs it would have replaced it.
constexpr const char* kNewlineVar = "__commsched_nl";

// shell_quote's word with every newline spelt "$__commsched_nl" (remote_script sets it): the script is one line.
std::string script_word(const std::string& s) {
  std::string out = shell_quote(s);
  const std::string nl = "'\"$" + std::string(kNewlineVar) + "\"'";
  for (size_t at = 0; (at = out.find('\n', at)) != std::string::npos; at += nl.size()) out.replace(at, 1, nl);
  return out;
}

}  // namespace

std::string remote_script(const std::string& cwd, const std::map<std::string, std::string>& env,
                          const std::vector<std::string>& argv) {
  const std::string nl = kNewlineVar;
  std::string script = nl + "=$(printf '\\n_'); " + nl + "=${" + nl + "%_};";
  for (const auto& [k, v] : env)
    if (k != nl) script += " export " + k + "=" + script_word(v) + ";";
  script += " cd " + script_word(cwd) + " && exec";
  for (const auto& a : argv) script += " " + script_word(a);
  return script + "\n";
}

std::map<std::string, std::string> forwarded_env(char** envp) {
  static const std::regex name_re("^[A-Za-z_][A-Za-z0-9_]*$");
  static const std::regex local_re(
      "^(HOSTNAME|HOST|PWD|OLDPWD|SHLVL|_|HOME|USER|LOGNAME|SHELL|MAIL|TERM|DISPLAY|TMPDIR|COMMSCHED_SECRET|"
      "SSH_.*|XDG_.*|BASH_FUNC_.*|LS_COLORS|__commsched_nl)$");
  std::map<std::string, std::string> out;
  for (char** e = envp; e && *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq);
    if (std::regex_match(k, name_re) && !std::regex_match(k, local_re)) out[k] = kv.substr(eq + 1);
  }
  return out;
}

void add_horovodrun_subcommand(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "horovodrun", "horovodrun's command line (-np N [-H host:slots,...] command): one `commsched launch` per host, "
                    "over ssh where it is not this one");
  sub->prefix_command();  // every argument is horovodrun's (CLI11 cannot parse -np)
  sub->callback([sub] {
    int rc = 2;
    try {
      rc = horovodrun(parse_args(sub->remaining()));
    } catch (const std::exception& e) {
      std::cerr << "commsched " << e.what() << std::endl;
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace commsched
