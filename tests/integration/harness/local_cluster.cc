#include "tests/integration/harness/local_cluster.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace commsched::testing {

int free_tcp_port() { return free_loopback_port(); }

LocalCluster::LocalCluster(std::string exe, int workers, int servers, std::vector<std::string> worker_args,
                           std::map<std::string, std::string> extra_env)
    : exe_(std::move(exe)), workers_(workers), servers_(servers), worker_args_(std::move(worker_args)),
      env_(std::move(extra_env)) {
  char tmpl[] = "/tmp/commsched-ps-test-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  port_ = free_tcp_port();
}

LocalCluster::~LocalCluster() {
  group_.kill_all();
  if (!std::getenv("COMMSCHED_TEST_KEEP_LOGS")) std::system(("rm -rf '" + dir_ + "'").c_str());
}

void LocalCluster::spawn(const std::string& role, int rank, const std::string& log,
                         const std::vector<std::string>& args) {
  std::map<std::string, std::string> env = env_;
  for (const auto& [k, v] : rank_env(workers_, rank, port_)) env[k] = v;
  env["COMMSCHED_ROLE"] = role;
  if (role == "server") env["COMMSCHED_LOCAL_RANK"] = "0", env["COMMSCHED_LOCAL_SIZE"] = "1";  // as the launcher does
  env["COMMSCHED_NUM_SERVERS"] = std::to_string(servers_);
  env["COMMSCHED_BIND"] = "127.0.0.1";
  std::vector<std::string> argv{exe_};
  argv.insert(argv.end(), args.begin(), args.end());
  const size_t at = group_.spawn(ProcessSpec{role + " " + std::to_string(rank), argv, env, log});
  procs_.push_back(Proc{role + " " + std::to_string(rank), group_.members()[at].pid, log, {}, {}});
}

void LocalCluster::start() {
  for (int s = 0; s < servers_; ++s) {
    spawn("server", s, dir_ + "/server" + std::to_string(s) + ".log", {});
  }
  for (int w = 0; w < workers_; ++w) {
    std::vector<std::string> args = worker_args_;
    for (auto& a : args) {  // per-worker file names: {dir} is the cluster's directory, {rank} the worker's rank
      if (auto at = a.find("{dir}"); at != std::string::npos) a.replace(at, 5, dir_);
      if (auto at = a.find("{rank}"); at != std::string::npos) a.replace(at, 6, std::to_string(w));
    }
    spawn("worker", w, dir_ + "/worker" + std::to_string(w) + ".log", args);
  }
}

void LocalCluster::reap() {
  for (size_t i : group_.reap()) {
    procs_[i].exit_code = group_.members()[i].code;
    procs_[i].exited = group_.members()[i].exited;
  }
}

int LocalCluster::alive() {
  reap();
  int n = 0;
  for (auto& p : procs_) n += !p.exit_code;
  return n;
}

bool LocalCluster::wait_all(std::chrono::milliseconds timeout) {
  // Sanitizer builds (scripts/sanitize.sh) run several times slower: COMMSCHED_TEST_TIME_SCALE stretches how long a
  // whole run may take. Detection limits (a lost peer within 10 s) are not stretched.
  if (const char* k = std::getenv("COMMSCHED_TEST_TIME_SCALE"); k && std::atof(k) > 1)
    timeout = std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(timeout.count()) * std::atof(k)));
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (alive() > 0) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

Proc& LocalCluster::proc(const std::string& name) {
  for (auto& p : procs_)
    if (p.name == name) return p;
  throw std::out_of_range("no process " + name);
}

void LocalCluster::kill9(const std::string& name) { ::kill(proc(name).pid, SIGKILL); }

std::string LocalCluster::read_log(const std::string& name) const {
  for (auto& p : procs_)
    if (p.name == name) {
      std::ifstream f(p.log);
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str();
    }
  return {};
}

}  // namespace commsched::testing
